"""Load test of ``qgmem serve``: concurrent clients over real ConvoMem histories and questions.

Starts the server on 127.0.0.1 (a fresh SQLite store), gives each of ``--users`` users a real ConvoMem
history appended as 20-turn sessions (the append latencies are reported as ``append (setup)``), then
runs ``--clients`` clients for ``--seconds``: each request is an answer (``POST
/v1/users/{id}/answer``, 55 %), a streamed OpenAI-style chat completion (35 %; the time to the first
content token is reported) or an append of a further 20-turn session of the user's history (10 %).
Reports throughput, p50 / p95 / p99 per endpoint, the activation seconds the server measured, the
error count and the server's RSS over the run; prints a table and one JSON line (the last).

    python -m bench.serving.serve_load --export checkpoints/export            # 8 clients x 60 s

``--single N`` measures single warm answers instead: one client asks N questions one after the other
(``POST /answer``, the users' own questions in a fixed order) after one warm-up question, and records
each answer's text, so two runs (say, ``--decode`` of the server before and after a change) can be
checked for identical greedy answers. ``--untrained-export DIR`` writes (once) an export shaped like the
one ``python train.py`` writes (the default preset's network, prompt contract, SmolLM2 and MiniLM) with
untrained weights: the LM's work per answer, hence the latency, is the trained export's; the answers
are not.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

from bench.common import REPO, free_port, rss_mb

TURNS_PER_SESSION = 20


def histories(users: int) -> list[dict]:
    """One ConvoMem case per user, from different categories: its 20-turn sessions and its questions."""
    from qgmem.data.loaders import load_cases

    cases, seen = [], set()
    for case in load_cases("convomem", "data/convomem").cases:
        category = case.qas[0].category if case.qas else ""
        if category in seen and len(seen) < users:
            continue
        seen.add(category)
        flat = [{"speaker": t.speaker, "text": t.text} for t in case.dialogue.turns()]
        sessions = [flat[i:i + TURNS_PER_SESSION] for i in range(0, len(flat), TURNS_PER_SESSION)]
        cases.append({"sessions": sessions, "questions": [qa.question for qa in case.qas]})
        if len(cases) == users:
            break
    return cases


def pcts(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    p = np.percentile(values, [50, 95, 99])
    return {"n": len(values), "p50": float(p[0]), "p95": float(p[1]), "p99": float(p[2])}


def untrained_export(folder: Path, preset: str = "default") -> Path:
    """An export with a preset's shapes and settings (``configs/<preset>.yaml`` over the module's signature
    defaults: features, readout, graph tokens, prompt cap and text budget, answer cap) and random
    graph-encoder weights: the LM's work per answer, hence the latency, is that of the preset's trained export."""
    import inspect

    import torch
    import yaml

    from qgmem.activation.answer_contract import AnswerContract
    from qgmem.activation.config import ActivationConfig
    from qgmem.embed import DEFAULT_ENCODER
    from qgmem.lm import EMBEDDED_LM
    from qgmem.memory.config import ConstructionConfig
    from qgmem.model.graph_token import GraphTokenConfig
    from qgmem.model.pretrained import GraphTokenEncoder
    from qgmem.prompting import PromptSettings
    from qgmem.training.module import GenerationSettings, QGMemModule

    if (folder / "config.json").is_file():
        return folder
    cfg = yaml.safe_load((REPO / "configs" / f"{preset}.yaml").read_text())
    signature = inspect.signature(QGMemModule.__init__).parameters
    model = {k: (cfg.get("model") or {}).get(k, signature[k].default)
             for k in ("features", "readout", "num_graph_tokens")}
    generation = GenerationSettings(**((cfg.get("model") or {}).get("generation") or {}))
    max_new_tokens = generation.max_new_tokens
    data = cfg.get("data") or {}
    torch.manual_seed(0)
    config = GraphTokenConfig(feature_dim=384, edge_dim=384, lm_hidden=576, features=model["features"],
                              readout=model["readout"], num_graph_tokens=model["num_graph_tokens"])
    prompt = PromptSettings(max_prompt_tokens=data["max_prompt_tokens"], max_answer_tokens=data["max_answer_tokens"],
                            num_graph_tokens=model["num_graph_tokens"], memory_units=data.get("memory_units"))
    answer = AnswerContract(prompt, ActivationConfig(), "token")
    export_config = {"lm": {"id": EMBEDDED_LM, "hidden_size": 576, "load_dtype": "auto"},
                     "answer": answer.to_dict(), "generation": {"max_new_tokens": max_new_tokens},
                     "sentence_encoder": {"id": DEFAULT_ENCODER, "dim": 384},
                     "construction": ConstructionConfig().to_dict(), "dataset": "convomem", "metrics": None}
    GraphTokenEncoder(config, export_config).eval().save_pretrained(folder)
    return folder


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds ``pid`` has used (Linux /proc): steadier than wall time on a loaded machine."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(export: str, threads: int | None = None, serve_args: list[str] = (), store: str | None = None) \
        -> tuple[subprocess.Popen, str, httpx.Client]:
    """``qgmem serve --export EXPORT`` on a free port of 127.0.0.1 over ``store`` (default: a fresh SQLite
    file), once it answers ``/healthz``: the process, its URL and a client (the caller stops the process)."""
    port = free_port()
    store = store or f"sqlite:///{tempfile.mkdtemp(prefix='qgmem-serve-load-')}/memories.db"
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "qgmem", "serve", "--export", export, "--store", store,
                             "--port", str(port), "--log-level", "warning",
                             *(["--threads", str(threads)] if threads else []), *serve_args],
                            stderr=subprocess.PIPE, text=True)
    client = httpx.Client(timeout=120)
    while True:
        if proc.poll() is not None:
            sys.exit(f"qgmem serve exited: {proc.stderr.read()}")
        try:
            if client.get(f"{url}/healthz").status_code == 200:
                return proc, url, client
        except httpx.HTTPError:
            time.sleep(0.2)


def single(client: httpx.Client, url: str, data: list[dict], n: int, server_pid: int) -> dict:
    """``n`` warm answers one after the other (after one warm-up), the users' questions in a fixed order;
    the wall seconds of each and the server's CPU seconds for each."""
    questions = [(u, h["questions"][i]) for i in range(max(len(h["questions"]) for h in data))
                 for u, h in enumerate(data) if i < len(h["questions"])]
    client.post(f"{url}/v1/users/u0/answer", json={"question": questions[0][1]}).raise_for_status()
    seconds, cpu, answers, stages, tokens = [], [], [], [], []
    for u, question in (questions * (1 + n // max(1, len(questions))))[:n]:
        t, c = time.perf_counter(), cpu_seconds(server_pid)
        r = client.post(f"{url}/v1/users/u{u}/answer", json={"question": question})
        r.raise_for_status()
        seconds.append(time.perf_counter() - t)
        cpu.append(cpu_seconds(server_pid) - c)
        body = r.json()
        answers.append(body["answer"])
        stages.append(body["seconds"])
        tokens.append(body.get("tokens") or {})
    per_stage = {k: pcts([s.get(k, 0.0) for s in stages]) for k in stages[0]} if stages else {}
    return {"answer_s": pcts(seconds), "server_cpu_s": pcts(cpu), "stages_s": per_stage, "answers": answers,
            "each": {"answer_s": seconds, "server_cpu_s": cpu, "stages_s": stages, "tokens": tokens}}


def profile_answer(export: str, data: list[dict], sessions: int, threads: int | None, top: int = 30) -> None:
    """cProfile of one warm answer in this process (the pipeline ``qgmem serve`` runs), by cumulative
    and by own time; then the same answer timed 5 times without the profiler."""
    import cProfile
    import pstats

    import torch

    from qgmem.serving.export_models import load_models

    torch.set_num_threads(threads or 1)
    pipe = load_models(export)
    pipe.remember(data[0]["sessions"][:sessions])
    question = data[0]["questions"][0]
    pipe.answer([question])  # warm: the activator's indexes, the first forward
    profiler = cProfile.Profile()
    profiler.enable()
    answer = pipe.answer([question])[0]
    profiler.disable()
    print(f"question: {question}\nanswer: {answer.answer!r}\ntokens: {answer.tokens}\nseconds: "
          f"{ {k: round(v, 3) for k, v in answer.seconds.items()} }")
    for order in ("cumulative", "tottime"):
        pstats.Stats(profiler).strip_dirs().sort_stats(order).print_stats(top)
    times = []
    for _ in range(5):
        t = time.perf_counter()
        pipe.answer([question])
        times.append(time.perf_counter() - t)
    print(f"unprofiled: p50 {np.median(times):.3f} s over 5 (min {min(times):.3f}); load average {os.getloadavg()[0]:.1f}")


def search_latency(client: httpx.Client, url: str, units: int, n: int) -> dict:
    """One user grown to at least ``units`` units from the ConvoMem sample's 20-turn sessions (cases one
    after the other), then ``n`` warm ``POST /search`` one after the other (their questions in turn)."""
    from qgmem.data.loaders import load_cases

    cases = load_cases("convomem", "data/convomem").cases
    questions = [qa.question for case in cases for qa in case.qas]
    sessions = [turns[i:i + TURNS_PER_SESSION] for case in cases
                for turns in [[{"speaker": t.speaker, "text": t.text} for t in case.dialogue.turns()]]
                for i in range(0, len(turns), TURNS_PER_SESSION)]
    have, appended = 0, 0
    for session in sessions * (1 + units // 50):
        if have >= units:
            break
        r = client.post(f"{url}/v1/users/big/sessions", json={"turns": session})
        r.raise_for_status()
        have, appended = r.json()["units"], appended + 1
    client.post(f"{url}/v1/users/big/search", json={"question": questions[0]}).raise_for_status()  # warm
    seconds, server = [], []
    for question in (questions * (1 + n // len(questions)))[:n]:
        t = time.perf_counter()
        r = client.post(f"{url}/v1/users/big/search", json={"question": question})
        r.raise_for_status()
        seconds.append(time.perf_counter() - t)
        server.append(r.json()["seconds"]["activation"])
    return {"units": have, "sessions": appended, "search_s": pcts(seconds), "activation_s": pcts(server)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export", required=True)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--setup-sessions", type=int, default=6, help="20-turn sessions per user before the load")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="the server's torch threads (qgmem serve --threads)")
    parser.add_argument("--single", type=int, default=0, help="N single warm answers (no concurrent load)")
    parser.add_argument("--untrained-export", action="store_true",
                        help="write --export (once) as an untrained export of the default preset's shape")
    parser.add_argument("--serve-arg", action="append", default=[], help="extra flag for qgmem serve (repeat)")
    parser.add_argument("--profile", action="store_true", help="cProfile one warm answer in this process instead")
    parser.add_argument("--search", type=int, default=0, help="N warm searches of one user grown to --search-units")
    parser.add_argument("--search-units", type=int, default=1000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.untrained_export:
        untrained_export(Path(args.export))

    data = histories(args.users)
    if args.profile:
        profile_answer(args.export, data, args.setup_sessions, args.threads)
        return
    started = time.perf_counter()
    proc, url, client = start_server(args.export, args.threads, args.serve_arg)
    startup = time.perf_counter() - started
    lat: dict[str, list[float]] = {"append (setup)": [], "answer": [], "chat stream (total)": [],
                                   "chat stream (first token)": [], "append (under load)": []}
    append_units, activation, errors, error_examples = [], [], 0, []
    pending = []
    for u, history in enumerate(data):
        for session in history["sessions"][: args.setup_sessions]:
            t = time.perf_counter()
            r = client.post(f"{url}/v1/users/u{u}/sessions", json={"turns": session})
            lat["append (setup)"].append(time.perf_counter() - t)
            if r.status_code != 200:
                errors += 1
                error_examples.append(f"setup append {r.status_code}")
            else:
                append_units.append(r.json()["units"])
        pending.extend((u, s) for s in history["sessions"][args.setup_sessions:])
    random.Random(args.seed).shuffle(pending)
    if args.search:
        try:
            measured = search_latency(client, url, args.search_units, args.search)
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
        s, a = measured["search_s"], measured["activation_s"]
        print(f"{args.search} warm searches of a {measured['units']}-unit user ({measured['sessions']} sessions): "
              f"p50 {s['p50'] * 1e3:.1f} ms, p95 {s['p95'] * 1e3:.1f} ms over HTTP; activation in the server p50 "
              f"{a['p50'] * 1e3:.1f} ms, p95 {a['p95'] * 1e3:.1f} ms; load average {os.getloadavg()[0]:.1f}")
        if args.json:
            print(json.dumps({**measured, "load_average": os.getloadavg()}))
        return
    if args.single:
        try:
            measured = single(client, url, data, args.single, proc.pid)
        finally:  # the server never outlives the bench
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
        result = {"single": args.single, "users": len(data), "serve_args": args.serve_arg, "threads": args.threads,
                  "units_per_user": append_units[args.setup_sessions - 1::args.setup_sessions],
                  **measured, "load_average": os.getloadavg()}
        a = result["answer_s"]
        print(f"{args.single} single warm answers ({' '.join(args.serve_arg) or 'defaults'}): p50 {a['p50']:.3f} s, "
              f"p95 {a['p95']:.3f} s; server CPU p50 {result['server_cpu_s']['p50']:.3f} s; generation p50 {result['stages_s']['generation']['p50']:.3f} s; "
              f"load average {result['load_average'][0]:.1f}")
        if args.json:
            print(json.dumps(result))
        return
    lock = threading.Lock()
    rss: list[tuple[float, float]] = []
    stop = threading.Event()

    def sample():
        t0 = time.perf_counter()
        while not stop.is_set():
            rss.append((time.perf_counter() - t0, rss_mb(proc.pid)))
            stop.wait(2.0)

    def worker(seed: int, deadline: float):
        nonlocal errors
        rng = random.Random(seed)
        http = httpx.Client(timeout=120)
        while time.perf_counter() < deadline:
            u = rng.randrange(len(data))
            question = rng.choice(data[u]["questions"])
            kind = rng.random()
            t = time.perf_counter()
            try:
                if kind < 0.10:
                    with lock:
                        job = pending.pop() if pending else None
                    if job is None:
                        kind = 0.5
                    else:
                        r = http.post(f"{url}/v1/users/u{job[0]}/sessions", json={"turns": job[1]})
                        r.raise_for_status()
                        with lock:
                            lat["append (under load)"].append(time.perf_counter() - t)
                        continue
                if kind < 0.65:
                    r = http.post(f"{url}/v1/users/u{u}/answer", json={"question": question})
                    r.raise_for_status()
                    with lock:
                        lat["answer"].append(time.perf_counter() - t)
                        activation.append(r.json()["seconds"]["activation"])
                    continue
                first = None
                body = {"model": "qgmem", "user": f"u{u}", "stream": True,
                        "messages": [{"role": "user", "content": question}]}
                with http.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
                    r.raise_for_status()
                    for line in r.iter_lines():
                        if first is None and line.startswith("data: {") and '"content": "' in line \
                                and '"content": ""' not in line:
                            first = time.perf_counter() - t
                        if line == "data: [DONE]":
                            break
                with lock:
                    lat["chat stream (total)"].append(time.perf_counter() - t)
                    if first is not None:
                        lat["chat stream (first token)"].append(first)
            except Exception as exc:  # noqa: BLE001 - every failure is counted and reported
                with lock:
                    errors += 1
                    if len(error_examples) < 5:
                        error_examples.append(f"{type(exc).__name__}: {str(exc)[:120]}")

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    deadline = time.perf_counter() + args.seconds
    load_started = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(args.seed + i, deadline)) for i in range(args.clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - load_started
    stop.set()
    sampler.join()
    health = client.get(f"{url}/healthz").json()
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
    requests = sum(len(lat[k]) for k in ("answer", "chat stream (total)", "append (under load)"))
    mb = [m for _, m in rss]
    third = max(1, len(mb) // 3)
    result = {
        "clients": args.clients, "seconds": round(wall, 1), "users": len(data), "server_startup_s": round(startup, 2),
        "units_per_user_at_start": append_units[args.setup_sessions - 1::args.setup_sessions],
        "requests": requests, "throughput_rps": round(requests / wall, 3), "errors": errors,
        "error_examples": error_examples, "latency_s": {k: pcts(v) for k, v in lat.items()},
        "activation_s": pcts(activation), "batches": health["batches"],
        "mean_batch": round(health["batched_questions"] / max(1, health["batches"]), 2),
        "rss_mb": {"first_third_mean": round(float(np.mean(mb[:third])), 1),
                   "last_third_mean": round(float(np.mean(mb[-third:])), 1), "max": round(max(mb), 1),
                   "samples": [(round(t, 1), round(m, 1)) for t, m in rss]},
        "load_average": os.getloadavg(), "threads": args.threads,
    }
    print(f"{args.clients} clients x {wall:.0f} s, {len(data)} users; {requests} requests "
          f"({result['throughput_rps']} /s), errors {errors}; mean LM batch {result['mean_batch']}; "
          f"server start {startup:.1f} s; load average {result['load_average'][0]:.1f}")
    print("| endpoint | n | p50 (s) | p95 (s) | p99 (s) |")
    print("|---|---|---|---|---|")
    for name, p in [*result["latency_s"].items(), ("activation (server-side)", result["activation_s"])]:
        if p["n"]:
            print(f"| {name} | {p['n']} | {p['p50']:.3f} | {p['p95']:.3f} | {p['p99']:.3f} |")
    r = result["rss_mb"]
    print(f"RSS: first third {r['first_third_mean']} MB, last third {r['last_third_mean']} MB, max {r['max']} MB")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
