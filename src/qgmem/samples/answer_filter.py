"""Answer filtering: keep the training QAs the frozen LM already answers correctly from its memory.

The paper supervises the graph token only on QA pairs whose final answer was correct (2,138 → 1,634):
the graph token should help the LM *use* evidence the working memory holds, not memorize answers the
memory cannot support. This module answers each training QA with the frozen LM on the textual working
memory (through the shared prompt contract and generation helper, :mod:`qgmem.prompting`), judges the
answer by a configurable rule (the shared judges, :mod:`qgmem.llm.judge`) and reports what was kept per
split and category.

ConvoMem's ``preference_evidence`` and ``implicit_connection_evidence`` "answers" are grading rubrics
("A good response should ..."), not answers: training on them would teach the LM to write rubrics. For
those categories the supervision target is the frozen LM's own answer *that an LLM judge accepted*; with
no LLM judge there is nothing to accept, so the category is left out of training (validation and test
keep it, with the rubric as the reference).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from qgmem.prompting import PromptSettings
from qgmem.llm.judge import (RUBRIC_CATEGORIES, Judge, JudgeItem, LLMJudge, MatchJudge, MatchRule,
                              backend_completer, llm_judge)

__all__ = ["RUBRIC_CATEGORIES", "RULES", "FilterDecision", "FilterReport", "Judge", "JudgeItem", "LLMJudge",
           "LMAnswerer", "MatchJudge", "MatchRule", "backend_completer", "decide", "make_judge"]

RULES = ("none", "match", "llm")


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
    return llm_judge(judge_config)


# --------------------------------------------------------------------------------------------------
# answering with the frozen LM


class LMAnswerer:
    """Answers from the frozen causal LM on the training prompt, text only (no graph token).

    Prompts and decoding are the shared ones (:class:`qgmem.prompting.PromptEncoder` and
    :func:`qgmem.prompting.generate`), so the LM is judged on exactly the prompt it is trained and
    evaluated on (same template, same memory trimming, same stop rule). Loaded lazily on first use;
    ``device=None`` picks CUDA when available. On CPU this is the slow part of a cache build (seconds
    per QA for SmolLM2-135M on two cores), which is why answers are cached by
    :class:`qgmem.samples.cache.AnswerCache` and never regenerated.
    """

    def __init__(self, lm: str, *, prompt: PromptSettings | None = None, batch_size: int = 8,
                 max_new_tokens: int = 32, device: str | None = None, dtype: str = "auto"):
        self.lm, self.batch_size, self.max_new_tokens = lm, batch_size, max_new_tokens
        self.prompt_settings = prompt or PromptSettings()
        self.device, self.dtype = device, dtype
        self._model = self._prompts = None

    @property
    def settings(self) -> dict[str, Any]:
        """What the answers depend on besides the prompt text (part of the answer-cache key)."""
        # the answer length cap and the graph-token slots never change a text-only answer
        prompt = {k: v for k, v in self.prompt_settings.to_dict().items()
                  if k not in ("max_answer_tokens", "num_graph_tokens")}
        from qgmem.prompting.answer import ANSWER_CUT_VERSION

        # the answer cut's version: a cut that reads replies differently changes the answers, and the filter's decisions
        return {"lm": self.lm, "max_new_tokens": self.max_new_tokens, "decoding": "greedy", "dtype": self.dtype,
                "prompt": prompt, "answer_cut": ANSWER_CUT_VERSION}

    def _load(self) -> None:
        if self._model is not None:
            return
        import torch

        from qgmem.lm import load_causal_lm, load_tokenizer
        from qgmem.prompting import PromptEncoder

        device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        self._prompts = PromptEncoder(load_tokenizer(self.lm), self.prompt_settings)
        self._model = load_causal_lm(self.lm, dtype=self.dtype, device=device)

    def answer(self, pairs: Sequence[tuple[str, str]]) -> list[str]:
        """Answers for ``(memory_text, question)`` pairs, in order."""
        from qgmem.prompting import final_answer, generate, left_pad

        if not pairs:
            return []
        self._load()
        encoder, settings = self._prompts, self.prompt_settings
        out: list[str] = []
        for start in range(0, len(pairs), self.batch_size):
            ids, mask = left_pad([encoder.prompt(m, q).ids for m, q in pairs[start:start + self.batch_size]],
                                 encoder.pad_id)
            gen = generate(self._model, encoder.tokenizer, mask, input_ids=ids, max_new_tokens=self.max_new_tokens,
                           stop_ids=encoder.stop_ids, pad_id=encoder.pad_id,
                           stop_at_newline=settings.first_line and not settings.enable_thinking)
            out.extend(final_answer(t, settings.first_line) for t in gen.texts)
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
