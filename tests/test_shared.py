"""The shared pieces every stage uses: records, sentence encoder, LM loading, CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from qgmem.cli import COMMANDS, main
from qgmem.data.errors import DataFormatError, SkipReport
from qgmem.data.records import QA, Case, Dialogue, Session, Turn
from qgmem.memory.records import MemoryTrace, MemoryUnit
from qgmem.memory.store import MemoryStore


def _case() -> Case:
    turns = [
        Turn(id="s1:0", session_id="s1", speaker="User", role="user", text="J’habite à Zürich — ça va?"),
        Turn(id="s1:1", session_id="s1", speaker="Assistant", role="assistant", text="Noted.", time="2023-05-08T13:56:00"),
    ]
    dialogue = Dialogue(id="d1", sessions=[Session(id="s1", turns=turns)])
    qa = QA(id="q1", question="Where?", answer="Zürich", category="user_evidence", evidence_turn_ids=["s1:0"])
    return Case(id="c1", dialogue=dialogue, qas=[qa], source={"dataset": "convomem", "person_id": "p1"})


def test_case_round_trips_through_json_with_non_ascii():
    case = _case()
    text = json.dumps(case.to_dict(), ensure_ascii=False)
    back = Case.from_dict(json.loads(text))
    assert back == case
    assert back.dialogue.turns()[0].text == "J’habite à Zürich — ça va?"


@pytest.mark.parametrize("key,expected", [("person", "p1"), ("dialogue", "d1")])
def test_group_key(key, expected):
    assert _case().group_key(key) == expected


def test_group_key_missing_names_the_case():
    case = _case()
    case.source.pop("person_id")
    with pytest.raises(KeyError, match="c1"):
        case.group_key("person")


def test_dialogue_reindex_counts_in_reading_order():
    case = _case()
    case.dialogue.sessions.insert(0, Session(id="s0", turns=[Turn("s0:0", "s0", "User", "user", "hi")]))
    case.dialogue.reindex()
    assert [t.index for t in case.dialogue.turns()] == [0, 1, 2]
    assert case.dialogue.num_turns() == 3
    assert set(case.dialogue.turn_map()) == {"s0:0", "s1:0", "s1:1"}


def test_data_format_error_names_file_item_and_field():
    err = DataFormatError("expected a list", file="a.json", item=3, field="conversations")
    assert str(err) == "file a.json, item 3, field conversations: expected a list"
    report = SkipReport()
    report.add(err)
    assert len(report) == 1 and report.summary()["skipped"] == 1


def test_memory_store_lookups():
    unit = MemoryUnit(id="u1", dialogue_id="d1", session_id="s1", window_id="w0", fact="User lives in Zürich",
                      subject="User", predicate="lives in", object="Zürich", source_turn_ids=["s1:0"],
                      source_text="J’habite à Zürich", trace_id="t1")
    trace = MemoryTrace(id="t1", dialogue_id="d1", subject="User", relation="lives in", unit_ids=["u1"],
                        transitions=["origin"], latest_unit_id="u1")
    store = MemoryStore(dialogue_id="d1", units=[unit], traces=[trace], embeddings=np.zeros((1, 4), np.float32))
    assert len(store) == 1 and store.unit("u1") is unit and store.index_of("u1") == 0
    assert store.trace_of(unit) is trace
    assert (unit.turn_start, unit.turn_end) == ("s1:0", "s1:0")
    assert MemoryUnit.from_dict(unit.to_dict()) == unit


def test_cli_help_lists_every_command(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert name in out


def test_cli_rejects_unknown_command(capsys):
    assert main(["no-such-command"]) == 2 and "invalid choice: 'no-such-command'" in capsys.readouterr().err


def test_sentence_encoder_is_normalized_and_memoized(sentence_encoder):
    vectors = sentence_encoder.encode(["I live in Boston.", "I moved to Denver.", "I live in Boston."])
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(vectors[0], vectors[2])
    calls = sentence_encoder.calls
    sentence_encoder.encode(["I moved to Denver."])
    assert sentence_encoder.calls == calls
    assert sentence_encoder.encode([]).shape == (0, 384)


def test_embedded_lm_loads_frozen_and_answers():
    import torch

    from qgmem.lm import EMBEDDED_LM, load_causal_lm, load_tokenizer

    model = load_causal_lm(EMBEDDED_LM)
    tokenizer = load_tokenizer(EMBEDDED_LM)
    assert model.config.hidden_size == 576 and not model.training
    assert not any(p.requires_grad for p in model.parameters())
    inputs = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                           add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, inputs["input_ids"].shape[1]:])


def test_embedded_lm_conversion_reuses_a_finished_folder(tmp_path, monkeypatch):
    """A finished conversion is reused as is: the GGUF file is not read again."""
    from qgmem import lm

    target = tmp_path / "SmolLM2"
    target.mkdir()
    (target / "config.json").write_text("{}")
    (target / "model.safetensors").write_bytes(b"x")
    monkeypatch.setattr(lm, "_embedded_gguf", lambda: (_ for _ in ()).throw(AssertionError("must not reconvert")))
    assert lm.convert_embedded_lm(target) == target
