"""Activation latency against store size: each channel, fusion + reranking, and the whole path.

Synthetic stores of templated units (names, places, dates drawn from fixed vocabularies, so BM25
postings and attribute matches look like real ones); unit embeddings (facts and source turns) are
random unit vectors because encoding 100k facts would dominate the run, while questions and attribute
names go through the real sentence encoder. No model reranker (the embedding reranker, the default). Prints one table and, with
``--json``, one JSON object as the last line.

    python -m bench.activation.activation --sizes 1000 10000 100000 --queries 200 --threads 1
"""

from __future__ import annotations

import argparse
import json
import random
import time

import numpy as np

NAMES = ["Alex", "Priya", "Daniel", "Caroline", "Melanie", "Jon", "Gina", "Omar", "Helena", "Arjun", "Sarah",
         "Mango", "Biscuit", "Northwind", "DataWeave", "QuantumCorp", "Riverside Striders", "Seafront Runners"]
PLACES = ["Lisbon", "Brighton", "Boston", "Paris", "Hanoi", "Montreal", "Sweden", "Elm Street", "the arts centre"]
VERBS = ["visited", "bought", "painted", "called", "adopted", "joined", "left", "met", "ran", "cooked", "booked",
         "emailed", "fixed", "sold", "planned", "cancelled", "moved to", "signed up for", "reviewed", "presented"]
OBJECTS = ["a sourdough loaf", "the quarterly report", "a blue mug", "a half marathon", "the sales pipeline",
           "a pottery class", "a follow-up call", "a new laptop", "the dashboard", "a charity race", "a cat",
           "the CRM export", "a lease", "a football match", "a spreadsheet", "a birthday gift", "a demo"]


def synthetic_store(n: int, dim: int, seed: int = 0):
    from qgmem.memory.records import MemoryUnit
    from qgmem.memory.store import MemoryStore

    rng = random.Random(seed)
    # a few thousand distinct entity strings, as a long history accumulates
    entity_pool = [f"{rng.choice(NAMES)} {i}" if i >= len(NAMES) else NAMES[i] for i in range(max(len(NAMES), n // 50))]
    units = []
    for i in range(n):
        who, verb, obj = rng.choice(NAMES), rng.choice(VERBS), rng.choice(OBJECTS)
        place = rng.choice(PLACES) if rng.random() < 0.3 else ""
        day = f"2023-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}" if rng.random() < 0.4 else ""
        fact = f"{who} {verb} {obj}" + (f" in {place}" if place else "") + f" (note {i})"
        units.append(MemoryUnit(
            id=f"u{i}", dialogue_id="bench", session_id=f"s{i // 40}", window_id=f"w{i // 4}", fact=fact,
            subject=who, predicate=verb, object=obj, source_turn_ids=[f"t{i}"], source_text=f"I think {fact}.",
            speaker=who, entities=[who, rng.choice(entity_pool)], location=place, fact_time=day, order=i,
        ))
    def unit_vectors(rng_seed: int) -> np.ndarray:
        v = np.random.default_rng(rng_seed).standard_normal((n, dim)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    # fact and source-turn vectors both random, as construction would have stored them
    return MemoryStore(dialogue_id="bench", units=units, embeddings=unit_vectors(seed),
                       source_embeddings=unit_vectors(seed + 1))


def questions(count: int, seed: int = 1) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        templates = [
            f"What did {rng.choice(NAMES)} do with {rng.choice(OBJECTS)} last week?",
            f"When did {rng.choice(NAMES)} go to {rng.choice(PLACES)}?",
            f"Who {rng.choice(VERBS)} {rng.choice(OBJECTS)} in {rng.choice(PLACES)}?",
            f"Did {rng.choice(NAMES)} mention {rng.choice(OBJECTS)} {i} days ago?",
        ]
        out.append((templates[i % len(templates)] + f" #{i}", "2023-08-12"))
    return out


def pct(values: list[float]) -> tuple[float, float]:
    return float(np.percentile(values, 50)), float(np.percentile(values, 95))


def run_size(n: int, encoder, queries: list[tuple[str, str]], ann_min_units: int) -> dict:
    from qgmem.activation.activator import Activator
    from qgmem.activation.config import ActivationConfig

    store = synthetic_store(n, encoder.dim)
    t = time.perf_counter()
    act = Activator(store, encoder, ActivationConfig(ann_min_units=ann_min_units))
    build_ms = (time.perf_counter() - t) * 1e3
    act.activate("warm-up question about Alex", None)
    stages: dict[str, list[float]] = {}
    total = []
    for question, qtime in queries:
        t = time.perf_counter()
        act.activate(question, qtime)
        total.append((time.perf_counter() - t) * 1e3)
        for name, ms in act.last_timings.items():
            stages.setdefault(name, []).append(ms)
    row = {"units": n, "index_build_ms": build_ms, "approximate_index": act.semantic.approximate,
           "total_ms": pct(total)}
    row.update({f"{name}_ms": pct(v) for name, v in stages.items() if name != "total"})
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1, help="torch/FAISS threads (default 1)")
    parser.add_argument("--ann-min-units", type=int, default=50_000)
    parser.add_argument("--encoder", default=None, help="sentence encoder folder (default: embedded MiniLM)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import faiss
    import torch

    from qgmem.embed import SentenceEncoder

    torch.set_num_threads(args.threads)
    faiss.omp_set_num_threads(args.threads)
    encoder = SentenceEncoder(args.encoder)
    rows = []
    for i, n in enumerate(args.sizes):
        rows.append(run_size(n, encoder, questions(args.queries, seed=100 + i), args.ann_min_units))
    cols = ["parse_encode", "lexical", "semantic", "attribute", "source", "fuse_rerank", "assemble", "total"]
    print(f"{'units':>8} {'index':>6} {'build s':>8} " + " ".join(f"{c + ' p50/p95':>22}" for c in cols))
    for r in rows:
        cells = " ".join(f"{r[c + '_ms'][0]:10.2f}/{r[c + '_ms'][1]:<10.2f}" for c in cols)
        print(f"{r['units']:>8} {'hnsw' if r['approximate_index'] else 'flat':>6} {r['index_build_ms'] / 1e3:8.2f} {cells}")
    print(f"(milliseconds; {args.queries} distinct questions per size; {args.threads} thread(s); "
          f"encoder {encoder.model_id})")
    if args.json:
        print(json.dumps({"threads": args.threads, "queries": args.queries, "rows": rows}))


if __name__ == "__main__":
    main()
