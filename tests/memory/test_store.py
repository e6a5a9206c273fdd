from __future__ import annotations

import json

import numpy as np
import pytest

from qgmem.memory.builder import MemoryBuilder
from qgmem.memory.config import ConstructionConfig
from qgmem.errors import IntegrityError
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
    assert back.meta["params"] == ConstructionConfig(min_fact_similarity=0.1).key_dict()
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
    with pytest.raises(IntegrityError, match="units.jsonl: truncated"):
        MemoryStore.load(folder)
    with pytest.raises(IntegrityError, match="incomplete or was edited"):  # the count check, unverified
        MemoryStore.load(folder, verify=False)
    meta = json.loads((folder / "meta.json").read_text())
    (folder / "meta.json").write_text(json.dumps({**meta, "format_version": 99}))
    with pytest.raises(StoreMismatchError, match="version 99"):
        MemoryStore.load(folder)


def test_mismatched_embeddings_refuse_to_save(tmp_path):
    store = MemoryStore("d", embeddings=np.zeros((2, 4), dtype=np.float32))
    with pytest.raises(ValueError, match="2 embeddings for 0 units"):
        store.save(tmp_path / "bad")


def _flip(path, n=32):
    """Invert ``n`` bytes in the middle of a file (the fault a bad disk or a bad copy gives)."""
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    for i in range(mid, min(mid + n, len(data))):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("name", ["embeddings.safetensors", "units.jsonl", "traces.jsonl"])
def test_flipped_bytes_are_detected_naming_the_file(built, name):
    _, _, folder = built
    _flip(folder / name, n=8)
    with pytest.raises(IntegrityError, match=f"{name}: checksum mismatch") as err:
        MemoryStore.load(folder)
    assert str(folder / name) in str(err.value) and "qgmem build-memory" in str(err.value)


@pytest.mark.parametrize("name", ["embeddings.safetensors", "units.jsonl"])
def test_truncated_file_names_path_and_fix(built, name):
    _, _, folder = built
    path = folder / name
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])
    with pytest.raises(IntegrityError, match=rf"{name}: truncated \(\d+ bytes, \d+ written\)") as err:
        MemoryStore.load(folder)
    assert str(path) in str(err.value) and "rebuild it with `qgmem build-memory" in str(err.value)


def test_truncated_embeddings_unverified_still_name_the_path(built):
    _, _, folder = built
    path = folder / "embeddings.safetensors"
    path.write_bytes(path.read_bytes()[:20])
    with pytest.raises(IntegrityError, match="embeddings.safetensors: unreadable"):
        MemoryStore.load(folder, verify=False)


def test_store_without_checksums_is_refused(built):
    _, _, folder = built
    meta = json.loads((folder / "meta.json").read_text())
    del meta["files"]
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(IntegrityError, match="no checksums recorded"):
        MemoryStore.load(folder)


def test_garbled_meta_is_an_integrity_error(built):
    _, _, folder = built
    (folder / "meta.json").write_text('{"format": "qgmem-memory-st')
    with pytest.raises(IntegrityError, match="meta.json: unreadable"):
        MemoryStore.load(folder)


def test_source_turn_embeddings_are_built_saved_and_checked(built, tmp_path):
    from safetensors.numpy import save_file

    from qgmem.integrity import manifest
    from qgmem.memory.source_turns import source_turn_embeddings
    from qgmem.memory.store import DATA_FILES

    builder, store, folder = built
    assert store.source_embeddings.shape == store.embeddings.shape
    np.testing.assert_array_equal(store.source_embeddings, source_turn_embeddings(store.units, builder.encoder))
    back = MemoryStore.load(folder)
    np.testing.assert_array_equal(back.source_embeddings, store.source_embeddings)

    def rewrite(tensors):  # a hand-edited file whose checksums were updated, so only the shape check can see it
        save_file(tensors, str(folder / "embeddings.safetensors"))
        meta = json.loads((folder / "meta.json").read_text())
        (folder / "meta.json").write_text(json.dumps({**meta, "files": manifest(folder, DATA_FILES)}))

    rewrite({"embeddings": store.embeddings})  # a store from before stores kept them: loads without
    assert MemoryStore.load(folder).source_embeddings is None
    rewrite({"embeddings": store.embeddings, "source_embeddings": store.source_embeddings[:-1]})
    with pytest.raises(IntegrityError, match="source-turn embeddings"):
        MemoryStore.load(folder)
    bad = store.source_embeddings.copy()
    bad[0, 0] = np.inf
    rewrite({"embeddings": store.embeddings, "source_embeddings": bad})
    with pytest.raises(IntegrityError, match="non-finite source-turn"):
        MemoryStore.load(folder)
    store.source_embeddings = store.source_embeddings[:, :3]
    with pytest.raises(ValueError, match="source-turn embeddings"):
        store.save(tmp_path / "other")


def test_nan_embeddings_written_by_hand_are_refused(built):
    from safetensors.numpy import save_file

    from qgmem.integrity import manifest
    from qgmem.memory.store import DATA_FILES

    _, store, folder = built
    bad = store.embeddings.copy()
    bad[0, 0] = np.nan
    save_file({"embeddings": bad}, str(folder / "embeddings.safetensors"))
    meta = json.loads((folder / "meta.json").read_text())
    (folder / "meta.json").write_text(json.dumps({**meta, "files": manifest(folder, DATA_FILES)}))  # checksums agree
    with pytest.raises(IntegrityError, match="non-finite embedding values"):
        MemoryStore.load(folder)


def test_save_replaces_atomically_and_stale_temp_is_cleaned(built, tmp_path):
    from qgmem.integrity import temp_path
    from qgmem.memory.store import clean_stale_temp

    _, store, folder = built
    (folder / "stray.txt").write_text("left by an older save")
    store.save(folder)  # replaces the whole folder
    assert sorted(p.name for p in folder.iterdir()) == ["embeddings.safetensors", "meta.json", "traces.jsonl",
                                                         "units.jsonl"]
    dead = folder.parent / ".other.tmp-999999999"  # no such process
    dead.mkdir()
    (dead / "units.jsonl").write_text("half")
    live = temp_path(folder.parent / "mine")  # this process: still being written
    live.mkdir()
    assert clean_stale_temp(folder.parent) == [dead]
    assert not dead.exists() and live.exists() and folder.exists()


def test_two_writers_and_a_reader_of_one_store_never_collide(tmp_path):
    """Two processes save one store over and over while a third loads it (was: `OSError: Directory not
    empty` in the writers, "missing file" errors in the reader): the swap and the load share a lock."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    folder = tmp_path / "stores" / "d"
    MemoryStore(dialogue_id="d", embeddings=np.ones((0, 4), dtype=np.float32)).save(folder)
    child = Path(__file__).with_name("store_race_child.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, str(child), role, str(folder), "150"], stdout=subprocess.PIPE,
                              text=True, env=env) for role in ("writer", "writer", "reader")]
    results = [json.loads(p.communicate(timeout=120)[0].strip().splitlines()[-1]) for p in procs]
    assert [r["errors"][:3] for r in results] == [[], [], []]
    assert MemoryStore.load(folder).meta["role"] == "writer"
    assert sorted(p.name for p in folder.parent.iterdir()) == [".d.lock", "d"]  # no temp or .old- folder left
