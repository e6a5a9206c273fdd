"""A test double of a serving engine: vLLM's Completions API with ``prompt_embeds`` over a local causal LM.

It implements the part of the wire format ``qgmem`` sends (:mod:`qgmem.llm.prompt_embeds`): ``POST
/v1/completions`` with ``prompt_embeds`` (base64 of ``torch.save`` of a ``(sequence_length,
hidden_size)`` tensor, no chat template applied), greedy decoding, ``max_tokens``, ``stop: ["\\n"]`` (left
out of the text, as vLLM does), ``stop_token_ids``, ``stream`` with ``stream_options.include_usage``, and
``GET /v1/models``. Generation is the project's own helper over the frozen LM, one request at a time.
It is not a product server: tests and the GPU rehearsal start it where vLLM is not installed.

    python tests/serving/engine_double.py --lm embedded:SmolLM2-135M-Instruct --port 8100
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch

from qgmem.llm.prompt_embeds import NEWLINE_STOP, decode_embeds
from qgmem.prompting import generate


class BadRequest(Exception):
    """The request is not one this double (or vLLM) takes: HTTP 400 with the message."""


class TextPieces:
    """A ``transformers`` streamer turning one row's new tokens into new text, cut at the first line break."""

    def __init__(self, tokenizer, stop_ids: set[int], newline: bool, emit):
        self.tokenizer, self.stop_ids, self.newline, self.emit = tokenizer, stop_ids, newline, emit
        self.ids: list[int] = []
        self.sent = ""
        self.closed = False

    def put(self, value) -> None:
        if value.dim() != 1 or self.closed:  # the prompt, or a row already ended
            return
        token = int(value[0])
        if token in self.stop_ids:
            self.closed = True
            return
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if self.newline and NEWLINE_STOP in text:
            text, self.closed = text.split(NEWLINE_STOP, 1)[0], True
        if text.startswith(self.sent) and len(text) > len(self.sent) and "\ufffd" not in text[len(self.sent):]:
            self.emit(text[len(self.sent):])
            self.sent = text

    def end(self) -> None:
        pass


class EngineDouble:
    """The LM and what a request asks of it (see the module docstring)."""

    def __init__(self, lm, tokenizer, model_name: str):
        self.lm, self.tokenizer, self.model_name = lm, tokenizer, model_name
        self.lock = threading.Lock()  # one generation at a time
        self.requests: list[dict] = []  # every request body, for tests
        self.delay_s = 0.0  # tests: seconds to wait before answering (a slow engine)
        self.fail_with: tuple[int, str] | None = None  # tests: answer every request with this status and message

    def check(self, body: Any) -> dict:
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        if body.get("model") != self.model_name:
            raise BadRequest(f"The model `{body.get('model')}` does not exist.")
        if "prompt_embeds" not in body:
            raise BadRequest("At least one of `prompt` or `prompt_embeds` must be set.")
        if body.get("prompt") not in (None, ""):
            raise BadRequest("this double takes prompt_embeds alone")
        if float(body.get("temperature", 1.0)) != 0.0:
            raise BadRequest("this double decodes greedily only (temperature 0)")
        stop = body.get("stop") or []
        if stop not in ([], [NEWLINE_STOP]):
            raise BadRequest(f"this double stops at a line break only, got stop={stop!r}")
        try:
            embeds = decode_embeds(body["prompt_embeds"])
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        hidden = self.lm.get_input_embeddings().embedding_dim
        if embeds.size(1) != hidden:
            raise BadRequest(f"prompt_embeds has hidden size {embeds.size(1)}, the model {hidden}")
        max_tokens = body.get("max_tokens", 16)
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise BadRequest(f"max_tokens must be a positive integer, got {max_tokens!r}")
        stop_ids = body.get("stop_token_ids") or [self.tokenizer.eos_token_id]
        return {"embeds": embeds, "max_tokens": max_tokens, "stop_ids": [int(i) for i in stop_ids],
                "newline": stop == [NEWLINE_STOP], "stream": bool(body.get("stream")),
                "usage": bool((body.get("stream_options") or {}).get("include_usage"))}

    def complete(self, asked: dict, emit=None) -> dict:
        """Greedy continuation of the prompt embeddings: text, finish reason, usage."""
        embeds = asked["embeds"].to(self.lm.dtype).unsqueeze(0)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else asked["stop_ids"][0]
        streamer = TextPieces(self.tokenizer, set(asked["stop_ids"]), asked["newline"], emit) if emit else None
        with self.lock:
            out = generate(self.lm, self.tokenizer, torch.ones(1, embeds.size(1), dtype=torch.long),
                           inputs_embeds=embeds, max_new_tokens=asked["max_tokens"], stop_ids=asked["stop_ids"],
                           pad_id=pad, stop_at_newline=asked["newline"], streamer=streamer)
        row, text = out.ids[0], out.texts[0]
        stopped = bool(row) and row[-1] in asked["stop_ids"]
        if asked["newline"] and NEWLINE_STOP in text:
            text, stopped = text.split(NEWLINE_STOP, 1)[0], True
        return {"text": text, "finish_reason": "stop" if stopped or len(row) < asked["max_tokens"] else "length",
                "usage": {"prompt_tokens": embeds.size(1), "completion_tokens": len(row),
                          "total_tokens": embeds.size(1) + len(row)}}


def make_handler(engine: EngineDouble):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # a streamed body ends when the connection closes

        def reply(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (a time-out test)
                pass

        def error(self, status: int, message: str) -> None:
            self.reply(status, {"object": "error", "message": message, "type": "BadRequestError", "code": status})

        def do_GET(self):  # noqa: N802 - http.server's naming
            if self.path.rstrip("/") == "/v1/models":
                self.reply(200, {"object": "list", "data": [{"id": engine.model_name, "object": "model"}]})
            else:
                self.error(404, f"no endpoint {self.path}")

        def do_POST(self):  # noqa: N802
            if self.path != "/v1/completions":
                return self.error(404, f"no endpoint {self.path}")
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                engine.requests.append(body)
                asked = engine.check(body)
            except (ValueError, BadRequest) as exc:
                return self.error(400, str(exc))
            if engine.delay_s:
                time.sleep(engine.delay_s)
            if engine.fail_with is not None:
                return self.error(*engine.fail_with)
            meta = {"id": f"cmpl-{uuid.uuid4().hex[:16]}", "object": "text_completion",
                    "created": int(time.time()), "model": engine.model_name}
            if not asked["stream"]:
                done = engine.complete(asked)
                return self.reply(200, {**meta, "choices": [{"index": 0, "text": done["text"], "logprobs": None,
                                                             "finish_reason": done["finish_reason"]}],
                                        "usage": done["usage"]})
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()

            def event(payload: Any) -> None:
                self.wfile.write(f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode())
                self.wfile.flush()

            def piece(text: str) -> None:
                event({**meta, "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": None}]})

            try:
                done = engine.complete(asked, emit=piece)
                event({**meta, "choices": [{"index": 0, "text": "", "logprobs": None,
                                            "finish_reason": done["finish_reason"]}]})
                if asked["usage"]:
                    event({**meta, "choices": [], "usage": done["usage"]})
                event("[DONE]")
            except (BrokenPipeError, ConnectionResetError):
                pass

        def log_message(self, *args):
            pass

    return Handler


class RunningEngine:
    """The double served on 127.0.0.1 in a thread: ``with RunningEngine(engine) as url: ...`` (url ends in /v1)."""

    def __init__(self, engine: EngineDouble, port: int = 0):
        self.engine = engine
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), make_handler(engine))
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        return self.url

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def main() -> None:
    from qgmem.lm import EMBEDDED_LM, load_causal_lm, load_tokenizer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lm", required=True, help=f"the frozen LM (a folder, hub id or {EMBEDDED_LM})")
    parser.add_argument("--served-model-name", default=None, help="the model name requests carry (default: --lm)")
    parser.add_argument("--dtype", default="float32", help="float32 | bfloat16 | float16 | auto")
    parser.add_argument("--port", type=int, default=8100)
    args = parser.parse_args()
    engine = EngineDouble(load_causal_lm(args.lm, dtype=args.dtype), load_tokenizer(args.lm),
                          args.served_model_name or args.lm)
    server = RunningEngine(engine, args.port)
    print(f"engine double: {args.lm} as {engine.model_name!r} on {server.url}", flush=True)
    server.httpd.serve_forever()


if __name__ == "__main__":
    main()
