"""The HTTP service over a tiny random-init export: endpoints, isolation, bad input, limits, the key."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

pytest.importorskip("fastapi")

from qgmem.lm import load_causal_lm, load_tokenizer
from qgmem.memory.config import ConstructionConfig
from qgmem.serving.pipeline import QGMemPipeline
from qgmem.serving.server import Limits, MemoryService, create_app

from .helpers import HashEncoder, make_encoder
from .server_helpers import running

ALICE = [{"speaker": "User", "text": "My favourite colour is teal and I paint my boat teal every spring."},
         {"speaker": "Assistant", "text": "Teal suits a boat."},
         {"speaker": "User", "text": "I live in Lisbon near the river with my dog Biscuit."}]
BOB = [{"speaker": "User", "text": "My favourite colour is crimson and I paint my boat crimson every spring."},
       {"speaker": "Assistant", "text": "Crimson suits a boat."},
       {"speaker": "User", "text": "I live in Oslo near the fjord with my cat Pepper."}]
ALICE_WORDS, BOB_WORDS = ("teal", "lisbon", "biscuit"), ("crimson", "oslo", "pepper")


@pytest.fixture(scope="module")
def pipeline(tiny_lm_path):
    encoder = make_encoder(tiny_lm_path, construction=ConstructionConfig(extractor="heuristic").to_dict())
    return QGMemPipeline(encoder, load_causal_lm(tiny_lm_path), load_tokenizer(tiny_lm_path, padding_side="left"),
                         HashEncoder(8), max_new_tokens=4)


def _service(pipeline, tmp_path, **kwargs):
    import copy
    import dataclasses

    pipe = copy.copy(pipeline)  # each app its own memory state over the same models
    pipe._builder = None
    (tmp_path / "memories").mkdir(exist_ok=True)
    return MemoryService(pipe, f"sqlite:///{tmp_path / 'memories' / 'memories.db'}", **kwargs)


@pytest.fixture
def server(pipeline, tmp_path):
    service = _service(pipeline, tmp_path)
    with running(create_app(service)) as url:
        yield url, service


def test_sessions_answer_chat_health_and_metrics(server):
    url, service = server
    r = httpx.post(f"{url}/v1/users/alice/sessions", json={"turns": ALICE, "time": "2024-05-01T10:00:00"})
    assert r.status_code == 200, r.text
    first = r.json()
    assert first["user"] == "alice" and first["session"] == 0 and first["units"] == first["units_added"] > 0
    assert set(first["seconds"]) == {"construction", "commit", "total"}
    second = httpx.post(f"{url}/v1/users/alice/sessions",
                        json={"turns": [{"speaker": "User", "text": "I bought a green kayak in June."}]}).json()
    assert second["session"] == 1 and second["units"] == first["units"] + second["units_added"]

    r = httpx.post(f"{url}/v1/users/alice/answer", json={"question": "What colour is my boat?"})
    assert r.status_code == 200, r.text
    a = r.json()
    assert a["user"] == "alice" and a["question"] == "What colour is my boat?" and a["graph_mode"] == "token"
    assert 0 < len(a["memory"]) <= second["units"] and all(m["label"] == f"M{i + 1}" for i, m in enumerate(a["memory"]))
    assert set(a["cited"]) <= {m["label"] for m in a["memory"]}
    assert {"activation", "graph_features", "graph_encoding", "generation", "queue", "total"} <= set(a["seconds"])
    assert a["batch_size"] >= 1 and a["tokens"]["graph"] == 1 and "nodes" in a["graph"]
    none = httpx.post(f"{url}/v1/users/alice/answer", json={"question": "What colour is my boat?", "graph_mode": "none"})
    assert none.json()["graph_mode"] == "none" and none.json()["tokens"]["graph"] == 0

    chat = httpx.post(f"{url}/v1/chat/completions", json={
        "model": "qgmem", "user": "alice", "messages": [{"role": "system", "content": "Be brief."},
                                                        {"role": "user", "content": "What colour is my boat?"}]})
    assert chat.status_code == 200, chat.text
    body = chat.json()
    assert body["object"] == "chat.completion" and body["choices"][0]["message"]["content"] == a["answer"]
    assert body["qgmem"]["memory"] == a["memory"] and body["usage"]["completion_tokens"] == a["tokens"]["generated"]

    health = httpx.get(f"{url}/healthz").json()
    assert health["status"] == "ok" and health["users_loaded"] == 1
    metrics = httpx.get(f"{url}/metrics").text
    for stage in ("activation", "generation", "graph_encoding", "queue", "append_construction", "append_commit"):
        assert f'qgmem_stage_seconds_bucket{{le="0.005",stage="{stage}"}}' in metrics, stage
    assert 'qgmem_request_seconds_count{endpoint="/v1/users/{user_id}/answer"} 2.0' in metrics


def test_stream_sends_the_answer_as_server_sent_events(server):
    url, _ = server
    httpx.post(f"{url}/v1/users/alice/sessions", json={"turns": ALICE}).raise_for_status()
    question = {"user": "alice", "messages": [{"role": "user", "content": "Where do I live?"}]}
    [choice] = httpx.post(f"{url}/v1/chat/completions", json=question).json()["choices"]
    whole = choice["message"]["content"]
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={**question, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and all(line.startswith("data: ") for line in lines)
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    # the stream ends as the whole answer did (the tiny random LM may write blank lines up to the cap: "length")
    assert chunks[-1]["choices"][0]["finish_reason"] == choice["finish_reason"] in ("stop", "length")
    assert "memory" in chunks[-1]["qgmem"]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == whole


def test_openai_client_talks_to_the_server(server):
    openai = pytest.importorskip("openai")
    url, _ = server
    httpx.post(f"{url}/v1/users/alice/sessions", json={"turns": ALICE}).raise_for_status()
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "What colour is my boat?"}]
    reply = client.chat.completions.create(model="qgmem", messages=messages, user="alice")
    assert reply.object == "chat.completion" and reply.choices[0].message.role == "assistant"
    streamed = client.chat.completions.create(model="qgmem", messages=messages, user="alice", stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices)
    assert text == reply.choices[0].message.content
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="qgmem", messages=messages, user="nobody")


def test_isolation_answers_never_cite_another_users_units(server):
    """Two users with conflicting facts, 48 concurrent questions (so batches mix the users): every
    memory entry an answer rests on is the asking user's; each user's own facts are found (control)."""
    url, service = server
    for user, turns in (("alice", ALICE), ("bob", BOB)):
        httpx.post(f"{url}/v1/users/{user}/sessions", json={"turns": turns}).raise_for_status()
    questions = ["What is my favourite colour?", "What colour do I paint my boat?", "Where do I live?",
                 "What is my pet called?", "Which city is near my home?", "What do I paint every spring?"]
    jobs = [(user, q) for q in questions for user in ("alice", "bob")] * 4

    def ask(job):
        user, question = job
        r = httpx.post(f"{url}/v1/users/{user}/answer", json={"question": question}, timeout=60)
        r.raise_for_status()
        return user, r.json()

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(ask, jobs))
    own_found = {"alice": 0, "bob": 0}
    for user, answer in results:
        own, other = (ALICE_WORDS, BOB_WORDS) if user == "alice" else (BOB_WORDS, ALICE_WORDS)
        texts = " ".join(m["fact"] + " " + " ".join(answer["graph"]["nodes"]) for m in answer["memory"]).lower()
        assert not any(w in texts for w in other), (user, answer["question"], texts)
        own_found[user] += any(w in texts for w in own)
    assert own_found == {"alice": 24, "bob": 24}
    assert service.batcher.batched_questions > service.batcher.batches, "no two questions shared a batch"


@pytest.mark.parametrize("path,body,status,needle", [
    ("/v1/users/alice/sessions", b"{not json", 400, "malformed JSON"),
    ("/v1/users/alice/sessions", b'{"turns": []}', 400, "turns"),
    ("/v1/users/alice/sessions", b'{"turns": [{"speaker": "User"}]}', 400, "turns[0]: field 'text'"),
    ("/v1/users/alice/sessions", json.dumps({"turns": [{"speaker": "User", "text": "x" * 200}]}).encode(), 413,
     "over the limit of 100"),
    ("/v1/users/alice/sessions", json.dumps({"turns": [{"speaker": "U", "text": "hi"}] * 11}).encode(), 413, "11 turns"),
    ("/v1/users/alice/sessions", b" " * 3000, 413, "over the limit of 2000"),
    ("/v1/users/nobody/answer", b'{"question": "Where do I live?"}', 404, "no memory for user 'nobody': append"),
    ("/v1/users/alice/answer", b'{"question": ""}', 400, "question"),
    ("/v1/users/alice/answer", b'{"question": "Where?", "graph_mode": "best"}', 400, "field 'graph_mode'"),
    ("/v1/users/alice/answer", b'{"question": "Where?", "graph": "best"}', 400, "field 'graph'"),  # its older name
    ("/v1/users/alice/answer", b'{"question": "Where?", "graph_mode": "none", "graph": "none"}', 400,
     "unknown field 'graph'"),  # the older name beside the name: one of them
    ("/v1/users/bad%20id/sessions", b'{"turns": [{"speaker": "U", "text": "hi"}]}', 400, "must match"),
    ("/v1/users/%2E%2E/answer", b'{"question": "q"}', 400, "must match"),
    ("/v1/users/" + "a" * 129 + "/sessions", b'{"turns": [{"speaker": "U", "text": "hi"}]}', 400, "must match"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}]}', 400, "field 'user'"),
    ("/v1/chat/completions", b'{"user": "../etc", "messages": [{"role": "user", "content": "hi"}]}', 400, "must match"),
    ("/v1/chat/completions", b'{"user": "alice", "messages": [{"role": "system", "content": "x"}]}', 400,
     "no user message"),
])
def test_bad_input_is_a_4xx_with_a_message_and_the_server_lives_on(pipeline, tmp_path, path, body, status, needle):
    service = _service(pipeline, tmp_path, limits=Limits(max_body_bytes=2000, max_turns=10, max_turn_chars=100))
    with running(create_app(service)) as url:
        r = httpx.post(url + path, content=body, headers={"content-type": "application/json"})
        assert r.status_code == status, r.text
        assert needle in r.json()["error"]["message"]
        assert service.users.user_ids() == []
        assert httpx.post(f"{url}/v1/users/alice/sessions", json={"turns": ALICE[:1]}).status_code == 200
        assert httpx.get(f"{url}/healthz").json()["status"] == "ok"


def test_a_question_over_the_prompt_budget_fails_alone(pipeline, tmp_path):
    """It is refused before it joins a batch: the question waiting beside it is still answered."""
    service = _service(pipeline, tmp_path)
    gate, real = threading.Event(), service.pipeline.generate
    service.pipeline.generate = lambda *a, **k: (gate.wait(30), real(*a, **k))[1]
    with running(create_app(service)) as url:
        httpx.post(f"{url}/v1/users/alice/sessions", json={"turns": ALICE}).raise_for_status()
        ask = lambda q: httpx.post(f"{url}/v1/users/alice/answer", json={"question": q}, timeout=60)
        with ThreadPoolExecutor(3) as pool:
            first = pool.submit(ask, "What colour is my boat?")  # holds the generation thread at the gate
            while service.batcher.batches == 0:
                threading.Event().wait(0.01)
            fine = pool.submit(ask, "Where do I live?")
            while service.batcher.depth() == 0:
                threading.Event().wait(0.01)
            long = pool.submit(ask, "why " * 400)
            threading.Event().wait(0.3)
            gate.set()
            assert long.result().status_code == 400 and "too long" in long.result().json()["error"]["message"]
            assert fine.result().status_code == 200 and first.result().status_code == 200


def test_full_queue_gets_503_with_retry_after(pipeline, tmp_path):
    service = _service(pipeline, tmp_path, max_queue=1, max_batch=1)
    gate, real = threading.Event(), service.pipeline.generate
    service.pipeline.generate = lambda *a, **k: (gate.wait(30), real(*a, **k))[1]
    with running(create_app(service)) as url:
        httpx.post(f"{url}/v1/users/alice/sessions", json={"turns": ALICE}).raise_for_status()
        with ThreadPoolExecutor(3) as pool:
            ask = lambda _: httpx.post(f"{url}/v1/users/alice/answer", json={"question": "Where do I live?"},
                                       timeout=60)
            first = pool.submit(ask, 0)  # taken by the generation thread, held at the gate
            while service.batcher.batches == 0:
                threading.Event().wait(0.01)
            second = pool.submit(ask, 1)  # fills the queue
            while service.batcher.depth() == 0:
                threading.Event().wait(0.01)
            third = ask(2)
            gate.set()
            assert first.result().status_code == 200 and second.result().status_code == 200
    assert third.status_code == 503 and third.headers["retry-after"] == "1"
    assert "waiting" in third.json()["error"]["message"]


def test_bearer_key_guards_everything_but_healthz(pipeline, tmp_path):
    with running(create_app(_service(pipeline, tmp_path), api_key="s3cret-key")) as url:
        assert httpx.get(f"{url}/healthz").status_code == 200
        no_key = httpx.post(f"{url}/v1/users/alice/sessions", json={"turns": ALICE})
        wrong = httpx.get(f"{url}/metrics", headers={"Authorization": "Bearer nope"})
        right = httpx.post(f"{url}/v1/users/alice/sessions", json={"turns": ALICE},
                           headers={"Authorization": "Bearer s3cret-key"})
    assert no_key.status_code == 401 and wrong.status_code == 401 and right.status_code == 200
    assert "s3cret" not in no_key.text


def test_a_request_naming_no_graph_mode_takes_the_exports(pipeline, tmp_path):
    """An export whose default answer mode is the text prompt (field ``graph_mode``: none) answers without
    graph tokens unless a request asks for them, on both endpoints."""
    import copy
    import dataclasses

    text_first = copy.copy(pipeline)
    text_first.contract = dataclasses.replace(pipeline.contract, graph_mode="none")
    with running(create_app(_service(text_first, tmp_path))) as url:
        assert httpx.post(f"{url}/v1/users/alice/sessions", json={"turns": ALICE}).status_code == 200
        plain = httpx.post(f"{url}/v1/users/alice/answer", json={"question": "What colour is my boat?"}).json()
        asked = httpx.post(f"{url}/v1/users/alice/answer",
                           json={"question": "What colour is my boat?", "graph_mode": "token"}).json()
        # a client written before the field was renamed sends its older name, ``graph``
        older = httpx.post(f"{url}/v1/users/alice/answer",
                           json={"question": "What colour is my boat?", "graph": "token"}).json()
        chats = [httpx.post(f"{url}/v1/chat/completions", json={
            "model": "qgmem", "user": "alice", "messages": [{"role": "user", "content": "What colour is my boat?"}],
            **extra}).json() for extra in ({}, {"graph_mode": "token"}, {"graph": "token"})]
    assert plain["graph_mode"] == "none" and plain["tokens"]["graph"] == 0
    assert asked["graph_mode"] == "token" and asked["tokens"]["graph"] == 1
    assert older["graph_mode"] == "token" and older["tokens"]["graph"] == 1 and older["answer"] == asked["answer"]
    assert [c["qgmem"]["graph_mode"] for c in chats] == ["none", "token", "token"]
    assert chats[1]["choices"][0]["message"]["content"] == chats[2]["choices"][0]["message"]["content"]
