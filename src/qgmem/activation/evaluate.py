"""``qgmem eval-retrieval``: activation against gold evidence turns, beside a BM25-over-turns baseline.

For every case: build the memory store (offline construction), build one activator, and for every
question with gold evidence activate a working memory; each activated unit stands for its own source
span. The same questions go to plain BM25 over the raw turns with the same ``k``, so both columns come
from one run on the same data.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from qgmem.activation.activator import Activator
from qgmem.activation.baseline import BM25TurnBaseline
from qgmem.activation.config import ActivationConfig
from qgmem.activation.metrics import evidence_metrics, mean_metrics, percentiles
from qgmem.activation.rerank import make_reranker
from qgmem.activation.serialize import count_tokens
from qgmem.data.loaders import DATASETS, add_load_arguments, load_arguments
from qgmem.data.records import Case
from qgmem.errors import as_user_error
from qgmem.memory.store import MemoryStore


@dataclass
class _Rows:
    """Per-question results of one system, kept by category."""

    metrics: list[dict[str, float]] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    categories: list[str] = field(default_factory=list)
    ceilings: list[float] = field(default_factory=list)

    def add(self, category: str, metrics: dict[str, float], tokens: int | None, ceiling: float | None = None) -> None:
        self.categories.append(category)
        self.metrics.append(metrics)
        if tokens is not None:
            self.tokens.append(tokens)
        if ceiling is not None:
            self.ceilings.append(ceiling)

    def summary(self, k: int, where: Callable[[str], bool] = lambda c: True) -> dict[str, Any]:
        keep = [i for i, c in enumerate(self.categories) if where(c)]
        out: dict[str, Any] = mean_metrics([self.metrics[i] for i in keep], k)
        tokens = [self.tokens[i] for i in keep] if len(self.tokens) == len(self.categories) else []
        out["context_tokens_mean"] = float(np.mean(tokens)) if tokens else None
        if len(self.ceilings) == len(self.categories) and keep:
            # the recall no ranking can beat: gold turns that some unit of the store grounds at all
            out["recall_ceiling"] = float(np.mean([self.ceilings[i] for i in keep]))
        out["n_questions"] = len(keep)
        return out


def evaluate_cases(cases: Iterable[Case], build_store: Callable[[Case], MemoryStore], encoder,
                   config: ActivationConfig, tokenizer=None, reranker=None, progress: bool = False) -> dict[str, Any]:
    """Run activation and the BM25 turn baseline over ``cases``; return the summary dict.

    ``build_store(case)`` is offline construction; ``tokenizer`` (optional) counts working-memory tokens;
    ``reranker`` is shared by all cases when given (model rerankers load once).
    """
    k = config.k
    ours, base = _Rows(), _Rows()
    latencies: list[float] = []
    index_ms: list[float] = []
    n_cases = n_units = skipped_no_evidence = 0
    build_s = 0.0
    encoder.encode(["warm-up query"])  # first-call setup is not query latency
    cases = list(cases)
    iterator: Iterable[Case] = cases
    if progress:
        from tqdm import tqdm

        iterator = tqdm(cases, desc="eval-retrieval", unit="case", file=sys.stderr)
    for case in iterator:
        qas = [qa for qa in case.qas if qa.evidence_turn_ids]
        skipped_no_evidence += len(case.qas) - len(qas)
        if not qas:
            continue
        t = time.perf_counter()
        store = build_store(case)
        build_s += time.perf_counter() - t
        n_cases += 1
        n_units += len(store)
        t = time.perf_counter()
        activator = Activator(store, encoder, config, reranker=reranker)
        index_ms.append((time.perf_counter() - t) * 1e3)
        grounded = {tid for u in store.units for tid in u.source_turn_ids}
        baseline = BM25TurnBaseline(case.dialogue, k1=config.bm25_k1, b=config.bm25_b)
        for qa in qas:
            t = time.perf_counter()
            wm = activator.activate(qa.question, qa.question_time or qa.meta.get("reference_time"))
            latencies.append((time.perf_counter() - t) * 1e3)
            entries = [u.source_turn_ids for u in wm.units]
            tokens = count_tokens(wm.text, tokenizer) if tokenizer is not None else None
            gold = set(qa.evidence_turn_ids)
            ours.add(qa.category, evidence_metrics(entries, gold, k), tokens, len(gold & grounded) / len(gold))
            b_entries = baseline.retrieve(qa.question, k)
            b_tokens = count_tokens(baseline.context(b_entries), tokenizer) if tokenizer is not None else None
            base.add(qa.category, evidence_metrics(b_entries, qa.evidence_turn_ids, k), b_tokens)
    lat = percentiles(latencies)
    summary: dict[str, Any] = ours.summary(k)
    summary.update({"latency_ms_p50": lat[50], "latency_ms_p95": lat[95], "n_questions": len(ours.metrics)})
    baseline_summary = base.summary(k)
    baseline_summary.pop("n_questions")
    summary["baseline_bm25_turns"] = baseline_summary
    per_category = {}
    for category in sorted(set(ours.categories)):
        row = ours.summary(k, lambda c, cat=category: c == cat)
        b_row = base.summary(k, lambda c, cat=category: c == cat)
        b_row.pop("n_questions")
        row["baseline_bm25_turns"] = b_row
        per_category[category] = row
    summary["per_category"] = per_category
    summary.update({
        "k": k, "n_cases": n_cases, "units_total": n_units,
        "units_per_case_mean": n_units / n_cases if n_cases else 0.0,
        "questions_without_evidence": skipped_no_evidence, "build_seconds": round(build_s, 3),
        "index_build_ms_mean": float(np.mean(index_ms)) if index_ms else 0.0,
        "reranker": config.reranker, "parser": config.parser,
        "encoder": getattr(encoder, "model_id", type(encoder).__name__),
    })
    return summary


def select_cases(cases: list[Case], limit: int | None = None, per_category: int | None = None) -> list[Case]:
    """The first ``per_category`` cases whose first question is of each category, then the first ``limit``."""
    if per_category is not None:
        taken: dict[str, int] = defaultdict(int)
        kept = []
        for case in cases:
            category = case.qas[0].category if case.qas else ""
            if taken[category] < per_category:
                taken[category] += 1
                kept.append(case)
        cases = kept
    return cases[:limit] if limit is not None else cases


#: flags also come from a --config YAML file, and --print_config shows them (jsonargparse)
CONFIG_FILE = True

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True, choices=DATASETS)
    parser.add_argument("--path", required=True, help="data file or folder")
    add_load_arguments(parser)
    parser.add_argument("--k", type=int, default=10, help="working-memory size and metric cutoff (default 10)")
    parser.add_argument("--pool-size", type=int, default=100, help="fused candidate pool n (default 100)")
    parser.add_argument("--limit", type=int, default=None, help="evaluate only the first N cases")
    parser.add_argument("--limit-per-category", type=int, default=None,
                        help="evaluate only the first N cases of each question category")
    parser.add_argument("--extractor", default="parser", choices=["parser", "heuristic", "llm"],
                        help="memory construction extractor (default parser: rules + spaCy parse, no LLM)")
    parser.add_argument("--reranker", default="embedding", choices=["embedding", "cross-encoder", "llm"])
    parser.add_argument("--reranker-path", default=None,
                        help="cross-encoder folder, or causal LM for --reranker llm (default: embedded SmolLM2)")
    parser.add_argument("--encoder", default=None, help="sentence encoder folder (default: embedded MiniLM)")
    parser.add_argument("--tokenizer", default="embedded:SmolLM2-135M-Instruct",
                        help="tokenizer that counts working-memory tokens ('none' to skip)")
    parser.add_argument("--superseded", default="attach", choices=["attach", "fold", "keep"],
                        help="superseded trace members: keep and attach the latest state (default), fold into it, or keep")
    parser.add_argument("--channels", default="lexical,semantic,attribute", help="comma-separated channel subset")
    parser.add_argument("--device", default=None, help="device for model rerankers (cpu, cuda)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch/FAISS CPU threads (1 avoids oversubscription on a busy machine)")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")


def _construction(args: argparse.Namespace, encoder) -> Callable[[Case], MemoryStore]:
    from qgmem.memory.builder import MemoryBuilder
    from qgmem.memory.config import ConstructionConfig

    if args.extractor == "llm":
        from qgmem.llm.backends import make_backend
        from qgmem.llm.base import LLMConfig

        builder = MemoryBuilder(ConstructionConfig(extractor="llm"), encoder, llm=make_backend(LLMConfig()))
    else:
        builder = MemoryBuilder(ConstructionConfig(extractor=args.extractor), encoder)
    return lambda case: builder.build(case.dialogue)


def _print_table(summary: dict[str, Any], k: int) -> None:
    head = f"{'category':<32}{'n':>5}  {'R@k':>6} {'nDCG':>6} {'P@k':>6}   | BM25 turns: {'R@k':>6} {'nDCG':>6} {'P@k':>6}"
    print(head.replace("@k", f"@{k}"))
    rows = list(summary["per_category"].items()) + [("all", summary)]
    for name, row in rows:
        b = row["baseline_bm25_turns"]
        print(f"{name:<32}{row['n_questions']:>5}  {row[f'recall@{k}']:6.3f} {row[f'ndcg@{k}']:6.3f} "
              f"{row[f'precision@{k}']:6.3f}   |             {b[f'recall@{k}']:6.3f} {b[f'ndcg@{k}']:6.3f} "
              f"{b[f'precision@{k}']:6.3f}")
    tokens = summary["context_tokens_mean"]
    b_tokens = summary["baseline_bm25_turns"]["context_tokens_mean"]
    if tokens is not None:
        print(f"working-memory tokens mean {tokens:.1f} (BM25 turns {b_tokens:.1f})")
    if "recall_ceiling" in summary:
        print(f"recall ceiling (gold turns grounded by any unit) {summary['recall_ceiling']:.3f}")
    print(f"activation latency p50 {summary['latency_ms_p50']:.1f} ms, p95 {summary['latency_ms_p95']:.1f} ms; "
          f"{summary['n_cases']} cases, {summary['units_total']} units, build {summary['build_seconds']:.1f} s")


def run(args: argparse.Namespace) -> int:
    from qgmem.data.loaders import load_cases
    from qgmem.embed import SentenceEncoder

    if args.threads:
        import faiss
        import torch

        torch.set_num_threads(args.threads)
        faiss.omp_set_num_threads(args.threads)
    loaded = load_cases(args.dataset, args.path, **load_arguments(args))
    if loaded.report.get("skipped"):
        print(f"skipped {loaded.report['skipped']} bad records (--lenient): "
              + "; ".join(loaded.report["skip_reasons"][:3]), file=sys.stderr)
    cases = select_cases(loaded.cases, args.limit, args.limit_per_category)
    with as_user_error(ValueError, prefix="bad option: "):
        config = ActivationConfig(k=args.k, pool_size=max(args.pool_size, args.k), reranker=args.reranker,
                                  reranker_path=args.reranker_path, superseded=args.superseded,
                                  channels=tuple(c.strip() for c in args.channels.split(",") if c.strip()))
    encoder = SentenceEncoder(args.encoder)
    tokenizer = None
    if args.tokenizer and args.tokenizer.lower() != "none":
        from qgmem.lm import load_tokenizer

        tokenizer = load_tokenizer(args.tokenizer)
    reranker = None
    if config.reranker != "embedding":  # model rerankers load once for all stores
        reranker = make_reranker(config.reranker, embeddings=np.zeros((0, encoder.dim), np.float32),
                                 path=config.reranker_path, batch_size=config.reranker_batch_size,
                                 max_doc_tokens=config.reranker_max_doc_tokens, device=args.device)
    summary = evaluate_cases(cases, _construction(args, encoder), encoder, config, tokenizer, reranker,
                             progress=not args.json)
    summary["dataset"] = args.dataset
    summary["load_skipped"] = loaded.report.get("skipped", 0)
    summary["tokenizer"] = args.tokenizer if tokenizer is not None else None
    _print_table(summary, config.k)
    if args.json:
        print(json.dumps(summary))
    return 0
