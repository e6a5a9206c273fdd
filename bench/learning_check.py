"""Learning check: does the trained graph token carry sample-specific evidence? (paired, multi-seed protocol)

Two settings, each trained once per seed on the usable QAs of the data set (configs/default.yaml's data
and model settings; all cases, splits grouped as the data module does):

- ``graph-only``: the prompt has no textual working memory, so the graph token is the only evidence;
- ``text-graph``: the paper's prompt (textual working memory + graph token).

Each seed's trained weights are evaluated on the held-out split three ways: the sample's own token, a
shuffled token (another sample's graph, never an identical one) and no token. The figure is the paired
per-sample difference in answer NLL (own − shuffled, own − none), seed-averaged per sample, with a 95 %
bootstrap interval over dialogues; also per category, plus EM/F1 of greedy answers. Every seed's results
are written to ``--root`` and reused by a rerun with the same settings. The model is the config's
(``configs/default.yaml``: node tokens with the alignment stage); ``--features text --readout mean
--num-queries 1 --align-steps 0 --align-weight 0`` is the paper's. The last line printed is one
JSON object::

    python bench/learning_check.py --protocol graph-only --root checkpoints/learning-check
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

SETTINGS = {"graph-only": True, "text-graph": False}  # name -> graph_only
KEYS = {"graph-only": "graph_only", "text-graph": "text_graph"}
REPO = Path(__file__).resolve().parents[1]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--protocol", choices=["both", *SETTINGS], default="both", help="which settings to run")
    p.add_argument("--root", default="checkpoints/learning-check", help="where each seed's results go")
    p.add_argument("--config", default=str(REPO / "configs" / "default.yaml"), help="data/model settings to start from")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--num-cases", type=int, default=None, help="cases to sample (default: all)")
    p.add_argument("--cache-dir", default=None, help="data cache (default: the config's)")
    p.add_argument("--split", choices=["val", "test"], default="test", help="held-out split to score (tune on val)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per setting (default: per setting)")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--features", default=None, help="model.features (default: the config's)")
    p.add_argument("--readout", default=None, help="model.readout (default: the config's)")
    p.add_argument("--num-queries", type=int, default=None)
    p.add_argument("--align-steps", type=int, default=None, help="model.align_steps (default: the config's)")
    p.add_argument("--align-weight", type=float, default=None, help="model.align_weight (default: the config's)")
    p.add_argument("--max-prompt-tokens", type=int, default=None)
    p.add_argument("--generate", nargs="*", default=["own", "shuffled", "none"],
                   help="conditions whose greedy answers are scored for EM/F1")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--n-boot", type=int, default=10_000)
    p.add_argument("--threads", type=int, default=2)
    return p.parse_args(argv)


# steps per setting: graph-only prompts are ~4x shorter, so the same wall time buys more steps
DEFAULT_STEPS = {"graph-only": 100, "text-graph": 60}


def load_config(path: str) -> dict[str, Any]:
    import yaml

    return yaml.safe_load(Path(path).read_text())


def run_settings(args, cfg: dict[str, Any], setting: str) -> dict[str, Any]:
    data_cfg = dict(cfg.get("data") or {})
    model_cfg = dict(cfg.get("model") or {})
    data_cfg.update(num_cases=args.num_cases, answer_filter="none", graph_only=SETTINGS[setting])
    if args.cache_dir:
        data_cfg["cache_dir"] = args.cache_dir
    if args.batch_size:
        data_cfg["batch_size"] = args.batch_size
    if args.max_prompt_tokens:
        data_cfg["max_prompt_tokens"] = args.max_prompt_tokens
    # the preset's --optimizer / --lr_scheduler (class_path + init_args) go to the model, as in train.py
    for key in ("optimizer", "lr_scheduler"):
        if cfg.get(key):
            model_cfg[key] = json.loads(json.dumps(cfg[key]))
    if args.lr is not None:
        model_cfg["optimizer"] = {"class_path": "torch.optim.AdamW", "init_args": {"lr": args.lr}}
    if args.warmup is not None:
        model_cfg["lr_scheduler"] = {"class_path": "qgmem.training.schedule.WarmupCosine",
                                     "init_args": {"warmup_steps": args.warmup}}
    for key, value in (("features", args.features),
                       ("readout", args.readout), ("num_queries", args.num_queries),
                       ("align_steps", args.align_steps), ("align_weight", args.align_weight)):
        if value is not None:
            model_cfg[key] = value
    model_cfg.update(graph="token", max_new_tokens=args.max_new_tokens)
    data_cfg.setdefault("lm", model_cfg.get("lm"))
    steps = args.steps or DEFAULT_STEPS[setting]
    trainer_cfg = cfg.get("trainer") or {}
    spec = {"setting": setting, "data": data_cfg, "model": model_cfg, "steps": steps, "split": args.split,
            "generate": sorted(args.generate), "clip": trainer_cfg.get("gradient_clip_val"),
            "precision": trainer_cfg.get("precision", "32-true")}
    spec_key = hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:12]
    out = Path(args.root) / setting / spec_key
    out.mkdir(parents=True, exist_ok=True)
    (out / "spec.json").write_text(json.dumps(spec, indent=2, default=str) + "\n")

    from qgmem.training.datamodule import QGMemDataModule

    t0 = time.perf_counter()
    dm = QGMemDataModule(**data_cfg)
    dm.prepare_data()
    dm.setup()
    data_s = time.perf_counter() - t0
    items, groups, left_out = usable(dm.split(args.split))
    train_n = len(dm.split("train"))
    print(f"[{setting}] cache {dm.cache_key}: {train_n} train samples, {len(items)} {args.split} samples "
          f"({left_out} rubric samples left out), {steps} steps of {dm.batch_size}", flush=True)
    runs, seeds_info = [], []
    for seed in args.seeds:
        path = out / f"seed-{seed}.json"
        if path.exists():
            result = json.loads(path.read_text())
            print(f"[{setting}] seed {seed}: reused {path}", flush=True)
        else:
            result = train_and_score(dm, model_cfg, trainer_cfg, steps, seed, items, groups, args)
            path.write_text(json.dumps(result, default=str) + "\n")
            print(f"[{setting}] seed {seed}: train {result['train_s']:.0f} s, score {result['score_s']:.0f} s, "
                  f"load {result['load_start']:.1f}->{result['load_end']:.1f}; mean NLL "
                  + ", ".join(f"{c} {sum(v) / len(v):.3f}" for c, v in result["scores"]["nll"].items()), flush=True)
        runs.append(result)
        seeds_info.append({k: result[k] for k in ("seed", "train_s", "score_s", "load_start", "load_end",
                                                   "final_train_nll", "pairing")})
    from qgmem.training.protocol import SampleScores, summarize

    summary = summarize([SampleScores.from_dict(r["scores"]) for r in runs], n_boot=args.n_boot)
    summary.update(setting=setting, results=str(out), cache_key=dm.cache_key, train_samples=train_n,
                   split=args.split, rubric_left_out=left_out, steps=steps, batch_size=dm.batch_size,
                   lr=((model_cfg.get("optimizer") or {}).get("init_args") or {}).get("lr", module_default("lr")),
                   features=model_cfg.get("features", module_default("features")),
                   readout=model_cfg.get("readout", module_default("readout")),
                   num_queries=model_cfg.get("num_queries", module_default("num_queries")),
                   seed_runs=seeds_info, data_s=round(data_s, 1))
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def module_default(name: str) -> Any:
    """A model setting's default: ``QGMemModule``'s signature (``lr``: the default optimizer's)."""
    import inspect

    import torch

    from qgmem.training.module import QGMemModule

    if name == "lr":
        return inspect.signature(torch.optim.AdamW).parameters["lr"].default
    return inspect.signature(QGMemModule).parameters[name].default


def usable(split) -> tuple[list[dict[str, Any]], list[str], int]:
    """Items whose reference is an answer (rubric categories are left out), with their dialogue ids."""
    from qgmem.samples.answer_filter import RUBRIC_CATEGORIES

    items, groups, left_out = [], [], 0
    for i in range(len(split)):
        row = split.row(i)
        if row["category"] in RUBRIC_CATEGORIES:
            left_out += 1
            continue
        items.append(split[i])
        groups.append(row["dialogue_id"])
    return items, groups, left_out


def progress_callback(every: int, label: str):
    """Print the running training NLL every ``every`` steps (a bar is useless in a log file)."""
    from lightning.pytorch.callbacks import Callback

    class Progress(Callback):
        def __init__(self):
            self.started, self.losses = time.perf_counter(), []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            loss = outputs["loss"] if isinstance(outputs, dict) else outputs
            if loss is not None:
                self.losses.append(float(loss))
            step = trainer.global_step
            if step % every == 0 and self.losses:
                recent = self.losses[-every:]
                print(f"  [{label}] step {step}: train NLL {sum(recent) / len(recent):.3f} "
                      f"({time.perf_counter() - self.started:.0f} s)", flush=True)

    return Progress()


def train_and_score(dm, model_cfg, trainer_cfg, steps, seed, items, groups, args) -> dict[str, Any]:
    import torch
    from lightning.pytorch import Trainer, seed_everything

    from qgmem.training.module import QGMemModule
    from qgmem.training.protocol import score_conditions

    load_start = os.getloadavg()[0]
    seed_everything(seed, verbose=False)
    module = QGMemModule(**{**model_cfg, "feature_dim": dm.feature_dim})
    accelerator = trainer_cfg.get("accelerator", "cpu")
    trainer = Trainer(accelerator=accelerator, devices=1, max_steps=steps, max_epochs=-1, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      limit_val_batches=0, num_sanity_val_steps=0, log_every_n_steps=max(1, steps // 10),
                      gradient_clip_val=trainer_cfg.get("gradient_clip_val"),
                      precision=trainer_cfg.get("precision", "32-true"),
                      callbacks=[progress_callback(max(1, steps // 6), f"seed {seed}")])
    t = time.perf_counter()
    trainer.fit(module, train_dataloaders=dm.train_dataloader())
    train_s = time.perf_counter() - t
    final = trainer.callback_metrics.get("train/nll_epoch", trainer.callback_metrics.get("train/nll"))
    if not all(torch.isfinite(p).all() for p in module.net.parameters()):
        raise FloatingPointError(f"seed {seed}: non-finite graph-token weights after training")
    if accelerator in ("gpu", "cuda", "auto") and torch.cuda.is_available():
        module.to("cuda")  # Lightning hands the module back on the CPU after fit
    t = time.perf_counter()
    scores, pairing = score_conditions(module, items, dm.collator, groups=groups, batch_size=dm.eval_batch_size,
                                       seed=seed, generate=args.generate)
    return {"seed": seed, "scores": scores.to_dict(), "pairing": pairing, "train_s": round(train_s, 1),
            "score_s": round(time.perf_counter() - t, 1), "final_train_nll": None if final is None else float(final),
            "load_start": load_start, "load_end": os.getloadavg()[0]}


def fmt(x: float | None, signed: bool = False) -> str:
    return "-" if x is None else (f"{x:+.3f}" if signed else f"{x:.3f}")


def ci(result: dict[str, Any]) -> str:
    lo, hi = result["ci95"]
    return f"{fmt(result['mean'], True)} [{fmt(lo, True)}, {fmt(hi, True)}]"


def print_tables(name: str, s: dict[str, Any]) -> None:
    print(f"\n### {name}: {s['n']} {s['split']} samples, {s['seeds']} seeds, {s['train_samples']} train samples, "
          f"{s['steps']} steps of {s['batch_size']}, lr {s['lr']}, features `{s['features']}`, readout "
          f"`{s['readout']}` (K={s['num_queries']})\n")
    print("| condition | answer NLL | EM | F1 |\n| --- | --- | --- | --- |")
    for c, v in s["nll"].items():
        em = s["em_f1"].get(c, {})
        print(f"| {c} | {v:.3f} | {fmt(em.get('em'))} | {fmt(em.get('f1'))} |")
    cats = sorted(s["per_category_n"])
    print("\n| paired NLL difference (95 % CI) | all | " + " | ".join(f"{c} (n={s['per_category_n'][c]})" for c in cats)
          + " |\n| --- | --- |" + " --- |" * len(cats))
    for key in ("token_vs_shuffled", "token_vs_none"):
        if key in s:
            r = s[key]
            print(f"| {key.replace('_', ' ')} | {ci(r)} | " + " | ".join(ci(r["per_category"][c]) for c in cats) + " |")
    print("\nper seed (own − shuffled): " + ", ".join(fmt(x, True) for x in s["token_vs_shuffled"]["per_seed_mean"]))
    p = s["seed_runs"][0]["pairing"]
    print(f"graphs: {p['distinct_graphs']} distinct of {p['samples']}, {p['samples_in_ties']} samples in ties "
          f"(largest {p['largest_tie']}); shuffled partners with an identical graph: {p['shuffled_same_graph']}")
    walls = [(r["train_s"] + r["score_s"]) for r in s["seed_runs"]]
    print(f"wall per seed (train + score): {', '.join(f'{w:.0f} s' for w in walls)}; load average "
          + ", ".join(f"{r['load_start']:.1f}->{r['load_end']:.1f}" for r in s["seed_runs"]))


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    cfg = load_config(args.config)
    settings = list(SETTINGS) if args.protocol == "both" else [args.protocol]
    started, load = time.perf_counter(), os.getloadavg()[0]
    summaries = {}
    for setting in settings:
        summaries[setting] = run_settings(args, cfg, setting)
        print_tables(setting, summaries[setting])
    final: dict[str, Any] = {}
    for setting, s in summaries.items():
        final[KEYS[setting]] = {k: {"mean": s[k]["mean"], "ci95": s[k]["ci95"],
                                    "per_category": {c: {"mean": v["mean"], "ci95": v["ci95"]}
                                                     for c, v in s[k]["per_category"].items()}}
                                for k in ("token_vs_shuffled", "token_vs_none") if k in s}
        final[KEYS[setting]].update(nll=s["nll"], em_f1={c: {"em": v["em"], "f1": v["f1"]} for c, v in s["em_f1"].items()},
                                    steps=s["steps"], results=s["results"])
    first = next(iter(summaries.values()))
    final.update(seeds=len(args.seeds), n_test=first["n"], split=args.split, train_samples=first["train_samples"],
                 wall_s=round(time.perf_counter() - started, 1), load_start=load, load_end=os.getloadavg()[0],
                 cpu_threads=args.threads)
    print(json.dumps(final))
    return 0


if __name__ == "__main__":
    sys.exit(main())
