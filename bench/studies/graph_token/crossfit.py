"""Cross-fitted learning check: every usable ConvoMem question scored by models that never saw it.

The setting is the product's (configs/nodes10.yaml, the default until issue 63: model, prompt, budget, distractors, training steps and
checkpoint selection; today's default construction and activation). Stages, each resumable under
``--root`` (a cut-off run loses nothing that was recorded; a rerun picks up where it stopped):

1. **samples**: the ConvoMem cases are loaded with their evidence conversations only, split into
   ``--folds`` folds grouped by evidence conversation (:func:`qgmem.evaluation.crossfit.assign_folds`),
   given distractor conversations from their own fold or from no fold's evidence, checked for leaks
   (any: exit 2), then replayed (memory, activation, the ablated and sham graphs) one case at a time,
   each case's rows saved under ``ROOT/samples-KEY/``;
2. **runs**: per fold, variant and seed (in that order): train on the other folds (the next fold is the validation
   part: checkpoint selection on its answer NLL, as ``python train.py`` selects), then score the held-out
   fold under every condition, with greedy answers with and without graph tokens. One JSON per
   (variant, fold, seed) under ``ROOT/runs/VARIANT/``;
3. **summary**: the crossed bootstrap over the seed rows and the questions of the folds done for every
   seed. ``--out`` writes it as JSON; a markdown table is printed.

``--max-minutes`` ends the run at a piece's boundary when the next piece would not fit (estimated from
the last such piece of the same variant this process ran, else from the longest one recorded under
``ROOT/runs``, the variant's own if it has any). Two copies of one command (``--threads 1`` each, one per
core) share the units: a unit being run is locked (``fold-F-seed-S.lock``, taken over when its process
died). Variants: ``product`` and ``tdP-M`` (text dropout with probability P keeping the top M units,
e.g. ``td0.5-1``). The held-out folds are scored for the
configurations named in docs/graph_token.md before they ran::

    python -m bench.studies.graph_token.crossfit --root checkpoints/crossfit --variants product --seeds 0 1 --max-minutes 40 \\
        --out docs/results/crossfit_product.json

**The compact prompt at matched budgets** (docs/graph_token.md, *Compact prompt study at matched budgets*).
Variants named before any run, each with the prompt's text cut to the top m = 3 units (``data.memory_units``;
every condition, validation included; the product's prompt cap of 288 tokens, which holds 3 units whole for
most prompts, not all: each unit records how many of its held-out prompts were trimmed) and the
``summary_units`` readout (one graph token per working-memory unit after the pooled one, K = 1 + k_graph):

- ``m3-answer``: today's recipe: the node-word pre-stage (today's alignment settings) and answer CE;
- ``m3-full``: stage 1, reconstruction of memory entries from the graph tokens (the ``MemoryReconstruction``
  stage, :data:`RECONSTRUCT_STEPS` steps, in place of the word stage), then stage 2, answer CE +
  :data:`DISTILL_WEIGHT` × KL(teacher ‖ student) over the answer tokens (teacher: the frozen LM reading the
  full 10-unit text, its top-:data:`DISTILL_TOPK` logits cached under ``ROOT/teacher``);
- ``m3-recon``: stage 1 alone (λ = 0), if time allows;
- ``m3-full-k20``: the full recipe over a graph of k_graph = 20 units (K = 21), if time allows; its
  samples are built with ``data.activation.k: 20`` (a config of its own, so a samples folder of its
  own), and the command refuses it over the samples of k = 10.

**The deep reader** (docs/graph_token.md, *The deep reader*): the graph as keys and values at every layer
(``model.injection: kv_prefix``, :mod:`qgmem.model.kv_prefix`), K = 11 slots over the top 10 units, early
stopping as above, named before any run:

- ``kv3-answer``: text budget m = 3, answer CE alone (no stage 1: the word alignment fits input embeddings);
- ``kv3-full``: m = 3, stage 1 (reconstruction) and stage 2 (distillation) as ``m3-full``;
- ``kv0-full``: the graph alone (m = 0) with the full recipe.

Each summary records ``injection``, ``text_units`` and ``graph_units``; they are not candidates of the compact
prompt's rule, whose choice they would not change::

    python -m bench.studies.graph_token.crossfit --root checkpoints/crossfit --variants kv3-answer kv3-full kv0-full \\
        --seeds 0 1 --max-minutes 40 --text10 checkpoints/crossfit/headroom-KEY/scores.jsonl \\
        --out docs/results/crossfit_kv.json

They train until validation stops improving (:data:`EARLY_STOP`: a validation every 10 steps, stop after
2 without a lower answer NLL, at most 120 steps; best weights as always) and record the learning curve
(the answer NLL of each training step, each validation's) and the steps run. Stage 1 runs before the fit
as a piece of its own (``…stage1.pt``, reused by a rerun; :func:`reconstruction_piece`) and is kept to 150
steps so that a full-recipe unit is sized to stay within about twice a product unit (10–13 minutes with two side by
side on 2 cores; ``--measure --variants m3-full`` times one on the saved cases before the study). Each
held-out fold is scored under own, ablated, sham, shuffled and none at m = 3, and its greedy answers
own and none also in ConvoMem's named-speaker form
(:func:`qgmem.evaluation.named_form.named_speaker_item`), the product's too (its units recorded before
that was added are taken up again for those two pieces alone, :func:`unit_done`). The reference text-10 without graph does not
depend on training: ``--text10`` reads it per question from the headroom study's ``scores.jsonl``
(:mod:`bench.studies.graph_token.headroom`), joined by question id (``own_vs_text10``; questions without
a row are counted and left out of that contrast only). The choice, on the validation parts only, is
:data:`qgmem.evaluation.crossfit.COMPACT_RULE` (written into the JSON as ``compact_choice``)::

    python -m bench.studies.graph_token.crossfit --root checkpoints/crossfit --variants product m3-answer m3-full \\
        --seeds 0 1 --max-minutes 40 --text10 checkpoints/crossfit/headroom-KEY/scores.jsonl \\
        --out docs/results/crossfit_compact.json
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import itertools
import json
import os
import pickle
import re
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import REPO, ci
CONDITIONS = ["own", "ablated", "sham", "shuffled", "none"]
GENERATE = ["own", "none"]
UNIT_FILE = re.compile(r"fold-\d+-seed-\d+\.json")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default="checkpoints/crossfit")
    p.add_argument("--config", default=str(REPO / "configs" / "nodes10.yaml"))  # the product (10 units of text)
    p.add_argument("--cache-dir", default=None, help="sentence-embedding memo folder (default: the data module's)")
    p.add_argument("--folds", type=int, default=5)
    p.add_argument("--fold-list", type=int, nargs="*", default=None, help="folds to run (default: all)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--variants", nargs="+", default=["product"])
    p.add_argument("--fold-seed", type=int, default=0, help="seed of the fold assignment and the distractor draw")
    p.add_argument("--max-minutes", type=float, default=40.0)
    p.add_argument("--samples-only", action="store_true")
    p.add_argument("--summary-only", action="store_true")
    p.add_argument("--graph-sizes", action="store_true",
                   help="only compare the node and edge counts of the own, ablated and sham graphs of the scored "
                        "questions (needs the samples, no training)")
    p.add_argument("--measure", action="store_true",
                   help="time one unit on the cases saved so far (train, validate and score on them; nothing "
                        "is recorded under runs/): the cost of one (fold, seed) comes from it")
    p.add_argument("--text10", default=None,
                   help="the headroom study's scores.jsonl: the frozen LM reading 10 units and no graph, per question "
                        "(own_vs_text10)")
    p.add_argument("--default-units", default=str(REPO / "docs" / "results" / "crossfit_compact.json"),
                   help=f"a summary JSON holding the default's units ({DEFAULT_VARIANT}: the compact prompt, whose "
                        "per-unit validation figures the deep reader's rule compares with)")
    p.add_argument("--out", default=None, help="write the summary JSON here")
    p.add_argument("--n-boot", type=int, default=10_000)
    p.add_argument("--threads", type=int, default=2)
    return p.parse_args(argv)


def product_setting(path: str) -> dict[str, Any]:
    """The preset's data, model and trainer settings with the signature defaults for the rest."""
    import yaml

    cfg = yaml.safe_load(Path(path).read_text())
    data, model, trainer = dict(cfg.get("data") or {}), dict(cfg.get("model") or {}), dict(cfg.get("trainer") or {})
    for key in ("optimizer", "lr_scheduler"):
        if cfg.get(key):
            model[key] = json.loads(json.dumps(cfg[key]))
    return {"data": data, "model": model, "trainer": trainer}


#: the compact prompt's training: validation every ``val_check_interval`` steps, stop after ``patience``
#: validations without a lower answer NLL, at most ``max_steps`` (the product trains a fixed 30 steps)
EARLY_STOP = {"val_check_interval": 10, "patience": 2, "max_steps": 120}
#: stage 1 of the compact recipes: steps of reconstructing memory entries from the graph tokens
RECONSTRUCT_STEPS = 150
RECONSTRUCT_BATCH = 8  # entries per reconstruction step, as the compact preset (an LM forward + backward each)
#: stage 2: the weight of KL(teacher ‖ student) over the answer tokens (xRAG's) and the teacher's cached top-k
DISTILL_WEIGHT, DISTILL_TOPK = 2.0, 16
#: the text-only reference of the compact variants: the frozen LM reading this many units, no graph
TEXT_REFERENCE_UNITS = 10
#: stage 1 (reconstruction) and stage 2 (distillation) as the compact variants list them (``model.stages``)
STAGE1 = {"class_path": "qgmem.training.stages.MemoryReconstruction",
          "init_args": {"steps": RECONSTRUCT_STEPS, "batch_size": RECONSTRUCT_BATCH}}
STAGE2 = {"class_path": "qgmem.training.stages.Distillation",
          "init_args": {"weight": DISTILL_WEIGHT, "topk": DISTILL_TOPK}}
#: the deep reader's training without stage 1: no word alignment (it fits input embeddings, not keys and values)
KV = {"injection": "kv_prefix"}
KV_ANSWER = {**KV, "stages": []}
#: the default's variant (``configs/default.yaml``, the compact prompt): the deep reader's rule compares with it
DEFAULT_VARIANT = "m3-full"
#: the compact variants, named before any run: text budget m, graph budget k_graph, the training recipe
#: (``m3-answer`` keeps the product's stages; the ``kv`` ones read the graph as keys and values at every
#: layer, ``model.injection: kv_prefix``)
COMPACT = {
    "m3-answer": {"text_units": 3, "graph_units": 10, "model": {}},
    "m3-full": {"text_units": 3, "graph_units": 10, "model": {"stages": [STAGE1, STAGE2]}},
    "m3-recon": {"text_units": 3, "graph_units": 10, "model": {"stages": [STAGE1]}},
    "m3-full-k20": {"text_units": 3, "graph_units": 20, "model": {"stages": [STAGE1, STAGE2]}},
    "kv3-answer": {"text_units": 3, "graph_units": 10, "model": dict(KV_ANSWER)},
    "kv3-full": {"text_units": 3, "graph_units": 10, "model": {**KV, "stages": [STAGE1, STAGE2]}},
    "kv0-full": {"text_units": 0, "graph_units": 10, "model": {**KV, "stages": [STAGE1, STAGE2]}},
}


def variant_of(name: str) -> dict[str, Any]:
    """A variant's name and its settings over the product's: data-module settings (``tdP-M``: text dropout;
    a compact variant's text budget), module settings (readout, stages), early stopping, and its budgets
    (``None``: the samples' k for the graph, all of it for the text)."""
    base = {"name": name, "data": {}, "model": {}, "early_stop": None, "text_units": None, "graph_units": None,
            "named_form": False, "injection": "input"}
    if name == "product":  # today's default: its tokens are checked in both forms too (the rule's last check)
        return {**base, "named_form": True}
    if name.startswith("td"):
        p, m = name[2:].split("-")
        return {**base, "data": {"text_dropout": float(p), "text_dropout_units": int(m)}}
    if name in COMPACT:
        c = COMPACT[name]
        return {**base, "data": {"memory_units": c["text_units"]}, "early_stop": dict(EARLY_STOP),
                "model": {"readout": "summary_units", "num_graph_tokens": 1 + c["graph_units"], **c["model"]},
                "text_units": c["text_units"], "graph_units": c["graph_units"], "named_form": True,
                "injection": c["model"].get("injection", "input")}
    raise SystemExit(f"--variants: unknown variant {name!r} (product, tdP-M, e.g. td0.5-1, or {', '.join(COMPACT)})")


def unit_settings(setting: dict[str, Any], variant: dict[str, Any], root: Path) -> dict[str, Any]:
    """One unit's data-module and module keyword arguments and its training length (the seed aside)."""
    data, model_cfg, trainer_cfg = {**setting["data"], **variant["data"]}, dict(setting["model"]), setting["trainer"]
    model = json.loads(json.dumps({**model_cfg, **variant["model"]}))  # the stage records are the unit's own
    for stage in model.get("stages") or []:  # the teacher's answer-token distributions, cached once for every unit
        if stage["class_path"].rsplit(".", 1)[-1] == "Distillation":
            stage["init_args"] = {**(stage.get("init_args") or {}), "cache_dir": str(root / "teacher")}
    early = variant["early_stop"]
    return {"data": {"batch_size": int(data.get("batch_size", 4)),
                     "eval_batch_size": int(data.get("eval_batch_size", 8)),
                     "max_prompt_tokens": int(data["max_prompt_tokens"]),
                     "max_answer_tokens": int(data["max_answer_tokens"]),
                     **{k: data[k] for k in ("text_dropout", "text_dropout_units", "memory_units") if k in data},
                     **({"lm": model_cfg["lm"]} if model_cfg.get("lm") else {})},
            "model": model,
            "max_steps": int(early["max_steps"] if early else trainer_cfg.get("max_steps", 30)),
            "val_check_interval": early["val_check_interval"] if early else trainer_cfg.get("val_check_interval", 15),
            "patience": early["patience"] if early else None}


# --------------------------------------------------------------------------------------------------
# stage 1: samples


def fold_cases(setting: dict[str, Any], args) -> tuple[list[Any], dict[str, int], set[str]]:
    from qgmem.data.loaders import load_cases
    from qgmem.evaluation.crossfit import assign_folds, leaks, with_distractors
    from qgmem.samples.answer_filter import RUBRIC_CATEGORIES

    data = setting["data"]
    path = data.get("data_path", "data/convomem")
    cases = list(load_cases("convomem", path, distractor_conversations=0).cases)
    scored = {c.id for c in cases if c.qas and c.qas[0].category not in RUBRIC_CATEGORIES}
    folds = assign_folds(cases, scored, k=args.folds, seed=args.fold_seed)
    mixed = with_distractors(cases, folds, n=int(data.get("distractor_conversations", 2)), seed=args.fold_seed)
    product = load_cases("convomem", path, distractor_conversations=int(data.get("distractor_conversations", 2))).cases
    loader_leaks = leaks(list(product), folds)  # what the loader's own draw (the whole person's pool) would leak
    print(f"[crossfit] the loader's own distractor draw would put held-out evidence in training histories "
          f"{len(loader_leaks)} times ({len({(f, c) for f, _, c in loader_leaks})} held-out conversations); "
          "the fold-bound draw:", flush=True)
    found = leaks(mixed, folds)
    print(f"[crossfit] {len(found)} leaks", flush=True)
    if found:
        f, case, conv = found[0]
        print(f"error: fold {f}'s evidence conversation {conv} is in training case {case}'s history "
              f"({len(found)} leaks)", file=sys.stderr)
        raise SystemExit(2)
    return mixed, folds, scored


def sample_spec(setting: dict[str, Any], args):
    from qgmem.samples.spec import CacheSpec

    data = setting["data"]
    kwargs = {"distractor_conversations": int(data.get("distractor_conversations", 2))}
    if args.cache_dir or data.get("cache_dir"):
        kwargs["cache_dir"] = Path(args.cache_dir or data["cache_dir"])
    if data.get("activation"):  # e.g. a graph budget of 20 units: its own samples folder (the key holds it)
        from qgmem.activation.config import ActivationConfig

        kwargs["activation"] = ActivationConfig(**data["activation"])
    return CacheSpec(dataset="convomem", data_path=data.get("data_path", "data/convomem"), num_cases=None, **kwargs)


def samples_folder(spec, args) -> Path:
    key = hashlib.sha256(json.dumps({"samples": spec.samples_key, "folds": args.folds, "fold_seed": args.fold_seed},
                                    sort_keys=True).encode()).hexdigest()[:12]
    return Path(args.root) / f"samples-{key}"


def build_samples(cases, spec, folder: Path, deadline: float) -> bool:
    """Replay every case not yet saved; ``False`` when the deadline stopped it first.

    Two copies share the work: a case being replayed is locked (:func:`claim`), the other copy skips it."""
    from qgmem.evaluation.counterfactuals import Counterfactuals
    from qgmem.samples.build import Replayer

    folder.mkdir(parents=True, exist_ok=True)
    todo = [c for c in cases if not case_file(folder, c.id).exists()]
    if not todo:
        return True
    print(f"[samples] {len(cases) - len(todo)} of {len(cases)} cases saved; replaying {len(todo)}", flush=True)
    replayer = Replayer(spec)
    counterfactuals = Counterfactuals(replayer)
    started = time.perf_counter()
    try:
        for n, case in enumerate(todo, 1):
            if time.time() > deadline:
                print(f"[samples] stopped at the time limit, {len(todo) - n + 1} cases left", flush=True)
                return False
            lock = case_file(folder, case.id).with_suffix(".lock")
            if case_file(folder, case.id).exists() or not claim(lock):  # saved, or another copy replays it
                continue
            try:
                rows = replayer.rows("crossfit", case, on_question=counterfactuals)
                tmp = case_file(folder, case.id).with_suffix(f".{os.getpid()}.tmp")
                tmp.write_bytes(pickle.dumps({"rows": rows, "counterfactuals": counterfactuals.take()}))
                tmp.replace(case_file(folder, case.id))
            finally:
                lock.unlink(missing_ok=True)
            if n % 5 == 0 or n == len(todo):
                if replayer.memo is not None:  # what is encoded so far survives a cut-off run
                    replayer.memo.flush()
                rate = (time.perf_counter() - started) / n
                print(f"[samples] {n}/{len(todo)} cases, {rate:.1f} s a case", flush=True)
    finally:
        replayer.close()
    return True


def case_file(folder: Path, case_id: str) -> Path:
    return folder / (hashlib.sha256(case_id.encode()).hexdigest()[:16] + ".pkl")


def load_items(cases, folder: Path) -> tuple[dict[str, list[dict[str, Any]]], dict[str, dict[str, Any]]]:
    """``case id -> its items`` and ``qa_id -> its ablated and sham graphs`` of the saved cases."""
    from qgmem.evaluation.counterfactuals import to_item
    from qgmem.samples import cache as C

    items, counterfactuals = {}, {}
    for case in cases:
        saved = pickle.loads(case_file(folder, case.id).read_bytes())
        items[case.id] = [{**C.row_to_item({**r, "answer": r["reference"]}), "group": r["dialogue_id"]}
                          for r in saved["rows"]]
        counterfactuals.update({r["qa_id"]: to_item(r) for r in saved["counterfactuals"]})
    return items, counterfactuals


def without_edge_units(counterfactuals: dict[str, dict[str, Any]]) -> int:
    """How many ablated or sham graphs lack their edges' working-memory positions (``edge_unit``), which
    the per-unit readout (``summary_units``) reads: tables replayed before the table recorded them."""
    return sum(1 for c in counterfactuals.values() for name in ("ablated_graph", "sham_graph")
               if c.get(name) is not None and c[name].edge_index.shape[1] > 0
               and (getattr(c[name], "edge_unit", None) is None or bool((c[name].edge_unit < 0).any())))


# --------------------------------------------------------------------------------------------------
# stage 2: one (variant, fold, seed)


def best_weights_callback():
    """Keeps the trainable weights of the validation with the lowest answer NLL (train.py's selection), and
    the learning curve: the answer NLL the module logs for each training step, each validation's NLL."""
    import torch
    from lightning.pytorch.callbacks import Callback

    class BestWeights(Callback):
        def __init__(self):
            self.best, self.state, self.history, self.train_curve = float("inf"), None, [], []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            value = trainer.callback_metrics.get("train/nll_step")
            if value is not None:
                self.train_curve.append({"step": int(trainer.global_step), "train_nll": float(value)})

        def on_validation_end(self, trainer, pl_module):
            value = trainer.callback_metrics.get("val/nll")
            if value is None or trainer.sanity_checking:
                return
            value = float(value)
            self.history.append({"step": int(trainer.global_step), "val_nll": value})
            if torch.isfinite(torch.tensor(value)) and value < self.best:
                self.best = value
                self.state = {k: v.detach().clone() for k, v in pl_module.named_parameters() if v.requires_grad}

    return BestWeights()


def reconstruction_piece(module, dm, path: Path | None, fits, clock: dict[str, Any], name: str) -> dict[str, Any]:
    """Stage 1 (the ``MemoryReconstruction`` stage) as a piece of its own, before the fit: the module's
    pre-training phase, run as :meth:`QGMemModule.on_train_start` runs it (same function, settings, draw
    order), its weights recorded at ``path`` and reused by a rerun; the fit then starts from them with the
    phase done. A full-recipe unit is then two pieces of under 40 minutes each, not one of over an hour.
    ``{}`` when the variant has no such stage."""
    import torch

    from qgmem.training.stages import MemoryReconstruction

    stage = next((s for s in module.stages if isinstance(s, MemoryReconstruction)), None)
    if stage is None:
        return {}
    if path is not None and path.exists():
        saved = torch.load(path)
    else:
        fits("stage1")
        dm.setup("fit")
        module.adopt_contract(dm.answer_contract)
        loader = dm.train_dataloader()
        t = time.perf_counter()
        result = module.pretrain(loader.dataset, loader.collate_fn.graphs, seed=dm.order_seed, progress=True)
        clock["stage1"] = time.perf_counter() - t
        saved = {"state": {k: v.detach().clone() for k, v in module.net.state_dict().items()},
                 "result": {**result, "steps": stage.steps, "seconds": round(clock["stage1"], 1)}}
        if path is not None:
            torch.save(saved, path)
        print(f"  [{name}] stage 1: {clock['stage1']:.0f} s, loss {result.get('first_loss', float('nan')):.3f} -> "
              f"{result.get('last_loss', float('nan')):.3f}", flush=True)
    module.net.load_state_dict(saved["state"])
    module.alignment_result = saved["result"]  # the pre-training phase is done: the fit starts from its weights
    return saved["result"]


def recorded_seconds(runs: Path, variant: str) -> dict[str, float]:
    """The longest recorded duration of each kind of piece (``stage1``, ``train``, ``score``, ``generate``)
    under ``runs``: the variant's own units for the kinds they recorded, else every variant's. A process that has not
    yet run a piece itself estimates it from these, so ``--max-minutes`` also stops it before its first
    fit; a kind nothing has recorded yet has no estimate."""
    seen: dict[str, dict[str, float]] = {}

    def note(name: str, kind: str, seconds) -> None:
        if isinstance(seconds, (int, float)):
            seen.setdefault(name, {})[kind] = max(seen.get(name, {}).get(kind, 0.0), float(seconds))

    for path in sorted(runs.glob("*/fold-*-seed-*.*.json")):
        name, piece = path.parent.name, path.name.split(".")[1]
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if piece == "train":
            note(name, "train", data.get("train_s"))
            note(name, "stage1", (data.get("stage1") or {}).get("seconds"))
        elif "score_s" in data:
            note(name, "generate" if piece in ("val", *GENERATE, *(f"named-{c}" for c in GENERATE)) else "score",
                 data["score_s"])
    longest = {k: max(v[k] for v in seen.values() if k in v) for k in {k for v in seen.values() for k in v}}
    return {**longest, **seen.get(variant, {})}


def unit_clock(clocks: dict[str, dict[str, Any]], runs: Path, variant: str, deadline: float) -> dict[str, Any]:
    """The clock a unit of ``variant`` runs on: the deadline and, per kind of piece, the duration this process
    last measured for the same variant, else the recorded estimate (:func:`recorded_seconds`). Kept per
    variant, since a fit of one recipe says little about another's."""
    clock = clocks.setdefault(variant, {"deadline": deadline})
    for kind, seconds in recorded_seconds(runs, variant).items():
        clock.setdefault(kind, seconds)
    return clock


class OutOfTime(Exception):
    """The next piece of a unit would pass ``--max-minutes``: stop at this boundary (all pieces so far kept)."""


def unit_done(path: Path, variant: dict[str, Any]) -> bool:
    """Whether the unit recorded at ``path`` holds every piece ``variant`` scores: a unit recorded before its
    variant was also scored in the named-speaker form is taken up again, and only the missing pieces run."""
    if not (path.exists() and path.with_name(path.name.replace(".json", ".val.json")).exists()):
        return False
    return not variant["named_form"] or "named" in json.loads(path.read_text())


def unit_order(folds, variants, seeds) -> list[tuple]:
    """The (fold, variant, seed) units in the order a run takes them: fold-major, so a fold is finished
    for every variant before the next fold starts and the units done so far pair the variants on the same
    questions (a study cut off between parts still compares them)."""
    return list(itertools.product(folds, variants, seeds))


LOCK_WRITE_GRACE_S = 60.0


def claim(lock: Path) -> bool:
    """Take ``lock`` for this process, or ``False`` when a live process holds it.

    Two copies of the same command (one per core) then share the units instead of running the same one
    twice; a lock left by a process that died is taken over. A lock without a pid yet is one another copy
    has just created and not yet written: it is held for :data:`LOCK_WRITE_GRACE_S`, not taken as stale.
    """
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                pid = int(lock.read_text().strip() or 0)
                age = time.time() - lock.stat().st_mtime
            except FileNotFoundError:  # its holder just let it go: try again
                continue
            except (OSError, ValueError):
                pid, age = 0, float("inf")
            if pid and pid != os.getpid() and _alive(pid):
                return False
            if not pid and age < LOCK_WRITE_GRACE_S:  # being written by the copy that created it
                return False
            lock.unlink(missing_ok=True)  # stale: its process is gone
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return True
    return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_unit(setting, variant, fold, seed, parts, items, args, stem: Path | None = None,
             clock: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train (checkpoint selection on the validation part), then score the held-out part per condition.

    Each piece (the training, the validation part's greedy answers, then each condition, then for a
    compact variant the named-speaker form's own and none) is recorded under ``stem`` (``…train.json``
    with its ``…weights.pt``, ``…val.json``, ``…<condition>.json``, ``…named-<condition>.json``) as soon as
    it ends, and reused by a rerun: one unit costs more than a 40-minute part on the shared CPU, so a
    part may end between its pieces. ``clock`` holds the deadline and the last piece's durations;
    :class:`OutOfTime` stops before a piece that would not fit.
    """
    import torch
    from lightning.pytorch import Trainer, seed_everything
    from lightning.pytorch.callbacks import EarlyStopping

    from qgmem.evaluation.crossfit import answer_scores
    from qgmem.evaluation.named_form import named_speaker_item
    from qgmem.evaluation.protocol import SampleScores, score_conditions
    from qgmem.evaluation.study_data import InMemoryStudyDataModule
    from qgmem.training.module import QGMemModule

    clock = clock if clock is not None else {"deadline": float("inf")}

    def fits(kind: str) -> None:
        if clock.get(kind) is not None and time.time() + clock[kind] > clock["deadline"]:
            raise OutOfTime(f"{kind} (~{clock[kind] / 60:.0f} min)")

    def piece(name: str) -> Path | None:
        return None if stem is None else stem.with_name(f"{stem.name}.{name}")

    run = unit_settings(setting, variant, Path(args.root))
    trainer_cfg = setting["trainer"]
    pick = {name: [it for cid in ids for it in items[cid]] for name, ids in parts.items()}
    scored = {name: [it for it in v if it["qa_id"] in args.scored_qa] for name, v in pick.items()}
    seed_everything(seed, verbose=False)
    dm = InMemoryStudyDataModule(pick["train"], scored["val"], scored["test"], order_seed=seed, **run["data"])
    module = QGMemModule(**{**run["model"], "feature_dim": dm.feature_dim})
    steps = run["max_steps"]
    meta_path, weights_path = piece("train.json"), piece("weights.pt")
    if meta_path is not None and meta_path.exists() and weights_path.exists():
        meta, state = json.loads(meta_path.read_text()), torch.load(weights_path)
    else:
        stage1 = reconstruction_piece(module, dm, piece("stage1.pt"), fits, clock, f"{variant['name']} fold {fold} "
                                      f"seed {seed}")
        fits("train")
        best = best_weights_callback()
        callbacks = [best]
        if run["patience"] is not None:  # train until validation stops improving (best weights kept as always)
            callbacks.append(EarlyStopping(monitor="val/nll", mode="min", patience=run["patience"],
                                           check_on_train_epoch_end=False))
        trainer = Trainer(accelerator=trainer_cfg.get("accelerator", "cpu"), devices=1, max_steps=steps, max_epochs=-1,
                          val_check_interval=run["val_check_interval"], check_val_every_n_epoch=None,
                          num_sanity_val_steps=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                          enable_model_summary=False, gradient_clip_val=trainer_cfg.get("gradient_clip_val"),
                          precision=trainer_cfg.get("precision", "32-true"),
                          default_root_dir=str(Path(args.root) / "trainer" / f"{variant['name']}-fold-{fold}-seed-{seed}"),
                          callbacks=callbacks)
        t = time.perf_counter()
        trainer.fit(module, datamodule=dm)
        train_s = time.perf_counter() - t
        clock["train"] = train_s
        if best.state is None:
            raise FloatingPointError(f"fold {fold} seed {seed}: no finite validation answer NLL")
        state = best.state
        meta = {"val_nll_best": best.best, "val_history": best.history, "train_curve": best.train_curve,
                "train_samples": len(pick["train"]), "val_samples": len(scored["val"]), "steps": steps,
                "steps_run": int(trainer.global_step), "early_stop": variant["early_stop"],
                "train_s": round(train_s, 1), "text_dropout_share": getattr(dm.split("train"), "share", None),
                "load": os.getloadavg()[0], **({"stage1": stage1} if stage1 else {})}
        if meta_path is not None:
            torch.save(state, weights_path)
            meta_path.write_text(json.dumps(meta) + "\n")
    with torch.no_grad():
        params = dict(module.named_parameters())
        for k, v in state.items():
            params[k].copy_(v)
    test = scored["test"]
    pieces = {}

    def score_piece(name: str, chosen: list[dict[str, Any]], condition: str, generate: bool) -> dict[str, Any]:
        path = piece(f"{name}.json")
        if path is not None and path.exists():
            return json.loads(path.read_text())
        kind = "generate" if generate else "score"
        fits(kind)
        t = time.perf_counter()
        scores, pairing = score_conditions(module, chosen, dm.collator, groups=[it["group"] for it in chosen],
                                           batch_size=dm.eval_batch_size, seed=seed,
                                           generate=[condition] if generate else [],
                                           conditions=[condition], counterfactuals=args.counterfactuals)
        clock[kind] = time.perf_counter() - t
        out = {"scores": scores.to_dict(), "pairing": pairing, "score_s": round(clock[kind], 1)}
        if path is not None:
            path.write_text(json.dumps(out) + "\n")
        print(f"  [{variant['name']} fold {fold} seed {seed}] {name}: {clock[kind]:.0f} s", flush=True)
        return out

    # the validation part's greedy answers with the selected weights: the compact prompt's rule reads their F1
    val = score_piece("val", scored["val"], "own", True)
    val_f1 = answer_scores(val["scores"]["predictions"]["own"], val["scores"]["answer"])["f1"]
    for condition in CONDITIONS:
        pieces[condition] = score_piece(condition, test, condition, condition in GENERATE)
    first = SampleScores.from_dict(pieces[CONDITIONS[0]]["scores"])

    def joined(names: dict[str, str]) -> SampleScores:
        return SampleScores(qa_id=first.qa_id, group=first.group, category=first.category, answer=first.answer,
                            nll={c: pieces[p]["scores"]["nll"][c] for c, p in names.items()},
                            predictions={c: pieces[p]["scores"]["predictions"][c] for c, p in names.items()
                                         if c in pieces[p]["scores"]["predictions"]})

    scores = joined({c: c for c in CONDITIONS})
    named = None
    if variant["named_form"]:  # ConvoMem's named-speaker form of the same held-out questions
        renamed = [named_speaker_item(it) for it in test]
        for condition in GENERATE:
            pieces[f"named-{condition}"] = score_piece(f"named-{condition}", renamed, condition, True)
        named = joined({c: f"named-{c}" for c in GENERATE}).to_dict()
    pairing = {**pieces["shuffled"]["pairing"], **{k: v for c in CONDITIONS for k, v in pieces[c]["pairing"].items()
                                                   if v is not None}}
    prompts = [dm.collator.encoder.prompt(it["memory_text"], it["question"]) for it in test]
    return {"variant": variant["name"], "fold": fold, "seed": seed, "scores": scores.to_dict(), "pairing": pairing,
            **({"named": named} if named is not None else {}), **meta,
            "val_f1": sum(val_f1) / max(1, len(val_f1)),
            "text_units": variant["text_units"], "num_graph_tokens": int(module.hparams.num_graph_tokens),
            "injection": str(module.hparams.get("injection", "input")),
            "prompt_text_tokens": [len(p.ids) for p in prompts],
            "prompts_trimmed": sum(p.memory_tokens_dropped > 0 for p in prompts),
            "score_s": round(sum(p["score_s"] for p in pieces.values()) + val["score_s"], 1)}


# --------------------------------------------------------------------------------------------------
# stage 3: summary


def seed_rows(runs: dict[tuple[int, int], dict[str, Any]], done: list[int], seeds: list[int], key: str = "scores"):
    """Seed ``s`` of every fold done: one row over all their questions (the crossed design)."""
    from qgmem.evaluation.protocol import SampleScores

    rows = []
    for s in seeds:
        parts = [SampleScores.from_dict(runs[(f, s)][key]) for f in done]
        rows.append(SampleScores(qa_id=sum((p.qa_id for p in parts), []), group=sum((p.group for p in parts), []),
                                 category=sum((p.category for p in parts), []), answer=sum((p.answer for p in parts), []),
                                 nll={c: sum((p.nll[c] for p in parts), []) for c in parts[0].nll},
                                 predictions={c: sum((p.predictions[c] for p in parts), []) for c in parts[0].predictions}))
    return rows


def read_text10(path: Path) -> dict[str, dict[str, Any]]:
    """``{qa_id: scores}`` of the frozen LM reading :data:`TEXT_REFERENCE_UNITS` units of text and no graph,
    from the headroom study's ``scores.jsonl`` (:mod:`bench.studies.graph_token.headroom`)."""
    out = {}
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        print(f"error: --text10 {path}: {exc.strerror}", file=sys.stderr)
        raise SystemExit(2)
    for n, line in enumerate(lines, 1):
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            if n == len(lines):  # a torn last line: the headroom run was cut off there
                continue
            print(f"error: --text10 {path}: line {n} is not JSON", file=sys.stderr)
            raise SystemExit(2)
        ref = (r.get("units") or {}).get(str(TEXT_REFERENCE_UNITS))
        if ref is None:
            print(f"error: --text10 {path}: question {r.get('qa_id')!r} has no {TEXT_REFERENCE_UNITS}-unit score "
                  "(units)", file=sys.stderr)
            raise SystemExit(2)
        out[r["qa_id"]] = ref
    return out


def text10_contrasts(rows, text10: dict[str, dict[str, Any]], n_boot: int) -> dict[str, Any]:
    """``own − text10`` (the own graph at the variant's text budget against the frozen LM reading 10 units
    and no graph) in answer NLL and in the greedy answers' scores, on the questions with a text-10 row; the
    others are counted and left out of this contrast only."""
    import numpy as np

    from qgmem.evaluation.crossfit import answer_contrasts
    from qgmem.evaluation.protocol import contrast

    have = [q for q in rows[0].qa_id if q in text10]
    missing = len(rows[0].qa_id) - len(have)
    out: dict[str, Any] = {"text10_joined": len(have), "text10_missing": missing}
    if not have:
        return out
    rows = [r.only(have) for r in rows]
    ref = [text10[q] for q in rows[0].qa_id]
    own = np.asarray([r.nll["own"] for r in rows], dtype=np.float64)
    result = contrast(own - np.asarray([x["nll"] for x in ref]), rows[0].group, rows[0].category, n_boot=n_boot)
    result.pop("per_seed", None)
    out["own_vs_text10"] = result
    out["answers_own_vs_text10"] = answer_contrasts(rows, "own", "text10", n_boot=n_boot,
                                                    against={m: [x[m] for x in ref] for m in ("f1", "em", "judge")})
    tokens = [x.get("prompt_tokens") for x in ref]
    out["text10_prompt_tokens"] = float(np.mean(tokens)) if None not in tokens else None
    return out


def summary(root: Path, variant: dict[str, Any], seeds: list[int], folds: int, items_by_qa, counterfactuals,
            n_boot: int, graph_units: int, text10: dict[str, dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """The crossed contrasts of one variant over the folds done for every seed (``None``: no fold yet)."""
    from qgmem.evaluation.crossfit import answer_contrasts, graph_sizes, same_size_removals
    from qgmem.evaluation.protocol import ABSTENTION, summarize

    runs = {}
    for path in sorted((root / "runs" / variant["name"]).glob("fold-*-seed-*.json")):
        if not UNIT_FILE.fullmatch(path.name):  # a unit's pieces sit beside it
            continue
        r = json.loads(path.read_text())
        runs[(r["fold"], r["seed"])] = r
    done = [f for f in range(folds) if all((f, s) in runs for s in seeds)]
    if not done:
        return None
    units = [runs[(f, s)] for f in done for s in seeds]
    rows = seed_rows(runs, done, seeds)
    out = summarize(rows, n_boot=n_boot)
    for key in [k for k in out if k.endswith(tuple(f"_vs_{c}" for c in CONDITIONS))]:
        out[key].pop("per_seed", None)
    out["answers_own_vs_none"] = answer_contrasts(rows, "own", "none", n_boot=n_boot)
    out["answers_own_vs_none_without_abstention"] = answer_contrasts(rows, "own", "none", categories_out=[ABSTENTION],
                                                                     n_boot=n_boot)
    if all("named" in u for u in units):  # the same questions in ConvoMem's named-speaker form
        out["answers_own_vs_none_named"] = answer_contrasts(seed_rows(runs, done, seeds, "named"), "own", "none",
                                                            n_boot=n_boot)
    if text10 is not None:
        out.update(text10_contrasts(rows, text10, n_boot))
    scored = [items_by_qa[q] for q in rows[0].qa_id]
    out["graph_sizes"] = graph_sizes(scored, counterfactuals)
    same = same_size_removals(scored, counterfactuals)
    if same:  # the removals' contrasts on the questions whose ablated and sham graphs have equal sizes
        matched = summarize([r.only(same) for r in rows], n_boot=n_boot)
        out["same_size_removals"] = {"n": len(same), **{k: matched[k] for k in ("own_vs_ablated", "own_vs_sham",
                                                                              "sham_vs_ablated") if k in matched}}
        for r in out["same_size_removals"].values():
            if isinstance(r, dict):
                r.pop("per_seed", None)
    first = [runs[(f, seeds[0])] for f in done]  # the seeds of a fold read the same prompts
    if all("prompt_text_tokens" in u for u in first):
        text = sum(sum(u["prompt_text_tokens"]) for u in first) / sum(len(u["prompt_text_tokens"]) for u in first)
        graph = {c: 0 if c == "none" else first[0]["num_graph_tokens"] for c in CONDITIONS}
        out["prompt_tokens"] = {c: {"text": text, "graph": graph[c], "all": text + graph[c]} for c in CONDITIONS}
        if out.get("text10_prompt_tokens") is not None:
            out["prompt_tokens"]["text10"] = {"text": out["text10_prompt_tokens"], "graph": 0,
                                              "all": out["text10_prompt_tokens"]}
        out["prompts_trimmed"] = sum(u["prompts_trimmed"] for u in first)
    out.update(variant=variant["name"], folds_done=done, seeds=seeds, injection=variant["injection"],
               text_units=variant["text_units"] if variant["text_units"] is not None else graph_units,
               graph_units=variant["graph_units"] if variant["graph_units"] is not None else graph_units,
               val_nll_best={f"{f}-{s}": runs[(f, s)]["val_nll_best"] for f in done for s in seeds},
               val_nll_mean=sum(u["val_nll_best"] for u in units) / len(units),
               val_f1={f"{f}-{s}": runs[(f, s)].get("val_f1") for f in done for s in seeds},
               steps_run={f"{f}-{s}": runs[(f, s)].get("steps_run", runs[(f, s)]["steps"]) for f in done for s in seeds},
               # the learning curve of each unit: validation answer NLL by step (units run before it was kept: [])
               val_curve={f"{f}-{s}": [[h["step"], round(h["val_nll"], 4)] for h in runs[(f, s)].get("val_history") or []]
                          for f in done for s in seeds},
               unit_s={f"{f}-{s}": runs[(f, s)]["train_s"] + runs[(f, s)]["score_s"] for f in done for s in seeds})
    return out


def unit_val_nll(root: Path, variant: str, seeds: list[int], folds: int) -> dict[str, float]:
    """``"fold-seed" -> best validation answer NLL`` of every unit of ``variant`` whose training is recorded."""
    out = {}
    for f in range(folds):
        for s in seeds:
            path = root / "runs" / variant / f"fold-{f}-seed-{s}.train.json"
            if path.exists():
                out[f"{f}-{s}"] = json.loads(path.read_text())["val_nll_best"]
    return out


def choose_on_validation(root: Path, names: list[str], seeds: list[int], folds: int) -> dict[str, Any] | None:
    """The named rule (:func:`~qgmem.evaluation.crossfit.validation_choice`): candidates against ``product``."""
    from qgmem.evaluation.crossfit import validation_choice

    candidates = {n: unit_val_nll(root, n, seeds, folds) for n in names if n != "product" and n not in COMPACT}
    if not candidates:
        return None
    out = validation_choice(unit_val_nll(root, "product", seeds, folds), candidates, units=folds * len(seeds))
    print(f"\nvalidation choice (lower mean and lower in >= {out['need_lower_in']} of {out['units']} paired units):")
    print("| candidate | units | lower in | mean val NLL | product, same units | status |\n| --- | --- | --- | --- | --- | --- |")
    for n, r in out["candidates"].items():
        mean = "-" if r["mean"] is None else f"{r['mean']:.4f}"
        base = "-" if r["baseline_mean"] is None else f"{r['baseline_mean']:.4f}"
        print(f"| {n} | {r['units']} | {r['lower_in']} | {mean} | {base} | {r['status']} |")
    print(f"chosen: {out['chosen'] or 'product (no candidate wins)'}" + ("" if out["decided"] else " (not decided yet)"))
    return out


def unit_val_figures(root: Path, variant: str, seeds: list[int], folds: int) -> dict[str, dict[str, float]]:
    """``"fold-seed" -> {"nll": best validation answer NLL, "f1": validation greedy F1}`` of every finished unit."""
    out = {}
    for f in range(folds):
        for s in seeds:
            path = root / "runs" / variant / f"fold-{f}-seed-{s}.json"
            if path.exists():
                r = json.loads(path.read_text())
                if r.get("val_f1") is not None:
                    out[f"{f}-{s}"] = {"nll": r["val_nll_best"], "f1": r["val_f1"]}
    return out


def choose_compact(root: Path, names: list[str], seeds: list[int], folds: int) -> dict[str, Any] | None:
    """The compact prompt's named rule (:func:`~qgmem.evaluation.crossfit.compact_choice`) against ``product``."""
    from qgmem.evaluation.crossfit import compact_choice

    candidates = {n: unit_val_figures(root, n, seeds, folds) for n in names
                  if n in COMPACT and "injection" not in COMPACT[n]["model"]}  # the deep reader has a rule of its own
    if not candidates:
        return None
    out = compact_choice(unit_val_figures(root, "product", seeds, folds), candidates, units=folds * len(seeds))
    print(f"\ncompact prompt: {out['rule']}")
    print("| variant | units | mean val NLL | mean val F1 | paired with product so far (units): val NLL, val F1 "
          "(a diagnostic; the rule waits for every unit) |\n| --- | --- | --- | --- | --- |")
    for n, r in out["candidates"].items():
        p = r["paired_with_product"]
        print(f"| {n} | {r['units']} | " + " | ".join("-" if r[k] is None else f"{r[k]:.4f}"
                                                       for k in ("val_nll_mean", "val_f1_mean")) + " | "
              + ("-" if not p["units"] else f"({p['units']}) {p['nll_minus_product']:+.4f}, "
                                            f"{p['f1_minus_product']:+.4f}") + " |")
    c = out["comparison"]
    if c is not None and c["units"]:
        print(f"chosen {out['chosen']} against product on {c['units']} paired units: val NLL "
              f"{c['nll']['chosen_minus_product']:+.4f}, val F1 {c['f1']['chosen_minus_product']:+.4f}")
    print(f"compact prompt the default: {out['compact_default']}" + ("" if out["decided"] else " (not decided yet)"))
    return out


def default_unit_figures(path: Path, variant: str = DEFAULT_VARIANT) -> dict[str, dict[str, float]]:
    """``"fold-seed" -> {"nll", "f1"}`` of the default's units from a summary JSON (``--default-units``)."""
    try:
        s = json.loads(Path(path).read_text())["summaries"][variant]
        return {u: {"nll": float(s["val_nll_best"][u]), "f1": float(s["val_f1"][u])} for u in s["val_nll_best"]}
    except OSError as e:
        print(f"error: --default-units {path}: {e.strerror}", file=sys.stderr)
        raise SystemExit(2) from None
    except (ValueError, KeyError, TypeError, AttributeError):
        print(f"error: --default-units {path}: no per-unit validation figures of {variant} "
              f"(summaries.{variant}.val_nll_best and .val_f1)", file=sys.stderr)
        raise SystemExit(2) from None


def choose_deep_reader(root: Path, names: list[str], seeds: list[int], folds: int, summaries: dict[str, Any],
                       default_path: Path) -> dict[str, Any] | None:
    """The deep reader's named rule (:func:`~qgmem.evaluation.crossfit.deep_reader_choice`) against the default."""
    from qgmem.evaluation.crossfit import deep_reader_choice

    kv = [n for n in names if n in COMPACT and "injection" in COMPACT[n]["model"]]
    if not kv:
        return None
    out = deep_reader_choice(default_unit_figures(default_path), {n: unit_val_figures(root, n, seeds, folds) for n in kv},
                             summaries, units=folds * len(seeds))

    def interval(c):
        return "-" if c is None else f"[{c[0]:+.3f}, {c[1]:+.3f}]"

    def num(v):
        return "-" if v is None else f"{v:+.4f}"

    print(f"\ndeep reader: {out['rule']}")
    print(f"| variant | units | sham vs ablated | own vs shuffled | val NLL − {DEFAULT_VARIANT} | val F1 − "
          f"{DEFAULT_VARIANT} (paired units) | F1 own − none, plain / named | passes |\n| --- | --- | --- | --- | --- "
          "| --- | --- | --- |")
    for n, r in out["candidates"].items():
        e, v, f = r["evidence"], r["validation_vs_default"], r["f1_own_minus_none"]
        print(f"| {n} | {r['units']} | {interval(e['sham_vs_ablated'])} | {interval(e['own_vs_shuffled'])} | "
              f"{num(v['nll_minus_default'])} | {num(v['f1_minus_default'])} ({v['units']}) | "
              f"{num(f['plain'])} / {num(f['named'])} | {'-' if r['passes'] is None else r['passes']} |")
    print(f"outcome: {out['outcome']}")
    return out


def choose_answer_mode(compact: dict[str, Any], summaries: dict[str, Any], folds: int) -> dict[str, Any]:
    """The rule on the answers users read (:func:`~qgmem.evaluation.crossfit.answer_mode`) for the default
    the compact prompt's rule gave: the chosen variant, or the product; its held-out F1 own − none in both
    forms once every fold is in its summary, and its degenerate shares where a summary holds them."""
    from qgmem.evaluation.crossfit import answer_mode

    default = {True: compact["chosen"], False: "product"}.get(compact["compact_default"])
    s = summaries.get(default) if default else None
    plain = named = None
    if s is not None and s["folds_done"] == list(range(folds)) and "answers_own_vs_none_named" in s:
        plain = s["answers_own_vs_none"]["f1"]["diff"]["mean"]
        named = s["answers_own_vs_none_named"]["f1"]["diff"]["mean"]
    # the study records no raw replies: degenerate shares come from eval-qa runs (docs/graph_token.md)
    out = answer_mode(default, plain, named, s.get("degenerate_share") if s is not None else None)
    print(f"answer mode of the default ({default or 'not chosen yet'}): "
          + (f"F1 own − none plain {plain:+.4f}, named {named:+.4f} -> graph_mode {out['graph_mode']}"
             if out["graph_mode"] else "not decided yet"))
    return out


def print_table(s: dict[str, Any]) -> None:
    cats = sorted(s["per_category_n"])
    print(f"\n### {s['variant']}: {s['n']} questions (folds {s['folds_done']}), seeds {s['seeds']}; text "
          f"{s['text_units']} units, graph {s['graph_units']} units, injection {s.get('injection', 'input')}\n")
    print("| condition | answer NLL |\n| --- | --- |")
    for c, v in s["nll"].items():
        print(f"| {c} | {v:.3f} |" if v is not None else f"| {c} | - |")
    print("\n| contrast (95 % CI, crossed) | all | without abstention | "
          + " | ".join(f"{c} (n={s['per_category_n'][c]})" for c in cats) + " |")
    print("| --- | --- | --- |" + " --- |" * len(cats))
    for key in ("own_vs_none", "own_vs_ablated", "own_vs_sham", "sham_vs_ablated", "own_vs_shuffled", "own_vs_text10"):
        if key in s:
            r = s[key]
            print(f"| {key.replace('_', ' ')} (n={r['n']}) | {ci(r)} | {ci(r['without_abstention'])} | "
                  + " | ".join(ci(r["per_category"][c]) for c in cats) + " |")
    print("\n| greedy answers | own | none | own − none (95 % CI) | without abstention: own − none |\n| --- | --- | --- | --- | --- |")
    for m in ("f1", "em", "judge"):
        a, b = s["answers_own_vs_none"][m], s["answers_own_vs_none_without_abstention"][m]
        print(f"| {m} | {a['own']:.3f} | {a['none']:.3f} | {ci(a['diff'])} | {ci(b['diff'])} |")
    if "answers_own_vs_none_named" in s:
        a, b = s["answers_own_vs_none"]["f1"], s["answers_own_vs_none_named"]["f1"]
        print(f"\ngreedy F1 own − none: plain form {ci(a['diff'])}, named-speaker form {ci(b['diff'])} "
              f"(named: own {b['own']:.3f}, none {b['none']:.3f})")
    if "answers_own_vs_text10" in s:
        a = s["answers_own_vs_text10"]["f1"]
        print(f"greedy F1 own − text10: {ci(a['diff'])} (without abstention {ci(a['diff']['without_abstention'])}; "
              f"own {a['own']:.3f}, text10 {a['text10']:.3f}; {s['text10_missing']} questions without a text-10 row)")
    if "prompt_tokens" in s:
        print("prompt tokens (text + graph): " + ", ".join(f"{c} {v['all']:.0f}" for c, v in s["prompt_tokens"].items())
              + f"; {s['prompts_trimmed']} prompts trimmed to the cap")
    g = s["graph_sizes"]
    print(f"\ngraph sizes over {g['n']} questions with all three graphs: "
          + "; ".join(f"{w} own {g[w]['own']:.2f}, ablated {g[w]['ablated']:.2f}, sham {g[w]['sham']:.2f} "
                      f"(sham − ablated {ci(g[w]['sham_minus_ablated'])})" for w in ("nodes", "edges") if g["n"]))
    m = s.get("same_size_removals")
    if m:
        print(f"\nablated and sham graphs of equal size (n={m['n']}): "
              + "; ".join(f"{k.replace('_', ' ')} {ci(m[k])} (without abstention {ci(m[k]['without_abstention'])})"
                          for k in ("own_vs_ablated", "own_vs_sham", "sham_vs_ablated") if k in m))
    print(f"validation answer NLL (best checkpoint), mean over units: {s['val_nll_mean']:.4f}; steps run: "
          + ", ".join(f"{u} {n}" for u, n in s["steps_run"].items()))
    for unit, curve in (s.get("val_curve") or {}).items():
        if curve:
            print(f"learning curve {unit} (step: validation answer NLL): "
                  + ", ".join(f"{step}: {nll:.3f}" for step, nll in curve))


def report_graph_sizes(items, scored, args) -> int:
    """Node and edge counts of own, ablated and sham graphs, paired per question, overall and per category."""
    from qgmem.evaluation.crossfit import graph_sizes

    chosen = [it for cid in sorted(scored) if cid in items for it in items[cid]]
    cf = args.counterfactuals
    out = {"all": graph_sizes(chosen, cf),
           "with_ablated_graph": sum(cf.get(it["qa_id"], {}).get("ablated_graph") is not None for it in chosen),
           "with_sham_graph": sum(cf.get(it["qa_id"], {}).get("sham_graph") is not None for it in chosen),
           "questions": len(chosen),
           "per_category": {c: graph_sizes([it for it in chosen if it["category"] == c], cf)
                            for c in sorted({it["category"] for it in chosen})}}

    print(f"| questions | graphs | own | ablated | sham | ablated − own | sham − own | sham − ablated |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, g in [("all", out["all"]), *out["per_category"].items()]:
        for what in ("nodes", "edges"):
            w = g[what]
            if g["n"]:
                print(f"| {name} (n={g['n']}) | {what} | {w['own']:.2f} | {w['ablated']:.2f} | {w['sham']:.2f} | "
                      f"{ci(w['ablated_minus_own'], 2)} | {ci(w['sham_minus_own'], 2)} | {ci(w['sham_minus_ablated'], 2)} |")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: out[k] for k in ("questions", "with_ablated_graph", "with_sham_graph")}))
    return 0


def measure(setting, variant, items, args) -> int:
    """One unit of ``variant`` (the first of ``--variants``) over the saved cases only, for its cost: seconds
    of training (both stages, every validation) and of scoring per held-out item (every condition plus the
    greedy answers)."""
    ids = sorted(items)
    parts = {"train": ids, "val": ids[:2], "test": ids}
    result = run_unit(setting, variant, -1, 0, parts, items, args)
    n_test = len(result["scores"]["qa_id"])
    n_val = result["val_samples"]
    out = {"cases": len(ids), "train_samples": result["train_samples"], "val_items": n_val, "test_items": n_test,
           "variant": variant["name"], "steps_run": result["steps_run"],
           "train_s": result["train_s"], "score_s": result["score_s"],
           "score_s_per_item": result["score_s"] / max(1, n_test), "load": result["load"]}
    print(json.dumps(out))
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    started = time.time()
    deadline = started + 60 * args.max_minutes
    setting = product_setting(args.config)
    variants = [variant_of(v) for v in args.variants]
    cases, folds, scored = fold_cases(setting, args)
    spec = sample_spec(setting, args)
    folder = samples_folder(spec, args)
    for v in variants:  # a graph budget is the samples' activation.k: another one needs its own samples
        if v["graph_units"] is not None and v["graph_units"] != spec.activation.k:
            print(f"error: --variants {v['name']}: its graph holds {v['graph_units']} units, the samples of "
                  f"{args.config} {spec.activation.k} (data.activation.k); run it with a config whose "
                  f"data.activation.k is {v['graph_units']} (its own samples folder)", file=sys.stderr)
            return 2
    text10 = read_text10(Path(args.text10)) if args.text10 else None
    print(f"[crossfit] {len(cases)} cases, {len(scored)} scored in {args.folds} folds "
          f"({[list(folds.values()).count(f) for f in range(args.folds)]}); samples in {folder}", flush=True)
    if not (args.summary_only or args.measure) and not build_samples(cases, spec, folder, deadline):
        return 0
    if args.samples_only:
        return 0
    items, args.counterfactuals = load_items([c for c in cases if case_file(folder, c.id).exists()], folder)
    stale = without_edge_units(args.counterfactuals) if any(v["model"].get("readout") == "summary_units"
                                                              for v in variants) else 0
    if stale and not (args.summary_only or args.graph_sizes):
        print(f"error: {stale} ablated or sham graphs under {folder} lack edge_unit, which the summary_units "
              "readout of the compact variants reads: those cases were replayed before the counterfactual table "
              "recorded it; replay them (move the folder aside and rerun; the embedding memo makes it cheaper)",
              file=sys.stderr)
        return 2
    by_qa = {it["qa_id"]: it for v in items.values() for it in v}
    args.scored_qa = {q for cid in scored if cid in items for q in (it["qa_id"] for it in items[cid])}
    if args.measure:
        return measure(setting, variants[0], items, args)
    if args.graph_sizes:
        return report_graph_sizes(items, scored, args)
    from qgmem.evaluation.crossfit import fold_parts

    clocks: dict[str, dict[str, Any]] = {}  # per variant: the deadline and its pieces' last durations
    folds_run = args.fold_list if args.fold_list is not None else range(args.folds)
    for fold, variant, seed in unit_order(folds_run, variants if not args.summary_only else [], args.seeds):
        out = Path(args.root) / "runs" / variant["name"]
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"fold-{fold}-seed-{seed}.json"
        lock = out / f"fold-{fold}-seed-{seed}.lock"
        if unit_done(path, variant) or not claim(lock):  # done, or another process is running it now
            continue
        parts = fold_parts(folds, fold, args.folds, list(items))
        clock = unit_clock(clocks, out.parent, variant["name"], deadline)
        try:
            result = run_unit(setting, variant, fold, seed, parts, items, args,
                              stem=out / f"fold-{fold}-seed-{seed}", clock=clock)
            path.write_text(json.dumps(result, default=str) + "\n")
        except OutOfTime as stop:
            print(f"[crossfit] stopping before {variant['name']} fold {fold} seed {seed}'s {stop}: it "
                  "would pass the time limit; rerun to go on", flush=True)
            break
        finally:
            lock.unlink(missing_ok=True)
        print(f"[crossfit] {variant['name']} fold {fold} seed {seed}: train {result['train_s']:.0f} s, score "
              f"{result['score_s']:.0f} s, val NLL {result['val_nll_best']:.4f}, load {result['load']:.1f}",
              flush=True)
    summaries = {}
    for variant in variants:
        s = summary(Path(args.root), variant, args.seeds, args.folds, by_qa, args.counterfactuals, args.n_boot,
                    graph_units=spec.activation.k, text10=text10)
        if s is not None:
            summaries[variant["name"]] = s
            print_table(s)
    choice = choose_on_validation(Path(args.root), [v["name"] for v in variants], args.seeds, args.folds)
    compact = choose_compact(Path(args.root), [v["name"] for v in variants], args.seeds, args.folds)
    mode = choose_answer_mode(compact, summaries, args.folds) if compact else None
    deep = choose_deep_reader(Path(args.root), [v["name"] for v in variants], args.seeds, args.folds, summaries,
                              Path(args.default_units))
    final = {"summaries": summaries, **({"validation_choice": choice} if choice else {}),
             **({"compact_choice": compact} if compact else {}), **({"answer_mode": mode} if mode else {}),
             **({"deep_reader_choice": deep} if deep else {}),
             "variant_settings": {v["name"]: {k: v[k] for k in ("data", "model", "early_stop", "text_units",
                                                                 "graph_units", "named_form", "injection")} for v in variants},
             **({"text10": str(args.text10)} if args.text10 else {}), "folds": args.folds,
             "seeds": args.seeds, "fold_seed": args.fold_seed,
             "cases": len(cases), "scored_cases": len(scored), "samples_key": spec.samples_key,
             "fold_sizes": [list(folds.values()).count(f) for f in range(args.folds)],
             "wall_s": round(time.time() - started, 1)}
    if args.out:
        Path(args.out).write_text(json.dumps(final, indent=1, default=str) + "\n")
    print(json.dumps({k: v for k, v in final.items() if k != "summaries"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
