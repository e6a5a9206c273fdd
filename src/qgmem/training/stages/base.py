"""The ``Stage`` protocol: a part of a training recipe beside the answer loss, with its own settings.

A recipe is the answer loss plus a list of stages (``model.stages``, in a preset or on the command
line). Each stage is a dataclass whose fields are its settings, says what it trains (:attr:`Stage.trains`),
and runs at one or both of two moments:

- a pre-training phase before answer training (:meth:`Stage.pretrain`, when :attr:`Stage.pretrains`):
  once, at the start of a fresh fit, in list order, on the graph-token network;
- a term added to the answer loss each training step (:meth:`Stage.term` times :attr:`Stage.weight`, when
  :attr:`Stage.adds_term`), logged as ``train/<term_name>``, in list order.

``QGMemModule`` only calls these methods, so a new recipe is a new stage, not new module parameters.
A checkpoint records its stages as ``{class_path, init_args}`` (:func:`stage_record`); the same form is
what a preset writes.
"""

from __future__ import annotations

import importlib
from dataclasses import asdict
from typing import Any, ClassVar, NamedTuple, Sequence

import torch

from qgmem.errors import SettingError


class AnswerLogits(NamedTuple):
    """One student forward's answer-token logits ``[N, vocab]``, their targets ``[N]`` and rows ``[N]``
    (:func:`qgmem.model.fusion.answer_logits`), for a term that reads them beside the answer loss."""

    logits: torch.Tensor
    targets: torch.Tensor
    rows: torch.Tensor


class Stage:
    """The protocol every training stage follows (subclasses are dataclasses; their fields are the settings).

    ``module`` in the methods is the ``QGMemModule`` that runs the stage: its ``net`` (the graph-token
    network, what every stage trains), ``lm``, ``tokenizer``, ``prompt_encoder``, ``device`` and ``trainer``.
    """

    #: what the stage trains, in words
    trains: ClassVar[str] = ""
    #: the name of its term in the logs (``train/<term_name>``)
    term_name: ClassVar[str] = ""
    #: whether :meth:`term` reads the answer's logits (the module then computes them in the same forward)
    reads_logits: ClassVar[bool] = False
    #: the term's weight in the loss (stages that add one)
    weight: float = 0.0

    @property
    def pretrains(self) -> bool:
        """Whether the stage runs a pre-training phase before answer training."""
        return False

    @property
    def adds_term(self) -> bool:
        """Whether the stage adds a term to the loss each training step."""
        return False

    def pretrain(self, module: Any, dataset: Sequence[dict[str, Any]], graphs: Any, *, seed: int,
                 progress: bool = False) -> dict[str, float]:
        """Train ``module.net`` in place over ``dataset`` (collated by ``graphs``, drawn in the order of
        ``seed``); returns ``first_loss``, ``last_loss`` and ``steps``."""
        raise NotImplementedError(f"{type(self).__name__} has no pre-training phase")

    def fit_start(self, module: Any, datamodule: Any) -> None:
        """Prepare what the term needs from the data, at every fit start (a resumed one too)."""

    def term(self, module: Any, batch: dict[str, Any], answer: AnswerLogits | None) -> torch.Tensor | None:
        """The unweighted term of a training batch (``None``: nothing to add for this batch)."""
        raise NotImplementedError(f"{type(self).__name__} adds no term to the loss")

    def check(self) -> None:
        """Refuse settings out of range (:meth:`refuse`); the module checks its stages when it is built."""

    def refuse(self, message: str) -> None:
        """A bad setting of this stage, named as a preset names it."""
        raise SettingError(f"model.stages: {type(self).__name__}: {message}")


def stage_record(stage: Stage) -> dict[str, Any]:
    """A stage as a preset and a checkpoint write it: ``{class_path, init_args}`` (plain data)."""
    cls = type(stage)
    package = importlib.import_module(__package__)
    home = __package__ if getattr(package, cls.__name__, None) is cls else cls.__module__
    return {"class_path": f"{home}.{cls.__qualname__}", "init_args": asdict(stage)}


def as_stage(value: Stage | dict[str, Any]) -> Stage:
    """A stage given as an object or as its record (a checkpoint's hyperparameters)."""
    if isinstance(value, Stage):
        return value
    path = value.get("class_path") if isinstance(value, dict) else None
    if not isinstance(path, str) or "." not in path:
        raise SettingError(f"model.stages: each stage is {{class_path: ..., init_args: {{...}}}}, got {value!r}")
    module, _, name = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name, None)
    except ImportError:
        cls = None
    if not (isinstance(cls, type) and issubclass(cls, Stage)):
        raise SettingError(f"model.stages: {path!r} is not a training stage (qgmem.training.stages)")
    return cls(**dict(value.get("init_args") or {}))


def check_stages(stages: Sequence[Stage]) -> None:
    """Each stage's settings in range, and a stage class listed once at most (a second copy would run
    its phase and term twice)."""
    seen: set[type] = set()
    for stage in stages:
        stage.check()
        if type(stage) in seen:
            raise SettingError(f"model.stages lists {type(stage).__name__} twice; list each stage once")
        seen.add(type(stage))
