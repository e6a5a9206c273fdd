"""Pulling one JSON value out of an LLM reply that may wrap it in prose, code fences or ``<think>``.

Models at temperature 0 still decorate their answers: reasoning models emit ``<think>…</think>`` first,
chat models add ```` ```json ```` fences or a sentence after the object. We strip the reasoning, then
decode the first complete JSON object/array with :meth:`json.JSONDecoder.raw_decode`, which stops at
the end of the value and so ignores whatever trails it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from qgmem.text.answers import strip_thinking

_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.DOTALL)
_DECODER = json.JSONDecoder()


class JSONExtractionError(ValueError):
    """No JSON value could be decoded from the reply (the message says why, for a retry prompt)."""


#: drop ``<think>`` blocks (an unclosed one runs to the end): the rule of :mod:`qgmem.text.answers`
strip_reasoning = strip_thinking


def extract_json(text: str, expect: type = dict) -> Any:
    """The first JSON value of type ``expect`` (``dict`` or ``list``) in ``text``.

    Fenced blocks are tried first (their content is what the model meant as data), then the bare text
    from each ``{``/``[``. Raises :class:`JSONExtractionError` when nothing decodes.
    """
    text = strip_reasoning(text)
    if not text.strip():
        raise JSONExtractionError("the reply is empty (or only reasoning)")
    candidates = [m.group(1) for m in _FENCE.finditer(text)] + [text]
    opener = "{" if expect is dict else "["
    last_error = "no JSON object found"
    for chunk in candidates:
        start, attempts = chunk.find(opener), 0
        while start != -1 and attempts < 64:  # bounded: junk with many braces must stay cheap
            attempts += 1
            try:
                value, _ = _DECODER.raw_decode(chunk, start)
            except json.JSONDecodeError as e:
                last_error = f"invalid JSON: {e.msg} at character {e.pos}"
            else:
                if isinstance(value, expect):
                    return value
                last_error = f"expected a JSON {expect.__name__}, got {type(value).__name__}"
            start = chunk.find(opener, start + 1)
    raise JSONExtractionError(last_error)
