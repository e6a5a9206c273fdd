"""The rehearsal's OpenAI-compatible server: the project's HTTP backend reads its replies as from vLLM."""

from __future__ import annotations

import json
import threading

import pytest

from qgmem.llm.base import LLMConfig
from qgmem.llm.http import OpenAIChatBackend
from qgmem.llm.judge import JudgeItem, judge_messages, parse_verdict
from qgmem.llm.prompts import construction_messages, consolidation_messages, format_turn
from qgmem.memory.extract_llm import parse_reply
from qgmem.model.random_lm import THINKING_TEMPLATE, save_random_lm
from bench_script import load_bench_script

pytest.importorskip("uvicorn")  # the serve extra, which the README's test command installs



@pytest.fixture(scope="module")
def served(tmp_path_factory):
    import uvicorn

    S = load_bench_script("bench.rehearsal.paper_preset_rehearsal_server")
    tmp = tmp_path_factory.mktemp("server")
    lm = save_random_lm(tmp / "lm", arch="qwen3", hidden_size=32, layers=1, chat_template=THINKING_TEMPLATE)
    responder = S.Responder(model_share=2, log=tmp / "log.jsonl", lm=str(lm))
    config = uvicorn.Config(S.make_app(responder), host="127.0.0.1", port=0, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        thread.join(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield S, responder, f"http://127.0.0.1:{port}/v1", tmp / "log.jsonl"
    server.should_exit = True
    thread.join(10)


def _window(texts):
    lines = [format_turn(f"T{i + 1}", "user" if i % 2 == 0 else "assistant", t, None, context=(i == 0))
             for i, t in enumerate(texts)]
    return construction_messages(lines, "2024-03-01")


def test_scripted_construction_is_a_valid_reply_from_the_window_own_turns(served):
    S = served[0]
    reply = S.scripted_construction(_window(["hello there", "I moved to Lisbon in May.", "Nice, Lisbon is sunny."]))
    units = parse_reply(reply)
    assert [u.turn_start for u in units] == ["T2", "T3"]  # the CONTEXT turn gives no unit
    assert units[0].subject == "assistant" and "Lisbon" in units[0].entities
    consolidation = json.loads(S.scripted_consolidation(consolidation_messages("user", "lives in",
                                                                               ["M1 (2024): a", "M2 (2025): b"])))
    assert consolidation == {"members": ["M1", "M2"], "transitions": {"M2": "supplement"}}


def test_the_backend_reaches_both_sources_and_the_judge_gets_a_verdict(served):
    S, responder, url, log = served
    backend = OpenAIChatBackend(LLMConfig(backend="openai", model="Qwen/Qwen3-8B", base_url=url, api_key_env=None,
                                      max_retries=0))
    windows = [_window(["hi", f"My sister {name} plays the cello.", "ok"]) for name in
               ("Ana", "Bea", "Cid", "Dan", "Eve", "Fay", "Gus", "Hal")]
    routes = [responder.route("construction", w) for w in windows]
    assert set(routes) == {"scripted", "model"}  # the hash sends some windows to the model, not all
    results = backend.chat(windows, max_new_tokens=512, temperature=0.0)
    for route, result in zip(routes, results):
        if route == "scripted":
            assert result.ok and parse_reply(result.text)
        else:  # the model's text (a random LM's may be empty: unusable), never a transport error
            assert result.ok or result.unusable or "empty reply" in result.error, result.error
    item = JudgeItem(question="Where does she live?", reference="Lisbon", prediction="in Lisbon", category="x")
    verdict = backend.chat([judge_messages(item)], max_new_tokens=64, temperature=0.0)[0]
    assert parse_verdict(verdict.text) in (True, False)
    logged = [json.loads(line) for line in log.read_text().splitlines()]
    assert {(r["kind"], r["source"]) for r in logged} >= {("construction", "scripted"), ("construction", "model"),
                                                          ("judge", "model")}
    assert responder.counts["judge/model"] == 1


def test_a_request_without_messages_is_a_400(served):
    import httpx

    assert httpx.post(served[2] + "/chat/completions", json={"model": "m"}).status_code == 400
