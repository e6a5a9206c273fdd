"""Per-user memories on disk: journal, snapshots, recovery from a torn line or a damaged snapshot."""

from __future__ import annotations

import pytest

from qgmem.activation.memory import Memory
from qgmem.errors import IntegrityError
from qgmem.memory.builder import MemoryBuilder
from qgmem.memory.config import ConstructionConfig
from qgmem.serving.users import JOURNAL, BadUserId, UnknownUser, UserMemories, check_user_id, read_journal

from .helpers import HashEncoder


class _Models:
    """What UserMemories needs of a pipeline: a builder, and memories built or opened with it."""

    def __init__(self):
        self._builder = MemoryBuilder(ConstructionConfig(extractor="heuristic"), HashEncoder(8))

    def builder(self):
        return self._builder

    def build_memory(self, dialogue):
        return Memory.build(self._builder, dialogue)

    def open_memory(self, store):
        return Memory(store, self._builder.encoder)


TURNS = [[{"speaker": "User", "text": f"I planted {n} tulips and {n + 1} roses in the garden."}] for n in range(4)]


def _facts(users: UserMemories, user_id: str) -> list[str]:
    return [u.fact for u in users.get(user_id).store.units]


def test_appends_persist_and_reload_to_the_same_store(tmp_path):
    users = UserMemories(tmp_path, _Models())
    for turns in TURNS:
        users.append("ana", turns)
    reloaded = UserMemories(tmp_path, _Models())
    assert reloaded.user_ids() == ["ana"] and reloaded.replayed_sessions == 0
    assert _facts(reloaded, "ana") == _facts(users, "ana") and len(_facts(users, "ana")) == 4
    assert sorted(p.name for p in (tmp_path / "users" / "ana").iterdir()) == [JOURNAL, "snapshot-00000004"]  # no lock files left
    with pytest.raises(UnknownUser):
        reloaded.get("bob")


def test_torn_last_line_is_dropped_and_a_damaged_snapshot_is_rebuilt_from_the_journal(tmp_path):
    users = UserMemories(tmp_path, _Models(), snapshot_every=2)
    for turns in TURNS[:3]:
        users.append("ana", turns)  # snapshot after session 2; session 3 only in the journal
    folder = tmp_path / "users" / "ana"
    with open(folder / JOURNAL, "a", encoding="utf-8") as f:
        f.write('{"seq": 3, "turns": [{"speaker": "User", "te')  # a kill mid-write: never acknowledged
    assert read_journal(folder / JOURNAL)[-1] is None
    (folder / "snapshot-00000002" / "units.jsonl").write_text("garbage\n")  # fails its checksum
    reloaded = UserMemories(tmp_path, _Models())
    assert _facts(reloaded, "ana") == _facts(users, "ana")
    assert reloaded.replayed_sessions == 3 and reloaded.dropped_torn_lines == 1
    assert len(read_journal(folder / JOURNAL)) == 3  # the torn line is gone; the next append follows


def test_a_complete_last_line_with_a_bad_checksum_is_refused_not_dropped(tmp_path):
    """One flipped byte in the last, newline-terminated (so acknowledged) line: a kill cannot leave that,
    so the user is refused naming the line, like a bad earlier line; nothing is cut and no snapshot
    (it holds the session) is touched. Was: the line cut, the session lost, the snapshot overwritten."""
    users = UserMemories(tmp_path, _Models())
    for turns in TURNS[:3]:
        users.append("ana", turns)
    folder = tmp_path / "users" / "ana"
    path = folder / JOURNAL
    raw = path.read_bytes()
    flipped = raw[:-10] + raw[-10:].replace(b"0", b"1", 1) if b"0" in raw[-10:] else raw[:-3] + b"x" + raw[-2:]
    assert flipped != raw and flipped.endswith(b"\n") and len(flipped) == len(raw)
    path.write_bytes(flipped)
    with pytest.raises(IntegrityError, match="line 3"):
        read_journal(path)
    reloaded = UserMemories(tmp_path, _Models())
    with pytest.raises(IntegrityError, match="line 3"):
        reloaded.get("ana")
    with pytest.raises(IntegrityError):  # an append is refused too: it would number the next session 2
        reloaded.append("ana", TURNS[3])
    assert path.read_bytes() == flipped and (folder / "snapshot-00000003" / "meta.json").is_file()


def test_a_verified_snapshot_ahead_of_the_journal_is_refused_and_kept(tmp_path):
    """A journal that lost its last acknowledged line (cut by hand, a restore from an older copy) is
    behind snapshot-00000003: the user is refused naming both, and the snapshot is never overwritten."""
    users = UserMemories(tmp_path, _Models())
    for turns in TURNS[:3]:
        users.append("ana", turns)
    folder = tmp_path / "users" / "ana"
    lines = (folder / JOURNAL).read_bytes().split(b"\n")
    (folder / JOURNAL).write_bytes(b"\n".join(lines[:2]) + b"\n")  # two whole lines: no torn tail
    before = (folder / "snapshot-00000003" / "units.jsonl").read_bytes()
    reloaded = UserMemories(tmp_path, _Models())
    with pytest.raises(IntegrityError, match="snapshot-00000003"):
        reloaded.append("ana", TURNS[3])
    assert (folder / "snapshot-00000003" / "units.jsonl").read_bytes() == before
    assert len(read_journal(folder / JOURNAL)) == 2


def test_a_bad_line_before_the_last_is_refused(tmp_path):
    users = UserMemories(tmp_path, _Models())
    for turns in TURNS[:3]:
        users.append("ana", turns)
    path = tmp_path / "users" / "ana" / JOURNAL
    lines = path.read_text().splitlines()
    lines[1] = lines[1].replace("tulips", "lilies")  # edited: its checksum no longer matches
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(IntegrityError, match="line 2"):
        read_journal(path)


@pytest.mark.parametrize("bad", ["", ".", "..", "a/b", "a b", "é", "x" * 129, "../x"])
def test_user_ids_never_become_paths(bad):
    with pytest.raises(BadUserId):
        check_user_id(bad)
    assert check_user_id("user-1_A.b") == "user-1_A.b" and check_user_id("x" * 128)


def test_snapshot_embeddings_are_written_readable_like_their_neighbours(tmp_path):
    """Was 0600 (safetensors' private temp file) beside 0644 units.jsonl."""
    import os

    users = UserMemories(tmp_path, _Models())
    users.append("ana", TURNS[0])
    snapshot = tmp_path / "users" / "ana" / "snapshot-00000001"
    modes = {name: os.stat(snapshot / name).st_mode & 0o777 for name in ("units.jsonl", "embeddings.safetensors")}
    assert modes["embeddings.safetensors"] == modes["units.jsonl"], modes
