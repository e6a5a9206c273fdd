"""The frozen LM behind a serving engine: a fused prompt sent as ``prompt_embeds`` to the Completions API.

The wire format is vLLM's ("Prompt Embedding Inputs", vLLM 0.11.0, and its example
``prompt_embed_inference_with_openai_client``; NVIDIA Dynamo and NIM read the same): ``POST
{base_url}/completions`` with a JSON body whose ``prompt_embeds`` is the base64 text of ``torch.save``
of one ``(sequence_length, hidden_size)`` float tensor: the **whole, already chat-templated** prompt,
graph tokens included, to which the engine applies no template. The engine is started with
``vllm serve MODEL --enable-prompt-embeds``. The body has no ``prompt``: vLLM needs ``prompt`` or
``prompt_embeds``, and the example's ``prompt=""`` is there only because the OpenAI Python client
requires the field. Decoding is greedy (``temperature`` 0), ``max_tokens`` is the answer cap,
``stop: ["\\n"]`` ends the answer at its first line break (the engine leaves the line break out of the
text) and ``stop_token_ids`` are the prompt contract's end-of-turn and eos. The reply is read from
``choices[0].text``, ``choices[0].finish_reason`` (``stop`` | ``length``) and ``usage``; with ``stream``
it comes as server-sent events (``data: {...}`` chunks, ``data: [DONE]`` last, the usage in the last
chunk through ``stream_options.include_usage``).

Requests go through the shared OpenAI-compatible backend (:mod:`qgmem.llm.http`): the same retries,
back-off, deadline, redacted errors and bounded concurrency as every LLM call. A failed request raises
:class:`EngineError` (the serving process answers 502, or 504 when time ran out) instead of an answer.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from qgmem.errors import UserError
from qgmem.llm.base import ChatResult, LLMConfig, _count_results
from qgmem.llm.http import OpenAIChatBackend, _count, _excerpt, redact

#: the dtypes an engine takes for prompt embeddings (vLLM loads float32, bfloat16 and float16)
EMBED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: what ends an answer besides the stop tokens: its first line break
NEWLINE_STOP = "\n"


class EngineError(UserError):
    """The engine did not answer: ``status`` is 504 when time ran out, 502 otherwise."""

    def __init__(self, message: str, status: int = 502):
        super().__init__(message)
        self.status = status


def encode_embeds(embeds: torch.Tensor) -> str:
    """``embeds`` ``(sequence_length, hidden_size)`` as the ``prompt_embeds`` text: base64 of ``torch.save``.

    The tensor is copied first, so a row of a larger batch does not carry the whole batch's storage.
    """
    if embeds.dim() != 2 or embeds.dtype not in EMBED_DTYPES:
        raise ValueError(f"prompt embeddings must be a 2-d float tensor, got {tuple(embeds.shape)} {embeds.dtype}")
    buffer = io.BytesIO()
    torch.save(embeds.detach().to("cpu").clone(), buffer)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def decode_embeds(text: str) -> torch.Tensor:
    """The tensor of a ``prompt_embeds`` text, checked as an engine checks it (``ValueError`` if not one)."""
    try:
        tensor = torch.load(io.BytesIO(base64.b64decode(text, validate=True)), weights_only=True)
    except (binascii.Error, ValueError, TypeError, RuntimeError, EOFError) as exc:
        raise ValueError(f"'prompt_embeds' is not base64 of a torch.save'd tensor ({type(exc).__name__})") from None
    if not isinstance(tensor, torch.Tensor) or tensor.dtype not in EMBED_DTYPES:
        raise ValueError(f"'prompt_embeds' must hold a float32, bfloat16 or float16 tensor, got "
                         f"{getattr(tensor, 'dtype', type(tensor).__name__)}")
    if tensor.dim() == 3 and tensor.size(0) == 1:
        tensor = tensor.squeeze(0)
    if tensor.dim() != 2 or tensor.size(0) == 0:
        raise ValueError(f"'prompt_embeds' must be (sequence_length, hidden_size), got {tuple(tensor.shape)}")
    return tensor


def completion_body(model: str, embeds: torch.Tensor, *, max_tokens: int, stop_ids: Sequence[int],
                    stop_at_newline: bool, stream: bool) -> dict:
    """The Completions request for one fused prompt (see the module docstring)."""
    body = {"model": model, "prompt_embeds": encode_embeds(embeds), "max_tokens": int(max_tokens),
            "temperature": 0.0, "stop_token_ids": [int(i) for i in stop_ids]}
    if stop_at_newline:
        body["stop"] = [NEWLINE_STOP]
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    return body


def parse_completion(raw: bytes, secrets: tuple[str, ...] = ()) -> ChatResult:
    """A non-streamed Completions reply: text, finish reason and usage (an error when unreadable)."""
    try:
        data = json.loads(raw)
        choice = data["choices"][0]
        text = choice["text"]
        if not isinstance(text, str):
            raise TypeError(f"text is {type(text).__name__}")
    except (ValueError, KeyError, IndexError, TypeError) as e:
        return ChatResult("", 0, 0, error=f"unreadable completion ({type(e).__name__}: "
                                         f"{redact(str(e), secrets)[:80]}): {_excerpt(raw, secrets)!r}")
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    return ChatResult(text, _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens")),
                      finish_reason=choice.get("finish_reason"))


class EventStream:
    """Reads a streamed Completions reply chunk by chunk; hands each new piece of text to ``on_text``."""

    def __init__(self, on_text: Callable[[str], None] | None = None):
        self.on_text = on_text
        self.buffer = b""
        self.text = ""
        self.finish_reason: str | None = None
        self.usage: dict = {}
        self.error: str | None = None
        self.done = False

    def feed(self, chunk: bytes) -> None:
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in lines:
            self._line(line.strip())

    def _line(self, line: bytes) -> None:
        if not line.startswith(b"data:") or self.done:
            return
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self.done = True
            return
        try:
            data = json.loads(payload)
        except ValueError:
            self.error = f"unreadable event {payload[:80]!r}"
            return
        if not isinstance(data, dict):
            return
        if isinstance(data.get("error"), dict):
            self.error = str(data["error"].get("message") or data["error"])[:300]
        if isinstance(data.get("usage"), dict):
            self.usage = data["usage"]
        for choice in data.get("choices") or []:
            piece = choice.get("text") or ""
            if piece:
                self.text += piece
                if self.on_text is not None:
                    self.on_text(piece)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def result(self, secrets: tuple[str, ...] = ()) -> ChatResult:
        if self.buffer.strip():
            self._line(self.buffer.strip())
            self.buffer = b""
        if self.error is not None:
            return ChatResult("", 0, 0, error=f"the engine reported: {redact(self.error, secrets)}")
        if not self.done and self.finish_reason is None:
            return ChatResult("", 0, 0, error="the stream ended before its last event")
        return ChatResult(self.text, _count(self.usage.get("prompt_tokens")),
                          _count(self.usage.get("completion_tokens")), finish_reason=self.finish_reason)


@dataclass
class Completion:
    """One engine answer: the text (up to, not including, its first line break), why it ended, tokens."""

    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int


class PromptEmbedsClient:
    """Sends fused prompts to an engine's Completions API, one request per prompt, side by side."""

    def __init__(self, config: LLMConfig, transport: OpenAIChatBackend | None = None):
        self.config = config
        self.http = transport or OpenAIChatBackend(config)

    @property
    def usage(self):
        return self.http.usage

    def complete(self, prompts: Sequence[torch.Tensor], *, max_tokens: Sequence[int], stop_ids: Sequence[int],
                 stop_at_newline: bool, on_text: Sequence[Callable[[str], None] | None] | None = None
                 ) -> list[Completion]:
        """Greedy answers to ``prompts`` (each ``(sequence_length, hidden_size)``), in order.

        ``on_text[i]`` (optional) streams prompt ``i``: it gets each new piece of text as the engine sends
        it. Raises :class:`EngineError` when any request fails.
        """
        on_text = list(on_text) if on_text is not None else [None] * len(prompts)
        pool = self.http._requests()
        futures = [pool.submit(self._one, embeds, cap, stop_ids, stop_at_newline, callback)
                   for embeds, cap, callback in zip(prompts, max_tokens, on_text)]
        results = [f.result() for f in futures]
        with self.http._lock:
            _count_results(self.http.usage, results)
        for r in results:
            if r.error is not None:
                raise EngineError(f"the LM engine at {self.config.base_url} did not answer: {r.error}",
                                  504 if r.timed_out else 502)
        return [Completion(r.text, r.finish_reason or "stop", r.prompt_tokens, r.completion_tokens) for r in results]

    def _one(self, embeds: torch.Tensor, cap: int, stop_ids: Sequence[int], stop_at_newline: bool,
             on_text: Callable[[str], None] | None) -> ChatResult:
        body = completion_body(self.config.model, embeds, max_tokens=cap, stop_ids=stop_ids,
                               stop_at_newline=stop_at_newline, stream=on_text is not None)
        if on_text is None:
            return self.http._redacted(self.http.send("/completions", body, parse_completion, problem=None))
        streams: list[EventStream] = []

        def sink() -> Callable[[bytes], None]:
            streams.append(EventStream(on_text))
            return streams[-1].feed

        result = self.http.send("/completions", body, lambda raw, secrets: streams[-1].result(secrets),
                                problem=None, sink=sink, may_retry=lambda: not (streams and streams[-1].text))
        return self.http._redacted(result)

    def served_models(self) -> list[str]:
        """The model ids the engine lists at ``GET {base_url}/models``.

        Raises ``httpx.TransportError`` when nothing answers there, and :class:`EngineError` naming the
        status (and the body's start, redacted) when the engine answers anything but a model list.
        """
        reply = self.http._client.get("/models")
        if reply.status_code != 200:
            raise EngineError(f"the LM engine at {self.config.base_url} answered GET /models with HTTP "
                              f"{reply.status_code}: {_excerpt(reply.content, self.http._secrets)}",
                              reply.status_code)
        try:
            listed = json.loads(reply.content)["data"]
            return [str(item["id"]) for item in listed]
        except (ValueError, KeyError, TypeError):
            raise EngineError(f"the LM engine at {self.config.base_url} answered GET /models with no model list: "
                              f"{_excerpt(reply.content, self.http._secrets)}") from None

    def close(self) -> None:
        self.http.close()
