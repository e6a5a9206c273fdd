"""LLM-backed cache build: one case after another against several cases in flight, one server.

A stub OpenAI-compatible server on 127.0.0.1 answers every construction prompt after a fixed delay
(``--delay-ms``, default 50) with one unit per user turn, and counts the requests it holds at once.
The cache samples of the first ``--cases`` planned ConvoMem cases are built (``build_samples``: the
LLM extractor, rule consolidation, activation, shards) once per (``max_concurrency``,
``construction_cases_in_flight``) pair, each in a fresh cache folder with no response cache, and the
datasets are checked equal to the serial build's. By default a hashing stand-in replaces the sentence
encoder so the figures isolate the wait on the server (``--real-encoder`` uses the configured MiniLM).
A warm-up build (one case, untimed) comes first; wall and CPU seconds are those of ``build_samples``
(the plan, which loads the data, included); "server floor" is requests × delay / max_concurrency,
what no build can beat. Prints a table and one JSON object last.

    python -m bench.construction.llm_cases_in_flight --cases 24 --concurrency 8,64
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np

from bench.common import HashEncoder


def recorded_reply(prompt: str) -> str:
    """One unit per non-context user turn of the slice, grounded on that turn."""
    units = []
    for line in prompt.splitlines():
        match = re.match(r"\[(T\d+)\](?! \[CONTEXT\])[^:]*?User: (.*)", line)
        if match:
            label, text = match.groups()
            units.append({"fact": f"User said: {text}", "turn_start": label, "turn_end": label, "subject": "User",
                          "predicate": "said", "object": text[:80], "entities": [], "location": "",
                          "fact_time": ""})
    return json.dumps({"units": units})


class SlowServer:
    """``/v1/chat/completions`` answered after ``delay_s``; ``peak`` is the most requests held at once."""

    def __init__(self, delay_s: float):
        self.active = self.peak = self.requests = 0
        lock, server = threading.Lock(), self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as a real server

            def do_POST(self):  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    server.requests += 1
                    server.active += 1
                    server.peak = max(server.peak, server.active)
                time.sleep(delay_s)
                with lock:
                    server.active -= 1
                payload = json.dumps({"choices": [{"message": {"role": "assistant", "content": recorded_reply(
                    body["messages"][-1]["content"])}}], "usage": {"prompt_tokens": 700, "completion_tokens": 200}})
                data = payload.encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        class Server(ThreadingHTTPServer):
            request_queue_size = 512  # the listen backlog: hundreds of clients connect at once

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def build(args, server: SlowServer, concurrency: int, in_flight: int, root: Path) -> tuple[dict, list]:
    from qgmem.llm.base import LLMConfig
    from qgmem.memory.config import ConstructionConfig
    from qgmem.samples import cache as C
    from qgmem.samples.build import build_samples
    from qgmem.samples.spec import CacheSpec

    llm = LLMConfig(backend="openai", model="stub", base_url=server.url, max_concurrency=concurrency, max_retries=0)
    spec = CacheSpec(data_path=args.data_path, num_cases=args.cases, distractor_conversations=args.distractors,
                     construction=ConstructionConfig(extractor="llm", consolidation="rule"), construction_llm=llm,
                     construction_cases_in_flight=in_flight, answer_filter="none",
                     cache_dir=root / f"c{concurrency}-f{in_flight}")
    encoder = None if args.real_encoder else HashEncoder(spec.feature_dim)
    samples = C.SampleCache(spec.samples_dir)
    server.peak, before = 0, server.requests
    start, cpu = time.perf_counter(), time.process_time()
    done = build_samples(spec, samples, encoder=encoder, progress=False)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    metas = [samples.shard_meta(i) for i in range(len(samples.plan()))]
    rows = [dict(r) for r in samples.load()]
    requests = server.requests - before
    return {"max_concurrency": concurrency, "cases_in_flight": in_flight, "cases": len(metas),
            "turns": sum(m["turns"] for m in metas), "requests": requests, "peak_in_flight": server.peak,
            "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "s_per_case": round(wall / len(metas), 3),
            "requests_per_s": round(requests / wall, 1),
            # no build can beat the server: every request takes the delay, max_concurrency at a time
            "server_floor_s": round(requests * args.delay_ms / 1000 / concurrency, 2),
            "cases_in_flight_used": done["seconds"]["cases_in_flight"]}, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-path", default="data/convomem")
    parser.add_argument("--cases", type=int, default=24)
    parser.add_argument("--distractors", type=int, default=0, help="distractor conversations per case")
    parser.add_argument("--delay-ms", type=float, default=50.0)
    parser.add_argument("--concurrency", default="8,64", help="max_concurrency values of the backend")
    parser.add_argument("--in-flight", default="1,auto", help="construction_cases_in_flight values (auto = None)")
    parser.add_argument("--real-encoder", action="store_true", help="the configured MiniLM, not the hash stand-in")
    args = parser.parse_args()

    server = SlowServer(args.delay_ms / 1000)
    root = Path(tempfile.mkdtemp(prefix="qgmem-in-flight-"))
    results, reference = [], None
    try:
        build(args, server, 1, 1, root / "warm-up")  # imports, data loading, first-call costs: not timed
        plan_s = _plan_seconds(args)
        for concurrency in (int(x) for x in args.concurrency.split(",")):
            serial_wall = None
            for value in args.in_flight.split(","):
                in_flight = concurrency if value == "auto" else int(value)
                row, rows = build(args, server, concurrency, in_flight, root)
                reference = reference if reference is not None else rows
                row["same_samples_as_first_build"] = _same(rows, reference)
                serial_wall = serial_wall or (row["wall_s"] if in_flight == 1 else None)
                row["speedup_vs_serial"] = round(serial_wall / row["wall_s"], 2) if serial_wall else None
                results.append(row)
                print(json.dumps(row), flush=True)
    finally:
        server.close()
        shutil.rmtree(root, ignore_errors=True)
    print("| max_concurrency | cases in flight | cases | requests | peak in flight | wall s | CPU s | s per case | "
          "requests/s | server floor s | speed-up | same samples |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['max_concurrency']} | {r['cases_in_flight']} | {r['cases']} | {r['requests']} | "
              f"{r['peak_in_flight']} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | {r['s_per_case']:.3f} | "
              f"{r['requests_per_s']:.1f} | {r['server_floor_s']:.2f} | {r['speedup_vs_serial']} | "
              f"{r['same_samples_as_first_build']} |")
    print(f"(each wall time includes the plan: {plan_s:.2f} s of loading and splitting the data)")
    print(json.dumps({"delay_ms": args.delay_ms, "encoder": "real" if args.real_encoder else "hash", "plan_s": plan_s,
                      "distractors": args.distractors, "cpu_count": os.cpu_count(),
                      "load_avg_1m": round(os.getloadavg()[0], 2), "runs": results}))


def _plan_seconds(args) -> float:
    """What one plan costs (loading and splitting the data): part of every build's wall time."""
    from qgmem.samples.build import plan_cases
    from qgmem.samples.spec import CacheSpec

    start = time.perf_counter()
    plan_cases(CacheSpec(data_path=args.data_path, num_cases=args.cases, distractor_conversations=args.distractors,
                         answer_filter="none"))
    return round(time.perf_counter() - start, 2)


def _same(rows: list[dict], reference: list[dict]) -> bool:
    if len(rows) != len(reference):
        return False
    for a, b in zip(rows, reference):
        for key in a:
            if key in ("x", "edge_attr"):
                if not np.array_equal(np.asarray(a[key], np.float32), np.asarray(b[key], np.float32)):
                    return False
            elif a[key] != b[key]:
                return False
    return True


if __name__ == "__main__":
    main()
