"""QGMemPipeline: memory from histories, batched answers in three graph modes, honest edge cases."""

from __future__ import annotations

import json

import pytest
import torch

from qgmem.errors import UserError
from qgmem.lm import load_causal_lm, load_tokenizer
from qgmem.serving import NO_MEMORY_ANSWER, QGMemPipeline
from qgmem.serving.records import cited_labels

from .helpers import HashEncoder, make_encoder

HISTORY = [
    [{"speaker": "User", "text": "I moved to Lisbon last spring and I love the city."},
     {"speaker": "Assistant", "text": "Lisbon is lovely. How is the new job going?"},
     {"speaker": "User", "text": "My new job at the bakery starts at six every morning."}],
    {"time": "2024-03-02T10:00:00", "turns": [
        {"speaker": "User", "text": "My sister Ana visited me in Lisbon last weekend."},
        {"speaker": "User", "text": "I bought a green bicycle for commuting to the bakery."}]},
]
QUESTIONS = ["Where do I live?", "What did I buy for commuting?", "Who visited me?"]


@pytest.fixture(scope="module")
def pipeline(tiny_lm_path):
    lm = load_causal_lm(tiny_lm_path)
    pipe = QGMemPipeline(make_encoder(tiny_lm_path), lm, load_tokenizer(tiny_lm_path, padding_side="left"),
                         HashEncoder(8), max_new_tokens=4)
    pipe.remember(HISTORY)
    return pipe


@pytest.mark.parametrize("mode,graph_tokens", [("token", 1), ("none", 0), ("shuffled", 1)])
def test_batched_answers_carry_memory_graph_and_costs(pipeline, mode, graph_tokens):
    answers = pipeline.answer(QUESTIONS, graph_mode=mode)
    assert [a.question for a in answers] == QUESTIONS and all(a.graph_mode == mode for a in answers)
    for a in answers:
        assert isinstance(a.answer, str) and a.memory and a.memory[0]["label"] == "M1"
        assert {"nodes", "edges"} == set(a.graph) and all(e["memory"].startswith("M") for e in a.graph["edges"])
        assert set(a.seconds) == {"activation", "graph_features", "graph_encoding", "generation", "total"}
        assert a.tokens["graph"] == graph_tokens and 1 <= a.tokens["generated"] <= 4
        assert a.tokens["total"] == a.tokens["prompt"] + a.tokens["graph"] + a.tokens["generated"]
        assert 0 < a.tokens["retrieved_context"] < a.tokens["prompt"]
        json.dumps(a.to_dict())


def test_batching_does_not_change_answers(pipeline):
    together = [a.answer for a in pipeline.answer(QUESTIONS)]
    alone = [pipeline.answer(q)[0].answer for q in QUESTIONS]
    assert together == alone


def test_unpadded_answers_continue_the_cached_prompt_head(pipeline, monkeypatch):
    """The pipeline hands the prompt head to the generation helper, which prefills it once per LM."""
    import importlib

    generation = importlib.import_module("qgmem.prompting.generate")  # the module (the package exports the function)
    seen = []
    original = generation.prefix_cache
    monkeypatch.setattr(generation, "prefix_cache", lambda lm, ids, n=1: seen.append((tuple(ids), n)) or
                        original(lm, ids, n))
    pipeline.answer(QUESTIONS[0])
    pipeline.answer(QUESTIONS[1])
    assert seen == [(tuple(pipeline.prompts.head_ids), 1)] * 2
    assert list(generation._PREFIXES[pipeline.lm]) == [tuple(pipeline.prompts.head_ids)]


def test_graph_modes_feed_the_lm_different_inputs(pipeline, monkeypatch):
    """token, none and shuffled differ only in the inserted graph token (shuffled: the next question's)."""
    seen = {}
    original = pipeline.encoder.encode

    def spy(graphs):
        out = original(graphs)
        seen.setdefault("calls", []).append(out)
        return out

    monkeypatch.setattr(pipeline.encoder, "encode", spy)
    retrieved = pipeline.retrieve(QUESTIONS)
    pipeline.generate(retrieved, graph_mode="token")
    pipeline.generate(retrieved, graph_mode="shuffled")
    pipeline.generate(retrieved, graph_mode="none")
    own, shuffled = seen["calls"]
    assert len(seen["calls"]) == 2  # `none` inserts nothing
    torch.testing.assert_close(shuffled, torch.roll(own, shifts=-1, dims=0))


def test_empty_history_answers_honestly(pipeline):
    pipe = QGMemPipeline(pipeline.encoder, pipeline.lm, pipeline.tokenizer, HashEncoder(8), max_new_tokens=4)
    store = pipe.remember([])
    assert len(store) == 0
    [answer] = pipe.answer("Where do I live?")
    assert answer.answer == NO_MEMORY_ANSWER and answer.memory == [] and answer.tokens["generated"] == 0


def test_question_longer_than_the_context_is_a_clear_error(pipeline):
    with pytest.raises(UserError, match=r"the question is too long: .* \(prompt.max_prompt_tokens = 256\)"):
        pipeline.answer("Where " * 400)


def test_sentence_encoder_of_another_width_is_refused(pipeline):
    from qgmem.serving import ExportFormatError

    with pytest.raises(ExportFormatError, match="gives 12-d features, but field 'graph_token.feature_dim' is 8"):
        QGMemPipeline(pipeline.encoder, pipeline.lm, pipeline.tokenizer, HashEncoder(12))


def test_answer_before_memory_and_unknown_mode(pipeline):
    fresh = QGMemPipeline(pipeline.encoder, pipeline.lm, pipeline.tokenizer, HashEncoder(8))
    with pytest.raises(UserError, match="no memory yet"):
        fresh.answer("Where?")
    with pytest.raises(UserError, match="graph_mode must be one of token, none, shuffled"):
        pipeline.answer("Where?", graph_mode="random")


def test_load_memory_reuses_a_saved_store(pipeline, tmp_path):
    pipeline.memory.store.save(tmp_path / "stores" / "one")
    pipe = QGMemPipeline(pipeline.encoder, pipeline.lm, pipeline.tokenizer, HashEncoder(8), max_new_tokens=4)
    assert len(pipe.load_memory(tmp_path)) == len(pipeline.memory)
    assert [a.answer for a in pipe.answer(QUESTIONS)] == [a.answer for a in pipeline.answer(QUESTIONS)]
    with pytest.raises(FileNotFoundError, match="no memory store"):
        pipe.load_memory(tmp_path / "stores")


@pytest.mark.parametrize("answer,expected", [("See [M2] and [M1], also [M2].", ["M2", "M1"]), ("[M9] no", []),
                                             ("none", [])])
def test_cited_labels(answer, expected):
    assert cited_labels(answer, 3) == expected


def test_node_word_features_and_node_tokens_through_serving(tiny_lm_path, monkeypatch):
    """An export with ``node_words`` features and the ``nodes`` readout: serving gives the encoder its
    LM's word embeddings and each graph its node texts' word pieces, and inserts K tokens."""
    from qgmem.model.encoder import EncoderConfig
    from qgmem.model.graph_token import GraphTokenConfig
    from qgmem.model.pretrained import GraphTokenEncoder

    from .helpers import HIDDEN, export_config

    config = GraphTokenConfig(feature_dim=8, edge_dim=8, lm_hidden=HIDDEN, features="node_words", readout="nodes",
                              num_graph_tokens=4, encoder=EncoderConfig(hidden=16, heads=2, layers=1, dropout=0.0))
    encoder = GraphTokenEncoder(config, export_config(tiny_lm_path, 8)).eval()
    tokenizer = load_tokenizer(tiny_lm_path, padding_side="left")
    pipe = QGMemPipeline(encoder, load_causal_lm(tiny_lm_path), tokenizer, HashEncoder(8), max_new_tokens=3)
    pipe.remember(HISTORY)
    seen = []
    original = encoder.encode
    monkeypatch.setattr(encoder, "encode", lambda graphs: seen.extend(graphs) or original(graphs))
    answers = pipe.answer(QUESTIONS[:2])
    assert [a.tokens["graph"] for a in answers] == [4, 4]
    first = pipe.retrieve(QUESTIONS[:1])[0]
    ids = seen[0].node_word_ids
    assert ids.shape == (first.graph.num_nodes, 8)
    text = first.memory.graph.node_text[0]
    assert ids[0][ids[0] >= 0].tolist() == tokenizer(" " + text, add_special_tokens=False)["input_ids"][:8]


def test_an_export_whose_text_budget_passes_its_graph_budget_is_refused(pipeline, tiny_lm_path):
    from qgmem.prompting import PromptSettings
    from qgmem.serving import ExportFormatError

    encoder = make_encoder(tiny_lm_path, prompt=PromptSettings(max_prompt_tokens=256, memory_units=11).to_dict())
    with pytest.raises(ExportFormatError, match=r"answer.prompt.memory_units = 11 is more than answer.activation.k = 10"):
        QGMemPipeline(encoder, pipeline.lm, pipeline.tokenizer, HashEncoder(8))


def test_the_exports_text_budget_cuts_the_answers_prompt(pipeline, tiny_lm_path):
    from qgmem.prompting import PromptSettings

    encoder = make_encoder(tiny_lm_path, prompt=PromptSettings(max_prompt_tokens=256, memory_units=1).to_dict())
    compact = QGMemPipeline(encoder, pipeline.lm, pipeline.tokenizer, HashEncoder(8), max_new_tokens=4)
    compact.remember(HISTORY)
    [full] = pipeline.answer(QUESTIONS[:1])
    [cut] = compact.answer(QUESTIONS[:1])
    assert len(full.memory) > 1 and cut.memory == full.memory  # the graph's units are the same
    assert 0 < cut.tokens["retrieved_context"] < full.tokens["retrieved_context"]


def test_an_answer_naming_no_mode_reads_the_exports_graph_mode(pipeline, tiny_lm_path):
    from qgmem.serving import ExportFormatError

    text_first = QGMemPipeline(make_encoder(tiny_lm_path, graph_mode="none"), pipeline.lm, pipeline.tokenizer,
                               HashEncoder(8), max_new_tokens=4)
    text_first.memory = pipeline.memory
    assert pipeline.contract.graph_mode == "token" and text_first.contract.graph_mode == "none"
    [plain], [asked] = text_first.answer(QUESTIONS[:1]), text_first.answer(QUESTIONS[:1], graph_mode="token")
    [reference_none], [reference_token] = (pipeline.answer(QUESTIONS[:1], graph_mode=m) for m in ("none", "token"))
    assert plain.graph_mode == "none" and plain.tokens["graph"] == 0 and plain.answer == reference_none.answer
    assert asked.graph_mode == "token" and asked.tokens["graph"] == 1 and asked.answer == reference_token.answer
    assert pipeline.answer(QUESTIONS[:1])[0].graph_mode == "token"  # an export that says token answers with it
    with pytest.raises(ExportFormatError, match="field 'graph_mode': graph_mode must be one of token, none, shuffled"):
        QGMemPipeline(make_encoder(tiny_lm_path, graph_mode="text"), pipeline.lm, pipeline.tokenizer, HashEncoder(8))


def test_the_exports_budgets_reach_answer_serve_and_eval_qa(tiny_lm_path, tmp_path):
    """``load_models`` (the one loading path of ``qgmem answer``, ``qgmem serve`` and ``qgmem eval-qa``)
    takes both budgets from the export: ``activation.k`` sizes the working memory, ``prompt.memory_units``
    cuts the prompt's text to its top entries."""
    from qgmem.activation.config import ActivationConfig
    from qgmem.prompting import PromptSettings
    from qgmem.serving.export_models import load_models

    from .helpers import make_export

    def budgets(folder, k, m):
        export = make_export(folder, tiny_lm_path, feature_dim=384, activation=ActivationConfig(k=k).to_dict(),
                             prompt=PromptSettings(max_prompt_tokens=256, memory_units=m).to_dict())
        pipe = load_models(str(export), device="cpu", max_new_tokens=2)
        pipe.remember(HISTORY)
        [retrieved] = pipe.retrieve(QUESTIONS[:1])
        [prompt] = pipe.encode_prompts([retrieved])
        return pipe, retrieved, pipe.tokenizer.decode(prompt.ids)

    wide, wide_r, wide_text = budgets(tmp_path / "wide", 10, None)
    compact, compact_r, compact_text = budgets(tmp_path / "compact", 2, 1)
    assert (wide.activation.k, wide.prompt_settings.memory_units) == (10, None)
    assert (compact.activation.k, compact.prompt_settings.memory_units) == (2, 1)
    assert len(wide_r.memory.units) > 2 and len(compact_r.memory.units) == 2
    assert "\n[M2]" in wide_text and "\n[M1]" in compact_text and "\n[M2]" not in compact_text
