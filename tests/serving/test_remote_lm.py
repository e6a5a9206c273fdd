"""``--lm-url``: the pipeline answers through an engine (the double) as it answers in process; failures are 502/504."""

from __future__ import annotations

import json
import time

import httpx
import pytest
import torch

from qgmem.cli import main
from qgmem.lm import load_causal_lm, load_input_embeddings, load_tokenizer
from qgmem.llm.prompt_embeds import EngineError, PromptEmbedsClient
from qgmem.memory.config import ConstructionConfig
from qgmem.model.pretrained import ExportFormatError
from qgmem.serving.batcher import Batcher
from qgmem.serving.pipeline import QGMemPipeline, load_lm_for
from qgmem.errors import UserError
from qgmem.llm.http import OpenAIChatBackend
from qgmem.serving import remote_lm
from qgmem.serving.remote_lm import RemoteLM, engine_config, served_model_name, wait_for_engine

from .engine_double import EngineDouble, RunningEngine
from .helpers import HashEncoder, make_encoder, make_export
from .test_pipeline import HISTORY, QUESTIONS

pytest.importorskip("fastapi")


@pytest.fixture(scope="module")
def lm(tiny_lm_path):
    return load_causal_lm(tiny_lm_path, dtype="float32")


@pytest.fixture(scope="module")
def engine(lm, tiny_lm_path):
    double = EngineDouble(lm, load_tokenizer(tiny_lm_path), "tiny")
    with RunningEngine(double) as url:
        yield double, url


def _remote(tiny_lm_path, url, **overrides) -> RemoteLM:
    config = engine_config(url, "tiny", None)
    for name, value in {"backoff_s": 0.0, **overrides}.items():
        setattr(config, name, value)
    return RemoteLM(load_input_embeddings(tiny_lm_path, dtype="float32"), PromptEmbedsClient(config))


def _pipelines(tiny_lm_path, lm, remote, max_new_tokens=4):
    encoder = make_encoder(tiny_lm_path, construction=ConstructionConfig(extractor="heuristic").to_dict())
    tokenizer = load_tokenizer(tiny_lm_path, padding_side="left")
    local = QGMemPipeline(encoder, lm, tokenizer, HashEncoder(8), max_new_tokens=max_new_tokens)
    far = QGMemPipeline(encoder, remote, tokenizer, HashEncoder(8), max_new_tokens=max_new_tokens)
    local.remember(HISTORY)
    far.memory = local.memory
    return local, far


@pytest.fixture(scope="module")
def pipelines(tiny_lm_path, lm, engine):
    return _pipelines(tiny_lm_path, lm, _remote(tiny_lm_path, engine[1]), max_new_tokens=6)


@pytest.mark.parametrize("mode", ["token", "none", "shuffled"])
def test_answers_through_the_engine_equal_the_in_process_ones(pipelines, mode):
    local, far = pipelines
    here, there = local.answer(QUESTIONS, graph_mode=mode), far.answer(QUESTIONS, graph_mode=mode)
    assert [a.answer for a in there] == [a.answer for a in here]
    assert [a.finish_reason for a in there] == [a.finish_reason for a in here]
    assert [a.tokens for a in there] == [a.tokens for a in here]
    assert [a.cited for a in there] == [a.cited for a in here]


def test_each_question_is_sent_as_its_fused_rows_without_padding(pipelines, engine):
    from qgmem.llm.prompt_embeds import decode_embeds

    local, far = pipelines
    double, _ = engine
    before = len(double.requests)
    [answer] = far.answer(["Who visited me?"], graph_mode="token")
    [sent] = double.requests[before:]
    embeds = decode_embeds(sent["prompt_embeds"])
    assert embeds.shape == (answer.tokens["prompt"] + answer.tokens["graph"], 32)
    # no stop string: the engine decodes to the cap, and the answer cut reads the reply here (it may skip a lead-in line)
    assert sent["max_tokens"] == 6 and not sent.get("stop") and sent["stop_token_ids"] == far.prompts.stop_ids
    assert sent["temperature"] == 0.0 and sent["model"] == "tiny"


def test_a_question_with_a_smaller_cap_gets_it(pipelines, engine):
    _, far = pipelines
    double, _ = engine
    [retrieved] = far.retrieve(["Where do I live?"])
    retrieved.max_new_tokens = 2
    before = len(double.requests)
    [answer] = far.generate([retrieved])
    assert double.requests[before]["max_tokens"] == 2 and answer.tokens["generated"] <= 2


def test_streamed_answers_arrive_piece_by_piece_and_equal_the_answer(pipelines):
    _, far = pipelines
    batcher = Batcher(far, max_batch=4, max_wait_ms=50)
    try:
        pieces = {q: [] for q in QUESTIONS}
        futures = [batcher.submit(far.retrieve([q])[0], "token", pieces[q].append) for q in QUESTIONS]
        answers = [f.result(timeout=60)[0] for f in futures]
    finally:
        batcher.close()
    for q, answer in zip(QUESTIONS, answers):
        assert "".join(pieces[q]) == answer.answer


def test_the_table_alone_is_loaded_and_a_lora_export_is_refused(tiny_lm_path, engine):
    config = engine_config(engine[1], "tiny", None)
    model, tokenizer = load_lm_for(make_encoder(tiny_lm_path), None, "float32", "cpu", config)
    assert isinstance(model, RemoteLM) and model.get_input_embeddings().weight.shape[1] == 32
    assert tokenizer.padding_side == "left"
    with pytest.raises(ExportFormatError, match="LoRA .*serve this export in process"):
        load_lm_for(make_encoder(tiny_lm_path, lora={"r": 2}), None, "float32", "cpu", config)


def test_the_engine_model_name_defaults_to_the_lm_id(tiny_lm_path):
    from qgmem.lm import EMBEDDED_LM, EMBEDDED_LM_HUB_ID

    assert served_model_name(tiny_lm_path) == tiny_lm_path
    assert served_model_name(EMBEDDED_LM) == EMBEDDED_LM_HUB_ID


# --- start-up: the engine is checked when the export loads ------------------------------------------------------

def test_loading_returns_once_the_engine_lists_the_model(engine):
    client = PromptEmbedsClient(engine_config(engine[1], "tiny", None))
    assert client.served_models() == ["tiny"]
    wait_for_engine(client, wait_s=0.0)  # positive control: a live engine serving the model passes at once


def test_an_engine_serving_another_model_stops_loading_at_once_naming_both(engine):
    client = PromptEmbedsClient(engine_config(engine[1], "Llama-3.1-8B", None))
    started = time.monotonic()
    with pytest.raises(UserError, match=r"serves \['tiny'\], not 'Llama-3.1-8B': give --lm-model"):
        wait_for_engine(client, wait_s=30.0)
    assert time.monotonic() - started < 5.0  # answered: no waiting


class _StartingEngine:
    """A client whose engine refuses connections ``down`` times, then lists ``served``."""

    def __init__(self, down: int, served=("m",)):
        self.config = engine_config("http://127.0.0.1:9/v1", "m", None)
        self.down, self.served, self.calls = down, list(served), 0

    def served_models(self):
        self.calls += 1
        if self.calls <= self.down:
            raise httpx.ConnectError("connection refused")
        return self.served


def test_an_engine_still_loading_is_waited_for_with_one_line(capsys):
    slept = []
    client = _StartingEngine(down=3)
    wait_for_engine(client, wait_s=60.0, poll_s=2.0, sleep=slept.append)
    assert client.calls == 4 and slept == [2.0, 2.0, 2.0]
    assert capsys.readouterr().err.count("waiting up to 60 s for the LM engine at http://127.0.0.1:9/v1") == 1


def test_no_engine_stops_loading_after_the_wait_with_exit_2(tmp_path, tiny_lm_path, capsys, monkeypatch):
    monkeypatch.setattr(remote_lm, "ENGINE_START_WAIT_S", 0.3)
    export = make_export(tmp_path / "export", tiny_lm_path)
    history = tmp_path / "history.json"
    history.write_text(json.dumps(HISTORY))
    started = time.monotonic()
    code = main(["answer", "--export", str(export), "--history", str(history), "--question", "Where?",
                 "--lm-url", "http://127.0.0.1:9/v1", "--lm-model", "tiny"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "no LM engine answers at http://127.0.0.1:9/v1 (ConnectError for 0.3 s)" in err
    assert time.monotonic() - started < 30.0


def test_an_engine_refusing_the_key_stops_loading_naming_the_status_without_the_key(monkeypatch):
    monkeypatch.setenv("QGMEM_TEST_ENGINE_KEY", "sk-secret-123")
    config = engine_config("http://engine.test/v1", "m", "QGMEM_TEST_ENGINE_KEY")
    seen = []

    def refuse(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, request.headers.get("authorization")))
        return httpx.Response(401, json={"error": "bad key Bearer sk-secret-123"})

    backend = OpenAIChatBackend(config, client=httpx.Client(base_url=config.base_url,
                                                            headers={"Authorization": "Bearer sk-secret-123"},
                                                            transport=httpx.MockTransport(refuse)))
    with pytest.raises(EngineError, match="answered GET /models with HTTP 401") as caught:
        wait_for_engine(PromptEmbedsClient(config, transport=backend), wait_s=30.0)
    assert seen == [("/v1/models", "Bearer sk-secret-123")]
    assert isinstance(caught.value, UserError) and "sk-secret-123" not in str(caught.value)


# --- failures reach the client as 502/504 -----------------------------------------------------------------------

def _service_over(far, tmp_path):
    import copy

    from qgmem.serving.server import MemoryService

    pipe = copy.copy(far)
    pipe._builder = None
    (tmp_path / "memories").mkdir(exist_ok=True)
    return MemoryService(pipe, f"sqlite:///{tmp_path / 'memories' / 'memories.db'}")


def _served(tiny_lm_path, lm, url, tmp_path, **overrides):
    from qgmem.serving.server import create_app

    from .server_helpers import running

    _, far = _pipelines(tiny_lm_path, lm, _remote(tiny_lm_path, url, **overrides))
    return running(create_app(_service_over(far, tmp_path)))


def _ask(base, stream=False):
    session = [{"speaker": "User", "text": "I live in Lisbon near the river with my dog Biscuit."}]
    assert httpx.post(f"{base}/v1/users/u/sessions", json={"turns": session}, timeout=30).status_code == 200
    if stream:
        body = {"model": "qgmem", "user": "u", "stream": True, "messages": [{"role": "user", "content": "Where?"}]}
        return httpx.post(f"{base}/v1/chat/completions", json=body, timeout=30)
    return httpx.post(f"{base}/v1/users/u/answer", json={"question": "Where do I live?"}, timeout=30)


def test_an_unreachable_engine_is_a_502_with_a_clear_message(tiny_lm_path, lm, tmp_path):
    with _served(tiny_lm_path, lm, "http://127.0.0.1:9/v1", tmp_path, max_retries=1) as base:
        reply = _ask(base)
    assert reply.status_code == 502
    error = reply.json()["error"]
    assert error["type"] == "engine_error"
    assert error["message"].startswith("the LM engine at http://127.0.0.1:9/v1 did not answer: gave up after 2 "
                                       "attempts: connection error")


def test_a_refusing_engine_is_a_502_and_the_stream_carries_the_error(tiny_lm_path, lm, engine, tmp_path):
    double, url = engine
    double.fail_with = (400, "prompt_embeds longer than max_model_len")
    try:
        with _served(tiny_lm_path, lm, url, tmp_path) as base:
            plain, streamed = _ask(base), _ask(base, stream=True)
    finally:
        double.fail_with = None
    assert plain.status_code == 502 and "HTTP 400" in plain.json()["error"]["message"]
    assert "max_model_len" in plain.json()["error"]["message"]
    events = [json.loads(line[6:]) for line in streamed.text.splitlines()
              if line.startswith("data: {") and "error" in line]
    assert streamed.status_code == 200 and "max_model_len" in events[0]["error"]["message"]


def test_a_hung_engine_is_a_504_within_the_deadline_not_a_hang(tiny_lm_path, lm, engine, tmp_path):
    double, url = engine
    double.delay_s = 5.0
    try:
        with _served(tiny_lm_path, lm, url, tmp_path, timeout_s=0.5, deadline_s=1.0, max_retries=3) as base:
            started = time.monotonic()
            reply = _ask(base)
            elapsed = time.monotonic() - started
    finally:
        double.delay_s = 0.0
    assert reply.status_code == 504 and reply.json()["error"]["type"] == "engine_timeout"
    assert "timeout after 0.5s" in reply.json()["error"]["message"] or "deadline of 1s" in reply.json()["error"]["message"]
    assert elapsed < 4.0


def test_pipeline_raises_engine_error_not_an_empty_answer(tiny_lm_path, lm):
    _, far = _pipelines(tiny_lm_path, lm, _remote(tiny_lm_path, "http://127.0.0.1:9/v1", max_retries=0))
    with pytest.raises(EngineError) as caught:
        far.answer(["Where do I live?"])
    assert caught.value.status == 502


# --- the command line ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv,message", [
    (["--lm-model", "x"], "--lm-model needs --lm-url"),
    (["--lm-api-key-env", "X"], "--lm-api-key-env needs --lm-url"),
    (["--lm-url", "127.0.0.1:8100"], "--lm-url must be an http(s) URL"),
    (["--lm-url", "http://127.0.0.1:9/v1", "--backbone", "api"], "--backbone api answers without it"),
    (["--lm-url", "http://127.0.0.1:9/v1", "--lm-api-key-env", "QGMEM_TEST_UNSET_KEY"], "is not set"),
])
def test_answer_flag_mistakes_are_one_line_and_exit_2(tmp_path, tiny_lm_path, capsys, argv, message):
    export = make_export(tmp_path / "export", tiny_lm_path)
    history = tmp_path / "history.json"
    history.write_text(json.dumps(HISTORY))
    code = main(["answer", "--export", str(export), "--history", str(history), "--question", "Where?", *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err


def test_serve_checks_the_engine_flags(tmp_path):
    from qgmem.errors import UserError
    from qgmem.serving.export_models import EngineSettings, LoadSettings
    from qgmem.serving.serve_cli import ServeSettings, check

    check(ServeSettings(LoadSettings("e", engine=EngineSettings(lm_url="http://127.0.0.1:8100/v1", lm_model="m"))))
    with pytest.raises(UserError, match="--lm-model needs --lm-url"):
        check(ServeSettings(LoadSettings("e", engine=EngineSettings(lm_model="m"))))
