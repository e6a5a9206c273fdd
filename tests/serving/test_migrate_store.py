"""``qgmem migrate-store``: a store root of the folder format (made by the last version that wrote it,
``tests/fixtures/folder_store``) moved into each backend with the same memories, keys and forgets; rerun
safely; and ``qgmem serve`` refusing such a root until it is moved."""

from __future__ import annotations

import shutil
from pathlib import Path

from qgmem.cli import main
from qgmem.serving.export_models import LoadSettings
from qgmem.serving.serve_cli import ServeSettings, check
from qgmem.serving.users import UserMemories

from .test_users import _Models, state

FOLDERS = Path(__file__).resolve().parents[1] / "fixtures" / "folder_store"


def test_a_folder_root_moves_with_the_same_memories_and_a_rerun_moves_nothing(store_url, tmp_path, capsys):
    root = tmp_path / "old"
    shutil.copytree(FOLDERS, root)
    assert main(["migrate-store", "--from", str(root), "--to", store_url]) == 0
    out = capsys.readouterr().out
    assert "moved 2 users (5 units)" in out and "0 already there" in out
    assert "1 with changes past their snapshot" in out  # bob: journal only, replayed at his first load
    assert main(["migrate-store", "--from", str(root), "--to", store_url]) == 0
    assert "moved 0 users (0 units)" in capsys.readouterr().out.replace("2 already there", "") and \
        (root / "MOVED").is_file()
    moved = UserMemories(store_url, _Models())
    reference = UserMemories(f"sqlite:///{tmp_path / 'reference.db'}", _Models())  # the histories replayed
    for user_id in ("ana", "bob"):
        reference.import_user(user_id, list(moved.export(user_id)))
    assert [e.get("forget", "") for e in moved.export("ana")].count("") == 6  # ana: 6 sessions, 1 forget
    for user_id in ("ana", "bob"):
        assert state(store_url, user_id) == state(f"sqlite:///{tmp_path / 'reference.db'}", user_id), user_id
    facts = [u.fact for u in moved.get("ana").store.units]
    assert "User's favourite colour is teal." in facts and not any("red" in f for f in facts)  # the forget moved
    replay = moved.append("ana", [{"speaker": "User", "text": "I planted 1 tulips and 2 roses in the garden."}],
                          "2024-05-01", key="one")
    assert replay["replayed"] and replay["session"] == 3  # the key moved with its first result
    assert moved.append("bob", [{"speaker": "User", "text": "I like jazz."}])["session"] == 2


def test_serve_refuses_a_folder_root_until_it_is_moved(tmp_path, capsys):
    root = tmp_path / "memories"
    shutil.copytree(FOLDERS, root)
    url = f"sqlite:///{root / 'memories.db'}"
    assert main(["serve", "--export", "x", "--store", url]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"qgmem migrate-store --from {root} --to {url}" in err.splitlines()[0]
    assert main(["serve", "--export", "x", "--store", str(root)]) == 2  # a folder for a URL: the same line
    assert f"qgmem migrate-store --from {root} --to sqlite:///{root / 'memories.db'}" in capsys.readouterr().err
    assert main(["migrate-store", "--from", str(root), "--to", url]) == 0
    check(ServeSettings(LoadSettings("x"), store=url))  # moved: served


def test_migrate_store_names_a_folder_that_is_not_a_root(tmp_path, capsys):
    assert main(["migrate-store", "--from", str(tmp_path), "--to", f"sqlite:///{tmp_path / 'm.db'}"]) == 2
    err = capsys.readouterr().err
    assert "not a store root of the folder format" in err and str(tmp_path) in err and "Traceback" not in err


def test_a_missing_flag_is_named_as_the_user_types_it(tmp_path, capsys):
    assert main(["migrate-store", "--to", f"sqlite:///{tmp_path / 'm.db'}"]) == 2
    assert capsys.readouterr().err.splitlines()[0].endswith("--from is required (qgmem migrate-store --from DIR --to URL)")
    assert main(["migrate-store", "--from", str(tmp_path)]) == 2
    assert "--to is required" in capsys.readouterr().err
