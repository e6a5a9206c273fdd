from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from qgmem.activation.activator import Activator
from qgmem.activation.config import ActivationConfig
from qgmem.activation.rerank import CrossEncoderReranker, weights_digest
from qgmem.reranker_training import (
    TRAINING_DATA_LICENSE,
    RerankerTrainingConfig,
    mine_pairs,
    train_cross_encoder,
    write_card,
)
from qgmem.data.records import QA, Case, Dialogue, Session, Turn

from activation.helpers import save_tiny_cross_encoder


@pytest.fixture()
def tiny_base(tmp_path):
    """A random one-layer BERT cross-encoder with the MiniLM tokenizer: starting weights for tests."""
    return save_tiny_cross_encoder(tmp_path / "base", hidden=16, max_positions=128)


def _case(store) -> Case:
    turns = [Turn(id=tid, session_id="s1", speaker=u.speaker, role="user", text=u.source_text, index=i)
             for i, u in enumerate(store.units) for tid in u.source_turn_ids]
    qas = [QA(id="q1", question="Where did Caroline run a charity race?", answer="Boston", category="c",
              evidence_turn_ids=["t11"]),
           QA(id="q2", question="Where are the keys?", answer="-", category="c", evidence_turn_ids=["t99"])]
    return Case(id="c1", dialogue=Dialogue(id="d1", sessions=[Session(id="s1", turns=turns)]), qas=qas)


def test_mine_pairs_from_the_pool(small_store, hash_encoder):
    rows, report = mine_pairs([_case(small_store)], lambda case: small_store, hash_encoder,
                              ActivationConfig(k=3, pool_size=8), negatives=2)
    # q1: u5 (turn t11) is the one positive, the two best-ranked others are the negatives;
    # q2: no unit grounds t99, so no positive and no rows
    assert report == {"questions": 2, "without_positive": 1, "positives": 1, "negatives": 2}
    assert [r["label"] for r in rows] == [1.0, 0.0, 0.0]
    assert rows[0]["document"].startswith("Fact: Caroline ran a charity race in Boston")
    assert all(r["question"] == "Where did Caroline run a charity race?" for r in rows)


def test_train_save_load_round_trip_and_use_in_activation(tiny_base, tmp_path, small_store, hash_encoder):
    rows, _ = mine_pairs([_case(small_store)], lambda case: small_store, hash_encoder,
                         ActivationConfig(k=3, pool_size=8), negatives=7)
    out = tmp_path / "trained"
    config = RerankerTrainingConfig(base=str(tiny_base), epochs=3, batch_size=4, lr=1e-3, max_length=64,
                                    logging_steps=1)
    model, info = train_cross_encoder(rows * 4, rows, out, config)
    assert info["steps"] > 0 and any("loss" in c for c in info["curve"]) and any("eval_loss" in c for c in info["curve"])
    assert not (out / "_trainer").exists()
    assert weights_digest(out) != weights_digest(tiny_base)  # training changed the weights
    pairs = [(r["question"], r["document"]) for r in rows]
    loaded = CrossEncoderReranker(str(out), batch_size=3)
    np.testing.assert_allclose(loaded.model.predict(pairs), model.predict(pairs), atol=1e-5)
    # the trained positive now outranks every negative of its question
    scores = loaded.model.predict(pairs)
    assert scores[0] > scores[1:].max()
    act = Activator(small_store, hash_encoder, ActivationConfig(k=2, reranker="trained", reranker_path=str(out)))
    wm = act.activate("Where did Caroline run a charity race?")
    assert wm.units[0].id == "u5" and len(wm.units) == 2
    expected = loaded.score("Where did Caroline run a charity race?", [c for c, _ in act.last_ranking])
    assert wm.scores == pytest.approx(sorted(expected.tolist(), reverse=True)[:2], abs=1e-5)


def test_trained_reranker_needs_a_path(small_store, hash_encoder):
    with pytest.raises(ValueError, match="train-reranker"):
        Activator(small_store, hash_encoder, ActivationConfig(reranker="trained"))


def test_weights_digest_follows_the_weights(tiny_base, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(tiny_base, copy)
    assert weights_digest(copy) == weights_digest(tiny_base)
    (copy / "config.json").write_text("{}")  # not a weight file: same digest
    assert weights_digest(copy) == weights_digest(tiny_base)
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert weights_digest(copy) != weights_digest(tiny_base)
    with pytest.raises(FileNotFoundError, match="no weight files"):
        weights_digest(tmp_path / "copy" / "config.json")


def test_model_card_names_the_licence(tmp_path):
    info = {"base": "model", "cases": 3, "steps": 4, "train_seconds": 1.0,
            "pairs": {"positives": 2, "negatives": 5, "without_positive": 1},
            "curve": [{"step": 1, "loss": 0.7}, {"step": 2, "eval_loss": 0.6}]}
    card = write_card(tmp_path, RerankerTrainingConfig(), info).read_text()
    assert TRAINING_DATA_LICENSE == "CC-BY-NC-4.0" and "licence CC-BY-NC-4.0" in card
    assert card.startswith("---\nlicense: cc-by-nc-4.0\n") and "0.700" in card and "0.600" in card
    assert "rerank_depth=20, model_weight=0.25" in card  # the validated setting travels with the weights
    json.dumps(info)


def test_cli_rejects_bad_options(tmp_path, capsys):
    from qgmem.cli import main

    assert main(["train-reranker", "--out", str(tmp_path / "o"), "--path", str(tmp_path / "missing")]) == 2
    assert "missing" in capsys.readouterr().err
    assert main(["train-reranker", "--out", str(tmp_path / "o"), "--path", str(tmp_path), "--negatives", "0"]) == 2
    assert "--negatives" in capsys.readouterr().err


def test_reranker_fingerprint(tiny_base, tmp_path):
    from qgmem.activation.rerank import reranker_fingerprint

    assert reranker_fingerprint("embedding", None) is None
    for kind in ("trained", "cross-encoder"):
        assert reranker_fingerprint(kind, str(tiny_base)) == f"sha256:{weights_digest(tiny_base)}"
    assert reranker_fingerprint("trained", "org/not-a-folder") == "id:org/not-a-folder"
    with pytest.raises(ValueError, match="reranker_path"):
        reranker_fingerprint("trained", None)


def test_held_apart_cases_choose_the_saved_step(tiny_base, tmp_path, small_store, hash_encoder):
    """With selection rows the saved weights are the checkpoint of lowest selection loss, not the last
    step's; without them, the last step's (control)."""
    rows, _ = mine_pairs([_case(small_store)], lambda case: small_store, hash_encoder,
                         ActivationConfig(k=3, pool_size=8), negatives=7)
    # selection pairs whose labels contradict the training pairs: their loss rises as training goes on,
    # so the best step is the first evaluated one, well before the last
    flipped = [{**r, "label": 1.0 - r["label"]} for r in rows]
    config = RerankerTrainingConfig(base=str(tiny_base), epochs=6, batch_size=4, lr=1e-3, max_length=64,
                                    logging_steps=1)
    model, info = train_cross_encoder(rows * 4, rows, tmp_path / "chosen", config, select_rows=flipped)
    selects = [(c["step"], c["select_loss"]) for c in info["curve"] if "select_loss" in c]
    assert len(selects) >= 3 and any("eval_loss" in c for c in info["curve"])
    best_step = min(selects, key=lambda s: s[1])[0]
    assert info["chosen_step"] == best_step < info["steps"]
    assert not (tmp_path / "chosen" / "_trainer").exists()
    last, _ = train_cross_encoder(rows * 4, rows, tmp_path / "last", config)
    pairs = [(r["question"], r["document"]) for r in rows]
    saved = CrossEncoderReranker(str(tmp_path / "chosen"), batch_size=3).model.predict(pairs)
    np.testing.assert_allclose(saved, model.predict(pairs), atol=1e-5)  # what was saved is what was chosen
    assert not np.allclose(saved, last.predict(pairs), atol=1e-4)  # ... and it is not the last step's


def test_num_cases_all_and_selection_cases_are_disjoint(monkeypatch):
    import qgmem.reranker_training as reranker

    cases = [Case(id=f"c{i}", dialogue=Dialogue(id=f"d{i}", sessions=[]), qas=[]) for i in range(12)]

    class Loaded:
        def __init__(self, cases):
            self.cases = cases

    monkeypatch.setattr("qgmem.data.loaders.load_cases", lambda *a, **k: Loaded(cases))
    monkeypatch.setattr(reranker, "convomem_splits", lambda c, seed=0: {"train": c[:10], "val": c[10:]})
    monkeypatch.setattr(reranker, "preset_held_out_ids", lambda c: {"c0"})
    train, select, val = reranker.training_cases("x", None, 0, select_cases=3)
    assert len(select) == 3 and len(train) == 6 and [c.id for c in val] == ["c10", "c11"]
    assert not {c.id for c in train} & {c.id for c in select} and "c0" not in {c.id for c in train + select}
    train, select, _ = reranker.training_cases("x", 4, 0)
    assert len(train) == 4 and select == []
    with pytest.raises(ValueError, match="select_cases=9"):
        reranker.training_cases("x", None, 0, select_cases=9)


def test_cli_num_cases_all(tmp_path, capsys):
    from qgmem.cli import main

    assert main(["train-reranker", "--out", str(tmp_path / "o"), "--path", str(tmp_path), "--num-cases", "many"]) == 2
    assert "--num-cases" in capsys.readouterr().err
    assert main(["train-reranker", "--out", str(tmp_path / "o"), "--path", str(tmp_path), "--select-cases", "-1"]) == 2
    assert "--select-cases" in capsys.readouterr().err
