"""Load check: a 100k-unit memory store saved, verified, loaded and asked 1,000 questions through activation.

What it reports: the seconds of each phase (build units, save with checksums, verified load, index
build, questions), question throughput, peak RSS, and RSS sampled every 100 questions, so a leak (RSS
that keeps growing with the number of questions) would show. Synthetic templated units with random
unit-vector embeddings, as in ``bench/activation/activation.py``; questions go through the real MiniLM encoder;
embedding reranker (no model reranker).

    python -m bench.reliability.load --units 100000 --questions 1000 --threads 1 --json
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path

from bench.activation.activation import questions, synthetic_store  # the same synthetic stores and questions
from bench.common import rss_mb as rss_mib


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=100_000)
    parser.add_argument("--questions", type=int, default=1_000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sample-every", type=int, default=100)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import faiss
    import torch

    from qgmem.activation.activator import Activator
    from qgmem.activation.config import ActivationConfig
    from qgmem.embed import SentenceEncoder
    from qgmem.memory.store import MemoryStore

    torch.set_num_threads(args.threads)
    faiss.omp_set_num_threads(args.threads)
    result: dict = {"units": args.units, "questions": args.questions, "threads": args.threads,
                    "rss_start_mib": round(rss_mib(), 1)}
    encoder = SentenceEncoder()
    result["rss_after_encoder_mib"] = round(rss_mib(), 1)
    seconds: dict[str, float] = {}
    t = time.perf_counter()
    store = synthetic_store(args.units, encoder.dim)
    seconds["make_units"] = time.perf_counter() - t
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "store"
        t = time.perf_counter()
        store.save(folder)
        seconds["save_with_checksums"] = time.perf_counter() - t
        result["store_mib"] = round(sum(p.stat().st_size for p in folder.iterdir()) / 2**20, 1)
        del store
        t = time.perf_counter()
        MemoryStore.load(folder, verify=False)  # first: also pays the one-time imports
        seconds["load_unverified"] = time.perf_counter() - t
        t = time.perf_counter()
        store = MemoryStore.load(folder)
        seconds["load_verified"] = time.perf_counter() - t
    result["rss_after_load_mib"] = round(rss_mib(), 1)
    t = time.perf_counter()
    activator = Activator(store, encoder, ActivationConfig())
    seconds["index_build"] = time.perf_counter() - t
    result["approximate_index"] = bool(activator.semantic.approximate)
    result["rss_after_index_mib"] = round(rss_mib(), 1)
    activator.activate("warm-up question about Alex", None)
    samples = []
    latencies = []
    t = time.perf_counter()
    for i, (question, qtime) in enumerate(questions(args.questions, seed=7), start=1):
        q0 = time.perf_counter()
        wm = activator.activate(question, qtime)
        latencies.append((time.perf_counter() - q0) * 1e3)
        assert len(wm.units) > 0
        if i % args.sample_every == 0:
            samples.append({"questions": i, "rss_mib": round(rss_mib(), 1)})
    seconds["questions"] = time.perf_counter() - t
    latencies.sort()
    result.update({
        "seconds": {k: round(v, 2) for k, v in seconds.items()},
        "questions_per_s": round(args.questions / seconds["questions"], 1),
        "latency_ms_p50": round(latencies[len(latencies) // 2], 2),
        "latency_ms_p95": round(latencies[int(len(latencies) * 0.95)], 2),
        "rss_samples": samples,
        "rss_growth_over_questions_mib": round(samples[-1]["rss_mib"] - samples[0]["rss_mib"], 1) if samples else 0.0,
        "peak_rss_mib": round(peak_rss_mib(), 1),
    })
    print(f"{args.units} units ({result['store_mib']} MiB on disk, {'HNSW' if result['approximate_index'] else 'flat'}), "
          f"{args.questions} questions: {result['questions_per_s']} questions/s "
          f"(p50 {result['latency_ms_p50']} ms, p95 {result['latency_ms_p95']} ms)")
    print("seconds: " + ", ".join(f"{k} {v}" for k, v in result["seconds"].items()))
    print(f"RSS MiB: start {result['rss_start_mib']}, encoder {result['rss_after_encoder_mib']}, loaded "
          f"{result['rss_after_load_mib']}, indexed {result['rss_after_index_mib']}; over the questions "
          + " ".join(f"{s['rss_mib']}" for s in samples) + f"; peak {result['peak_rss_mib']}")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
