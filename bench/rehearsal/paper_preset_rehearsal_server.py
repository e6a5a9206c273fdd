"""The rehearsal's LLM server: an OpenAI-compatible ``/v1/chat/completions`` on 127.0.0.1 (FastAPI + uvicorn).

It stands where vLLM/SGLang stand in ``configs/qwen3_8b.yaml``: the project's HTTP backend, response
cache, retries and concurrency limits reach it exactly as they reach a production server. Behind it:

- **SmolLM2-135M-Instruct** (the embedded LM, through transformers, one request at a time) answers every
  judge request and one construction window in ``--model-share`` (chosen by a hash of the window, so the
  same windows every run). A judge reply is SmolLM2's choice between ``VERDICT: CORRECT`` and
  ``VERDICT: INCORRECT`` by the likelihood of each (the guided choice vLLM offers; one forward pass, so
  the judge costs seconds, not minutes, on a CPU). A construction reply is its greedy text, cut at
  ``SMOLLM_MAX_TOKENS``: malformed extraction JSON, which the build must count, skip and go past.
- **a scripted responder** answers the other construction windows and the consolidation prompts with
  well-formed replies built from the window's own turns (one unit per non-context turn), so the build
  reaches training in minutes on a CPU. Which replies came from which (source ``model`` or ``scripted``)
  is counted (``GET /stats``) and logged, one JSON line per request, to ``--log``. ``--lm`` puts another
  causal LM folder behind the server (the tests use a random one).

Why not LitServe's ``OpenAISpec``: it is a new dependency (the project already ships FastAPI and
uvicorn for ``qgmem serve``) and it runs inference in separate worker processes, one more copy of the
model and one more process on a 2-core machine shared by the two DDP ranks; the HTTP contract the
backend sees (request body, JSON reply, status codes) is the same.

    python -m bench.rehearsal.paper_preset_rehearsal_server --port 8123 --log server.jsonl [--model-share 8]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import threading
import time
from pathlib import Path
from typing import Any

#: the first words of each prompt the preset sends to ``base_url`` (qgmem.llm.prompts, qgmem.llm.judge)
KINDS = (("construction", "You turn a slice of a conversation into memory entries"),
         ("consolidation", "You maintain the history of one evolving piece of information"),
         ("judge", "You grade an assistant's reply"))
#: ``[T3] [CONTEXT] (2024-01-02) user: text`` — a turn line of a construction prompt (qgmem.llm.prompts.format_turn)
TURN = re.compile(r"^\[(?P<label>[^\]]+)\](?P<context> \[CONTEXT\])?(?: \((?P<time>[^)]*)\))? (?P<speaker>[^:]+): (?P<text>.*)$")
#: SmolLM2's reply length per kind: enough for a verdict, and a window's JSON is cut where a weak model's would be
SMOLLM_MAX_TOKENS = {"construction": 16, "consolidation": 16, "other": 16}
VERDICTS = ("VERDICT: CORRECT", "VERDICT: INCORRECT")


def kind_of(messages: list[dict[str, str]]) -> str:
    system = next((m.get("content", "") for m in messages if m.get("role") == "system"), "")
    return next((kind for kind, start in KINDS if system.startswith(start)), "other")


def window_key(messages: list[dict[str, str]]) -> str:
    """The window a construction request is about (its first user message), retries included."""
    user = next((m.get("content", "") for m in messages if m.get("role") == "user"), "")
    return hashlib.sha256(user.encode()).hexdigest()


def scripted_construction(messages: list[dict[str, str]]) -> str:
    """One well-formed unit per non-context turn of the window, its triple from the turn's own words."""
    user = next((m.get("content", "") for m in messages if m.get("role") == "user"), "")
    units = []
    for line in user.splitlines():
        turn = TURN.match(line.strip())
        if not turn or turn["context"] or not turn["text"].strip():
            continue
        words = turn["text"].split()
        speaker = turn["speaker"].strip()
        units.append({"fact": f"{speaker} said: {turn['text'].strip()}"[:300], "turn_start": turn["label"],
                      "turn_end": turn["label"], "subject": speaker, "predicate": "said",
                      "object": " ".join(words[:8]) or "something",
                      "entities": sorted({w.strip(".,!?") for w in words if w[:1].isupper()})[:5],
                      "location": "", "fact_time": ""})
    return json.dumps({"units": units})


def scripted_consolidation(messages: list[dict[str, str]]) -> str:
    """Keep every entry, each later one a supplement (a valid, neutral reply)."""
    user = next((m.get("content", "") for m in messages if m.get("role") == "user"), "")
    ids = re.findall(r"^(M\d+)\b", user, flags=re.M)
    return json.dumps({"members": ids, "transitions": {i: "supplement" for i in ids[1:]}})


class Responder:
    """Routes each request to SmolLM2 or the script and counts both."""

    def __init__(self, model_share: int, log: Path | None, lm: str | None = None):
        self.model_share = max(1, model_share)
        self.log = log
        self.lm_name = lm
        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._model_lock = threading.Lock()
        self._lm = None

    def _model(self):
        if self._lm is None:
            from qgmem.lm import EMBEDDED_LM, load_causal_lm, load_tokenizer

            name = self.lm_name or EMBEDDED_LM
            self._lm = (load_causal_lm(name), load_tokenizer(name, padding_side="left"))
        return self._lm

    def smollm(self, messages: list[dict[str, str]], max_tokens: int) -> tuple[str, int, int]:
        import torch

        with self._model_lock:
            model, tok = self._model()
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                          return_dict=True)
            with torch.no_grad():
                out = model.generate(**ids, max_new_tokens=max_tokens, do_sample=False,
                                     pad_token_id=tok.pad_token_id)
            new = out[0, ids["input_ids"].shape[1]:]
            return tok.decode(new, skip_special_tokens=True), int(ids["input_ids"].shape[1]), int(new.shape[0])

    def choose(self, messages: list[dict[str, str]], options: tuple[str, ...]) -> tuple[str, int]:
        """The option SmolLM2 finds likelier after the prompt (summed log-probability of its tokens)."""
        import torch

        with self._model_lock:
            model, tok = self._model()
            prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            scores = []
            for option in options:
                ids = tok(prompt + option, return_tensors="pt", add_special_tokens=False)["input_ids"]
                n = len(tok(option, add_special_tokens=False)["input_ids"])
                with torch.no_grad():
                    logp = model(ids).logits[0, :-1].float().log_softmax(-1)
                target = ids[0, 1:]
                scores.append(float(logp[-n:].gather(1, target[-n:, None]).sum()))
            return options[max(range(len(options)), key=scores.__getitem__)], int(ids.shape[1])

    def route(self, kind: str, messages: list[dict[str, str]]) -> str:
        if kind == "judge" or kind == "other":
            return "model"
        if kind == "construction" and int(window_key(messages)[:8], 16) % self.model_share == 0:
            return "model"
        return "scripted"

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body.get("messages") or []
        kind = kind_of(messages)
        source = self.route(kind, messages)
        started = time.perf_counter()
        if source == "model" and kind == "judge":
            text, prompt_tokens = self.choose(messages, VERDICTS)
            completion_tokens = 4
        elif source == "model":
            cap = min(int(body.get("max_tokens") or 64), SMOLLM_MAX_TOKENS[kind])
            text, prompt_tokens, completion_tokens = self.smollm(messages, cap)
        else:
            text = scripted_construction(messages) if kind == "construction" else scripted_consolidation(messages)
            prompt_tokens, completion_tokens = sum(len(m.get("content", "")) for m in messages) // 4, len(text) // 4
        with self._lock:
            key = f"{kind}/{source}"
            self.counts[key] = self.counts.get(key, 0) + 1
            if self.log is not None:
                with self.log.open("a") as f:
                    f.write(json.dumps({"kind": kind, "source": source, "retry": len(messages) > 2,
                                        "empty": not text.strip(),
                                        "seconds": round(time.perf_counter() - started, 3)}) + "\n")
        return {"id": f"chatcmpl-{int(time.time() * 1e6)}", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model", "rehearsal"),
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                          "total_tokens": prompt_tokens + completion_tokens}}


def make_app(responder: Responder):
    from fastapi import FastAPI, HTTPException

    app = FastAPI(title="rehearsal LLM server")

    @app.post("/v1/chat/completions")
    def chat(body: dict[str, Any]) -> dict[str, Any]:  # a sync route: FastAPI runs it on its thread pool
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            raise HTTPException(status_code=400, detail="messages: a non-empty list is required")
        return responder(body)

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "rehearsal", "object": "model"}]}

    @app.get("/stats")
    def stats() -> dict[str, int]:
        return dict(responder.counts)

    return app


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--log", type=Path, default=None, help="one JSON line per request (kind, source)")
    p.add_argument("--model-share", type=int, default=8, help="1 in N construction windows go to SmolLM2")
    p.add_argument("--lm", default=None, help="the model behind the server (default: the embedded SmolLM2)")
    args = p.parse_args(argv)
    responder = Responder(args.model_share, args.log, args.lm)
    import torch

    torch.set_num_threads(2)
    responder._model()  # loaded before the port opens: a client that connects gets answers, not a stall
    uvicorn.run(make_app(responder), host="127.0.0.1", port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
