"""Each activation mechanism and reranker against the embedded default, side by side in one run.

Sets: ConvoMem's validation split (the whole-data split that ``qgmem train-reranker`` also uses, so no
trained reranker saw these cases), reported as two slices (the first 10 validation cases of each
category and the next 10, like the earlier per-category slices) and together; the LoCoMo-form
fixtures ``tests/fixtures/locomo_small.json`` and ``tests/activation/fixtures/locomo_form.json``.
``convomem_long`` is a long-history stress set built from the same validation cases: they are taken
round-robin over the categories and concatenated in groups of ``--long-group`` (4: about 1,150 turns and
1,200 units per store, against ~300 for one case), each case's sessions one after another, every
question asked of the whole group's store. ``convomem_named_long`` is the same set in the LoCoMo form
(``qgmem.evaluation.named_form``: the speakers named, the questions in the third person), and
``convomem_named_long_swapped`` asks its questions that name one speaker with the other's name, on the
same stores. Every store is built once (parser extractor, MiniLM) and shared by all variants, so only activation
differs; activation uses an encoder without a memo, so each variant pays for its question encodings. Per set and variant: fused-pool recall, Recall@10, nDCG@10, working-memory tokens, p50
activation latency, per-category Recall@10, and a paired bootstrap interval of each variant's R@10
difference from the default (1000 resamples of the questions).

    python -m bench.activation.activation_mechanisms [--variants default expansion3 ...] [--trained [LABEL=]DIR ...]

Each trained variant runs once per ``--trained`` model; with more than one it is reported as
``<variant>[<LABEL>]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from bench.common import REPO as ROOT, MemoEncoder, paired_interval

#: name -> ActivationConfig overrides against the default (reranker variants need --trained / --llm)
VARIANTS: dict[str, dict] = {
    "default": {},
    # the paper's activation: its three channels, no source-turn term, no turn diversity, names kept
    "paper": {"channels": ("lexical", "semantic", "attribute"), "source_weight": 0.0, "max_units_per_turn": 0,
              "dense_speaker_names": "keep"},
    "source_w0.3": {"source_weight": 0.3},
    "source_w0.7": {"source_weight": 0.7},
    "per_turn2": {"max_units_per_turn": 2},
    "pool200": {"pool_size": 200, "channel_depth": 200},
    "names_keep": {"dense_speaker_names": "keep"},
    "trained@20": {"reranker": "trained", "rerank_depth": 20},
    "trained@100": {"reranker": "trained", "rerank_depth": 0},
    # the model's score beside the first stage's (``model_weight``); 0.25 is the validated share
    "trained_mix0.25@20": {"reranker": "trained", "rerank_depth": 20, "model_weight": 0.25},
    "trained_mix0.5@20": {"reranker": "trained", "rerank_depth": 20, "model_weight": 0.5},
    "trained_mix0.75@20": {"reranker": "trained", "rerank_depth": 20, "model_weight": 0.75},
    "llm@20": {"reranker": "llm", "rerank_depth": 20},
}
#: the embedding reranker's blend (cosine weight w, BM25 weight λ; default w 0.3, λ 0.2), a grid to tune on validation
VARIANTS.update({f"blend_w{w}_l{lam}": {"embedding_weight": w, "lexical_weight": lam}
                 for w in (0.1, 0.3, 0.5, 0.7, 1.0) for lam in (0.0, 0.2, 0.4, 0.8) if (w, lam) != (0.3, 0.2)})
#: ``convomem_long`` in the LoCoMo form (``qgmem.evaluation.named_form``), and its swapped-speaker probe
NAMED_SETS = ("convomem_named_long", "convomem_named_long_swapped")
FIXTURES = {
    "locomo_small": ROOT / "tests" / "fixtures" / "locomo_small.json",
    "locomo_form": ROOT / "tests" / "activation" / "fixtures" / "locomo_form.json",
}


def concatenated_cases(cases, size: int):
    """Cases taken round-robin over their categories and joined ``size`` at a time into one long dialogue.

    Turn, session and evidence ids get the case's position in its group as a prefix, so they stay unique;
    every question keeps its own gold turns and is asked of the whole group's store.
    """
    from qgmem.data.records import QA, Case, Dialogue, Session, Turn

    queues: dict[str, list] = defaultdict(list)
    for case in cases:
        queues[case.qas[0].category if case.qas else ""].append(case)
    order = []
    while any(queues.values()):
        for category in list(queues):
            if queues[category]:
                order.append(queues[category].pop(0))
    groups = []
    for start in range(0, len(order), size):
        members = order[start:start + size]
        sessions, qas = [], []
        for j, case in enumerate(members):
            for session in case.dialogue.sessions:
                sessions.append(Session(id=f"g{j}/{session.id}", time=session.time, meta=dict(session.meta),
                                        turns=[Turn(id=f"g{j}/{t.id}", session_id=f"g{j}/{t.session_id}",
                                                    speaker=t.speaker, role=t.role, text=t.text, time=t.time)
                                               for t in session.turns]))
            qas += [QA(id=q.id, question=q.question, answer=q.answer, category=q.category,
                       evidence_turn_ids=[f"g{j}/{e}" for e in q.evidence_turn_ids],
                       question_time=q.question_time, meta=dict(q.meta)) for q in case.qas]
        dialogue = Dialogue(id=f"long{start // size}", sessions=sessions)
        dialogue.reindex()
        groups.append(Case(id=f"convomem_long/{start // size}", dialogue=dialogue, qas=qas,
                           source={"dataset": "convomem", "members": [c.id for c in members]}))
    return groups


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", default=["default", "paper"],
                        choices=list(VARIANTS), metavar="VARIANT",
                        help="activation variants (names in VARIANTS at the top of this file)")
    parser.add_argument("--sets", nargs="+", default=["convomem_val1", "convomem_val2", *FIXTURES],
                        choices=["convomem_val1", "convomem_val2", "convomem_long", *FIXTURES,
                                 "locomo_form_swapped", *NAMED_SETS])
    parser.add_argument("--long-group", type=int, default=4,
                        help="validation cases joined into one dialogue in the convomem_long set")
    parser.add_argument("--store-dir", default=None,
                        help="keep built stores here (one folder per case) and reuse them in later runs")
    parser.add_argument("--trained", nargs="+", default=[], metavar="[LABEL=]DIR",
                        help="folders of `qgmem train-reranker` models (each trained variant runs on each)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-dense-baseline", action="store_true",
                        help="skip the dense-over-turns baseline (it embeds every turn; an earlier run has it)")
    parser.add_argument("--json-out", default=None, help="also write the results JSON here")
    parser.add_argument("--per-question-dir", default=None,
                        help="keep the per-question files here (<set>.<variant>.jsonl; read them with "
                             "bench/activation/per_question.py); default: a temporary folder")
    args = parser.parse_args()

    import faiss
    import torch

    torch.set_num_threads(args.threads)
    faiss.omp_set_num_threads(args.threads)
    from qgmem.evaluation.adversarial import swapped_speaker_cases
    from qgmem.evaluation.named_form import named_speaker_cases
    from qgmem.activation.config import ActivationConfig
    from qgmem.evaluation.retrieval import evaluate_cases
    from qgmem.activation.rerank import make_reranker
    from qgmem.reranker_training import convomem_splits
    from qgmem.data.loaders import load_cases
    from qgmem.embed import SentenceEncoder
    from qgmem.lm import EMBEDDED_LM, load_tokenizer
    from qgmem.memory.builder import MemoryBuilder
    from qgmem.memory.config import ConstructionConfig

    encoder = MemoEncoder(SentenceEncoder())  # construction: each fact embedded once for all sets
    # activation: no memo, so every variant pays the question encoding (latency is comparable)
    query_encoder = SentenceEncoder(max_cache_entries=0)
    tokenizer = load_tokenizer(EMBEDDED_LM)
    builder = MemoryBuilder(ConstructionConfig(), encoder)
    shared = {}  # model rerankers load once
    trained = {}  # label -> folder
    for item in args.trained:
        label, _, folder = item.rpartition("=")
        trained[label or Path(folder).name] = folder
    if any(VARIANTS[v].get("reranker") == "trained" for v in args.variants):
        if not trained:
            parser.error("trained variants need --trained DIR")
        for label, folder in trained.items():
            shared[f"trained/{label}"] = make_reranker("trained", embeddings=np.zeros((0, encoder.dim), np.float32),
                                                       path=folder)
    # the runs: (variant name as reported, activation variant, trained model label or None)
    runs = []
    for activation in args.variants:
        if VARIANTS[activation].get("reranker") == "trained":
            runs += [(activation if len(trained) == 1 else f"{activation}[{label}]", activation, label)
                     for label in trained]
        else:
            runs.append((activation, activation, None))
    if any(VARIANTS[v].get("reranker") == "llm" for v in args.variants):
        shared["llm"] = make_reranker("llm", embeddings=np.zeros((0, encoder.dim), np.float32))

    sets = {}
    loaded = {}

    def val_split():
        if "val" not in loaded:
            loaded["val"] = convomem_splits(list(load_cases("convomem", ROOT / "data" / "convomem").cases))["val"]
        return loaded["val"]

    for name in args.sets:
        if name in ("convomem_val1", "convomem_val2", "convomem_long"):
            val = val_split()
            if name == "convomem_long":
                sets[name] = concatenated_cases(val, args.long_group)
            else:
                sets[name] = per_category_slice(val, 0, 10) if name.endswith("1") else per_category_slice(val, 10, 10)
        elif name in NAMED_SETS:  # convomem_long in the LoCoMo form; the swapped set asks its questions of the other
            sets[name] = named_speaker_cases(concatenated_cases(val_split(), args.long_group))
            if name.endswith("_swapped"):
                sets[name], left_out = swapped_speaker_cases(sets[name])
                print(f"{name}: {sum(len(c.qas) for c in sets[name])} questions; {left_out} left out "
                      "(they name neither speaker, or both)", file=sys.stderr)
        elif name == "locomo_form_swapped":  # the form fixture's stores, its questions with the speakers swapped
            sets[name], left_out = swapped_speaker_cases(load_cases("locomo", FIXTURES["locomo_form"]).cases)
            print(f"swapped-speaker set: {sum(len(c.qas) for c in sets[name])} questions; {left_out} left out "
                  "(they name neither speaker, or both)", file=sys.stderr)
        else:
            sets[name] = list(load_cases("locomo", FIXTURES[name]).cases)

    built = {}  # (store folder, case id) -> store: a swapped set shares its set's stores

    def build(set_name: str, case):
        set_folder = set_name.removesuffix("_swapped")  # a swapped set asks its questions of its set's stores
        if set_folder.endswith("_long"):
            set_folder += str(args.long_group)
        key = (set_folder, case.id)
        if key in built:
            return built[key]
        if args.store_dir is None:
            built[key] = builder.build(case.dialogue)
            return built[key]
        from qgmem.memory.store import MemoryStore

        folder = Path(args.store_dir) / set_folder / "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in case.id)
        if (folder / "meta.json").is_file():
            built[key] = MemoryStore.load(folder, expected_meta=builder.expected_meta())
            return built[key]
        store = builder.build(case.dialogue)
        store.save(folder)
        built[key] = store
        return store

    results: dict[str, dict[str, dict]] = {}
    per_question: dict[str, dict[str, dict[str, dict]]] = {}
    scratch = Path(args.per_question_dir or tempfile.mkdtemp(prefix="activation-mechanisms-"))
    scratch.mkdir(parents=True, exist_ok=True)
    print(f"per-question files: {scratch}", file=sys.stderr)
    for set_name, cases in sets.items():
        results[set_name], per_question[set_name] = {}, {}
        started = time.perf_counter()
        stores = {}
        for i, case in enumerate(cases, 1):
            stores[case.id] = build(set_name, case)
            print(f"[{set_name}] store {i}/{len(cases)}: {len(stores[case.id].units)} units "
                  f"({time.perf_counter() - started:.0f} s)", file=sys.stderr)
        print(f"[{set_name}] {len(cases)} cases, stores built in {time.perf_counter() - started:.0f} s",
              file=sys.stderr)
        for variant, activation, label in runs:
            overrides = dict(VARIANTS[activation])
            kind = overrides.get("reranker")
            if kind == "trained":
                overrides["reranker_path"] = trained[label]
                kind = f"trained/{label}"
            config = ActivationConfig(**overrides)
            out = scratch / f"{set_name}.{variant}.jsonl"
            started = time.perf_counter()
            summary = evaluate_cases(cases, lambda case: stores[case.id], query_encoder, config, tokenizer,
                                     reranker=shared.get(kind), out=out, dense_baseline=variant == "default" and not args.no_dense_baseline)
            summary["wall_s"] = round(time.perf_counter() - started, 1)
            results[set_name][variant] = summary
            per_question[set_name][variant] = {
                (r := json.loads(line))["question_id"]: r for line in out.read_text().splitlines()}
            print(f"[{set_name}] {variant}: pool {summary['pool_recall']['fused']:.3f} R@10 {summary['recall@10']:.3f} "
                  f"nDCG@10 {summary['ndcg@10']:.3f} tokens {summary['context_tokens_mean']:.0f} "
                  f"p50 {summary['latency_ms_p50']:.1f} ms ({summary['wall_s']} s)", file=sys.stderr)

    for set_name, by_variant in results.items():
        default = per_question[set_name].get("default")
        first = next(iter(by_variant.values()))
        print(f"\n#### {set_name} ({first['n_questions']} questions, {first['units_per_case_mean']:.0f} units per store)")
        print("| variant | ceiling | pool recall (n = 100) | R@10 | nDCG@10 | R@30 | tokens | p50 ms | "
              "ΔR@10 vs default [95 % CI] |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for variant, s in by_variant.items():
            delta = ""
            if default is not None and variant != "default":
                ids = list(default)
                mean, lo, hi = paired_interval([default[i]["recall@10"] for i in ids],
                                               [per_question[set_name][variant][i]["recall@10"] for i in ids])
                delta = f"{mean:+.3f} [{lo:+.3f}, {hi:+.3f}]"
            print(f"| {variant} | {s.get('recall_ceiling', float('nan')):.3f} | {s['pool_recall']['fused']:.3f} | {s['recall@10']:.3f} | {s['ndcg@10']:.3f} | "
                  f"{s['recall@30']:.3f} | {s['context_tokens_mean']:.0f} | {s['latency_ms_p50']:.1f} | {delta} |")
        if "default" in by_variant:
            s = by_variant["default"]
            for b in ("baseline_bm25_turns", "baseline_dense_turns"):
                if b not in s:
                    continue
                print(f"| {b[len('baseline_'):]} | | | {s[b]['recall@10']:.3f} | {s[b]['ndcg@10']:.3f} | "
                      f"{s[b]['recall@30']:.3f} | {s[b]['context_tokens_mean']:.0f} | | |")
        categories = list(first["per_category"])
        print("\n| variant | " + " | ".join(f"{c} (n {first['per_category'][c]['n_questions']})" for c in categories)
              + " |")
        print("|" + " --- |" * (1 + len(categories)))
        for variant, s in by_variant.items():
            print(f"| {variant} R@10 | " + " | ".join(f"{s['per_category'][c]['recall@10']:.3f}" for c in categories)
                  + " |")
        if "default" in by_variant:
            s = by_variant["default"]
            for b in ("baseline_bm25_turns", "baseline_dense_turns"):
                if b not in s:
                    continue
                print(f"| {b[len('baseline_'):]} R@10 | "
                      + " | ".join(f"{s['per_category'][c][b]['recall@10']:.3f}" for c in categories) + " |")
    slices = [name for name in ("convomem_val1", "convomem_val2") if name in per_question]
    if len(slices) == 2 and "default" in per_question[slices[0]]:
        print("\n#### ConvoMem validation, both slices pooled")
        print("| variant | n | R@10 | nDCG@10 | ΔR@10 vs default [95 % CI] | ΔnDCG@10 vs default [95 % CI] |")
        print("| --- | --- | --- | --- | --- | --- |")
        for variant in results[slices[0]]:
            rows = {metric: ([], []) for metric in ("recall@10", "ndcg@10")}
            for name in slices:
                default = per_question[name]["default"]
                for qid, record in default.items():
                    other = per_question[name][variant][qid]
                    for metric, (a, b) in rows.items():
                        a.append(record[metric])
                        b.append(other[metric])
            (ra, rb), (na, nb) = rows["recall@10"], rows["ndcg@10"]
            dr, dn = paired_interval(ra, rb), paired_interval(na, nb)
            print(f"| {variant} | {len(rb)} | {np.mean(rb):.3f} | {np.mean(nb):.3f} | "
                  f"{dr[0]:+.3f} [{dr[1]:+.3f}, {dr[2]:+.3f}] | {dn[0]:+.3f} [{dn[1]:+.3f}, {dn[2]:+.3f}] |")
        for b in ("baseline_bm25_turns", "baseline_dense_turns"):  # question-weighted over the slices
            rows = [results[name]["default"] for name in slices]
            if any(b not in r for r in rows):
                continue
            n = sum(r["n_questions"] for r in rows)
            mean = {m: sum(r[b][m] * r["n_questions"] for r in rows) / n for m in ("recall@10", "ndcg@10")}
            print(f"| {b[len('baseline_'):]} | {n} | {mean['recall@10']:.3f} | {mean['ndcg@10']:.3f} | | |")
    payload = json.dumps(results)
    if args.json_out:
        Path(args.json_out).write_text(payload)
    print(payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
