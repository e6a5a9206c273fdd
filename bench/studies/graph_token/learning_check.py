"""Learning check: what does the trained graph token add to answers? (paired, multi-seed protocol)

Each setting trains the graph encoder once per seed on the usable QAs of the data set
(configs/default.yaml's data and model settings; all cases, splits grouped as the data module does).
A seed fixes the initialisation, dropout, the training data order and the alignment stage's order.
The same trained weights are then scored on the held-out split under every condition of
:mod:`qgmem.evaluation.protocol` (own, ablated, shuffled, norel, none); the text of the prompt is the
same in all of them, only the graph changes. Settings (``--protocol``):

- ``text-graph``: the product's prompt (textual working memory + graph tokens), full memory;
- ``graph-only``: no textual working memory (a diagnostic: the graph is the only evidence);
- ``budget``: text+graph with the prompt's text cut to the top ``m`` working-memory units for each
  ``--memory-units m`` while the graph keeps all k (the context-budget sweep; a diagnostic);
- ``lora``: text+graph with LoRA (``--lora-r``, attention projections) trained with graph tokens and,
  at the same rank, without them; the figure is LoRA+graph (own) − LoRA-only, paired per sample and seed;
- ``both``: text-graph and graph-only.

Every contrast has a hierarchical bootstrap interval of the crossed design (seeds, and the dialogues
once for all drawn seeds: every seed scores the same samples) and per-seed figures. The untrained node-word probe (``bench/studies/graph_token/node_word_probe.py``: the LM's own word
embeddings of the node texts as soft tokens) is scored beside every setting, on the same split and
conditions, as the baseline a trained model must beat. Each seed's results are written to ``--root``
and reused by a rerun with the same settings. The last line printed is one JSON object::

    python -m bench.studies.graph_token.learning_check --protocol budget --memory-units 1 3 --root checkpoints/learning-check

Choose settings with ``--split val``; score a configuration on ``test`` only once it is named in
docs/BENCHMARKS.md.
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

from bench.common import REPO, ci
PROTOCOL_VERSION = 2  # 2: ablated/norel conditions, order seeds, hierarchical bootstrap (the seeds' scores do not depend on it)
CONTRAST_KEYS = ("own_vs_ablated", "own_vs_none", "own_vs_shuffled", "own_vs_norel", "own_vs_sham", "sham_vs_ablated")
#: optimizer steps per setting: graph-only and budget prompts are shorter, so the same wall time buys more
DEFAULT_STEPS = {"graph-only": 100, "text-graph": 60, "budget": 60, "lora": 60}
DEFAULT_SEEDS = [0, 1, 2, 3, 4]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--protocol", choices=["both", "text-graph", "graph-only", "budget", "lora"], default="both")
    p.add_argument("--root", default="checkpoints/learning-check", help="where each seed's results go")
    p.add_argument("--config", default=str(REPO / "configs" / "default.yaml"), help="data/model settings to start from")
    p.add_argument("--seeds", type=int, nargs="+", default=DEFAULT_SEEDS)
    p.add_argument("--memory-units", type=int, nargs="+", default=[0, 1, 3, 10],
                   help="budget sweep: text entries kept in the prompt (the graph keeps all k)")
    p.add_argument("--num-cases", type=int, default=None, help="cases to sample (default: all)")
    p.add_argument("--cache-dir", default=None, help="data cache (default: the config's)")
    p.add_argument("--split", choices=["val", "test"], default="val",
                   help="held-out split to score: val to choose settings; test only for a configuration named in docs first")
    p.add_argument("--conditions", nargs="+", default=["own", "ablated", "sham", "shuffled", "norel", "none"])
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per setting (default: per setting)")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--features", default=None, help="model.features (default: the config's)")
    p.add_argument("--readout", default=None, help="model.readout (default: the config's)")
    p.add_argument("--num-graph-tokens", type=int, default=None)
    p.add_argument("--align-steps", type=int, default=None,
                   help="the NodeWordAlignment stage's steps (default: the config's stages)")
    p.add_argument("--align-weight", type=float, default=None,
                   help="the NodeWordAlignment stage's weight (default: the config's stages)")
    p.add_argument("--lora-r", type=int, default=8, help="--protocol lora: adapter rank (q/k/v/o projections)")
    p.add_argument("--max-prompt-tokens", type=int, default=None)
    p.add_argument("--generate", nargs="*", default=[], help="conditions whose greedy answers are scored for EM/F1")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--probe", action=argparse.BooleanOptionalAction, default=True,
                   help="score the untrained node-word probe beside each setting")
    p.add_argument("--n-boot", type=int, default=10_000)
    p.add_argument("--threads", type=int, default=2)
    return p.parse_args(argv)


def load_config(path: str) -> dict[str, Any]:
    import yaml

    return yaml.safe_load(Path(path).read_text())


def settings_of(args) -> list[tuple[str, dict[str, Any]]]:
    """``[(name, overrides)]``: the runs a protocol consists of (overrides of data/model settings)."""
    if args.protocol == "both":
        return [("text-graph", {}), ("graph-only", {"graph_only": True})]
    if args.protocol == "graph-only":
        return [("graph-only", {"graph_only": True})]
    if args.protocol == "budget":
        return [(f"budget-m{m}", {"memory_units": m}) for m in args.memory_units]
    if args.protocol == "lora":
        lora = {"r": args.lora_r, "alpha": 2 * args.lora_r, "dropout": 0.0,
                "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
        return [("lora-graph", {"lora": lora}), ("lora-only", {"lora": lora, "graph_mode": "none"})]
    return [("text-graph", {})]


def kind_of(name: str) -> str:
    return "budget" if name.startswith("budget") else "lora" if name.startswith("lora") else name


WORDS = "qgmem.training.stages.NodeWordAlignment"


def with_word_stage(stages: list[dict[str, Any]] | None, steps: int | None,
                    weight: float | None) -> list[dict[str, Any]]:
    """``stages`` (records; ``None``: the module's default, the word stage alone) with the word stage's
    ``steps`` and ``weight`` set where given; left out when both end at 0."""
    stages = [dict(s) for s in (stages if stages is not None else [{"class_path": WORDS}])]
    words = next((s for s in stages if s["class_path"].rsplit(".", 1)[-1] == "NodeWordAlignment"), None)
    if words is None:
        words = {"class_path": WORDS}
        stages.append(words)
    words["init_args"] = {**(words.get("init_args") or {}),
                          **{k: v for k, v in (("steps", steps), ("weight", weight)) if v is not None}}
    from qgmem.training.stages import as_stage

    word = as_stage(words)
    if word.steps == 0 and word.weight == 0:
        stages.remove(words)
    return stages


def build_run(args, cfg: dict[str, Any], name: str, overrides: dict[str, Any]):
    data_cfg = dict(cfg.get("data") or {})
    model_cfg = dict(cfg.get("model") or {})
    data_cfg.update(num_cases=args.num_cases, answer_filter="none", graph_only=bool(overrides.get("graph_only")),
                    memory_units=overrides.get("memory_units"))
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
                       ("readout", args.readout), ("num_graph_tokens", args.num_graph_tokens)):
        if value is not None:
            model_cfg[key] = value
    if args.align_steps is not None or args.align_weight is not None:
        model_cfg["stages"] = with_word_stage(model_cfg.get("stages"), args.align_steps, args.align_weight)
    model_cfg.update(graph_mode=overrides.get("graph_mode", "token"),
                     generation={**(model_cfg.get("generation") or {}), "max_new_tokens": args.max_new_tokens})
    if "lora" in overrides:
        model_cfg["lora"] = overrides["lora"]
    if model_cfg["graph_mode"] == "none":  # nothing of the graph network is trained or scored
        model_cfg["stages"] = []
    if data_cfg.get("lm") is None:  # linked from model.lm, as LightningCLI does (the signature when unset)
        data_cfg["lm"] = model_cfg.get("lm") or module_default("lm")
    conditions = ["none"] if model_cfg["graph_mode"] == "none" else list(args.conditions)
    steps = args.steps or DEFAULT_STEPS[kind_of(name)]
    trainer_cfg = cfg.get("trainer") or {}
    spec = {"protocol": PROTOCOL_VERSION, "setting": name, "data": data_cfg, "model": model_cfg, "steps": steps,
            "split": args.split, "conditions": sorted(conditions), "generate": sorted(args.generate),
            "clip": trainer_cfg.get("gradient_clip_val"), "precision": trainer_cfg.get("precision", "32-true")}
    return data_cfg, model_cfg, trainer_cfg, steps, conditions, spec


def run_setting(args, cfg: dict[str, Any], name: str, overrides: dict[str, Any]) -> dict[str, Any]:
    data_cfg, model_cfg, trainer_cfg, steps, conditions, spec = build_run(args, cfg, name, overrides)
    from qgmem.evaluation import counterfactuals as CF
    from qgmem.evaluation.study_data import StudyDataModule

    t0 = time.perf_counter()
    dm = StudyDataModule(**data_cfg)
    dm.prepare_data()
    dm.setup()
    table = {r["qa_id"]: r for r in CF.build(dm.cache_spec).load()}  # the ablated and sham graphs, by question
    counterfactuals = {q: CF.to_item(r) for q, r in table.items()}
    spec["cache_key"] = dm.cache_key
    spec_key = hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:12]
    out = Path(args.root) / name / spec_key
    out.mkdir(parents=True, exist_ok=True)
    (out / "spec.json").write_text(json.dumps(spec, indent=2, default=str) + "\n")
    data_s = time.perf_counter() - t0
    items, groups, left_out = usable(dm.split(args.split))
    train_n = len(dm.split("train"))
    tokens = prompt_tokens(dm, items, model_cfg)
    print(f"[{name}] cache {dm.cache_key}: {train_n} train samples, {len(items)} {args.split} samples "
          f"({left_out} rubric samples left out), {steps} steps of {dm.batch_size}; prompt text "
          f"{tokens['prompt_tokens']:.0f} tokens (memory {tokens['memory_tokens']:.0f})", flush=True)
    runs, seeds_info = [], []
    for seed in args.seeds:
        path = out / f"seed-{seed}.json"
        if path.exists():
            result = json.loads(path.read_text())
            print(f"[{name}] seed {seed}: reused {path}", flush=True)
        else:
            result = train_and_score(dm, model_cfg, trainer_cfg, steps, seed, items, groups, conditions, args,
                                     root=out / f"seed-{seed}", counterfactuals=counterfactuals)
            path.write_text(json.dumps(result, default=str) + "\n")
            print(f"[{name}] seed {seed}: train {result['train_s']:.0f} s, score {result['score_s']:.0f} s, "
                  f"load {result['load_start']:.1f}->{result['load_end']:.1f}; mean NLL "
                  + ", ".join(f"{c} {mean_of(v):.3f}" for c, v in result["scores"]["nll"].items()), flush=True)
        runs.append(result)
        seeds_info.append({k: result[k] for k in ("seed", "train_s", "score_s", "load_start", "load_end",
                                                   "final_train_nll", "pairing")})
    from qgmem.evaluation.protocol import SampleScores, summarize

    scores = [SampleScores.from_dict(r["scores"]) for r in runs]
    summary = summarize(scores, n_boot=args.n_boot)
    summary.update(setting=name, results=str(out), cache_key=dm.cache_key, train_samples=train_n,
                   split=args.split, rubric_left_out=left_out, steps=steps, batch_size=dm.batch_size,
                   lr=((model_cfg.get("optimizer") or {}).get("init_args") or {}).get("lr", module_default("lr")),
                   features=model_cfg.get("features", module_default("features")),
                   readout=model_cfg.get("readout", module_default("readout")),
                   num_graph_tokens=model_cfg.get("num_graph_tokens", module_default("num_graph_tokens")),
                   memory_units=overrides.get("memory_units"), seed_list=list(args.seeds), seed_runs=seeds_info,
                   data_s=round(data_s, 1), ablation=ablation_counts(dm.split(args.split), table), **tokens)
    summary["_scores"] = [s.to_dict() for s in scores]
    if args.probe and model_cfg["graph_mode"] != "none":
        probe_path = out / "probe.json"
        if probe_path.exists():
            summary["probe"] = json.loads(probe_path.read_text())
        else:
            summary["probe"] = run_probe(dm, items, groups, conditions, args, counterfactuals)
            probe_path.write_text(json.dumps(summary["probe"]) + "\n")
    (out / "summary.json").write_text(json.dumps({k: v for k, v in summary.items() if k != "_scores"}, indent=2) + "\n")
    return summary


def mean_of(values) -> float:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else float("nan")


def prompt_tokens(dm, items, model_cfg) -> dict[str, float]:
    """Mean text tokens of the prompt and of its memory part over ``items``, plus the graph tokens' count."""
    from qgmem.prompting.contract import first_entries

    enc = dm.collator.encoder
    encoded = [enc.prompt(it["memory_text"], it["question"]) for it in items]
    k = 0 if model_cfg.get("graph_mode") == "none" else int(model_cfg.get("num_graph_tokens", module_default("num_graph_tokens")))
    whole = []  # entries [M1]..[Mj] that fit in the prompt's memory text whole (what a budget of m amounts to)
    for it, e in zip(items, encoded):
        text = first_entries(it["memory_text"], enc.settings.memory_units)
        j = 0
        while first_entries(text, j + 1) != first_entries(text, j) and \
                len(enc._ids(first_entries(text, j + 1).strip())) <= e.memory_tokens:
            j += 1
        whole.append(j)
    n = max(1, len(encoded))
    return {"prompt_tokens": sum(len(e.ids) for e in encoded) / n, "memory_tokens": sum(e.memory_tokens for e in encoded) / n,
            "prompt_graph_tokens": k, "entries_whole": sum(whole) / n}


def ablation_counts(split, table: dict[str, dict[str, Any]]) -> dict[str, int]:
    """What the evidence ablation did on the usable samples of ``split`` (``table``: the counterfactual
    table's rows by question id, :mod:`qgmem.evaluation.counterfactuals`)."""
    from qgmem.samples.answer_filter import RUBRIC_CATEGORIES

    counts = {"ablated": 0, "no_gold_evidence": 0, "no_evidence_unit_in_store": 0, "ablated_graph_unchanged": 0,
              "own_graph_without_evidence_unit": 0, "lose_all_evidence_nodes": 0, "keep_some_through_other_units": 0}
    for i in range(len(split)):
        if split.row(i)["category"] in RUBRIC_CATEGORIES:
            continue
        row = table[split.row(i)["qa_id"]]
        if not row.get("ablated"):
            counts[row.get("ablation_status") or "no_gold_evidence"] += 1
            continue
        counts["ablated"] += 1
        if not row["memory_evidence_units"]:
            counts["own_graph_without_evidence_unit"] += 1
        elif row["evidence_nodes_kept"]:
            counts["keep_some_through_other_units"] += 1
        else:
            counts["lose_all_evidence_nodes"] += 1
    return counts


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


def train_and_score(dm, model_cfg, trainer_cfg, steps, seed, items, groups, conditions, args,
                    root: Path, counterfactuals: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """One seed: initialisation, dropout, data order and alignment order all follow ``seed``.

    ``root``: the seed's folder (the alignment stage saves its weights there, not in the working folder).
    """
    import torch
    from lightning.pytorch import Trainer, seed_everything

    from qgmem.training.module import QGMemModule
    from qgmem.evaluation.protocol import score_conditions

    load_start = os.getloadavg()[0]
    seed_everything(seed, verbose=False)
    dm.order_seed = seed  # the training order and the alignment stage's order
    module = QGMemModule(**{**model_cfg, "feature_dim": dm.feature_dim})
    accelerator = trainer_cfg.get("accelerator", "cpu")
    trainer = Trainer(accelerator=accelerator, devices=1, max_steps=steps, max_epochs=-1, logger=False,
                      default_root_dir=str(root),
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      limit_val_batches=0, num_sanity_val_steps=0, log_every_n_steps=max(1, steps // 10),
                      gradient_clip_val=trainer_cfg.get("gradient_clip_val"),
                      precision=trainer_cfg.get("precision", "32-true"),
                      callbacks=[progress_callback(max(1, steps // 6), f"seed {seed}")])
    t = time.perf_counter()
    trainer.fit(module, datamodule=dm)
    train_s = time.perf_counter() - t
    final = trainer.callback_metrics.get("train/nll_epoch", trainer.callback_metrics.get("train/nll"))
    if not all(torch.isfinite(p).all() for p in module.parameters() if p.requires_grad):
        raise FloatingPointError(f"seed {seed}: non-finite trained weights after training")
    if accelerator in ("gpu", "cuda", "auto") and torch.cuda.is_available():
        module.to("cuda")  # Lightning hands the module back on the CPU after fit
    t = time.perf_counter()
    scores, pairing = score_conditions(module, items, dm.collator, groups=groups, batch_size=dm.eval_batch_size,
                                       seed=seed, generate=[g for g in args.generate if g in conditions],
                                       conditions=conditions, counterfactuals=counterfactuals)
    return {"seed": seed, "scores": scores.to_dict(), "pairing": pairing, "train_s": round(train_s, 1),
            "score_s": round(time.perf_counter() - t, 1), "final_train_nll": None if final is None else float(final),
            "load_start": load_start, "load_end": os.getloadavg()[0]}


def run_probe(dm, items, groups, conditions, args, counterfactuals) -> dict[str, Any]:
    """The untrained node-word probe on the same items, prompt and conditions (one deterministic run)."""
    from qgmem.evaluation.protocol import summarize

    from bench.studies.graph_token.node_word_probe import probe_scores

    t = time.perf_counter()
    scores = probe_scores(dm, items, groups, conditions=[c for c in conditions if c != "norel"],
                          counterfactuals=counterfactuals)
    s = summarize([scores], n_boot=args.n_boot)
    return {"nll": s["nll"], **{k: {"mean": s[k]["mean"], "ci95": s[k]["ci95"]} for k in CONTRAST_KEYS if k in s},
            "wall_s": round(time.perf_counter() - t, 1)}


def fmt(x: float | None, signed: bool = False) -> str:
    return "-" if x is None else (f"{x:+.3f}" if signed else f"{x:.3f}")


def print_tables(name: str, s: dict[str, Any]) -> None:
    print(f"\n### {name}: {s['n']} {s['split']} samples, {s['seeds']} seeds, {s['train_samples']} train samples, "
          f"{s['steps']} steps of {s['batch_size']}, lr {s['lr']}, features `{s['features']}`, readout "
          f"`{s['readout']}` (K={s['num_graph_tokens']}); prompt text {s['prompt_tokens']:.0f} tokens, memory "
          f"{s['memory_tokens']:.0f}, entries kept whole {s['entries_whole']:.1f}\n")
    print("| condition | answer NLL | EM | F1 |\n| --- | --- | --- | --- |")
    for c, v in s["nll"].items():
        em = s["em_f1"].get(c, {})
        print(f"| {c} | {fmt(v)} | {fmt(em.get('em'))} | {fmt(em.get('f1'))} |")
    cats = sorted(s["per_category_n"])
    print("\n| paired NLL difference (95 % CI) | all | per seed | " + " | ".join(
        f"{c} (n={s['per_category_n'][c]})" for c in cats) + " |\n| --- | --- | --- |" + " --- |" * len(cats))
    for key in CONTRAST_KEYS:
        if key in s and s[key]["mean"] is not None:
            r = s[key]
            print(f"| {key.replace('_', ' ')} (n={r['n']}) | {ci(r)} | "
                  + ", ".join(fmt(x, True) for x in r["per_seed_mean"]) + " | "
                  + " | ".join(ci(r["per_category"][c]) for c in cats) + " |")
    if "probe" in s:
        p = s["probe"]
        print("\nuntrained node-word probe: NLL " + ", ".join(f"{c} {fmt(v)}" for c, v in p["nll"].items()) + "; "
              + "; ".join(f"{k.replace('_', ' ')} {ci(p[k])}" for k in CONTRAST_KEYS if k in p))
    print("ablation: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in s["ablation"].items()))
    pairing = s["seed_runs"][0]["pairing"]
    print(f"graphs: {pairing['distinct_graphs']} distinct of {pairing['samples']}, {pairing['samples_in_ties']} in ties; "
          f"with an ablated graph: {pairing.get('with_ablated_graph')}")
    walls = [(r["train_s"] + r["score_s"]) for r in s["seed_runs"]]
    print(f"wall per seed (train + score): {', '.join(f'{w:.0f} s' for w in walls)}; load average "
          + ", ".join(f"{r['load_start']:.1f}->{r['load_end']:.1f}" for r in s["seed_runs"]))


def brief(s: dict[str, Any]) -> dict[str, Any]:
    """The JSON entry of one setting: contrasts with intervals, per-seed figures, NLL, tokens."""
    out: dict[str, Any] = {k: {"mean": s[k]["mean"], "ci95": s[k]["ci95"], "n": s[k]["n"]}
                           for k in CONTRAST_KEYS if k in s}
    out["per_seed"] = [{"seed": seed, **{k: s[k]["per_seed"][i] for k in CONTRAST_KEYS if k in s}}
                       for i, seed in enumerate(s["seed_list"])]
    out.update(nll=s["nll"], nll_per_seed=s["nll_per_seed"], em_f1={c: {"em": v["em"], "f1": v["f1"]} for c, v in s["em_f1"].items()},
               per_category={k: {c: {"mean": v["mean"], "ci95": v["ci95"]} for c, v in s[k]["per_category"].items()}
                             for k in CONTRAST_KEYS if k in s},
               prompt_tokens=round(s["prompt_tokens"], 1), memory_tokens=round(s["memory_tokens"], 1),
               entries_whole=round(s["entries_whole"], 2),
               prompt_graph_tokens=s["prompt_graph_tokens"], steps=s["steps"], cache_key=s["cache_key"], results=s["results"],
               ablation=s["ablation"])
    if "probe" in s:
        out["probe"] = s["probe"]
    return out


def lora_contrast(graph: dict[str, Any], only: dict[str, Any], n_boot: int) -> dict[str, Any]:
    """LoRA+graph (own) − LoRA-only, paired per sample and seed (seed i of one with seed i of the other)."""
    import numpy as np

    from qgmem.evaluation.protocol import hierarchical_bootstrap

    a = np.asarray([[np.nan if v is None else v for v in r["nll"]["own"]] for r in graph["_scores"]])
    b = np.asarray([[np.nan if v is None else v for v in r["nll"]["none"]] for r in only["_scores"]])
    r = hierarchical_bootstrap(a - b, graph["_scores"][0]["group"], design="crossed", n_boot=n_boot)
    return {"mean": r["mean"], "ci95": r["ci95"], "per_seed": r["per_seed"],
            "nll": {"lora_graph_own": graph["nll"].get("own"), "lora_only": only["nll"].get("none")}}


def target_met(entry: dict[str, Any]) -> bool:
    """The budget target at one m: own beats none and ablated, each whole 95 % interval below zero."""
    return all(entry.get(k, {}).get("ci95", [None, None])[1] is not None and entry[k]["ci95"][1] < 0
               for k in ("own_vs_none", "own_vs_ablated"))


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    cfg = load_config(args.config)
    started, load = time.perf_counter(), os.getloadavg()[0]
    summaries = {}
    for name, overrides in settings_of(args):
        summaries[name] = run_setting(args, cfg, name, overrides)
        print_tables(name, summaries[name])
    final: dict[str, Any] = {}
    for name, s in summaries.items():
        if name == "text-graph":
            final["text_graph"] = brief(s)
        elif name == "graph-only":
            final["graph_only"] = brief(s)
        elif name.startswith("budget"):
            entry = brief(s)
            entry["target_met"] = target_met(entry) if s.get("memory_units") else None
            final.setdefault("budget", {})[str(s["memory_units"])] = entry
        elif name == "lora-graph":
            final["lora"] = {"graph": brief(s), "lora_only": brief(summaries["lora-only"]),
                             "graph_vs_lora_only": lora_contrast(s, summaries["lora-only"], args.n_boot)}
    if "budget" in final:
        final["budget_target_met"] = any(e["target_met"] for m, e in final["budget"].items() if m in ("1", "3"))
    first = next(iter(summaries.values()))
    final.update(seeds=len(args.seeds), seed_list=list(args.seeds), n_test=first["n"], split=args.split,
                 train_samples=first["train_samples"], wall_s=round(time.perf_counter() - started, 1),
                 load_start=load, load_end=os.getloadavg()[0], cpu_threads=args.threads)
    print(json.dumps(final))
    return 0


if __name__ == "__main__":
    sys.exit(main())
