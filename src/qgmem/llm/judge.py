"""Judging a predicted answer: the ``match`` rule (no LLM) and an LLM judge through the shared backend.

Used by the training data's answer filter and by ``qgmem eval-qa``, so "correct" means one thing. The
LLM judge's instructions follow the grading rules of the QGMem paper's evaluation, restated here:

- a reply that means the same as the reference is correct, whatever its wording;
- a reply that contradicts the reference, leaves out a detail the reference depends on, stays too vague
  to pin the answer down, or asserts things the reference does not back is incorrect;
- LongMemEval: a count of days, weeks or months that is off by one from the reference still counts;
- when a fact was updated, a reply that gives the current value is correct even if it also mentions the
  earlier one;
- an abstention question (the history does not hold the answer) is answered correctly only by a reply
  that says the information is not there.

ConvoMem's ``preference_evidence`` and ``implicit_connection_evidence`` references are rubrics ("A good
response should ..."), not answers; only an LLM judge can grade them, with its own rubric wording.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

from qgmem.text.answers import is_abstention, normalize_answer, strip_thinking, token_f1

#: categories whose reference "answer" is a rubric for judging a response, not a response
RUBRIC_CATEGORIES = frozenset({"preference_evidence", "implicit_connection_evidence"})


def _contains(haystack: str, needle: str) -> bool:
    return bool(needle) and f" {needle} " in f" {haystack} "


@dataclass
class MatchRule:
    """Normalized exact / containment match, the no-LLM judge.

    Correct when the normalized prediction equals or contains the reference at word boundaries, or the
    prediction is contained in the reference and has at least ``min_tokens`` tokens (so "Sarah
    Jenkins." matches "The designated contact person is Sarah Jenkins." but "Sarah" alone does not).
    ``f1_threshold`` optionally also accepts token F1 at or above it (off by default: F1 on long
    references rewards paraphrases of the question). An abstention reference requires an abstaining
    prediction, and an abstaining prediction never matches a real answer.
    """

    min_tokens: int = 2
    f1_threshold: float | None = None

    def __call__(self, prediction: str, reference: str) -> bool:
        pred, ref = normalize_answer(prediction), normalize_answer(reference)
        if not pred:
            return False
        if is_abstention(reference):
            return is_abstention(prediction)
        if is_abstention(prediction):
            return False
        if pred == ref or _contains(pred, ref):
            return True
        if len(pred.split()) >= self.min_tokens and _contains(ref, pred):
            return True
        return self.f1_threshold is not None and token_f1(prediction, reference) >= self.f1_threshold


@dataclass
class JudgeItem:
    """One prediction to judge against its reference (or rubric).

    ``dataset`` selects dataset-specific rules (LongMemEval's off-by-one durations); ``abstention``
    marks a question whose history does not hold the answer (``None``: read from the reference).
    """

    question: str
    reference: str
    prediction: str
    category: str = ""
    dataset: str = ""
    abstention: bool | None = None

    @property
    def is_rubric(self) -> bool:
        return self.category in RUBRIC_CATEGORIES

    @property
    def is_abstention(self) -> bool:
        return is_abstention(self.reference) if self.abstention is None else bool(self.abstention)


class Judge(Protocol):
    """Decides, for a batch of predictions, which are correct."""

    name: str

    def __call__(self, items: Sequence[JudgeItem]) -> list[bool]: ...


@dataclass
class MatchJudge:
    """The ``match`` rule as a judge; it cannot grade rubrics (callers leave those out, and count them)."""

    rule: MatchRule = field(default_factory=MatchRule)
    name: str = "match"

    def __call__(self, items: Sequence[JudgeItem]) -> list[bool]:
        return [self.rule(it.prediction, it.reference) for it in items]


_VERDICT_LINE = "End with one line: 'VERDICT: CORRECT' or 'VERDICT: INCORRECT'."
JUDGE_SYSTEM_PROMPT = (
    "You grade an assistant's reply to a question about a user's past conversations. You get the "
    "question, a reference answer and the reply. Mark the reply CORRECT when it says the same thing as "
    "the reference, even in different words. Mark it INCORRECT when it contradicts the reference, leaves "
    "out a detail the reference depends on, is too vague to pin down the answer, or adds claims the "
    "reference does not support. If the question concerns something that changed over time, a reply "
    "that gives the current value is CORRECT even when it also mentions the earlier one. "
)
JUDGE_DURATION_RULE = (
    "For a number of days, weeks or months, a reply that is off by one from the reference is still CORRECT. "
)
JUDGE_ABSTENTION_PROMPT = (
    "You grade an assistant's reply to a question about a user's past conversations. The conversations "
    "do not contain the answer to this question. Mark the reply CORRECT only if it says that the "
    "information is not available or that it cannot answer; any reply that offers an answer is INCORRECT. "
)
JUDGE_RUBRIC_SYSTEM_PROMPT = (
    "You grade an assistant's reply to a user's question. Instead of a reference answer you get a rubric "
    "that says what a good reply must do. Mark the reply CORRECT when it meets the rubric's requirements "
    "(it need not cover every optional point, but it must use the user's relevant personal information "
    "correctly), otherwise INCORRECT. "
)
_VERDICT = re.compile(r"\b(INCORRECT|CORRECT)\b")


def judge_system_prompt(item: JudgeItem) -> str:
    """The grading instructions for one item: rubric, abstention or answer wording (+ dataset rules)."""
    if item.is_rubric:
        return JUDGE_RUBRIC_SYSTEM_PROMPT + _VERDICT_LINE
    if item.is_abstention:
        return JUDGE_ABSTENTION_PROMPT + _VERDICT_LINE
    extra = JUDGE_DURATION_RULE if item.dataset == "longmemeval" else ""
    return JUDGE_SYSTEM_PROMPT + extra + _VERDICT_LINE


def judge_messages(item: JudgeItem) -> list[dict[str, str]]:
    """Chat messages asking an LLM for a verdict on one item."""
    label = "Rubric" if item.is_rubric else "Reference answer"
    user = f"Question: {item.question}\n{label}: {item.reference}\nReply to grade: {item.prediction}"
    return [{"role": "system", "content": judge_system_prompt(item)}, {"role": "user", "content": user}]


def parse_verdict(text: str) -> bool | None:
    """The last CORRECT/INCORRECT in a judge reply (thinking blocks ignored); ``None`` when absent."""
    found = _VERDICT.findall(strip_thinking(text).upper())
    return None if not found else found[-1] == "CORRECT"


@dataclass
class LLMJudge:
    """An LLM judge through the shared backend (``qgmem.llm.backends``), temperature 0.

    ``complete`` maps a batch of chat-message lists to reply texts; :func:`backend_completer` adapts a
    shared backend to it (tests pass a stub). An unparsable verdict counts as incorrect and is counted
    in ``unparsed``; a request that got no reply at all (``complete`` gives ``None``: the server was down)
    counts there too and in ``failed``, so a caller that must not read an outage as "incorrect" (the
    training cache's answer filter) can stop instead.
    """

    complete: Callable[[list[list[dict[str, str]]]], list[str]]
    name: str = "llm"
    unparsed: int = 0
    failed: int = 0

    def __call__(self, items: Sequence[JudgeItem]) -> list[bool]:
        if not items:
            return []
        replies = self.complete([judge_messages(it) for it in items])
        verdicts = []
        for reply in replies:
            self.failed += reply is None
            verdict = parse_verdict(reply or "")
            self.unparsed += verdict is None
            verdicts.append(bool(verdict))
        return verdicts


def backend_completer(backend: Any, max_new_tokens: int = 256
                      ) -> Callable[[list[list[dict[str, str]]]], list[str | None]]:
    """Adapt a shared :class:`qgmem.llm.base.LLMBackend` to ``messages batch -> reply texts``.

    A failed request (``ChatResult.error``; a reply that arrived but was empty or unusable is a reply)
    becomes ``None``: an unparsed verdict, counted in :attr:`LLMJudge.failed`.
    """

    def complete(batch: list[list[dict[str, str]]]) -> list[str]:
        results = backend.chat(batch, max_new_tokens=max_new_tokens, temperature=0.0)
        return [None if _no_reply(r) else str(r.text or "") for r in results]

    return complete


def _no_reply(result: Any) -> bool:
    """A request that failed without the model answering (connection, timeout, HTTP error), as opposed to a
    reply that was empty or unusable (the model's own answer, which stays an unparsed verdict)."""
    error = getattr(result, "error", None)
    return bool(error) and not getattr(result, "unusable", False) and "empty reply" not in str(error)


def llm_judge(config: Any) -> LLMJudge:
    """An :class:`LLMJudge` over the shared backend that ``config`` (an ``LLMConfig``) describes."""
    from qgmem.llm.backends import make_backend

    return LLMJudge(backend_completer(make_backend(config)))
