"""The build's --out folder: the store served is the one the index names, never "the one left readable"."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from qgmem.cli import main
from qgmem.errors import InputPathError, IntegrityError, UserError
from qgmem.serving.pipeline import QGMemPipeline

from .test_build_cli import fake_encoder  # noqa: F401  (fixture)

LOCOMO = Path(__file__).parents[1] / "fixtures" / "locomo_small.json"


@pytest.fixture()
def two_stores(tmp_path, fake_encoder, capsys):  # noqa: F811
    out = tmp_path / "out"
    assert main(["build-memory", "--dataset", "locomo", "--path", str(LOCOMO), "--out", str(out),
                 "--extractor", "heuristic"]) == 0
    capsys.readouterr()
    index = [json.loads(line) for line in (out / "index.jsonl").read_text().splitlines()]
    assert len(index) == 2
    return out, index


def _load(folder, dialogue=None):
    """``QGMemPipeline.load_memory`` without a model (it hands the store to ``open_memory``)."""
    return QGMemPipeline.load_memory(SimpleNamespace(open_memory=lambda store: SimpleNamespace(store=store)),
                                     folder, dialogue)


def test_a_store_with_its_meta_deleted_is_an_error_naming_it(two_stores):
    out, index = two_stores
    (out / index[0]["folder"] / "meta.json").unlink()  # as an interrupted write leaves it
    with pytest.raises(UserError, match="holds 2 stores; name one"):
        _load(out)  # was: answered from the other dialogue's store, rc 0
    with pytest.raises(InputPathError) as err:
        _load(out, index[0]["dialogue_id"])
    assert str(out / index[0]["folder"] / "meta.json") in str(err.value) and "build-memory" in str(err.value)
    assert _load(out, index[1]["dialogue_id"]).dialogue_id == index[1]["dialogue_id"]


def test_an_unknown_dialogue_lists_the_index_not_the_readable_stores(two_stores):
    out, index = two_stores
    (out / index[0]["folder"] / "meta.json").unlink()
    with pytest.raises(UserError) as err:
        _load(out, "nobody")
    assert f"no store of dialogue 'nobody' in index.jsonl (it lists 2: {index[0]['dialogue_id']}, " \
           f"{index[1]['dialogue_id']})" in str(err.value)


def test_a_damaged_index_or_a_swapped_store_is_named(two_stores):
    from qgmem.memory.output import load_built_store

    out, index = two_stores
    rows = (out / "index.jsonl").read_text().splitlines()
    swapped = [json.loads(rows[0]), json.loads(rows[1])]
    swapped[0]["folder"], swapped[1]["folder"] = swapped[1]["folder"], swapped[0]["folder"]
    (out / "index.jsonl").write_text("".join(json.dumps(r) + "\n" for r in swapped))
    with pytest.raises(UserError, match=rf"holds dialogue {index[1]['dialogue_id']!r}, but .*index.jsonl says"):
        load_built_store(out, index[0]["dialogue_id"])
    (out / "index.jsonl").write_text(rows[0] + "\n{not json\n")
    with pytest.raises(IntegrityError, match=r"index.jsonl, line 2"):
        load_built_store(out, index[0]["dialogue_id"])


def test_one_store_folder_and_an_out_without_index(two_stores):
    from qgmem.memory.output import load_built_store

    out, index = two_stores
    one = out / index[1]["folder"]
    assert load_built_store(one).dialogue_id == index[1]["dialogue_id"]
    with pytest.raises(UserError, match="holds the store of dialogue"):
        load_built_store(one, index[0]["dialogue_id"])
    (out / "index.jsonl").unlink()
    (out / index[0]["folder"] / "meta.json").unlink()
    with pytest.raises(InputPathError, match="meta.json: not a memory store"):  # never skipped to look further
        load_built_store(out, "nobody")


def test_a_second_build_of_one_out_stops_with_a_clear_message(tmp_path, fake_encoder, capsys):  # noqa: F811
    """Another process holds OUT's lock (as a running build does): this build stops, exit 2, and leaves
    the first one's index and summary alone (was: both wrote them, the last one won)."""
    import os
    import subprocess
    import sys

    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom qgmem.memory.output import build_lock\n"
                               f"with build_lock({str(out)!r}):\n    print('held', flush=True)\n    sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        assert holder.stdout.readline().strip() == "held"
        args = ["build-memory", "--dataset", "locomo", "--path", str(LOCOMO), "--out", str(out), "--extractor",
                "heuristic"]
        assert main(args) == 2
        err = capsys.readouterr().err
        assert "another `qgmem build-memory` is writing this folder" in err and ".build.lock" in err
        assert "Traceback" not in err and not (out / "index.jsonl").exists() and not (out / "stores").exists()
    finally:
        holder.communicate("", timeout=30)  # the holder exits, and the lock goes with it
    assert main(args) == 0 and (out / "index.jsonl").is_file()


def test_an_out_that_names_an_existing_file_is_one_line_and_exit_2(tmp_path, fake_encoder, capsys):  # noqa: F811
    """Was: a FileExistsError traceback, exit 1. The positive control: a missing --out is made and built."""
    taken = tmp_path / "taken.txt"
    taken.write_text("not a folder\n")
    args = ["build-memory", "--dataset", "locomo", "--path", str(LOCOMO), "--extractor", "heuristic", "--out"]
    assert main([*args, str(taken)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("qgmem build-memory: error: ") and str(taken) in err[0] and "not a folder" in err[0]
    assert "Traceback" not in "\n".join(err) and taken.read_text() == "not a folder\n"
    assert main([*args, str(tmp_path / "fresh")]) == 0
