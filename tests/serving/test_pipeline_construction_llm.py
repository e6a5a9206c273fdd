"""An export trained with LLM construction (the paper's preset) builds memories through the server it records."""

from __future__ import annotations

import pytest

from qgmem.errors import UserError
from qgmem.export import construction_llm
from qgmem.llm.base import LLMConfig
from qgmem.memory.config import ConstructionConfig
from qgmem.serving import QGMemPipeline

from llm.helpers import StubServer, completion
from memory.test_builder import _recorded

from .helpers import make_export
from .test_pipeline import HISTORY

MINILM_DIM = 384


def _export(folder, lm, url: str | None):
    extra = {"construction": ConstructionConfig(extractor="llm", consolidation="rule").to_dict()}
    if url is not None:
        extra["construction_llm"] = construction_llm(LLMConfig(backend="openai", model="Qwen/Qwen3-8B", base_url=url,
                                                               api_key_env=None, max_retries=0,
                                                               cache_path="data/cache/llm.sqlite").to_dict())
    return make_export(folder, lm, feature_dim=MINILM_DIM, **extra)


def test_the_export_records_where_construction_llm_was_and_serving_reaches_it(tiny_lm_path, tmp_path):
    with StubServer(lambda request: completion(_recorded(request["messages"]))) as server:
        folder = _export(tmp_path / "export", tiny_lm_path, server.url)
        pipe = QGMemPipeline.from_pretrained(folder, device="cpu")
        store = pipe.remember(HISTORY)
        answer = pipe.answer(["Where do I live?"])[0]
    assert server.requests and all(r["model"] == "Qwen/Qwen3-8B" for r in server.requests)
    assert any("Lisbon" in u.fact for u in store.units) and answer.question == "Where do I live?"


def test_without_a_recorded_server_the_error_names_the_field(tiny_lm_path, tmp_path):
    pipe = QGMemPipeline.from_pretrained(_export(tmp_path / "export", tiny_lm_path, None), device="cpu")
    with pytest.raises(UserError, match="construction.extractor"):
        pipe.remember(HISTORY)


def test_the_training_machine_response_cache_path_is_not_exported():
    recorded = construction_llm({"backend": "openai", "base_url": "http://h:8000/v1", "cache_path": "data/c.sqlite"})
    assert recorded == {"backend": "openai", "base_url": "http://h:8000/v1"} and construction_llm(None) is None
