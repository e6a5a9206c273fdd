"""Retrieval with each extractor, side by side in one run: ConvoMem slices and the LoCoMo-form fixture.

The same questions, encoder, tokenizer and activation settings for every extractor; only construction
differs. Per set and category it prints Recall@10, nDCG@10, the coverage ceiling and working-memory
tokens, then one JSON object with everything.

    python bench/extractor_retrieval.py [--extractors heuristic parser] [--sets convomem1 convomem2 locomo]

``convomem1`` is the first 10 cases of each category (what the rules were developed on), ``convomem2``
cases 11-20 of each category, ``locomo`` the LoCoMo-form test fixture (76 turns, 31 questions).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETS = {
    "convomem1": ("convomem", ROOT / "data" / "convomem", 0, 10),
    "convomem2": ("convomem", ROOT / "data" / "convomem", 10, 10),
    "locomo": ("locomo", ROOT / "tests" / "activation" / "fixtures" / "locomo_form.json", 0, None),
}


def per_category_slice(cases, skip: int, take: int | None):
    """Cases ``skip+1 .. skip+take`` of each category (by the first question), in data order."""
    if take is None:
        return list(cases)
    seen: dict[str, int] = defaultdict(int)
    kept = []
    for case in cases:
        category = case.qas[0].category if case.qas else ""
        if skip <= seen[category] < skip + take:
            kept.append(case)
        seen[category] += 1
    return kept


class MemoEncoder:
    """The sentence encoder with its vectors remembered by text: the extractors share most unit facts,
    so each fact is embedded once for all of them (vectors are identical either way)."""

    def __init__(self, encoder):
        self.encoder, self.dim, self.model_id = encoder, encoder.dim, getattr(encoder, "model_id", "encoder")
        self.memo: dict[str, object] = {}

    def encode(self, texts):
        import numpy as np

        texts = list(texts)
        missing = list(dict.fromkeys(t for t in texts if t not in self.memo))
        if missing:
            self.memo.update(zip(missing, self.encoder.encode(missing)))
        return np.stack([self.memo[t] for t in texts]) if texts else self.encoder.encode(texts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extractors", nargs="+", default=["heuristic", "parser"])
    parser.add_argument("--sets", nargs="+", default=list(SETS), choices=list(SETS))
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import faiss
    import torch

    torch.set_num_threads(args.threads)
    faiss.omp_set_num_threads(args.threads)
    from qgmem.activation.config import ActivationConfig
    from qgmem.evaluation.retrieval import evaluate_cases
    from qgmem.data.loaders import load_cases
    from qgmem.embed import SentenceEncoder
    from qgmem.lm import EMBEDDED_LM, load_tokenizer
    from qgmem.memory.builder import MemoryBuilder
    from qgmem.memory.config import ConstructionConfig

    encoder = MemoEncoder(SentenceEncoder())
    tokenizer = load_tokenizer(EMBEDDED_LM)
    config = ActivationConfig()
    results: dict[str, dict[str, dict]] = {}
    for name in args.sets:
        dataset, path, skip, take = SETS[name]
        cases = per_category_slice(load_cases(dataset, path).cases, skip, take)
        results[name] = {}
        for extractor in args.extractors:
            builder = MemoryBuilder(ConstructionConfig(extractor=extractor), encoder)
            started = time.perf_counter()
            summary = evaluate_cases(cases, lambda case: builder.build(case.dialogue), encoder, config, tokenizer)
            summary["wall_s"] = round(time.perf_counter() - started, 1)
            results[name][extractor] = summary
            print(f"[{name}] {extractor}: R@10 {summary['recall@10']:.3f} nDCG@10 {summary['ndcg@10']:.3f} "
                  f"ceiling {summary.get('recall_ceiling', 0):.3f} tokens {summary['context_tokens_mean']:.0f} "
                  f"units/case {summary['units_per_case_mean']:.0f} ({summary['wall_s']} s)", file=sys.stderr)
    for name, by_extractor in results.items():
        print(f"\n## {name}")
        head = "| category | n | " + " | ".join(f"{e} R@10 / nDCG@10 (ceiling)" for e in by_extractor) + " |"
        print(head)
        print("|" + " --- |" * (2 + len(by_extractor)))
        first = next(iter(by_extractor.values()))
        for category in [*first["per_category"], "all"]:
            cells = []
            for summary in by_extractor.values():
                row = summary if category == "all" else summary["per_category"][category]
                cells.append(f"{row['recall@10']:.1%} / {row['ndcg@10']:.1%} ({row.get('recall_ceiling', 0):.1%})")
            print(f"| {category} | {first['n_questions'] if category == 'all' else first['per_category'][category]['n_questions']} | "
                  + " | ".join(cells) + " |")
        print("| tokens | | " + " | ".join(f"{s['context_tokens_mean']:.0f}" for s in by_extractor.values()) + " |")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
