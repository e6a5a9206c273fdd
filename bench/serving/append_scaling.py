"""Appending a 20-turn session to a memory store, against the store's size (up to 100k units).

The sessions are real: 20-turn slices of a ConvoMem history, through the export's default
construction (the parser extractor, spaCy) and the embedded MiniLM. The store they are appended to
is synthetic so that its size can reach 100k units without encoding 100k facts: the templated units
and random unit embeddings of ``bench/activation/activation.py``; the trace index beside it (relation-key
embeddings, each unit's 21 nearest neighbours) is synthesized too: random unit key vectors and, per
unit, 20 random neighbours with their true inner products (an exact 100k x 100k search would take
minutes and does not change what an append costs: the append searches only its new rows and merges
them into the old rows' lists). Each size gets a fresh builder (an empty parse memo) and sessions
not appended before (their facts are not in the encoder's memo).

Per size: the append itself (extraction, embedding, neighbour lists, regrouping the traces), the
snapshot write (``MemoryStore.save``, checksums included; ``qgmem serve --snapshot-every`` amortizes
it) and the activator update the next question pays (``Activator.extended``: the dense index gets the
new rows in place, BM25 and the attribute index are rebuilt); beside it, the first build of the
activator over the store (what a server pays once per user it loads). Prints one
table and, with ``--json``, one JSON object as the last line.

    python -m bench.serving.append_scaling --sizes 1000 10000 100000 --sessions 3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.activation.activation import synthetic_store
from bench.common import rss_mb


def real_sessions(count: int, turns: int = 20) -> list:
    """``count`` 20-turn sessions cut from the ConvoMem sample's first histories."""
    from qgmem.data.loaders import load_cases
    from qgmem.serving.users import to_session

    out = []
    for case in load_cases("convomem", "data/convomem").cases:
        flat = [{"speaker": t.speaker, "text": t.text} for t in case.dialogue.turns()]
        for start in range(0, len(flat) - turns + 1, turns):
            out.append(to_session(flat[start:start + turns]))
            if len(out) == count:
                return out
    return out


def synthetic_index(store, config, seed: int = 0):
    from qgmem.memory.traces import TraceIndex, _traceable

    n, k = len(store), config.neighbours + 1
    if n == 0:
        return TraceIndex.empty(store.embeddings.shape[1], k)
    rng = np.random.default_rng(seed)
    keys = rng.standard_normal((n, store.embeddings.shape[1])).astype(np.float32)
    keys /= np.linalg.norm(keys, axis=1, keepdims=True)
    ids = np.concatenate([np.arange(n)[:, None], rng.integers(0, n, (n, k - 1))], axis=1).astype(np.int64)
    sims = np.empty(ids.shape, np.float32)
    for start in range(0, n, 4096):  # in chunks: [n, k, dim] at once would be 3 GB at 100k units
        rows = slice(start, start + 4096)
        sims[rows] = np.einsum("nd,nkd->nk", store.embeddings[rows], store.embeddings[ids[rows]])
    order = np.argsort(-sims, axis=1, kind="stable")
    return TraceIndex(keys, np.take_along_axis(ids, order, 1), np.take_along_axis(sims, order, 1),
                      _traceable(store.units))


def run_size(n: int, sessions: list, encoder, config) -> dict:
    from qgmem.activation.activator import Activator
    from qgmem.memory.builder import MemoryBuilder

    store = synthetic_store(n, encoder.dim)
    store.meta = {"extent": {"sessions": n // 40, "turns": n, "windows": n // 4, "user": "User"}, "counts": {}}
    index = synthetic_index(store, config)
    builder = MemoryBuilder(config, encoder)
    append_s, save_s, activator_s, added = [], [], [], []
    t = time.perf_counter()
    activator = Activator(store, encoder) if n else None  # what a server holds before the appends
    first_build = time.perf_counter() - t
    with tempfile.TemporaryDirectory() as tmp:
        for i, session in enumerate(sessions):
            t0 = time.perf_counter()
            grown, index = builder.append(store, [session], index)
            t1 = time.perf_counter()
            grown.save(Path(tmp) / f"snapshot-{i}")
            t2 = time.perf_counter()
            activator = activator.extended(grown) if activator is not None else Activator(grown, encoder)
            t3 = time.perf_counter()
            append_s.append(t1 - t0)
            save_s.append(t2 - t1)
            activator_s.append(t3 - t2)
            added.append(len(grown) - len(store))
            store = grown
        rss = rss_mb()  # the grown store, its trace index and its activator alive
        del activator
    return {"rss_mb": round(rss, 1), "units": n, "sessions": len(sessions), "units_added_per_session": float(np.mean(added)),
            "append_s": float(np.median(append_s)), "append_max_s": float(np.max(append_s)),
            "snapshot_s": float(np.median(save_s)), "activator_update_s": float(np.median(activator_s)),
            "activator_first_build_s": round(first_build, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[0, 1000, 10000, 100000])
    parser.add_argument("--sessions", type=int, default=3, help="20-turn sessions appended per size")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from qgmem.embed import SentenceEncoder
    from qgmem.memory.config import ConstructionConfig
    from qgmem.memory.nlp import load_pipeline

    encoder, config = SentenceEncoder(), ConstructionConfig()  # the export's defaults: the parser extractor
    load_pipeline()  # spaCy loads once per process, before any timing
    # every appended session is a different one: the encoder's memo never holds its facts already
    pool = real_sessions(args.sessions * len(args.sizes) + 1)
    encoder.encode(["warm up"])
    run_size(0, pool[:1], encoder, config)  # warm-up (first parse, first encoder batch): not reported
    rows = []
    for i, n in enumerate(args.sizes):
        rows.append(run_size(n, pool[1 + i * args.sessions: 1 + (i + 1) * args.sessions], encoder, config))
        r = rows[-1]
        print(f"{r['units']:>7} units: append {r['append_s']:.3f} s (max {r['append_max_s']:.3f}), "
              f"+{r['units_added_per_session']:.0f} units/session; snapshot {r['snapshot_s']:.3f} s; "
              f"activator update {r['activator_update_s']:.3f} s (first build {r['activator_first_build_s']:.1f} s)", file=sys.stderr, flush=True)
    print("| store units | append (median s) | append (max s) | units added | snapshot write (s) | activator update (s) | activator first build (s) | process RSS (MB) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['units']:,} | {r['append_s']:.3f} | {r['append_max_s']:.3f} | {r['units_added_per_session']:.0f} "
              f"| {r['snapshot_s']:.3f} | {r['activator_update_s']:.3f} | {r['activator_first_build_s']:.1f} | {r['rss_mb']:.0f} |")
    if args.json:
        print(json.dumps({"rows": rows, "turns_per_session": 20, "extractor": config.extractor,
                          "load_average": os.getloadavg()}))


if __name__ == "__main__":
    main()
