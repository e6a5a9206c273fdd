"""The paper's preset (``configs/qwen3_8b.yaml``) rehearsed end to end in miniature, on two CPU processes.

Everything runs as the preset runs it, through the project's own commands, except the size of the
models and the run (the overrides in ``bench/rehearsal/paper_preset_rehearsal.yaml``, nothing else):

1. models: random-init ``Qwen3ForCausalLM`` folders (2 layers, hidden 64, SmolLM2's vocabulary with a
   chat template that has Qwen3's thinking switch) for the frozen LM and the yes/no reranker;
2. an OpenAI-compatible server on 127.0.0.1 (``bench/rehearsal/paper_preset_rehearsal_server.py``: SmolLM2 for the
   judge and one construction window in ``--model-share``, a scripted responder for the rest);
3. ``torchrun --nproc_per_node 2 -m qgmem.training.build_cache --shard auto``, the server killed after
   ``--kill-after`` construction requests, then restarted and the same command run again (resume);
4. the same build on 1 process into another folder, from a copy of the response caches (a replay: the
   new requests it sends are counted; only replies that came back empty, never cached, may be asked
   again), compared sample by sample with the sharded one;
5. ``python train.py --config qwen3_8b --config <overrides>`` (DDP, 2 ranks, gloo, bf16-mixed, gradient
   checkpointing) with a probe callback that records what each rank saw;
6. ``qgmem serve --export`` answers one question over HTTP; ``qgmem eval-qa`` scores 10 questions.

It prints one JSON line with what the run's own outputs show, the seconds of each stage and the peak
RSS of each rank. Stages resume: a finished stage's outputs are reused when the command is run again
with the same ``--work`` folder (``--fresh`` starts over).

    python -m bench.rehearsal.paper_preset_rehearsal --work /scratch/rehearsal            # the full rehearsal
    python -m bench.rehearsal.paper_preset_rehearsal --work DIR --cases 8 --epochs 1     # the reduced one (CI)
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from bench.common import REPO, free_port

HERE = Path(__file__).resolve().parent
OVERRIDES = HERE / "paper_preset_rehearsal.yaml"
PRESET = "qwen3_8b"
LM_SHAPE = dict(arch="qwen3", hidden_size=64, layers=2, heads=4, kv_heads=2)


def fill(node: Any, values: dict[str, Any]) -> Any:
    """The overrides with their ``"{name}"`` placeholders replaced (a whole-string placeholder keeps the value's type)."""
    if isinstance(node, dict):
        return {k: fill(v, values) for k, v in node.items()}
    if isinstance(node, str) and node.startswith("{") and node.endswith("}") and node[1:-1] in values:
        return values[node[1:-1]]
    if isinstance(node, str):
        return node.format(**values)
    return node


def override_keys(node: dict[str, Any] | None = None, prefix: str = "") -> list[str]:
    """The dotted keys the overrides set (the one list the print_config test checks)."""
    node = yaml.safe_load(OVERRIDES.read_text()) if node is None else node
    keys = []
    for k, v in node.items():
        keys += override_keys(v, f"{prefix}{k}.") if isinstance(v, dict) else [f"{prefix}{k}"]
    return keys


def write_overrides(work: Path, port: int, cases: int, cache_dir: Path | None = None) -> Path:
    values = {"root": str(work / "run"), "lm": str(work / "models" / "qwen3-lm"),
              "reranker": str(work / "models" / "qwen3-reranker"), "data_path": str(REPO / "data" / "convomem"),
              "num_cases": cases, "cache_dir": str(cache_dir or work / "cache"),
              "base_url": f"http://127.0.0.1:{port}/v1", "max_new_tokens": 16}
    filled = fill(yaml.safe_load(OVERRIDES.read_text()), values)
    name = "rehearsal.yaml" if cache_dir is None else f"rehearsal-{cache_dir.name}.yaml"
    out = work / name
    out.write_text(yaml.safe_dump(filled, sort_keys=False))
    return out


def config_args(overrides: Path) -> list[str]:
    return ["--config", PRESET, "--config", str(overrides)]


def make_models(work: Path) -> dict[str, str]:
    from qgmem.model.random_lm import THINKING_TEMPLATE, save_random_lm

    lm = save_random_lm(work / "models" / "qwen3-lm", chat_template=THINKING_TEMPLATE, seed=0, **LM_SHAPE)
    rr = save_random_lm(work / "models" / "qwen3-reranker", chat_template=THINKING_TEMPLATE, seed=1, **LM_SHAPE)
    return {"lm": str(lm), "reranker": str(rr)}


def folder_digest(folder: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    for f in sorted(folder.glob("*.safetensors")):
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


class Server:
    """The rehearsal's LLM server as a child process (started, killed, restarted on one port)."""

    def __init__(self, port: int, log: Path, model_share: int, env: dict[str, str], lm: str | None = None):
        self.port, self.log, self.model_share, self.env, self.lm = port, log, model_share, env, lm
        self.proc: subprocess.Popen | None = None

    def start(self, wait_s: float = 180.0) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.rehearsal.paper_preset_rehearsal_server",
                                      "--port", str(self.port), "--log", str(self.log),
                                      "--model-share", str(self.model_share),
                                      *(["--lm", self.lm] if self.lm else [])],
                                     env=self.env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=open(self.log.with_suffix(".err"), "a"))
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the LLM server exited ({self.proc.returncode}); see {self.log.with_suffix('.err')}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v1/models", timeout=2).read()
                return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError("the LLM server did not start")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            kill_tree(self.proc)
        self.proc = None

    def requests(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]


def count(records: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in records:
        key = f"{r['kind']}/{r['source']}"
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))


def run(command: list[str], env: dict[str, str], log: Path, check: bool = True,
        watch=None) -> tuple[int, float, float]:
    """Run ``command`` (stdout+stderr to ``log``); ``watch(proc)`` is polled while it runs.

    Returns (exit code, seconds, peak RSS of the largest child in MiB, from ``RUSAGE_CHILDREN``).
    """
    started = time.perf_counter()
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(command)}\n")
        out.flush()
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                start_new_session=True)
        try:
            while proc.poll() is None:
                if watch is not None:
                    watch(proc)
                time.sleep(0.2)
        finally:  # interrupted: the command's whole tree goes too (torchrun's ranks sit in sessions of their own)
            if proc.poll() is None:
                kill_tree(proc)
    seconds = time.perf_counter() - started
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:6])} ... failed ({proc.returncode}); see {log}:\n"
                           + log.read_text()[-3000:])
    return proc.returncode, seconds, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc`` and every process under it (by parent links, not by name)."""
    try:
        import psutil
    except ImportError:  # without psutil: the process group the command was started in
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return

    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    for p in [psutil.Process(proc.pid), *children] if proc.poll() is None else children:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait()


def dataset_dir(cache_dir: Path) -> Path:
    found = sorted(Path(p) for p in glob.glob(str(cache_dir / "dataset-*")) if Path(p, "summary.json").exists())
    if not found:
        raise RuntimeError(f"no built dataset under {cache_dir}")
    return found[-1]


def compare_datasets(a: Path, b: Path) -> dict[str, Any]:
    from bench.cache.cache_processes import compare  # the sample-by-sample comparison of the cache bench

    from qgmem.samples import cache as C

    ids = {}
    for name, folder in (("a", a), ("b", b)):
        splits = C.DatasetCache(folder).load()
        qa = [row["qa_id"] for split in C.SPLITS for row in splits[split]]
        ids[name] = {"samples": len(qa), "duplicates": len(qa) - len(set(qa)),
                     "cases": len({row["case_id"] for split in C.SPLITS for row in splits[split]})}
    return {**compare(str(a), str(b)), "sharded": ids["a"], "single": ids["b"]}


def http_json(url: str, body: dict[str, Any] | None = None, timeout: float = 300.0) -> dict[str, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def rehearse(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(args.work).resolve()
    if args.fresh and work.exists():
        shutil.rmtree(work)
    (work / "logs").mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO),
                                                        os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    seconds: dict[str, float] = {}
    result: dict[str, Any] = {"preset": PRESET, "overrides": override_keys(), "cases": args.cases,
                              "server_lm": args.server_lm, "model_share": args.model_share}

    t = time.perf_counter()
    models = make_models(work)
    before = {k: folder_digest(Path(v)) for k, v in models.items()}
    seconds["models"] = time.perf_counter() - t

    port = free_port()
    server = Server(port, work / "logs" / "server.jsonl", args.model_share, env,
                    models["lm"] if args.server_lm == "random" else None)
    overrides = write_overrides(work, port, args.cases)
    log = work / "logs" / "commands.log"
    py = sys.executable
    try:
        t = time.perf_counter()
        server.start()
        seconds["server_start"] = time.perf_counter() - t

        # 3. the sharded build under torchrun, the server killed mid-build, then the same command again
        build = [py, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
                 "-m", "qgmem.training.build_cache", *config_args(overrides), "--shard", "auto", "--no-progress"]
        kill = {"after": args.kill_after, "killed_at_requests": None, "first_exit": None}
        sharded_dir = work / "cache"

        def killer(_proc) -> None:
            if kill["killed_at_requests"] is None and args.kill_after:
                n = sum(1 for r in server.requests() if r["kind"] == "construction")
                if n >= args.kill_after:
                    server.kill()
                    kill["killed_at_requests"] = n

        t = time.perf_counter()
        done_before = glob.glob(str(sharded_dir / "dataset-*" / "summary.json"))
        if not done_before:
            rc, _, _ = run(build, env, log, check=False, watch=killer)
            kill["first_exit"] = rc
            if kill["killed_at_requests"] is not None:
                server.start()
            if rc != 0:
                run(build, env, log)
        seconds["build_sharded"] = time.perf_counter() - t
        first_requests = server.requests()
        result["server_requests_build"] = count(first_requests)
        result["kill"] = kill

        # 4. one process, into its own folder, from a copy of the response caches: a replay
        single_dir = work / "cache_single"
        single = write_overrides(work, port, args.cases, cache_dir=single_dir)
        t = time.perf_counter()
        if not glob.glob(str(single_dir / "dataset-*" / "summary.json")):
            single_dir.mkdir(exist_ok=True)
            for f in sharded_dir.glob("llm-*.sqlite"):
                shutil.copy2(f, single_dir / f.name)
            run([py, "-m", "qgmem.training.build_cache", *config_args(single), "--no-progress"], env, log)
        seconds["build_single_replay"] = time.perf_counter() - t
        replay_requests = server.requests()[len(first_requests):]
        result["replay_new_requests"] = count(replay_requests)
        # an empty HTTP 200 is treated as a server fault (retried, never cached): those alone may be asked again
        result["replay_new_requests_with_content"] = count([r for r in replay_requests if not r.get("empty")])
        result["sharded_vs_single"] = compare_datasets(dataset_dir(sharded_dir), dataset_dir(single_dir))
        summary = json.loads((dataset_dir(sharded_dir) / "summary.json").read_text())
        result["build_summary"] = {k: summary.get(k) for k in ("samples", "skipped_cases", "construction", "filter")
                                   if k in summary}

        # 5. the training job, DDP over 2 CPU processes
        root = work / "run"
        t = time.perf_counter()
        probe = ["--trainer.callbacks+=bench.rehearsal.paper_preset_rehearsal_probe.RehearsalProbe",
                 f"--trainer.callbacks.out={work / 'probe'}"]
        epochs = [] if args.epochs is None else ["--trainer.max_epochs", str(args.epochs)]  # the reduced run only
        if not (root / "metrics.json").exists():
            run([py, str(REPO / "train.py"), *config_args(overrides), *probe, *epochs], env, log)
        seconds["train"] = time.perf_counter() - t
        result["training"] = training_checks(work, root)
        after = {k: folder_digest(Path(v)) for k, v in models.items()}
        result["training"]["model_folders_unchanged"] = before == after

        # 6. serve the export and ask one question; eval-qa on 10 questions with the LLM reranker
        t = time.perf_counter()
        result["serve"] = serve_one(root / "export", work, env)
        seconds["serve"] = time.perf_counter() - t
        t = time.perf_counter()
        result["eval_qa"] = eval_qa(root / "export", work, env, port, log, args.eval_limit)
        seconds["eval_qa"] = time.perf_counter() - t
        result["server_requests_total"] = count(server.requests())
    finally:
        server.kill()
    result["seconds"] = {k: round(v, 1) for k, v in seconds.items()}
    result["seconds"]["total"] = round(sum(seconds.values()), 1)
    return result


def training_checks(work: Path, root: Path) -> dict[str, Any]:
    """What the run's own files show about the DDP fit, the checkpoint choice and the export."""
    import torch

    probes = [json.loads(p.read_text()) for p in sorted((work / "probe").glob("probe-rank*.json"))]
    n_train = sum(json.loads((dataset_dir(work / "cache") / "summary.json").read_text())["samples"]["train"].values())
    epochs = []  # per epoch: each rank's sample slots, the distinct samples, those both ranks had
    for epoch in sorted({e for p in probes for e in p["train_epochs"]}):
        seen = [[q for b, e in zip(p["train_qa_ids"], p["train_epochs"]) if e == epoch for q in b] for p in probes]
        epochs.append({"slots": [len(s) for s in seen], "distinct": len(set().union(*map(set, seen))),
                       "shared": len(set(seen[0]) & set(seen[1])) if len(seen) == 2 else None})
    metrics = json.loads((root / "metrics.json").read_text())
    ckpts = sorted((root / "checkpoints").glob("*.ckpt"))
    best = metrics.get("best_checkpoint")
    vals = {}
    for c in ckpts:
        state = torch.load(c, map_location="cpu", weights_only=True)
        for key, cb in state.get("callbacks", {}).items():
            if key.startswith("FiniteModelCheckpoint") or key.startswith("ModelCheckpoint"):
                vals.update({k: float(v) for k, v in (cb.get("best_k_models") or {}).items()})
        early = next((cb for key, cb in state.get("callbacks", {}).items() if key.startswith("EarlyStopping")), None)
    history, epochs_run = tensorboard_history(root)
    export = root / "export"
    cfg = json.loads((export / "config.json").read_text()) if (export / "config.json").exists() else {}
    return {
        "ranks": len(probes),
        # disjoint shares: within an epoch the ranks share only the sampler's padding (slots beyond the samples)
        "train_samples": n_train,
        "train_per_epoch": epochs,
        "train_disjoint": len(probes) == 2 and bool(epochs) and all(
            e["distinct"] == n_train and e["shared"] == sum(e["slots"]) - n_train for e in epochs),
        "steps_per_rank": [len(p["train_qa_ids"]) for p in probes],
        "val_batches_per_rank": [p["val_batches"] for p in probes],
        "loss_finite": all(all(map(lambda x: x == x and abs(x) != float("inf"), p["losses"])) for p in probes)
                       and any(p["losses"] for p in probes),
        "losses_rank0": [round(x, 3) for x in probes[0]["losses"]] if probes else [],
        "grad_params": sorted({n for p in probes for n in p["grad_params"]}),
        "lm_weights_unchanged": all(p["lm_digest_before"] == p["lm_digest_after"] for p in probes),
        "lm_class": probes[0]["lm_class"] if probes else None,
        "lm_dtype": probes[0]["lm_dtype"] if probes else None,
        "gradient_checkpointing": [p["gradient_checkpointing"] for p in probes],
        "layer_calls_per_step": sorted({c for p in probes for c in p["layer_calls_per_step"]}),
        "peak_rss_mib_per_rank": [p["peak_rss_mib"] for p in probes],
        "best_checkpoint": Path(best).name if best else None,
        "best_score": metrics.get("best_score"),
        "val_nll_history": history,
        "best_is_min_val_nll": bool(history) and best is not None
                               and abs(metrics.get("best_score") - min(v for _, v in history)) < 1e-6,
        "epochs_trained": epochs_run,
        "val_nll_by_checkpoint": {Path(k).name: round(v, 4) for k, v in vals.items()},
        "early_stopping_state": {k: (float(v) if hasattr(v, "item") else v) for k, v in (early or {}).items()
                                 if k in ("wait_count", "stopped_epoch", "patience", "best_score")},
        "metrics_json": len(list(work.rglob("metrics.json"))),
        "tensorboard_runs": len(list(root.glob("lightning_logs/version_*"))),
        "event_files": len(list(root.rglob("events.out.tfevents*"))),
        "exports": len(list(work.rglob("graph_encoder.safetensors"))) - len(list(root.glob("alignment/*"))),
        "export_config": {"lm": (cfg.get("lm") or {}).get("id"), "lm_dtype": (cfg.get("lm") or {}).get("load_dtype"),
                          "construction_llm": (cfg.get("construction_llm") or {}).get("base_url"),
                          "num_graph_tokens": (cfg.get("graph_token") or {}).get("num_graph_tokens"),
                          "enable_thinking": ((cfg.get("answer") or {}).get("prompt") or {}).get("enable_thinking")},
        "seconds": metrics.get("seconds"),
    }


def tensorboard_history(root: Path) -> tuple[list[tuple[int, float]], int | None]:
    """Every validation's ``val/nll`` (step, value) and the epochs trained (``train/nll_epoch`` points), from
    the TensorBoard logs."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs = sorted(root.glob("lightning_logs/version_*"))
    if not runs:
        return [], None
    events = EventAccumulator(str(runs[-1]))
    events.Reload()
    tags = events.Tags()["scalars"]
    history = [(e.step, round(e.value, 6)) for e in events.Scalars("val/nll")] if "val/nll" in tags else []
    epochs = len(events.Scalars("train/nll_epoch")) if "train/nll_epoch" in tags else None
    return history, epochs


def serve_one(export: Path, work: Path, env: dict[str, str]) -> dict[str, Any]:
    port = free_port()
    err = open(work / "logs" / "serve.log", "a")
    proc = subprocess.Popen([sys.executable, "-m", "qgmem", "serve", "--export", str(export), "--port", str(port),
                             "--store", f"sqlite:///{work / 'memories' / 'memories.db'}", "--device", "cpu"],
                            env=env, start_new_session=True, stdout=err, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 240
        while True:
            if proc.poll() is not None:
                return {"ok": False, "why": f"serve exited {proc.returncode}; see logs/serve.log"}
            try:
                urllib.request.urlopen(base + "/healthz", timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    return {"ok": False, "why": "serve did not start"}
                time.sleep(0.5)
        turns = [{"speaker": "User", "text": "I mark hot leads in red and warm leads in orange."},
                 {"speaker": "Assistant", "text": "Got it: red for hot leads, orange for warm ones."}]
        added = http_json(base + "/v1/users/ana/sessions", {"turns": turns})
        answer = http_json(base + "/v1/users/ana/answer", {"question": "Which color marks hot leads?"})
        return {"ok": isinstance(answer.get("answer"), str), "units_added": added.get("units_added"),
                "answer": str(answer.get("answer"))[:80], "memory_entries": len(answer.get("memory") or [])}
    except Exception as exc:  # noqa: BLE001 - the rehearsal reports what broke
        return {"ok": False, "why": f"{type(exc).__name__}: {str(exc)[:300]}"}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            kill_tree(proc)


def eval_qa(export: Path, work: Path, env: dict[str, str], port: int, log: Path, limit: int) -> dict[str, Any]:
    out = work / "eval-qa"
    rc, _, _ = run([sys.executable, "-m", "qgmem", "eval-qa", "--export", str(export), "--dataset", "convomem",
                    "--path", str(REPO / "data" / "convomem"), "--split", "all", "--limit", str(limit), "--graph-modes", "token",
                    "--out", str(out), "--json", "--device", "cpu"], env, log, check=False)
    results = out / "results.json"
    if rc != 0 or not results.exists():
        return {"ok": False, "exit": rc}
    data = json.loads(results.read_text())
    activation = (json.loads((export / "config.json").read_text()).get("answer") or {}).get("activation") or {}
    overall = next((r for r in data.get("table") or [] if r.get("category") == "all"), {})
    return {"ok": True, "questions": data.get("questions"), "judged": overall.get("judged"),
            "accuracy": overall.get("accuracy"), "errors": overall.get("errors"),
            "reranker": activation.get("reranker"), "reranker_path": Path(str(activation.get("reranker_path"))).name,
            "seconds_per_question": round((overall.get("seconds") or {}).get("total") or 0.0, 2)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", required=True, help="the rehearsal's folder (models, caches, run, logs)")
    p.add_argument("--cases", type=int, default=24, help="ConvoMem cases (data.num_cases)")
    p.add_argument("--epochs", type=int, default=None, help="trainer.max_epochs (default: the preset's)")
    p.add_argument("--model-share", type=int, default=256, help="1 in N construction windows go to SmolLM2")
    p.add_argument("--kill-after", type=int, default=40, help="kill the server after N construction requests (0: never)")
    p.add_argument("--eval-limit", type=int, default=10, help="questions qgmem eval-qa scores")
    p.add_argument("--server-lm", choices=["smollm2", "random"], default="smollm2",
                   help="the model behind the LLM server: the embedded SmolLM2, or the random Qwen3 LM (a quicker check)")
    p.add_argument("--fresh", action="store_true", help="remove --work first")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a terminated rehearsal still stops its children
    result = rehearse(args)
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
