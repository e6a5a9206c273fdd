"""An export with ``injection: kv_prefix`` answers in process (pipeline, ``qgmem answer``) and refuses ``--lm-url``."""

from __future__ import annotations

import json

import pytest
import torch

from qgmem.cli import main as qgmem_main
from qgmem.errors import ExportFormatError
from qgmem.lm import load_causal_lm, load_tokenizer
from qgmem.model.encoder import EncoderConfig
from qgmem.model.graph_token import GraphTokenConfig
from qgmem.model.pretrained import GraphTokenEncoder
from qgmem.serving import QGMemPipeline
from qgmem.serving.pipeline import load_lm_for
from qgmem.serving.remote_lm import engine_config

from .helpers import HIDDEN, HashEncoder, export_config
from .test_pipeline import HISTORY, QUESTIONS

K = 3


def kv_encoder(lm_path: str, seed: int = 0) -> GraphTokenEncoder:
    torch.manual_seed(seed)
    config = GraphTokenConfig(feature_dim=8, edge_dim=8, lm_hidden=HIDDEN, features="text", readout="queries",
                              num_graph_tokens=K, injection="kv_prefix", lm_layers=1, lm_kv_width=16,
                              encoder=EncoderConfig(hidden=16, heads=2, layers=1, dropout=0.0))
    return GraphTokenEncoder(config, export_config(lm_path, 8)).eval()


@pytest.fixture(scope="module")
def pipeline(tiny_lm_path):
    pipe = QGMemPipeline(kv_encoder(tiny_lm_path), load_causal_lm(tiny_lm_path),
                         load_tokenizer(tiny_lm_path, padding_side="left"), HashEncoder(8), max_new_tokens=4)
    pipe.remember(HISTORY)
    return pipe


@pytest.mark.parametrize("mode,slots", [("token", K), ("none", 0), ("shuffled", K)])
def test_the_pipeline_answers_with_a_key_value_prefix(pipeline, mode, slots):
    answers = pipeline.answer(QUESTIONS, graph_mode=mode)
    assert [a.graph_mode for a in answers] == [mode] * len(QUESTIONS)
    assert all(a.tokens["graph"] == slots and 1 <= a.tokens["generated"] <= 4 for a in answers)
    alone = [pipeline.answer(q, graph_mode=mode)[0].answer for q in QUESTIONS]  # left padding changes nothing
    assert [a.answer for a in answers] == alone


def test_the_pipeline_s_lm_reads_the_prefix_while_it_generates(pipeline, monkeypatch):
    import qgmem.serving.pipeline as served

    seen = {}
    original = served.generate

    def spy(lm, tokenizer, mask, *, inputs_embeds, **kwargs):
        with torch.no_grad():
            seen["inside"] = lm(inputs_embeds=inputs_embeds, attention_mask=mask).logits[:, -1]
        seen["embeds"], seen["mask"] = inputs_embeds, mask
        return original(lm, tokenizer, mask, inputs_embeds=inputs_embeds, **kwargs)

    monkeypatch.setattr(served, "generate", spy)
    pipeline.generate(pipeline.retrieve(QUESTIONS[:1]), graph_mode="token")
    with torch.no_grad():  # the same columns without the prefix: zero placeholders only
        outside = pipeline.lm(inputs_embeds=seen["embeds"], attention_mask=seen["mask"]).logits[:, -1]
    assert not torch.allclose(seen["inside"], outside)


def test_an_engine_behind_lm_url_cannot_read_a_key_value_prefix(tiny_lm_path, tmp_path, capsys):
    config = engine_config("http://127.0.0.1:9/v1", "tiny", None)
    with pytest.raises(ExportFormatError, match=r"graph_token\.injection.*kv_prefix.*--lm-url"):
        load_lm_for(kv_encoder(tiny_lm_path), None, "float32", "cpu", config)
    export = tmp_path / "export"
    kv_encoder(tiny_lm_path).save_pretrained(export)
    history = tmp_path / "history.json"
    history.write_text(json.dumps(HISTORY))
    code = qgmem_main(["answer", "--export", str(export), "--lm-url", "http://127.0.0.1:9/v1", "--question", "Where?",
                       "--history", str(history)])
    err = capsys.readouterr().err
    assert code == 2 and "kv_prefix" in err and "--lm-url" in err and "Traceback" not in err
