from __future__ import annotations

import numpy as np
import pytest
import torch

from qgmem.activation.rerank import (
    Candidate,
    CrossEncoderReranker,
    EmbeddingReranker,
    LLMReranker,
    candidate_document,
    make_reranker,
)

from qgmem.errors import InputPathError, UserError

from .helpers import save_tiny_cross_encoder


def _candidates(store, indices, fused=None):
    fused = fused or [1.0 / (60 + r) for r in range(1, len(indices) + 1)]
    out = []
    for i, f in zip(indices, fused):
        unit = store.units[i]
        out.append(Candidate(index=i, unit=unit, fused=f,
                             document=candidate_document(unit, store.trace_of(unit), store.unit)))
    return out


def test_candidate_document_has_fact_source_attributes_and_trajectory(small_store):
    unit = small_store.unit("u4")
    doc = candidate_document(unit, small_store.trace_of(unit), small_store.unit)
    assert doc.splitlines()[0] == "Fact: Melanie now works as a pottery teacher"
    assert "Source (turn 20, Melanie): Melanie now works as a pottery teacher" in doc
    assert "Attributes: entities: Melanie" in doc
    assert doc.splitlines()[-1] == ("Trajectory: origin: Melanie works as a nurse at the city hospital | "
                                    "update: Melanie now works as a pottery teacher (current)")
    plain = candidate_document(small_store.unit("u5"), None, None, source_chars=10)
    assert "Trajectory" not in plain and "Source (turn 11, Caroline): Caroline r ..." in plain
    assert "location: Boston; fact time: 2023-05-01/2023-05-07" in plain


@pytest.mark.parametrize("weight,lexical_weight", [(0.0, 0.0), (0.5, 0.0), (1.0, 0.0), (0.3, 0.2), (0.0, 1.0)])
def test_embedding_reranker_formula(small_store, weight, lexical_weight):
    cands = _candidates(small_store, [2, 5, 7], fused=[0.04, 0.02, 0.01])
    for c, lexical in zip(cands, [0.0, 1.0, 0.4]):
        c.lexical = lexical
    q = small_store.embeddings[5]
    reranker = EmbeddingReranker(small_store.embeddings, weight=weight, lexical_weight=lexical_weight)
    scores = reranker.score("q", cands, q)
    cos = small_store.embeddings[[2, 5, 7]] @ q
    expected = weight * cos + (1 - weight) * np.array([1.0, 0.5, 0.25]) + lexical_weight * np.array([0.0, 1.0, 0.4])
    assert scores.shape == (3,) and scores.dtype == np.float32
    np.testing.assert_allclose(scores, expected, rtol=1e-5)


def _tiny_lm(vocab_size: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    return LlamaForCausalLM(config).eval()


def test_llm_reranker_batched_equals_single_and_is_p_yes(small_store, smollm2_tokenizer):
    model = _tiny_lm(len(smollm2_tokenizer))
    cands = _candidates(small_store, [0, 3, 4, 5, 6])
    batched = LLMReranker(model, smollm2_tokenizer, batch_size=4).score("What is Melanie's job?", cands)
    single = LLMReranker(model, smollm2_tokenizer, batch_size=1).score("What is Melanie's job?", cands)
    assert batched.shape == (5,) and np.all((batched > 0) & (batched < 1))
    np.testing.assert_allclose(batched, single, atol=1e-4)  # left padding does not change scores
    scorer = LLMReranker(model, smollm2_tokenizer)
    ids = smollm2_tokenizer(scorer.prompt("What is Melanie's job?", cands[2].document), return_tensors="pt",
                            add_special_tokens=False)
    with torch.no_grad():
        logits = model(**ids).logits[0, -1]
    p_yes = torch.softmax(torch.stack([logits[scorer.no_id], logits[scorer.yes_id]]), 0)[1].item()
    assert batched[2] == pytest.approx(p_yes, abs=1e-4)
    assert smollm2_tokenizer.padding_side == "right"  # restored after scoring


def test_llm_reranker_truncates_long_documents(small_store, smollm2_tokenizer):
    scorer = LLMReranker(_tiny_lm(len(smollm2_tokenizer)), smollm2_tokenizer, max_doc_tokens=8)
    prompt = scorer.prompt("q", "word " * 500)
    assert prompt.count("word") <= 9
    assert prompt.rstrip().endswith("assistant")  # the assistant turn is opened for the next token


def test_cross_encoder_from_local_folder(tmp_path, small_store):
    save_tiny_cross_encoder(tmp_path, hidden=32, max_positions=512)
    reranker = CrossEncoderReranker(str(tmp_path), batch_size=2)
    cands = _candidates(small_store, [0, 1, 2])
    scores = reranker.score("What did Caroline research?", cands)
    assert scores.shape == (3,) and scores.dtype == np.float32 and np.isfinite(scores).all()
    again = make_reranker("cross-encoder", embeddings=small_store.embeddings, path=str(tmp_path), batch_size=3)
    np.testing.assert_allclose(again.score("What did Caroline research?", cands), scores, atol=1e-5)


def test_make_reranker_validates():
    with pytest.raises(ValueError, match="needs reranker_path"):
        make_reranker("cross-encoder", embeddings=np.zeros((0, 4), np.float32))
    with pytest.raises(ValueError, match="unknown reranker"):
        make_reranker("bm25", embeddings=np.zeros((0, 4), np.float32))


def test_trained_reranker_path_is_checked_before_loading(tmp_path, small_store):
    missing, empty, good = tmp_path / "missing", tmp_path / "empty", tmp_path / "good"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    with pytest.raises(InputPathError, match="reranker_path .*missing.*no such folder"):
        make_reranker("trained", embeddings=small_store.embeddings, path=str(missing))
    with pytest.raises(UserError, match="reranker_path .*empty.*no weight file"):
        make_reranker("trained", embeddings=small_store.embeddings, path=str(empty))
    # positive control: a real folder passes the check and loads
    save_tiny_cross_encoder(good, hidden=32, max_positions=512)
    reranker = make_reranker("trained", embeddings=small_store.embeddings, path=str(good))
    assert isinstance(reranker, CrossEncoderReranker)


def test_llm_reranker_with_smollm2(small_store):
    from qgmem.lm import EMBEDDED_LM

    reranker = make_reranker("llm", embeddings=small_store.embeddings, path=EMBEDDED_LM, batch_size=2,
                             max_doc_tokens=48)
    cands = _candidates(small_store, [1, 4])
    scores = reranker.score("What does Melanie work as now?", cands)
    assert scores.shape == (2,) and np.all((scores > 0) & (scores < 1))
    np.testing.assert_allclose(reranker.score("What does Melanie work as now?", cands[1:2]), scores[1:2], atol=1e-3)
