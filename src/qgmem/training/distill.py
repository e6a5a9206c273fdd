"""The distillation term: KL(teacher ‖ student) over the answer tokens, from the teacher's cached top-k logits.

The teacher's distribution at an answer token is the softmax of its top ``k`` logits (temperature 1,
renormalized within the ``k``); the student's log-probabilities are its full-vocabulary log-softmax read
at those ``k`` ids. The term ``Σ p_t (log p_t − log q_s)`` is 0 exactly when the student puts the
teacher's probabilities on the ``k`` ids and nothing elsewhere, and positive otherwise. The teacher and
the student read the same answer tokens, so the ``i``-th answer token of a sample is aligned with the
``i``-th row of its :class:`~qgmem.training.teacher.TeacherEntry`.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from qgmem.training.teacher import TeacherEntry


def topk_kl(student_logits: torch.Tensor, teacher_ids: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """Mean over answer tokens of KL(teacher ‖ student): ``student_logits`` ``[N, vocab]``, the teacher's ``[N, k]``."""
    teacher_log_p = F.log_softmax(teacher_logits.float(), dim=-1)
    student_log_q = F.log_softmax(student_logits.float(), dim=-1).gather(1, teacher_ids)
    return (teacher_log_p.exp() * (teacher_log_p - student_log_q)).sum(-1).mean()


def teacher_targets(table: dict[str, TeacherEntry], qa_ids: Sequence[str], targets: torch.Tensor,
                    rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher's ``(ids, logits)`` ``[N, k]`` aligned with a batch's answer tokens.

    ``targets`` and ``rows`` are :func:`qgmem.model.fusion.answer_logits`'s: the batch's answer tokens in
    row order and the row of each. A sample missing from ``table``, or whose cached answer differs from
    the batch's, is an error: its targets would belong to another text.
    """
    entries = []
    for b, qa_id in enumerate(qa_ids):
        entry = table.get(str(qa_id))
        if entry is None:
            raise KeyError(f"no teacher entry for training sample {qa_id!r}: the teacher is built over the "
                           "training split at fit start")
        if not torch.equal(entry.answer, targets[rows == b].cpu()):
            raise ValueError(f"the teacher entry of {qa_id!r} holds other answer tokens than the batch")
        entries.append(entry)
    device = targets.device
    return (torch.cat([e.ids for e in entries]).to(device), torch.cat([e.logits for e in entries]).to(device))


__all__ = ["teacher_targets", "topk_kl"]
