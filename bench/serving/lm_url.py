"""``--lm-url`` against the in-process LM: the same greedy answers, and the serving process's memory.

1. **Answers.** ``--questions`` real ConvoMem questions (one per case, the cases spread evenly over
   the sample, so every category; each history remembered once) answered at float32 in process and through ``--lm-url`` against the engine double (the
   embedded SmolLM2 behind vLLM's prompt-embeddings wire format, ``tests/serving/engine_double.py``),
   over the same memory; reports how many answers, finish reasons and token counts are equal.
   ``--engine-url`` compares against a running engine instead (the GPU rehearsal's ``vllm serve``).
2. **Memory** (``--rss``). Two ``qgmem serve`` processes side by side, one with the LM in process and
   one with ``--lm-url`` (the double in a third process); each gets the same ConvoMem session and
   answers the same question; their resident set sizes (VmRSS) are read after that answer.

    python -m bench.serving.lm_url --export checkpoints/export --questions 20 --rss
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import httpx

from bench.common import REPO, free_port, rss_mb
from bench.serving.serve_load import histories, untrained_export


def convomem_questions(n: int):
    """``(case, [question])`` for ``n`` cases spread evenly over the sample's file order (every category)."""
    from qgmem.data.loaders import load_cases

    cases = [c for c in load_cases("convomem", REPO / "data" / "convomem").cases if c.qas]
    return [(cases[i * len(cases) // n], [cases[i * len(cases) // n].qas[0].question]) for i in range(min(n, len(cases)))]


def compare_answers(export: str, n: int, engine_url: str | None = None) -> dict:
    from qgmem.lm import EMBEDDED_LM, EMBEDDED_LM_HUB_ID, load_causal_lm, load_tokenizer
    from qgmem.serving.export_models import load_models
    from qgmem.serving.remote_lm import engine_config
    from tests.serving.engine_double import EngineDouble, RunningEngine

    here = load_models(export, device="cpu", lm_dtype="float32")
    rows, seconds = [], {"in_process": 0.0, "lm_url": 0.0}
    if engine_url is None:
        double = EngineDouble(load_causal_lm(EMBEDDED_LM, dtype="float32"), load_tokenizer(EMBEDDED_LM),
                              EMBEDDED_LM_HUB_ID)
        running = RunningEngine(double)
    else:
        running = nullcontext(engine_url)
    with running as url:
        there = load_models(export, device="cpu", lm_dtype="float32", engine=engine_config(url, None, None))
        for case, questions in convomem_questions(n):
            here.remember(case)
            there.memory = here.memory
            t0 = time.perf_counter()
            local = here.answer(questions)
            t1 = time.perf_counter()
            remote = there.answer(questions)
            seconds["in_process"] += t1 - t0
            seconds["lm_url"] += time.perf_counter() - t1
            for a, b in zip(local, remote):
                rows.append({"question": a.question, "in_process": a.answer, "lm_url": b.answer,
                             "same_answer": a.answer == b.answer,
                             "same_finish_and_tokens": (a.finish_reason, a.tokens) == (b.finish_reason, b.tokens)})
            print(f"  {len(rows)}/{n} questions", file=sys.stderr, flush=True)
    return {"questions": len(rows), "same_answers": sum(r["same_answer"] for r in rows),
            "same_finish_and_tokens": sum(r["same_finish_and_tokens"] for r in rows),
            "seconds": {k: round(v, 1) for k, v in seconds.items()},
            "mismatches": [r for r in rows if not (r["same_answer"] and r["same_finish_and_tokens"])]}


def _wait(url: str, proc: subprocess.Popen, path: str = "/healthz") -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{proc.args[:4]} exited with {proc.returncode}")
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.3)
    sys.exit(f"{url} did not start within 300 s")


def compare_rss(export: str) -> dict:
    from qgmem.lm import EMBEDDED_LM, EMBEDDED_LM_HUB_ID

    env = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1"}
    engine_port = free_port()
    engine = subprocess.Popen([sys.executable, str(REPO / "tests" / "serving" / "engine_double.py"), "--lm", EMBEDDED_LM,
                               "--served-model-name", EMBEDDED_LM_HUB_ID, "--port", str(engine_port)],
                              env=env, stdout=subprocess.DEVNULL)
    servers, out = {}, {}
    try:
        _wait(f"http://127.0.0.1:{engine_port}", engine, "/v1/models")
        for name, extra in (("in_process", []), ("lm_url", ["--lm-url", f"http://127.0.0.1:{engine_port}/v1"])):
            port = free_port()
            servers[name] = (f"http://127.0.0.1:{port}", subprocess.Popen(
                [sys.executable, "-m", "qgmem", "serve", "--export", export, "--store",
                 f"sqlite:///{tempfile.mkdtemp(prefix=f'qgmem-rss-{name}-')}/memories.db", "--port", str(port), "--lm-dtype", "float32",
                 "--threads", "1", "--log-level", "warning", *extra], env=env))
        data = histories(1)[0]
        for name, (url, proc) in servers.items():
            _wait(url, proc)
            started = time.perf_counter()
            assert httpx.post(f"{url}/v1/users/u/sessions", json={"turns": data["sessions"][0]},
                              timeout=300).status_code == 200
            reply = httpx.post(f"{url}/v1/users/u/answer", json={"question": data["questions"][0]}, timeout=300)
            assert reply.status_code == 200, reply.text
            out[name] = {"rss_mb": round(rss_mb(proc.pid)), "answer": reply.json()["answer"],
                         "append_and_answer_s": round(time.perf_counter() - started, 1)}
        out["engine_double_rss_mb"] = round(rss_mb(engine.pid))
    finally:
        for _, proc in servers.values():
            proc.send_signal(signal.SIGINT)
        for _, proc in servers.values():
            proc.wait(timeout=60)
        engine.terminate()
        engine.wait(timeout=60)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export", required=True)
    parser.add_argument("--untrained-export", action="store_true",
                        help="write --export (once) as an untrained export of the default preset's shape")
    parser.add_argument("--questions", type=int, default=20)
    parser.add_argument("--engine-url", default=None,
                        help="compare against this engine (e.g. vllm serve … --enable-prompt-embeds, serving the "
                             "embedded SmolLM2 under its hub id) instead of the engine double")
    parser.add_argument("--rss", action="store_true", help="also measure the two servers' RSS side by side")
    args = parser.parse_args()
    if args.untrained_export:
        untrained_export(Path(args.export))
    result = {"export": args.export}
    if args.questions:
        result["answers"] = compare_answers(args.export, args.questions, args.engine_url)
        a = result["answers"]
        print(f"{a['same_answers']}/{a['questions']} answers equal through --lm-url; finish reason and tokens equal "
              f"for {a['same_finish_and_tokens']}; seconds in process {a['seconds']['in_process']}, "
              f"through {args.engine_url or 'the engine double'} {a['seconds']['lm_url']}")
    if args.rss:
        result["rss"] = compare_rss(args.export)
        r = result["rss"]
        print(f"qgmem serve RSS after one append and one answer: in process {r['in_process']['rss_mb']} MB, "
              f"with --lm-url {r['lm_url']['rss_mb']} MB (the engine double: {r['engine_double_rss_mb']} MB)")
    print(json.dumps(result, ensure_ascii=False))


if __name__ == "__main__":
    main()
