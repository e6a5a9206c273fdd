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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from qgmem.activation.config import RERANKERS, SPEAKER_NAME_MODES, ActivationConfig
from qgmem.data.loaders import DATASETS, add_load_arguments, load_arguments
from qgmem.errors import as_user_error
from qgmem.lm import EMBEDDED_LM
from qgmem.memory.config import EXTRACTORS, ConstructionConfig
from qgmem.older_records import RETRIEVAL_EVAL_FLAGS
from qgmem.settings_flags import add_retired_arguments, add_settings_arguments, settings_from_args

if TYPE_CHECKING:
    from qgmem.activation.activator import Activator
    from qgmem.data.records import Case
    from qgmem.memory.store import MemoryStore


#: cutoffs of the recall-depth diagnostic: beyond ``k`` they read the rest of the reranked pool
RECALL_DEPTHS = (5, 10, 20, 30)


@dataclass
class _Rows:
    """Per-question results of one system, kept by category."""

    metrics: list[dict[str, float]] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    categories: list[str] = field(default_factory=list)
    ceilings: list[float] = field(default_factory=list)
    depths: list[dict[int, float]] = field(default_factory=list)  # recall at each RECALL_DEPTHS cutoff
    pools: list[dict[str, float]] = field(default_factory=list)  # pool recall per channel and fused

    def add(self, category: str, metrics: dict[str, float], tokens: int | None, ceiling: float | None = None,
            depths: dict[int, float] | None = None, pools: dict[str, float] | None = None) -> None:
        self.categories.append(category)
        self.metrics.append(metrics)
        if tokens is not None:
            self.tokens.append(tokens)
        if ceiling is not None:
            self.ceilings.append(ceiling)
        if depths is not None:
            self.depths.append(depths)
        if pools is not None:
            self.pools.append(pools)

    def summary(self, k: int, where: Callable[[str], bool] = lambda c: True) -> dict[str, Any]:
        import numpy as np

        from qgmem.evaluation.metrics import mean_metrics

        keep = [i for i, c in enumerate(self.categories) if where(c)]
        out: dict[str, Any] = mean_metrics([self.metrics[i] for i in keep], k)
        tokens = [self.tokens[i] for i in keep] if len(self.tokens) == len(self.categories) else []
        out["context_tokens_mean"] = float(np.mean(tokens)) if tokens else None
        if len(self.ceilings) == len(self.categories) and keep:
            # the recall no ranking can beat: gold turns that some unit of the store grounds at all
            out["recall_ceiling"] = float(np.mean([self.ceilings[i] for i in keep]))
        if len(self.depths) == len(self.categories) and keep:
            for depth in RECALL_DEPTHS:
                out.setdefault(f"recall@{depth}", float(np.mean([self.depths[i][depth] for i in keep])))
        if len(self.pools) == len(self.categories) and keep:
            names = list(dict.fromkeys(name for i in keep for name in self.pools[i]))
            out["pool_recall"] = {name: float(np.mean([self.pools[i].get(name, 0.0) for i in keep]))
                                  for name in names}
        out["n_questions"] = len(keep)
        return out


def _depth_recalls(entries: list[list[str]], gold: set[str]) -> dict[int, float]:
    from qgmem.evaluation.metrics import covered_recall

    return {depth: covered_recall(entries[:depth], gold) for depth in RECALL_DEPTHS}


def pool_recalls(activator: Activator, gold: set[str]) -> dict[str, float]:
    """Recall of the latest activation's candidates before reranking: each channel's top ``pool_size``
    list on its own, and the fused pool (``fused``). Low fused recall means fusion or the channels lose
    the evidence; high fused but low Recall@k means the reranker does."""
    from qgmem.evaluation.metrics import covered_recall

    units = activator.store.units
    n = activator.config.pool_size
    out = {name: covered_recall([units[i].source_turn_ids for i, _ in hits[:n]], gold)
           for name, hits in activator.last_hits.items()}
    out["fused"] = covered_recall([c.unit.source_turn_ids for c in activator.last_pool], gold)
    return out


def question_record(case: Case, qa, activator: Activator, k: int, gold: set[str], grounded: set[str],
                    pools: dict[str, float], baselines: dict[str, list[list[str]]]) -> dict[str, Any]:
    """One line of ``--out``: gold turns, the activated units with their source turns, and where each
    gold turn ranks in the reranked pool and in each baseline's list (None: not retrieved)."""
    from qgmem.evaluation.metrics import evidence_metrics, gold_ranks

    ranking = activator.last_ranking
    entries = [c.unit.source_turn_ids for c, _ in ranking]
    return {
        "case_id": case.id, "question_id": qa.id, "category": qa.category, "question": qa.question,
        "gold_turn_ids": sorted(gold), "ungrounded_gold_turn_ids": sorted(gold - grounded),
        "activated": [{"unit_id": c.unit.id, "source_turn_ids": list(c.unit.source_turn_ids),
                       "speaker": c.unit.speaker, "fact": c.unit.fact, "score": round(score, 6)}
                      for c, score in ranking[:k]],
        "gold_rank": gold_ranks(entries, gold),
        **{f"recall@{depth}": r for depth, r in _depth_recalls(entries, gold).items()},
        **{f"{name}@{k}": value for name, value in evidence_metrics(entries[:k], gold, k).items() if name != "recall"},
        "pool_size": len(activator.last_pool), "pool_recall": pools,
        **{f"gold_rank_{name}": gold_ranks(b_entries, gold) for name, b_entries in baselines.items()},
    }


def evaluate_cases(cases: Iterable[Case], build_store: Callable[[Case], MemoryStore], encoder,
                   config: ActivationConfig, tokenizer=None, reranker=None, progress: bool = False,
                   out: str | Path | None = None, dense_baseline: bool = True) -> dict[str, Any]:
    """Run activation and the BM25 (and dense) turn baselines over ``cases``; return the summary dict.

    ``build_store(case)`` is offline construction; ``tokenizer`` (optional) counts working-memory tokens;
    ``reranker`` is shared by all cases when given (model rerankers load once); ``out`` names a JSONL
    file that gets one :func:`question_record` per question.
    """
    import numpy as np

    from qgmem.activation.activator import Activator
    from qgmem.activation.serialize import count_tokens
    from qgmem.evaluation.baselines import BM25TurnBaseline, DenseTurnBaseline
    from qgmem.evaluation.metrics import evidence_metrics, percentiles

    k = config.k
    depth = max(k, *RECALL_DEPTHS)
    ours = _Rows()
    bases = {"bm25_turns": _Rows(), **({"dense_turns": _Rows()} if dense_baseline else {})}
    latencies: list[float] = []
    index_ms: list[float] = []
    n_cases = n_units = skipped_no_evidence = 0
    build_s = 0.0
    encoder.encode(["warm-up query"])  # first-call setup is not query latency
    work = [(case, [qa for qa in case.qas if qa.evidence_turn_ids]) for case in cases]
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=sum(len(qas) for _, qas in work), desc="eval-retrieval", unit="question",
                   file=sys.stderr)
    sink = None
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        sink = open(out, "w", encoding="utf-8")
    try:
        for n_done, (case, qas) in enumerate(work, start=1):
            if bar is not None:
                bar.set_postfix_str(f"dialogue {n_done}/{len(work)}")
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
            bm25 = BM25TurnBaseline(case.dialogue, k1=config.bm25_k1, b=config.bm25_b)
            dense = DenseTurnBaseline(case.dialogue, encoder) if dense_baseline else None
            for qa in qas:
                t = time.perf_counter()
                wm = activator.activate(qa.question, qa.question_time or qa.meta.get("reference_time"))
                latencies.append((time.perf_counter() - t) * 1e3)
                gold = set(qa.evidence_turn_ids)
                entries = [c.unit.source_turn_ids for c, _ in activator.last_ranking]
                tokens = count_tokens(wm.text, tokenizer) if tokenizer is not None else None
                pools = pool_recalls(activator, gold)
                ours.add(qa.category, evidence_metrics(entries[:k], gold, k), tokens, len(gold & grounded) / len(gold),
                         _depth_recalls(entries, gold), pools)
                retrieved = {"bm25_turns": bm25.retrieve(qa.question, depth)}
                if dense is not None:
                    retrieved["dense_turns"] = dense.retrieve(qa.question, depth, activator.last_question_vec)
                for name, b_entries in retrieved.items():
                    b_tokens = (count_tokens(bm25.context(b_entries[:k]), tokenizer) if tokenizer is not None
                                else None)
                    bases[name].add(qa.category, evidence_metrics(b_entries[:k], gold, k), b_tokens,
                                    depths=_depth_recalls(b_entries, gold))
                if sink is not None:
                    record = question_record(case, qa, activator, k, gold, grounded, pools, retrieved)
                    sink.write(json.dumps(record) + "\n")
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        if sink is not None:
            sink.close()
    lat = percentiles(latencies)
    summary: dict[str, Any] = ours.summary(k)
    summary.update({"latency_ms_p50": lat[50], "latency_ms_p95": lat[95], "n_questions": len(ours.metrics)})

    def baseline_rows(where: Callable[[str], bool] = lambda c: True) -> dict[str, Any]:
        rows = {}
        for name, rows_of in bases.items():
            row = rows_of.summary(k, where)
            row.pop("n_questions")
            rows[f"baseline_{name}"] = row
        return rows

    summary.update(baseline_rows())
    per_category = {}
    for category in sorted(set(ours.categories)):
        row = ours.summary(k, lambda c, cat=category: c == cat)
        row.update(baseline_rows(lambda c, cat=category: c == cat))
        per_category[category] = row
    summary["per_category"] = per_category
    summary.update({
        "k": k, "pool_size": config.pool_size, "n_cases": n_cases, "units_total": n_units,
        "units_per_case_mean": n_units / n_cases if n_cases else 0.0,
        "questions_without_evidence": skipped_no_evidence, "build_seconds": round(build_s, 3),
        "index_build_ms_mean": float(np.mean(index_ms)) if index_ms else 0.0,
        "reranker": config.reranker, "parser": config.parser,
        "encoder": getattr(encoder, "model_id", type(encoder).__name__),
        "activation": config.to_dict(),
    })
    return summary


@dataclass
class RetrievalEvalSettings:
    """What ``qgmem eval-retrieval`` runs with; one field per flag (beside ``--strict``/``--lenient``, ``--max-turn-chars``)."""

    dataset: Literal[DATASETS]  #: the data set's form
    path: str  #: data file or folder
    k: int = ActivationConfig.k  #: working-memory size and metric cutoff
    reranker: Literal[RERANKERS] = ActivationConfig.reranker  #: what orders the fused pool (docs/activation.md)
    reranker_path: str | None = None  #: cross-encoder folder, or causal LM for --reranker llm (default: embedded SmolLM2)
    #: model rerankers score only the top N of the embedding reranker's order (0: the whole pool)
    rerank_depth: int = ActivationConfig.rerank_depth
    #: a model reranker's share of the score beside the embedding reranker's: (1 - W) * embedding + W * model
    model_weight: float = ActivationConfig.model_weight
    #: comma-separated subset of lexical,semantic,attribute,source
    channels: str = ",".join(ActivationConfig.channels)
    #: embedding reranker: weight of the question's cosine with each unit's source turn
    source_weight: float = ActivationConfig.source_weight
    #: turn diversity: units whose source turns already have this many units above them move down (0: off)
    max_units_per_turn: int = ActivationConfig.max_units_per_turn
    #: what the dense query does with the dialogue's speaker names in a question: drop them, or keep them (the paper's activation)
    dense_speaker_names: Literal[SPEAKER_NAME_MODES] = ActivationConfig.dense_speaker_names
    #: ConvoMem in the LoCoMo form: name its two speakers (USER,ASSISTANT) and ask every question in the third person (docs/activation.md); applied before --swap-speakers
    name_speakers: str | None = None
    #: an adversarial probe: ask each question that names one of its dialogue's two speakers with the other's name, gold turns kept (docs/activation.md)
    swap_speakers: bool = False
    extractor: Literal[EXTRACTORS] = ConstructionConfig.extractor  #: memory construction extractor (parser: rules + spaCy parse, no LLM)
    encoder: str | None = None  #: sentence encoder folder (default: embedded MiniLM)
    tokenizer: str = EMBEDDED_LM  #: tokenizer that counts working-memory tokens ('none' to skip)
    no_dense_baseline: bool = False  #: skip the dense-over-turns baseline (it embeds every turn of every case)
    limit: int | None = None  #: evaluate only the first N cases
    out: str | None = None  #: write one JSON line per question: gold turns, activated units, gold-turn ranks
    threads: int | None = None  #: torch/FAISS CPU threads (1 avoids oversubscription on a busy machine)
    json: bool = False  #: print one JSON object as the last line

    def activation(self) -> ActivationConfig:
        """The activation these settings ask for (the pool grows to ``k`` when ``k`` is larger)."""
        return ActivationConfig(k=self.k, pool_size=max(ActivationConfig.pool_size, self.k), reranker=self.reranker,
                                reranker_path=self.reranker_path, rerank_depth=self.rerank_depth,
                                model_weight=self.model_weight, source_weight=self.source_weight,
                                max_units_per_turn=self.max_units_per_turn,
                                dense_speaker_names=self.dense_speaker_names,
                                channels=tuple(c.strip() for c in self.channels.split(",") if c.strip()))




def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_settings_arguments(parser, RetrievalEvalSettings)
    add_load_arguments(parser)
    add_retired_arguments(parser, RETRIEVAL_EVAL_FLAGS)


def _construction(extractor: str, encoder) -> Callable[[Case], MemoryStore]:
    from qgmem.memory.builder import MemoryBuilder

    if extractor == "llm":
        from qgmem.llm.backends import make_backend
        from qgmem.llm.base import LLMConfig

        builder = MemoryBuilder(ConstructionConfig(extractor="llm"), encoder, llm=make_backend(LLMConfig()))
    else:
        builder = MemoryBuilder(ConstructionConfig(extractor=extractor), encoder)
    return lambda case: builder.build(case.dialogue)


def _print_table(summary: dict[str, Any], k: int) -> None:
    names = [name for name in ("baseline_bm25_turns", "baseline_dense_turns") if name in summary]
    head = f"{'category':<32}{'n':>5}  {'R@k':>6} {'nDCG':>6} {'P@k':>6} {'pool':>6}"
    for name in names:
        head += f"   | {name[len('baseline_'):]}: {'R@k':>6} {'nDCG':>6}"
    print(head.replace("@k", f"@{k}"))
    rows = list(summary["per_category"].items()) + [("all", summary)]
    for name, row in rows:
        line = (f"{name:<32}{row['n_questions']:>5}  {row[f'recall@{k}']:6.3f} {row[f'ndcg@{k}']:6.3f} "
                f"{row[f'precision@{k}']:6.3f} {row.get('pool_recall', {}).get('fused', 0.0):6.3f}")
        for b in names:
            line += f"   | {' ' * (len(b) - len('baseline_') + 1)} {row[b][f'recall@{k}']:6.3f} {row[b][f'ndcg@{k}']:6.3f}"
        print(line)
    depths = " ".join(f"@{d} {summary[f'recall@{d}']:.3f}" for d in RECALL_DEPTHS if f"recall@{d}" in summary)
    print(f"recall {depths}")
    for b in names:
        row = summary[b]
        print(f"  {b[len('baseline_'):]}: " + " ".join(f"@{d} {row[f'recall@{d}']:.3f}" for d in RECALL_DEPTHS
                                                       if f"recall@{d}" in row))
    if "pool_recall" in summary:
        print(f"pool recall (n = {summary['pool_size']}, before reranking): "
              + ", ".join(f"{name} {value:.3f}" for name, value in summary["pool_recall"].items()))
    tokens = summary["context_tokens_mean"]
    b_tokens = summary["baseline_bm25_turns"]["context_tokens_mean"]
    if tokens is not None:
        print(f"working-memory tokens mean {tokens:.1f} (BM25 turns {b_tokens:.1f})")
    if "recall_ceiling" in summary:
        print(f"recall ceiling (gold turns grounded by any unit) {summary['recall_ceiling']:.3f}")
    print(f"activation latency p50 {summary['latency_ms_p50']:.1f} ms, p95 {summary['latency_ms_p95']:.1f} ms; "
          f"{summary['n_cases']} cases, {summary['units_total']} units, build {summary['build_seconds']:.1f} s")


def run(args: argparse.Namespace) -> int:
    from qgmem.activation.rerank import shared_reranker
    from qgmem.data.loaders import load_cases
    from qgmem.embed import SentenceEncoder

    settings = settings_from_args(RetrievalEvalSettings, args)
    if settings.threads:
        import faiss
        import torch

        torch.set_num_threads(settings.threads)
        faiss.omp_set_num_threads(settings.threads)
    loaded = load_cases(settings.dataset, settings.path, **load_arguments(args))
    if loaded.report.get("skipped"):
        print(f"skipped {loaded.report['skipped']} bad records (--lenient): "
              + "; ".join(loaded.report["skip_reasons"][:3]), file=sys.stderr)
    cases = loaded.cases[:settings.limit] if settings.limit is not None else loaded.cases
    named = None
    if settings.name_speakers is not None:
        from qgmem.evaluation.named_form import cases_from_flag

        cases, named = cases_from_flag(cases, settings.name_speakers)
    swapped = None
    if settings.swap_speakers:
        from qgmem.evaluation.adversarial import swapped_speaker_cases

        cases, left_out = swapped_speaker_cases(cases)
        swapped = {"questions": sum(len(c.qas) for c in cases), "left_out": left_out}
        print(f"--swap-speakers: {swapped['questions']} questions asked with the other speaker's name; "
              f"{left_out} left out (they name neither of two speakers, or both)", file=sys.stderr)
    with as_user_error(ValueError, prefix="bad option: "):
        config = settings.activation()
    encoder = SentenceEncoder(settings.encoder)
    tokenizer = None
    if settings.tokenizer and settings.tokenizer.lower() != "none":
        from qgmem.lm import load_tokenizer

        tokenizer = load_tokenizer(settings.tokenizer)
    reranker = shared_reranker(config)  # a model reranker loads once for all stores
    summary = evaluate_cases(cases, _construction(settings.extractor, encoder), encoder, config, tokenizer, reranker,
                             progress=True, out=settings.out, dense_baseline=not settings.no_dense_baseline)
    summary["dataset"] = settings.dataset
    summary["named_speakers"] = named
    summary["swapped_speakers"] = swapped
    summary["load_skipped"] = loaded.report.get("skipped", 0)
    summary["tokenizer"] = settings.tokenizer if tokenizer is not None else None
    _print_table(summary, config.k)
    if settings.json:
        print(json.dumps(summary))
    return 0
