from __future__ import annotations

import shutil

import torch

from qgmem.activation.config import LATER_FIELDS, ActivationConfig
from qgmem.samples.spec import CacheSpec

from activation.helpers import save_tiny_cross_encoder


def _spec(activation: ActivationConfig) -> CacheSpec:
    return CacheSpec(activation=activation, answer_filter="none", data_fingerprint="stat")


def test_later_fields_enter_the_key_only_away_from_their_earlier_behaviour():
    before = ActivationConfig(channels=("lexical", "semantic", "attribute"), **LATER_FIELDS)
    key = _spec(before).sample_settings()["activation"]
    assert not set(LATER_FIELDS) & set(key) and "reranker_weights" not in key
    # a later setting away from its earlier value is in the key
    assert _spec(ActivationConfig(rerank_depth=20)).samples_key != _spec(ActivationConfig()).samples_key
    # the round-5 defaults (source channel, its reranker weight, turn diversity) are in the default key
    default = _spec(ActivationConfig()).sample_settings()["activation"]
    assert default["source_weight"] == 1.0 and default["max_units_per_turn"] == 1
    assert "source" in default["channels"]
    assert _spec(ActivationConfig()).samples_key != _spec(before).samples_key


def test_key_covers_the_reranker_weights(tmp_path):
    model = tmp_path / "reranker"
    save_tiny_cross_encoder(model, max_positions=64)
    config = ActivationConfig(reranker="trained", reranker_path=str(model))
    before = _spec(config)
    assert before.sample_settings()["activation"]["reranker_weights"].startswith("sha256:")
    assert _spec(config).samples_key == before.samples_key  # same weights, same key
    # retrained in place: same folder name, other weights -> another key (the cache rebuilds)
    shutil.rmtree(model)
    torch.manual_seed(1)
    save_tiny_cross_encoder(model, max_positions=64)
    (model / "model.safetensors").write_bytes((model / "model.safetensors").read_bytes()[:-1] + b"\x01")
    assert _spec(config).samples_key != before.samples_key


def test_distractors_default_to_the_training_histories_and_resolve_before_the_key():
    """``None`` is the training caches' number (both presets' 2), not the loader's 6; the key holds the number."""
    from qgmem.data.convomem_history import DEFAULT_DISTRACTORS, TRAINING_DISTRACTORS

    default = CacheSpec(answer_filter="none", data_fingerprint="stat")
    assert default.distractor_conversations == TRAINING_DISTRACTORS == 2 != DEFAULT_DISTRACTORS
    explicit = CacheSpec(answer_filter="none", data_fingerprint="stat", distractor_conversations=TRAINING_DISTRACTORS)
    assert explicit.samples_key == default.samples_key  # a preset that wrote 2 keeps its cache
    loader = CacheSpec(answer_filter="none", data_fingerprint="stat", distractor_conversations=DEFAULT_DISTRACTORS)
    assert loader.samples_key != default.samples_key
