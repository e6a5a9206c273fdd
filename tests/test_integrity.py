"""Size + SHA-256 manifests, atomic folder replacement and stale temp cleanup (qgmem.integrity)."""

from __future__ import annotations

import os
import time

import pytest

from qgmem.errors import IntegrityError, UserError
from qgmem.integrity import (manifest, publish_dir, remove_stale_temp, sha256_file, stale_temp, temp_path,
                             verify_file, verify_files, write_text_atomic)


@pytest.fixture()
def folder(tmp_path):
    (tmp_path / "a.bin").write_bytes(bytes(range(256)) * 8)
    (tmp_path / "b.txt").write_text("hello\n")
    return tmp_path


def test_manifest_round_trip(folder):
    records = manifest(folder, ["a.bin", "b.txt"])
    assert records["a.bin"]["size"] == 2048 and len(records["b.txt"]["sha256"]) == 64
    verify_files(folder, records)  # unchanged: no error


@pytest.mark.parametrize(("damage", "message"), [
    (lambda p: p.write_bytes(p.read_bytes()[:100]), r"truncated \(100 bytes, 2048 written\)"),
    (lambda p: p.write_bytes(p.read_bytes() + b"x"), r"longer than written \(2049 bytes"),
    (lambda p: p.write_bytes(bytes(b ^ (i == 1000) for i, b in enumerate(p.read_bytes()))), "checksum mismatch"),
    (lambda p: p.unlink(), "missing"),
    (lambda p: (p.unlink(), p.mkdir()), "missing .or not a file."),
])
def test_each_damage_names_the_file(folder, damage, message):
    records = manifest(folder, ["a.bin"])
    damage(folder / "a.bin")
    with pytest.raises(IntegrityError, match=message) as err:
        verify_file(folder / "a.bin", records["a.bin"], hint="rebuild with X")
    assert str(folder / "a.bin") in str(err.value) and str(err.value).endswith("(rebuild with X)")
    assert isinstance(err.value, UserError)


def test_sha256_matches_hashlib(folder):
    import hashlib

    assert sha256_file(folder / "a.bin") == hashlib.sha256((folder / "a.bin").read_bytes()).hexdigest()


def _old_and_new(tmp_path):
    final = tmp_path / "store"
    final.mkdir()
    (final / "old.txt").write_text("old")
    tmp = temp_path(final)
    tmp.mkdir()
    (tmp / "new.txt").write_text("new")
    return tmp, final


def test_publish_dir_replace_swaps_whole_folder(tmp_path):
    tmp, final = _old_and_new(tmp_path)
    assert publish_dir(tmp, final, if_exists="replace") == final
    assert [p.name for p in final.iterdir()] == ["new.txt"] and not tmp.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["store"]  # the ".old-" folder is gone too


def test_publish_dir_keep_lets_the_first_writer_win(tmp_path):
    tmp, final = _old_and_new(tmp_path)
    assert publish_dir(tmp, final, if_exists="keep") == final
    assert [p.name for p in final.iterdir()] == ["old.txt"] and not tmp.exists()
    fresh, target = temp_path(tmp_path / "new"), tmp_path / "new"
    fresh.mkdir()
    (fresh / "a.txt").write_text("a")
    assert publish_dir(fresh, target, if_exists="keep") == target and (target / "a.txt").is_file()


def test_publish_dir_needs_an_explicit_choice(tmp_path):
    tmp, final = _old_and_new(tmp_path)
    with pytest.raises(TypeError):
        publish_dir(tmp, final)
    with pytest.raises(ValueError, match="if_exists"):
        publish_dir(tmp, final, if_exists="merge")


def test_write_text_atomic_replaces_the_file_and_leaves_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    path.write_text("old", encoding="utf-8")
    assert write_text_atomic(path, "new ü\n") == path
    assert path.read_text(encoding="utf-8") == "new ü\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]
    # a write that fails midway leaves the old file whole (and its temp file, which the stale sweep removes)
    def fail(self, *a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(type(path), "write_text", fail)
    with pytest.raises(OSError, match="disk full"):
        write_text_atomic(path, "newer")
    monkeypatch.undo()
    assert path.read_text(encoding="utf-8") == "new ü\n"


def test_stale_temp_by_dead_pid_or_age(tmp_path):
    dead = tmp_path / ".x.tmp-999999999"
    dead.mkdir()
    mine_old = tmp_path / f".y.tmp-{os.getpid()}"
    mine_old.mkdir()
    mine_new = tmp_path / f".z.old-{os.getpid()}"
    mine_new.mkdir()
    unrelated = tmp_path / ".hidden"
    unrelated.mkdir()
    past = time.time() - 3 * 24 * 3600
    os.utime(mine_old, (past, past))
    assert stale_temp(tmp_path) == sorted([dead, mine_old])
    assert remove_stale_temp(tmp_path) == sorted([dead, mine_old])
    assert sorted(p.name for p in tmp_path.iterdir()) == [".hidden", f".z.old-{os.getpid()}"]
    assert stale_temp(tmp_path / "missing") == []


def test_seal_and_verify_sealed(tmp_path):
    from qgmem.integrity import CHECKSUMS, seal, verify_sealed

    (tmp_path / "sub").mkdir()
    (tmp_path / "a.bin").write_bytes(b"abc")
    (tmp_path / "sub" / "b.bin").write_bytes(b"defg")
    seal(tmp_path, ["sub/b.bin", "a.bin"])
    assert set(verify_sealed(tmp_path)) == {"a.bin", "sub/b.bin"}
    (tmp_path / "sub" / "b.bin").write_bytes(b"defh")
    with pytest.raises(IntegrityError, match=r"b\.bin: checksum mismatch .*\(fix\)"):
        verify_sealed(tmp_path, hint="fix")
    (tmp_path / CHECKSUMS).write_text("[1]")
    with pytest.raises(IntegrityError, match="not a checksum listing"):
        verify_sealed(tmp_path)
    (tmp_path / CHECKSUMS).unlink()
    with pytest.raises(IntegrityError, match="checksums.json: is missing"):
        verify_sealed(tmp_path)


def _killed_between_renames(tmp_path, pid=999999999):
    """What a replace killed after its first rename leaves: no final folder, the old one renamed aside."""
    aside = tmp_path / f".store.old-{pid}"
    aside.mkdir()
    (aside / "old.txt").write_text("old")
    return tmp_path / "store", aside


def test_restore_replaced_puts_back_the_old_folder(tmp_path, caplog):
    from qgmem.integrity import restore_replaced

    final, aside = _killed_between_renames(tmp_path)
    with caplog.at_level("WARNING", logger="qgmem.integrity"):
        assert restore_replaced(final) == final
    assert (final / "old.txt").read_text() == "old" and not aside.exists()
    assert "restored" in caplog.text and aside.name in caplog.text
    assert restore_replaced(final) is None  # nothing missing: nothing to do


def test_restore_replaced_leaves_a_live_writer_and_an_existing_final_alone(tmp_path):
    from qgmem.integrity import restore_replaced

    final, live = _killed_between_renames(tmp_path, pid=os.getpid())  # the swap is still under way
    assert restore_replaced(final) is None and live.is_dir() and not final.exists()
    final.mkdir()
    (final / "new.txt").write_text("new")
    dead = tmp_path / ".store.old-999999999"
    dead.mkdir()
    assert restore_replaced(final) is None and (final / "new.txt").is_file() and dead.is_dir()
    other = tmp_path / ".storex.old-999999999"  # another folder's leftover is not this one's
    other.mkdir()
    assert restore_replaced(tmp_path / "storex2") is None and other.is_dir()


def test_remove_stale_temp_restores_instead_of_deleting_the_only_copy(tmp_path):
    final, aside = _killed_between_renames(tmp_path)
    older = tmp_path / ".store.old-999999998"
    older.mkdir()
    (older / "older.txt").write_text("older")
    past = time.time() - 3600
    os.utime(older, (past, past))
    removed = remove_stale_temp(tmp_path)
    assert (final / "old.txt").is_file()  # the newest aside folder is back
    assert removed == [older] and sorted(p.name for p in tmp_path.iterdir()) == ["store"]
