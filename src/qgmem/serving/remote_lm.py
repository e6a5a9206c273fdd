"""The frozen LM behind a serving engine (``--lm-url``): its input embedding table here, its transformer there.

The serving process keeps construction, activation, the graph encoder and the LM's input embedding
table (:func:`qgmem.lm.load_input_embeddings`); it builds each question's fused sequence exactly as
in process (template, memory text, question, graph tokens at their slot) and sends it, one row per
question without its padding, as prompt embeddings to an OpenAI-compatible engine such as ``vllm
serve MODEL --enable-prompt-embeds`` (:mod:`qgmem.llm.prompt_embeds`). The engine decodes greedily up
to the answer cap and the first line break; its errors and time-outs raise
:class:`~qgmem.llm.prompt_embeds.EngineError`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import httpx
import torch

from qgmem.errors import UserError
from qgmem.lm import EMBEDDED_LM_HUB_ID, load_input_embeddings, resolve_lm_path
from qgmem.llm.base import LLMConfig
from qgmem.llm.prompt_embeds import PromptEmbedsClient

#: how long the engine may take: each read, and one answer with its retries (a hung engine is a 504)
ENGINE_TIMEOUT_S = 60.0
ENGINE_DEADLINE_S = 120.0
ENGINE_RETRIES = 2
#: how long loading waits for an engine that does not answer yet (one still loading its weights)
ENGINE_START_WAIT_S = 60.0


def engine_config(url: str, model: str | None, api_key_env: str | None) -> LLMConfig:
    """The shared backend's settings for an engine at ``url`` (``.../v1``) serving ``model`` (``None``:
    named after the export's LM when it loads, :func:`served_model_name`)."""
    return LLMConfig(backend="openai", model=model, base_url=url, api_key_env=api_key_env,
                     timeout_s=ENGINE_TIMEOUT_S, deadline_s=ENGINE_DEADLINE_S, max_retries=ENGINE_RETRIES)


def served_model_name(lm_id: str) -> str:
    """The name an engine serves the LM ``lm_id`` under by default (``vllm serve`` names it by its hub id)."""
    return EMBEDDED_LM_HUB_ID if resolve_lm_path(lm_id) != lm_id else lm_id


def wait_for_engine(client: PromptEmbedsClient, *, wait_s: float | None = None, poll_s: float = 2.0,
                    sleep: Callable[[float], None] = time.sleep) -> None:
    """Return once the engine lists ``client``'s model; :class:`~qgmem.errors.UserError` (exit 2) otherwise.

    Checked when the export loads, so a wrong ``--lm-url``, ``--lm-model`` or key stops ``qgmem serve``,
    ``answer`` and ``eval-qa`` at start-up with its reason, not at the first answer as a 502. An engine that
    does not answer yet (it may still be loading) is polled every ``poll_s`` for up to ``wait_s`` (default
    :data:`ENGINE_START_WAIT_S`); one that answers without the model, or with an error, stops at once.
    """
    wait_s = ENGINE_START_WAIT_S if wait_s is None else wait_s
    url, model = client.config.base_url, client.config.model
    deadline = time.monotonic() + wait_s
    announced = False
    while True:
        try:
            served = client.served_models()
            break
        except httpx.TransportError as exc:
            if time.monotonic() >= deadline:
                raise UserError(f"no LM engine answers at {url} ({type(exc).__name__} for {wait_s:g} s): start it "
                                "(vllm serve MODEL --enable-prompt-embeds) or correct --lm-url") from None
            if not announced:
                print(f"waiting up to {wait_s:g} s for the LM engine at {url} ...", file=sys.stderr, flush=True)
                announced = True
            sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
    if model not in served:
        raise UserError(f"the LM engine at {url} serves {served}, not {model!r}: give --lm-model (the name the "
                        "engine serves the export's LM under)")


class RemoteLM:
    """Stands where the in-process LM stands: its input embeddings, and answers from the engine."""

    def __init__(self, embedding: torch.nn.Embedding, client: PromptEmbedsClient):
        self.embedding, self.client = embedding, client

    @property
    def device(self) -> torch.device:
        return self.embedding.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embedding.weight.dtype

    @classmethod
    def load(cls, lm_id: str, engine: LLMConfig, *, dtype: str = "auto", device: str | None = None) -> RemoteLM:
        """``lm_id``'s input embedding table, and a client of ``engine`` (its model named by default) once the
        engine serves that model (:func:`wait_for_engine`)."""
        if not engine.model:
            engine = replace(engine, model=served_model_name(lm_id))
        client = PromptEmbedsClient(engine)
        wait_for_engine(client)
        return cls(load_input_embeddings(lm_id, dtype=dtype, device=device), client)

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return self.embedding

    def answer(self, embeds: torch.Tensor, mask: torch.Tensor, caps: Sequence[int], stop_ids: Sequence[int],
               stop_at_newline: bool, streamer: Any = None) -> tuple[list[str], list[int], list[str]]:
        """Texts, generated-token counts and finish reasons of the left-padded fused rows ``embeds``.

        ``streamer``: the batcher's row streamer; each streamed row's text goes to its ``add_text``.
        """
        rows = [row[keep.bool()] for row, keep in zip(embeds, mask)]
        on_text = None
        if streamer is not None:
            on_text = [None if streamer.callbacks[i] is None else (lambda piece, i=i: streamer.add_text(i, piece))
                       for i in range(len(rows))]
        # an engine's stop strings end a reply at its first line break, which cuts the answer off a reply that
        # opens with a lead-in line ("The answer is:"): the engine decodes to the cap, and the answer cut reads
        # the reply here as in process (a reply that holds an answer line ended there, as far as it is read)
        from qgmem.prompting.answer import holds_answer_line

        done = self.client.complete(rows, max_tokens=caps, stop_ids=stop_ids, stop_at_newline=False, on_text=on_text)
        finish = ["stop" if c.finish_reason == "stop" or (stop_at_newline and holds_answer_line(c.text)) else c.finish_reason
                  for c in done]
        return [c.text for c in done], [c.completion_tokens for c in done], finish

    def close(self) -> None:
        self.client.close()
