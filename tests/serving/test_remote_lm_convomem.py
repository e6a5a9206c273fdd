"""Acceptance: real ConvoMem questions answered through ``--lm-url`` (the engine double over the embedded
SmolLM2) and in process give the same greedy answers at float32. Three questions over one real history
here; twenty questions, each over its own case's history, in ``bench/serving/lm_url.py`` (docs/BENCHMARKS.md)."""

from __future__ import annotations

import pytest
import torch

from qgmem.lm import EMBEDDED_LM, EMBEDDED_LM_HUB_ID, load_causal_lm, load_tokenizer
from qgmem.serving.export_models import load_models
from qgmem.serving.remote_lm import RemoteLM, engine_config

from .engine_double import EngineDouble, RunningEngine

pytestmark = pytest.mark.slow


def default_shaped_export(folder):
    """An export of the default preset's shapes (17 node-word graph tokens over SmolLM2), random weights."""
    from qgmem.activation.config import ActivationConfig
    from qgmem.embed import DEFAULT_ENCODER
    from qgmem.memory.config import ConstructionConfig
    from qgmem.model.graph_token import GraphTokenConfig
    from qgmem.activation.answer_contract import AnswerContract
    from qgmem.model.pretrained import GraphTokenEncoder
    from qgmem.prompting import PromptSettings

    torch.manual_seed(0)
    config = GraphTokenConfig(feature_dim=384, edge_dim=384, lm_hidden=576, features="node_words",
                              readout="summary_nodes", num_graph_tokens=17)
    prompt = PromptSettings(max_prompt_tokens=288, max_answer_tokens=48, num_graph_tokens=17)
    GraphTokenEncoder(config, {"lm": {"id": EMBEDDED_LM, "hidden_size": 576, "load_dtype": "auto"},
                               "answer": AnswerContract(prompt, ActivationConfig(), "token").to_dict(),
                               "generation": {"max_new_tokens": 12},
                               "sentence_encoder": {"id": DEFAULT_ENCODER, "dim": 384},
                               "construction": ConstructionConfig().to_dict(), "dataset": "convomem",
                               "metrics": None}).eval().save_pretrained(folder)
    return folder


def test_three_convomem_questions_get_the_same_answers_through_the_engine(tmp_path, convomem_path):
    from qgmem.data.loaders import load_cases

    export = str(default_shaped_export(tmp_path / "export"))
    # the shortest history (its construction dominates the run) and its question, then two other cases' questions
    cases = sorted(load_cases("convomem", convomem_path).cases, key=lambda c: len(list(c.dialogue.turns())))
    case, questions = cases[0], [c.qas[0].question for c in cases[:3]]
    assert len(set(questions)) == 3
    here = load_models(export, device="cpu", lm_dtype="float32")
    here.remember(case)
    local = here.answer(questions)
    double = EngineDouble(load_causal_lm(EMBEDDED_LM, dtype="float32"), load_tokenizer(EMBEDDED_LM), EMBEDDED_LM_HUB_ID)
    with RunningEngine(double) as url:
        there = load_models(export, device="cpu", lm_dtype="float32", engine=engine_config(url, None, None))
        assert isinstance(there.lm, RemoteLM)
        there.memory = here.memory
        remote = there.answer(questions)
    assert len(double.requests) == len(questions) and double.requests[0]["model"] == EMBEDDED_LM_HUB_ID
    assert [a.answer for a in remote] == [a.answer for a in local]
    # the engine decodes without a line-break stop (a lead-in line must not cost the answer) and the answer cut
    # runs here, so it may decode more tokens than the in-process loop, never fewer; the rest is the same
    assert [a.finish_reason for a in remote] == [a.finish_reason for a in local]
    for r, l in zip(remote, local):
        assert {k: v for k, v in r.tokens.items() if k not in ("generated", "total")} == \
            {k: v for k, v in l.tokens.items() if k not in ("generated", "total")}
        assert l.tokens["generated"] <= r.tokens["generated"] <= 12
