"""Distillation from the full-text prompt: λ · KL(teacher ‖ student) over the answer tokens, each training step.

The teacher is the same frozen LM reading every working-memory unit as text and no graph tokens; its
answer-token distributions are computed once per training sample at fit start and cached on disk
(:mod:`qgmem.training.teacher`); the term is :func:`qgmem.training.distill.topk_kl` against them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from qgmem.training.stages.base import AnswerLogits, Stage


@dataclass
class Distillation(Stage):
    """Pull the student (the LM reading the prompt and the graph tokens) towards the full-text teacher.

    Args:
        weight: λ, the weight of KL(teacher ‖ student) in the loss; the named candidates are 2.0 (xRAG's)
            and 0.5.
        topk: ``k``, the teacher's most likely next tokens kept per answer token in the teacher cache (its
            distribution is the softmax over them).
        cache_dir: Folder of the teacher cache (``None`` = ``<trainer.default_root_dir>/teacher``). Entries are
            content-addressed, so runs and folds that share a folder share what they have in common.
    """

    trains: ClassVar[str] = ("the graph encoder and projector: the answer distribution towards the full-text "
                             "prompt's")
    term_name: ClassVar[str] = "kl"
    reads_logits: ClassVar[bool] = True

    weight: float = 2.0
    topk: int = 16
    cache_dir: str | None = None

    def check(self) -> None:
        if not self.weight > 0:
            self.refuse(f"weight must be > 0 (leave the stage out for none), got {self.weight}")
        if self.topk < 1:
            self.refuse(f"topk must be >= 1, got {self.topk}")

    def __post_init__(self) -> None:
        self.teacher: dict[str, Any] | None = None  # the training samples' targets by qa_id (fit_start)

    @property
    def adds_term(self) -> bool:
        return True

    def fit_start(self, module: Any, datamodule: Any) -> None:
        """The training samples' teacher targets: rank 0 computes the missing ones, then every rank reads
        them from the cache folder."""
        from lightning.pytorch.utilities import rank_zero_info

        from qgmem.errors import SettingError
        from qgmem.training.teacher import TEACHER_PROMPT_TOKENS, build_teacher

        trainer = module.trainer
        if datamodule is None:
            raise SettingError("model.stages: Distillation needs a data module: the teacher is built over its "
                               "training split at fit start")
        folder = self.cache_dir or os.path.join(trainer.default_root_dir, "teacher")
        dataset = datamodule.train_dataloader().dataset

        def build():
            return build_teacher(module.lm, module.hparams.lm, module.tokenizer, module.prompt_encoder.settings,
                                 dataset, topk=self.topk, folder=folder, progress=trainer.is_global_zero)

        module.lm.eval()  # the teacher is the LM as it reads: no layer flagged for recomputation
        try:
            if trainer.world_size > 1:  # rank 0 fills the cache, the others wait (and stop if it failed)
                from qgmem.ranks import raise_on_every_rank

                error = None
                if trainer.is_global_zero:
                    try:
                        build()
                    except Exception as exc:  # noqa: BLE001 -- raised below, on every rank
                        error = exc
                raise_on_every_rank(error, lambda flag: trainer.strategy.reduce_boolean_decision(flag, all=False),
                                    "the teacher cache's build on rank 0")
            self.teacher, stats = build()
        finally:
            module.keep_lm_frozen()
        rank_zero_info(f"teacher: {stats['samples']} training samples, {stats['hits']} reused, {stats['misses']} "
                       f"computed, {stats['corrupt']} corrupt rewritten, {stats['truncated']} over the "
                       f"{TEACHER_PROMPT_TOKENS}-token cap, {stats['seconds']:.1f} s ({folder})")

    def term(self, module: Any, batch: dict[str, Any], answer: AnswerLogits | None) -> torch.Tensor:
        from qgmem.training.distill import teacher_targets, topk_kl

        if self.teacher is None or answer is None:
            raise RuntimeError("Distillation's term needs the teacher, built at fit start (QGMemModule.on_fit_start)")
        ids, teacher_logits = teacher_targets(self.teacher, batch["qa_id"], answer.targets, answer.rows)
        return topk_kl(answer.logits, ids, teacher_logits)
