"""--backbone api: the working memory plus the text-serialized local graph through the shared HTTP backend."""

from __future__ import annotations

import pytest

from qgmem.llm.backends import LLMConfig, make_backend
from qgmem.serving import QGMemPipeline
from qgmem.serving.text_graph_backbone import TextGraphBackbone

from llm.helpers import StubServer, completion  # tests/llm/helpers.py

from .helpers import HashEncoder, make_encoder
from .test_pipeline import HISTORY, QUESTIONS


def _reply(request):
    user = request["messages"][-1]["content"]
    if "boom" in user:
        return 500, "server error"
    return completion("You live in Lisbon [M1].\nMore text.", prompt_tokens=40, completion_tokens=7)


@pytest.fixture
def api_pipeline(tiny_lm_path):
    def build(url):
        backend = make_backend(LLMConfig(backend="openai", base_url=url, model="gpt-4o-mini", api_key_env=None,
                                         max_retries=0, timeout_s=10))
        encoder = make_encoder(tiny_lm_path)
        pipe = QGMemPipeline(encoder, None, None, HashEncoder(8),
                             backbone=TextGraphBackbone(backend, max_new_tokens=16))
        pipe.remember(HISTORY)
        return pipe
    return build


@pytest.mark.parametrize("mode", ["token", "none", "shuffled"])
def test_api_backbone_against_a_stub_server(api_pipeline, mode):
    with StubServer(_reply) as server:
        pipe = api_pipeline(server.url)
        answers = pipe.answer(QUESTIONS, graph_mode=mode)
    assert [a.answer for a in answers] == ["You live in Lisbon [M1]."] * 3  # first line, as the contract says
    assert all(a.cited == ["M1"] and a.tokens["prompt"] == 40 and a.tokens["generated"] == 7 for a in answers)
    assert len(server.requests) == 3 and all(r["model"] == "gpt-4o-mini" and r["temperature"] == 0
                                              for r in server.requests)
    users = [r["messages"][-1]["content"] for r in server.requests]  # concurrent: in any order
    by_question = {u.rsplit("Question: ", 1)[1]: u for u in users}
    graphs = [by_question[q].split("Local memory graph (subject; relation; object) [entry]:\n")[1]
              .split("\n\nQuestion:")[0] if "Local memory graph" in by_question[q] else None for q in QUESTIONS]
    retrieved = pipe.retrieve(QUESTIONS)
    from qgmem.activation.serialize import serialize_graph_triples

    own = [serialize_graph_triples(r.memory.graph) for r in retrieved]
    expected = {"token": own, "none": [None] * 3, "shuffled": own[1:] + own[:1]}[mode]
    assert graphs == expected
    assert all(u.startswith("Memory:\n[M1]") and "Question: " in u for u in users)
    assert all(r["messages"][0]["role"] == "system" for r in server.requests)


def test_api_failure_is_an_empty_answer_with_its_error(api_pipeline):
    with StubServer(_reply) as server:
        pipe = api_pipeline(server.url)
        [answer] = pipe.answer("boom?")
    assert answer.answer == "" and "500" in answer.error


def _default_graph_token_settings() -> dict:
    """``features`` / ``readout`` / ``num_graph_tokens`` of what ``python train.py`` exports: the module's
    signature defaults, with whatever the default preset sets over them."""
    import inspect

    import yaml

    from qgmem.configs import preset_path
    from qgmem.training.module import QGMemModule

    keys = ("features", "readout", "num_graph_tokens")
    params = inspect.signature(QGMemModule).parameters
    model = (yaml.safe_load(preset_path("default").read_text()) or {}).get("model") or {}
    return {key: model.get(key, params[key].default) for key in keys}


def test_api_backbone_with_the_default_export(tiny_lm_path):
    """The default export's node_words features need the LM's tokenizer only for the graph token; an API
    backbone (which reads the graph as text, and has no LM) used to crash building node word ids."""
    from qgmem.model.encoder import EncoderConfig
    from qgmem.model.graph_token import GraphTokenConfig
    from qgmem.model.pretrained import GraphTokenEncoder

    from .helpers import HIDDEN, export_config

    settings = _default_graph_token_settings()
    assert settings["features"] == "node_words"  # the default this test is about
    config = GraphTokenConfig(feature_dim=8, edge_dim=8, lm_hidden=HIDDEN, **settings,
                              encoder=EncoderConfig(hidden=16, heads=2, layers=1, dropout=0.0))
    encoder = GraphTokenEncoder(config, export_config(tiny_lm_path, 8)).eval()
    with StubServer(_reply) as server:
        backend = make_backend(LLMConfig(backend="openai", base_url=server.url, model="m", api_key_env=None,
                                         max_retries=0, timeout_s=10))
        pipe = QGMemPipeline(encoder, None, None, HashEncoder(8), backbone=TextGraphBackbone(backend, max_new_tokens=8))
        pipe.remember(HISTORY)
        answers = pipe.answer(QUESTIONS[:2])
    assert [a.answer for a in answers] == ["You live in Lisbon [M1]."] * 2 and len(server.requests) == 2
    assert all(a.error is None for a in answers)


def test_the_exports_text_budget_cuts_the_api_backbones_memory_text(tiny_lm_path):
    """``prompt.memory_units`` holds for ``--backbone api`` too: the text keeps the top m entries, the
    serialized graph still covers every unit of the working memory."""
    from qgmem.prompting import PromptSettings

    backend = make_backend(LLMConfig(backend="openai", base_url="http://127.0.0.1:9/v1", model="m",
                                     api_key_env=None, max_retries=0, timeout_s=10))
    pipe = QGMemPipeline(make_encoder(tiny_lm_path), None, None, HashEncoder(8),
                         backbone=TextGraphBackbone(backend, PromptSettings(memory_units=1)))
    pipe.remember(HISTORY)
    [r] = pipe.retrieve(QUESTIONS[:1])
    assert len(r.memory.units) > 1
    block = pipe.backbone.memory_block(r, r)
    memory, graph = block.split("\n\nLocal memory graph (subject; relation; object) [entry]:\n")
    assert memory == r.memory.text.split("\n[M2]")[0] and "[M1]" in memory
    from qgmem.activation.serialize import serialize_graph_triples

    assert graph == serialize_graph_triples(r.memory.graph)
