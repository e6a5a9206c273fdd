"""The one generation helper: batched, left-padded decoding from token ids or from fused embeddings.

The answer filter, the local LLM backend, training's EM/F1 and serving all decode through
:func:`generate`, so an answer reads the same wherever it was produced: generation stops at the first
stop token (end of turn or eos) and, for answers, at the first line break (see
:attr:`~qgmem.prompting.contract.PromptSettings.first_line`); :func:`final_answer` turns the decoded
text into the answer that is scored.
"""

from __future__ import annotations

import copy
import weakref
from dataclasses import dataclass
from typing import Sequence

import torch

from qgmem.text import strip_thinking


@dataclass
class Generation:
    """New token ids per row, cut after the first stop token (or after the line break that ended the
    row, without the batch's padding), and their decoded text."""

    ids: list[list[int]]
    texts: list[str]

    @property
    def num_tokens(self) -> list[int]:
        return [len(row) for row in self.ids]


def left_pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` ``[B, max_len]`` with every row ending in the last column."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, row in enumerate(rows):
        if row:
            ids[b, width - len(row):] = torch.tensor(list(row), dtype=torch.long)
            mask[b, width - len(row):] = 1
    return ids, mask


@torch.no_grad()
def generate(lm, tokenizer, attention_mask: torch.Tensor, *, input_ids: torch.Tensor | None = None,
             inputs_embeds: torch.Tensor | None = None, max_new_tokens: int, stop_ids: Sequence[int],
             pad_id: int, stop_at_newline: bool = False, temperature: float = 0.0, streamer=None,
             prefix_ids: Sequence[int] = ()) -> Generation:
    """Continue left-padded prompts (``input_ids`` or ``inputs_embeds``, ``[B, T(, H)]``).

    Greedy at ``temperature`` 0 (sampling above it). ``stop_at_newline`` also ends a row at its first
    line break. Special tokens are dropped from the text; thinking blocks are kept (see
    :func:`final_answer`). ``streamer``: a ``transformers`` streamer that gets each step's tokens.
    ``prefix_ids``: the tokens every prompt starts with (the system prompt and template head); when no
    row is padded, their KV cache is computed once per LM (:func:`prefix_cache`) and a copy of it
    continued, so the prefill covers only the rest.
    """
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("pass exactly one of input_ids and inputs_embeds")
    device = next(lm.parameters()).device
    kwargs = {"input_ids": input_ids.to(device)} if input_ids is not None else {"inputs_embeds": inputs_embeds}
    if prefix_ids and bool(attention_mask.all()) and attention_mask.size(1) > len(prefix_ids):
        kwargs["cache"] = prefix_cache(lm, prefix_ids, attention_mask.size(0))
    sampling = {"do_sample": True, "temperature": float(temperature)} if temperature > 0 else {"do_sample": False}
    if stop_at_newline:
        sampling.update(stopping_criteria=[newline_stop(tokenizer)])
    out = lm.generate(**kwargs, attention_mask=attention_mask.to(device), max_new_tokens=int(max_new_tokens),
                      eos_token_id=list(stop_ids), pad_token_id=pad_id, num_beams=1, streamer=streamer,
                      **sampling)
    if input_ids is not None:  # generate returns prompt + continuation for ids, the continuation for embeds
        out = out[:, input_ids.shape[1]:]
    stops = set(stop_ids)
    rows = []
    for row in out.tolist():
        end = next((i + 1 for i, tok in enumerate(row) if tok in stops), len(row))
        row = row[:end]
        if stop_at_newline and end > 1 and row[-1] == pad_id and "\n" in tokenizer.decode(row[-2:-1]):
            row = row[:-1]  # a line break ended the row a step earlier: the stop token after it is padding
        rows.append(row)
    texts = tokenizer.batch_decode(rows, skip_special_tokens=True) if rows else []
    return Generation(rows, texts)


#: per LM, the KV cache of each prompt prefix it was asked for (a frozen LM's prefix never changes)
_PREFIXES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@torch.no_grad()
def prefix_cache(lm, prefix_ids: Sequence[int], batch_size: int = 1):
    """A fresh copy of the KV cache of ``prefix_ids`` for ``batch_size`` rows, the prefix's forward run
    once per LM (from its input embeddings, as fused prompts enter the LM)."""
    key = tuple(int(t) for t in prefix_ids)
    per_lm = _PREFIXES.setdefault(lm, {})
    cache = per_lm.get(key)
    if cache is None:
        ids = torch.tensor([key], dtype=torch.long, device=next(lm.parameters()).device)
        cache = per_lm[key] = lm(inputs_embeds=lm.get_input_embeddings()(ids), use_cache=True).cache
    cache = copy.deepcopy(cache)
    if batch_size > 1:
        cache.batch_repeat_interleave(batch_size)
    return cache


#: one first-line-break criterion per tokenizer: building it reads the whole vocabulary (0.2–0.6 s for
#: SmolLM2's on a 2-core CPU), which ``stop_strings=`` would redo on every ``generate`` call
_NEWLINE_STOPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def newline_stop(tokenizer):
    """The ``transformers`` criterion that ends a row at its first line break, built once per tokenizer."""
    from transformers import StopStringCriteria

    criterion = _NEWLINE_STOPS.get(tokenizer)
    if criterion is None:
        criterion = _NEWLINE_STOPS[tokenizer] = StopStringCriteria(tokenizer, ["\n"])
    return criterion


def final_answer(text: str, first_line: bool = True) -> str:
    """The scored answer: thinking removed, then the first non-empty line (or all of it), trimmed."""
    text = strip_thinking(text)
    if first_line:
        text = next((line for line in text.splitlines() if line.strip()), "")
    return text.strip()
