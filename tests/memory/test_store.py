from __future__ import annotations

import json

import numpy as np
import pytest

from qgmem.memory.builder import MemoryBuilder
from qgmem.memory.config import ConstructionConfig
from qgmem.memory.store import MemoryStore, StoreMismatchError

from .helpers import BagOfWordsEncoder, make_dialogue
from .test_traces import MOVING


@pytest.fixture()
def built(tmp_path):
    builder = MemoryBuilder(ConstructionConfig(min_fact_similarity=0.1), BagOfWordsEncoder())
    store = builder.build(make_dialogue(MOVING, dialogue_id="dlg/1#x"))
    return builder, store, store.save(tmp_path / "store")


def test_round_trip_keeps_units_traces_embeddings(built):
    builder, store, folder = built
    assert sorted(p.name for p in folder.iterdir()) == ["embeddings.safetensors", "meta.json", "traces.jsonl",
                                                         "units.jsonl"]
    back = MemoryStore.load(folder, expected_meta=builder.expected_meta())
    assert back.units == store.units and back.traces == store.traces and len(back.traces) >= 1
    assert back.embeddings.dtype == np.float32 and back.embeddings.shape == store.embeddings.shape
    np.testing.assert_array_equal(back.embeddings, store.embeddings)
    assert back.dialogue_id == "dlg/1#x" and back.meta["num_units"] == len(store.units)
    assert back.meta["params"] == ConstructionConfig(min_fact_similarity=0.1).to_dict()
    unit = back.units[0]
    assert back.unit(unit.id) is unit and back.index_of(unit.id) == 0
    traced = next(u for u in back.units if u.trace_id)
    assert back.trace_of(traced).id == traced.trace_id


@pytest.mark.parametrize("expected,names", [
    ({"extractor": "llm"}, "extractor: expected 'llm', stored 'parser'"),
    ({"params": {"window_size": 8, "trace_threshold": 0.8}}, "params.window_size: expected 8, stored 6"),
    ({"encoder": "BAAI/bge-base-en-v1.5"}, "encoder: expected"),
    ({"not_there": 1}, "not_there: expected 1, not recorded"),
])
def test_other_parameters_are_reported(built, expected, names):
    _, _, folder = built
    with pytest.raises(StoreMismatchError, match=names.replace("(", r"\(").replace(")", r"\)")):
        MemoryStore.load(folder, expected_meta=expected)
    with pytest.warns(UserWarning, match="built with other parameters"):
        MemoryStore.load(folder, expected_meta=expected, strict=False)


def test_empty_store_round_trips(tmp_path):
    store = MemoryStore("empty", embeddings=np.zeros((0, 8), dtype=np.float32))
    back = MemoryStore.load(store.save(tmp_path / "e"))
    assert len(back) == 0 and back.embeddings.shape == (0, 8)


def test_incomplete_or_foreign_folders_fail_clearly(built, tmp_path):
    _, _, folder = built
    with pytest.raises(FileNotFoundError, match="no meta.json"):
        MemoryStore.load(tmp_path)
    lines = (folder / "units.jsonl").read_text().splitlines()
    (folder / "units.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(ValueError, match="incomplete or was edited"):
        MemoryStore.load(folder)
    meta = json.loads((folder / "meta.json").read_text())
    (folder / "meta.json").write_text(json.dumps({**meta, "format_version": 99}))
    with pytest.raises(StoreMismatchError, match="version 99"):
        MemoryStore.load(folder)


def test_mismatched_embeddings_refuse_to_save(tmp_path):
    store = MemoryStore("d", embeddings=np.zeros((2, 4), dtype=np.float32))
    with pytest.raises(ValueError, match="2 embeddings for 0 units"):
        store.save(tmp_path / "bad")
