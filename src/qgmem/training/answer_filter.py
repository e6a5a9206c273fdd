"""Answer filtering: keep the training QAs the frozen LM already answers correctly from its memory.

The paper supervises the graph token only on QA pairs whose final answer was correct (2,138 → 1,634):
the graph token should help the LM *use* evidence the working memory holds, not memorize answers the
memory cannot support. This module answers each training QA with the frozen LM on the textual working
memory (greedy, batched, left padding, the shared prompt), judges the answer by a configurable rule and
reports what was kept per split and category.

ConvoMem's ``preference_evidence`` and ``implicit_connection_evidence`` "answers" are grading rubrics
("A good response should ..."), not answers: training on them would teach the LM to write rubrics. For
those categories the supervision target is the frozen LM's own answer *that an LLM judge accepted*; with
no LLM judge there is nothing to accept, so the category is left out of training (validation and test
keep it, with the rubric as the reference).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence


RULES = ("none", "match", "llm")

#: categories whose reference "answer" is a rubric for judging a response, not a response
RUBRIC_CATEGORIES = frozenset({"preference_evidence", "implicit_connection_evidence"})

#: a reference saying the memory cannot answer; the prediction must then abstain too
_ABSTAIN_PATTERNS = (
    "no information", "not mentioned", "don t know", "do not know", "dont know", "not enough information",
    "cannot answer", "can t answer", "unable to answer", "no record", "not available in", "doesn t contain",
    "does not contain", "not provided", "no mention",
)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_THINK = re.compile(r"<think>.*?(</think>|$)", flags=re.DOTALL)


# --------------------------------------------------------------------------------------------------
# normalization and the ``match`` rule


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation and articles, squeeze whitespace (SQuAD-style normalization).

    Punctuation becomes a space rather than vanishing, so ``don't`` and ``don t`` normalize alike and
    ``$2,000`` keeps its digits together.
    """
    text = _THINK.sub(" ", text or "").lower()
    text = text.replace("’", "'").replace("‘", "'")
    text = "".join(" " if ch in string.punctuation else ch for ch in text)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def is_abstention(text: str) -> bool:
    """Whether an answer says the memory does not hold the answer."""
    norm = f" {normalize_answer(text)} "
    return any(f" {p} " in norm for p in _ABSTAIN_PATTERNS)


def token_f1(prediction: str, reference: str) -> float:
    """Bag-of-tokens F1 between normalized answers (0 when either is empty)."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(reference).split()
    common = sum((Counter(pred) & Counter(ref)).values())
    if not pred or not ref or common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def _contains(haystack: str, needle: str) -> bool:
    return bool(needle) and f" {needle} " in f" {haystack} "


@dataclass
class MatchRule:
    """Normalized exact / containment match, the no-LLM judge.

    Correct when the normalized prediction equals or contains the reference at word boundaries, or
    the prediction is contained in the reference and has at least ``min_tokens`` tokens (so
    "Sarah Jenkins." matches "The designated contact person is Sarah Jenkins." but "Sarah" alone does
    not). ``f1_threshold``
    optionally also accepts token-F1 at or above it (off by default: the paper's rule is correctness,
    and F1 on long references rewards paraphrases of the question). An abstention reference requires an
    abstaining prediction, and an abstaining prediction never matches a real answer.
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
        if pred == ref:
            return True
        if _contains(pred, ref):
            return True
        if len(pred.split()) >= self.min_tokens and _contains(ref, pred):
            return True
        return self.f1_threshold is not None and token_f1(prediction, reference) >= self.f1_threshold


# --------------------------------------------------------------------------------------------------
# judges


@dataclass
class JudgeItem:
    """One prediction to judge against its reference (or rubric)."""

    question: str
    reference: str
    prediction: str
    category: str = ""

    @property
    def is_rubric(self) -> bool:
        return self.category in RUBRIC_CATEGORIES


class Judge(Protocol):
    """Decides, for a batch of predictions, which are correct."""

    name: str

    def __call__(self, items: Sequence[JudgeItem]) -> list[bool]: ...


@dataclass
class MatchJudge:
    """The ``match`` rule as a judge; it cannot grade rubrics (callers leave those categories out)."""

    rule: MatchRule = field(default_factory=MatchRule)
    name: str = "match"

    def __call__(self, items: Sequence[JudgeItem]) -> list[bool]:
        return [self.rule(it.prediction, it.reference) for it in items]


JUDGE_SYSTEM_PROMPT = (
    "You grade an assistant's reply to a user's question. You get the question, a reference and the "
    "reply. Mark the reply CORRECT when it states the same answer as the reference, even in other words, "
    "and INCORRECT when it contradicts the reference, leaves out a key detail, is too vague, or adds "
    "claims the reference does not support. When the reference says the information is not available, "
    "the reply is CORRECT only if it also says it cannot answer. End with one line: "
    "'VERDICT: CORRECT' or 'VERDICT: INCORRECT'."
)
JUDGE_RUBRIC_SYSTEM_PROMPT = (
    "You grade an assistant's reply to a user's question. Instead of a reference answer you get a rubric "
    "that says what a good reply must do. Mark the reply CORRECT when it satisfies the rubric's "
    "requirements (it need not address every nice-to-have point, but it must use the user's relevant "
    "personal information correctly), otherwise INCORRECT. End with one line: 'VERDICT: CORRECT' or "
    "'VERDICT: INCORRECT'."
)
_VERDICT = re.compile(r"\b(INCORRECT|CORRECT)\b")


def judge_messages(item: JudgeItem) -> list[dict[str, str]]:
    """Chat messages asking an LLM for a verdict on one item (rubric wording for rubric categories)."""
    system = JUDGE_RUBRIC_SYSTEM_PROMPT if item.is_rubric else JUDGE_SYSTEM_PROMPT
    label = "Rubric" if item.is_rubric else "Reference answer"
    user = f"Question: {item.question}\n{label}: {item.reference}\nReply to grade: {item.prediction}"
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def parse_verdict(text: str) -> bool | None:
    """The last CORRECT/INCORRECT in a judge reply (thinking blocks ignored); ``None`` when absent."""
    found = _VERDICT.findall(_THINK.sub(" ", text or "").upper())
    return None if not found else found[-1] == "CORRECT"


@dataclass
class LLMJudge:
    """An LLM judge through the shared backend (``qgmem.llm.backends``), temperature 0.

    ``complete`` maps a batch of chat-message lists to reply texts; :func:`backend_completer` adapts a
    shared backend to it (tests pass a stub). An unparsable verdict counts as incorrect and is counted in ``unparsed``.
    """

    complete: Callable[[list[list[dict[str, str]]]], list[str]]
    name: str = "llm"
    unparsed: int = 0

    def __call__(self, items: Sequence[JudgeItem]) -> list[bool]:
        if not items:
            return []
        replies = self.complete([judge_messages(it) for it in items])
        verdicts = []
        for reply in replies:
            verdict = parse_verdict(reply)
            self.unparsed += verdict is None
            verdicts.append(bool(verdict))
        return verdicts


def backend_completer(backend: Any, max_new_tokens: int = 256) -> Callable[[list[list[dict[str, str]]]], list[str]]:
    """Adapt a shared :class:`qgmem.llm.base.LLMBackend` to ``messages batch -> reply texts``.

    A failed request (``ChatResult.error``) becomes an empty reply, i.e. an unparsed verdict: it costs
    that sample, never the build.
    """

    def complete(batch: list[list[dict[str, str]]]) -> list[str]:
        results = backend.chat(batch, max_new_tokens=max_new_tokens, temperature=0.0)
        return ["" if getattr(r, "error", None) else str(r.text) for r in results]

    return complete


def make_judge(rule: str, judge_config: Any = None, match: MatchRule | None = None) -> Judge | None:
    """The judge for a rule name: ``none`` → ``None``, ``match`` → :class:`MatchJudge`, ``llm`` → LLM."""
    if rule not in RULES:
        raise ValueError(f"answer_filter must be one of {RULES}, got {rule!r}")
    if rule == "none":
        return None
    if rule == "match":
        return MatchJudge(match or MatchRule())
    if judge_config is None:
        raise ValueError("answer_filter='llm' needs a judge: LLMConfig (the shared LLM backend settings)")
    from qgmem.llm.backends import make_backend

    return LLMJudge(backend_completer(make_backend(judge_config)))


# --------------------------------------------------------------------------------------------------
# answering with the frozen LM


def strip_reply(text: str) -> str:
    """The final answer text: thinking blocks removed, whitespace trimmed."""
    return _THINK.sub(" ", text or "").strip()


class LMAnswerer:
    """Greedy, batched answers from the frozen causal LM on the training prompt (left padding).

    The prompt ids come from the collator's :class:`~qgmem.training.collate.PromptEncoder`, so the LM
    is judged on exactly the prompt it is trained and evaluated on (same template, same memory
    trimming). Loaded lazily on first use; ``device=None`` picks CUDA when available. On CPU this is
    the slow part of a cache build (seconds per QA for SmolLM2-135M on two cores), which is why
    answers are cached by :class:`qgmem.training.cache.AnswerCache` and never regenerated.
    ``first_line`` stops at the first line break: the prompt asks for one short sentence, and a small
    LM that goes on to list steps only costs time (the rest is never judged).
    """

    def __init__(self, lm: str, *, batch_size: int = 8, max_new_tokens: int = 32,
                 max_prompt_tokens: int = 1024, device: str | None = None, dtype: str = "auto",
                 enable_thinking: bool = False, first_line: bool = True):
        self.lm, self.batch_size, self.max_new_tokens = lm, batch_size, max_new_tokens
        self.max_prompt_tokens, self.device, self.dtype = max_prompt_tokens, device, dtype
        self.enable_thinking, self.first_line = enable_thinking, first_line
        self._model = self._prompts = None

    @property
    def settings(self) -> dict[str, Any]:
        """What the answers depend on besides the prompt text (part of the answer-cache key)."""
        from qgmem.training.prompts import SYSTEM_PROMPT

        return {"lm": self.lm, "max_new_tokens": self.max_new_tokens, "max_prompt_tokens": self.max_prompt_tokens,
                "decoding": "greedy", "dtype": self.dtype, "enable_thinking": self.enable_thinking,
                "first_line": self.first_line, "system_prompt": SYSTEM_PROMPT}

    def _load(self) -> None:
        if self._model is not None:
            return
        import torch

        from qgmem.lm import load_causal_lm, load_tokenizer
        from qgmem.training.collate import PromptEncoder

        device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        tokenizer = load_tokenizer(self.lm)
        self._prompts = PromptEncoder(tokenizer, max_prompt_tokens=self.max_prompt_tokens,
                                      enable_thinking=self.enable_thinking)
        self._model = load_causal_lm(self.lm, dtype=self.dtype, device=device)

    def answer(self, pairs: Sequence[tuple[str, str]]) -> list[str]:
        """Answers for ``(memory_text, question)`` pairs, in order."""
        import torch

        if not pairs:
            return []
        self._load()
        model, encoder = self._model, self._prompts
        tokenizer, pad = encoder.tokenizer, encoder.pad_id
        out: list[str] = []
        for start in range(0, len(pairs), self.batch_size):
            ids = [encoder.prompt(m, q).ids for m, q in pairs[start:start + self.batch_size]]
            width = max(len(x) for x in ids)
            input_ids = torch.full((len(ids), width), pad, dtype=torch.long)
            mask = torch.zeros((len(ids), width), dtype=torch.long)
            for row, x in enumerate(ids):  # left padding: every prompt ends where generation starts
                input_ids[row, width - len(x):] = torch.tensor(x)
                mask[row, width - len(x):] = 1
            stop = {"stop_strings": ["\n"], "tokenizer": tokenizer} if self.first_line else {}
            with torch.no_grad():
                generated = model.generate(input_ids=input_ids.to(model.device), attention_mask=mask.to(model.device),
                                           max_new_tokens=self.max_new_tokens, do_sample=False,
                                           pad_token_id=pad, eos_token_id=[encoder.eot_id, tokenizer.eos_token_id],
                                           **stop)
            texts = tokenizer.batch_decode(generated[:, width:], skip_special_tokens=True)
            out.extend(strip_reply(t.split("\n")[0] if self.first_line else t) for t in texts)
        return out


# --------------------------------------------------------------------------------------------------
# the filtering decision and its report


@dataclass
class FilterDecision:
    """Whether a training sample is kept, and its supervision target when it is."""

    keep: bool
    target: str
    reason: str  # "kept" | "incorrect" | "rubric_no_judge" | "unfiltered"


def decide(category: str, reference: str, lm_answer: str | None, correct: bool | None, rule: str) -> FilterDecision:
    """The supervision decision for one *training* sample under ``rule``.

    Non-rubric categories keep the reference answer as the target (when correct, or always with
    ``none``); rubric categories keep the LM's accepted answer under ``llm`` and are left out otherwise.
    """
    rubric = category in RUBRIC_CATEGORIES
    if rubric and rule != "llm":
        return FilterDecision(False, "", "rubric_no_judge")
    if rule == "none":
        return FilterDecision(True, reference, "unfiltered")
    if not correct:
        return FilterDecision(False, "", "incorrect")
    return FilterDecision(True, (lm_answer or "") if rubric else reference, "kept")


@dataclass
class FilterReport:
    """Counts per split and category: samples, judged, judged correct, kept for supervision."""

    rule: str
    counts: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    left_out_categories: dict[str, str] = field(default_factory=dict)

    def add(self, split: str, category: str, *, judged: bool, correct: bool, kept: bool) -> None:
        row = self.counts.setdefault(split, {}).setdefault(
            category, {"samples": 0, "judged": 0, "correct": 0, "kept": 0})
        row["samples"] += 1
        row["judged"] += judged
        row["correct"] += correct
        row["kept"] += kept

    def totals(self, split: str) -> dict[str, int]:
        out = {"samples": 0, "judged": 0, "correct": 0, "kept": 0}
        for row in self.counts.get(split, {}).values():
            for key in out:
                out[key] += row[key]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "counts": self.counts,
                "totals": {split: self.totals(split) for split in self.counts},
                "left_out_categories": self.left_out_categories}
