"""What agents ask of a user's memory on disk, through the Python API (``UserMemories``): forgetting one
unit, batch appends, export and import; each journaled, and killed at every durable step (SIGKILL in a
forked child just before each fsync or rename) without losing or doubling anything."""

from __future__ import annotations

import json
import logging
import shutil

import pytest

from qgmem.errors import IntegrityError, UserError
from qgmem.serving.users import (JOURNAL, IdempotencyConflict, UnknownUnit, UserExists, UserMemories, line_digest,
                                 read_journal)

from .server_helpers import KillRig
from .test_users import TURNS, _Models

COLOURS = [[{"speaker": "User", "text": f"My favourite colour is {c}."}] for c in ("teal", "red")]


def _state(root, user_id: str) -> tuple | None:
    """The user's memory as a fresh process loads it: (unit id, fact, trace id) per unit and the traces."""
    users = UserMemories(root, _Models())
    if not users.exists(user_id):
        return None
    store = users.get(user_id).store
    return ([(u.id, u.fact, u.trace_id) for u in store.units],
            [(t.unit_ids, t.transitions, t.latest_unit_id) for t in store.traces])


@pytest.fixture(scope="module")
def rig():
    rig = KillRig("from serving.test_users import _Models\nfrom qgmem.serving.users import UserMemories")
    yield rig
    rig.close()


def _users(root) -> str:
    """Python source that opens ``root``'s memories as ``users`` (run before the kill points count)."""
    return f"users = UserMemories({str(root)!r}, _Models())"


def _ana(root) -> UserMemories:
    users = UserMemories(root, _Models())
    for turns in (*COLOURS, TURNS[0]):
        users.append("ana", turns)
    return users


# ------------------------------------------------------------------------------------------ forget
def test_a_forgotten_unit_leaves_the_store_and_its_trace_and_stays_gone_after_a_restart(tmp_path):
    users = _ana(tmp_path)
    store = users.get("ana").store
    red = next(u for u in store.units if "red" in u.fact)
    assert store.trace_of(red) is not None and len(store.traces) == 1  # control: red updates teal
    reply = users.forget("ana", red.id)
    assert reply == {"user": "ana", "unit_id": red.id, "forgotten": True, "units": 2, "traces": 0}
    after = users.get("ana").store
    assert red.id not in {u.id for u in after.units} and all(red.id not in t.unit_ids for t in after.traces)
    with pytest.raises(UnknownUnit, match="forgotten already"):  # a second forget is a 404, not a no-op
        users.forget("ana", red.id)
    with pytest.raises(UnknownUnit):
        users.forget("ana", "w9999.u0")
    assert users.append("ana", TURNS[1])["session"] == 3  # sessions go on numbering: forgets are not sessions
    lines = read_journal(tmp_path / "users" / "ana" / JOURNAL)
    assert [("forget" in e, e["seq"]) for e in lines] == [(False, 0), (False, 1), (False, 2), (True, 3), (False, 4)]
    live = users.get("ana").store
    assert _state(tmp_path, "ana") == ([(u.id, u.fact, u.trace_id) for u in live.units], [])
    shutil.rmtree(next((tmp_path / "users" / "ana").glob("snapshot-*")))  # replayed from the journal alone
    assert _state(tmp_path, "ana")[0] == [(u.id, u.fact, u.trace_id) for u in live.units]


def test_a_forget_killed_at_any_point_leaves_the_unit_either_there_or_gone(tmp_path, rig):
    base = tmp_path / "base"
    users = _ana(base)
    red = next(u.id for u in users.get("ana").store.units if "red" in u.fact)
    before = _state(base, "ana")
    step, outcomes = 0, []
    while True:
        step += 1
        root = tmp_path / f"kill{step}"
        shutil.copytree(base, root)
        finished = rig.run(step, _users(root), f"users.forget('ana', {red!r})")
        state = _state(root, "ana")
        gone = red not in [uid for uid, _, _ in state[0]]
        assert state == before or gone, step
        outcomes.append(gone)
        if gone:  # durable: a retry is a 404 and the memory is the finished one's
            with pytest.raises(UnknownUnit):
                UserMemories(root, _Models()).forget("ana", red)
        else:
            UserMemories(root, _Models()).forget("ana", red)
        if finished:
            break
    assert step >= 3 and outcomes[0] is False and outcomes[-1] is True
    assert len({str(_state(tmp_path / f"kill{s}", "ana")) for s in range(1, step + 1)}) == 1


# ------------------------------------------------------------------------------------------- batch
def test_a_batch_is_one_line_per_session_idempotent_as_a_whole_and_equal_to_single_appends(tmp_path):
    users = UserMemories(tmp_path, _Models())
    users.append("ana", TURNS[0])
    batch = [(TURNS[1], "2024-05-01"), (COLOURS[0], None), (COLOURS[1], "2024-06-01T10:00:00")]
    first = users.append_batch("ana", batch, key="b-1")
    assert [s["session"] for s in first["sessions"]] == [1, 2, 3] and first["units"] == 4
    again = users.append_batch("ana", batch, key="b-1")
    assert again["replayed"] and {k: v for k, v in again.items() if k != "replayed"} == first
    with pytest.raises(IdempotencyConflict):
        users.append_batch("ana", batch[:2], key="b-1")
    with pytest.raises(IdempotencyConflict):  # one key space for single and batch appends
        users.append("ana", *batch[0], key="b-1")
    lines = read_journal(tmp_path / "users" / "ana" / JOURNAL)
    assert [e.get("batch") for e in lines] == [None, [0, 3], [1, 3], [2, 3]] and lines[-1]["key"] == "b-1"
    single = UserMemories(tmp_path / "single", _Models())
    single.append("ana", TURNS[0])
    for turns, when in batch:
        single.append("ana", turns, when)
    assert _state(tmp_path, "ana") == _state(tmp_path / "single", "ana")
    restarted = UserMemories(tmp_path, _Models())  # the key is in the journal
    assert restarted.append_batch("ana", batch, key="b-1")["replayed"]


def test_a_journal_ending_inside_a_batch_drops_the_unacknowledged_lines(tmp_path, caplog):
    """A batch is written with one write; a journal holding only its first lines (a cut write, never
    acknowledged) loses them at load, like a torn line. Inside the journal that is damage, refused."""
    users = UserMemories(tmp_path, _Models())
    users.append("ana", TURNS[0])
    users.append_batch("ana", [(TURNS[1], None), (TURNS[2], None)])
    path = tmp_path / "users" / "ana" / JOURNAL
    whole = path.read_bytes()
    cut = whole[: whole.rindex(b"\n", 0, len(whole) - 1) + 1]  # the batch's last line gone
    for snapshot in (tmp_path / "users" / "ana").glob("snapshot-*"):
        shutil.rmtree(snapshot)
    path.write_bytes(cut)
    with caplog.at_level(logging.WARNING, logger="qgmem.serve"):
        reloaded = UserMemories(tmp_path, _Models())
        assert len(reloaded.get("ana").store) == 1
    assert "batch append cut by a kill" in caplog.text and len(read_journal(path)) == 1
    assert reloaded.append("ana", TURNS[3])["session"] == 1
    other = {"seq": 2, "turns": TURNS[3], "time": None}  # a whole, checksummed line after the batch's first
    other_line = json.dumps({**other, "sha256": line_digest(other)}).encode()
    path.write_bytes(b"\n".join(whole.split(b"\n")[:2] + [other_line, b""]))
    with pytest.raises(IntegrityError, match="line 3: batch position"):
        UserMemories(tmp_path, _Models()).get("ana")


def test_a_batch_killed_at_any_point_is_stored_whole_or_not_at_all_and_its_retry_stores_it_once(tmp_path, rig):
    base = tmp_path / "base"
    UserMemories(base, _Models()).append("ana", TURNS[0])
    batch = [(TURNS[1], None), (TURNS[2], None), (TURNS[3], None)]
    step, seen = 0, set()
    while True:
        step += 1
        root = tmp_path / f"kill{step}"
        shutil.copytree(base, root)
        finished = rig.run(step, _users(root), f"users.append_batch('ana', {batch!r}, key='k')")
        units = len(_state(root, "ana")[0])
        assert units in (1, 4), (step, units)  # all of the batch or none of it
        seen.add(units)
        retry = UserMemories(root, _Models()).append_batch("ana", batch, key="k")
        assert retry.get("replayed", False) == (units == 4)
        assert len(_state(root, "ana")[0]) == 4 and len(read_journal(root / "users" / "ana" / JOURNAL)) == 4
        if finished:
            break
    assert seen == {1, 4} and step >= 3


# ------------------------------------------------------------------------------------ export, import
def test_an_export_imported_as_a_new_user_gives_the_same_memory(tmp_path):
    users = _ana(tmp_path)
    users.forget("ana", next(u.id for u in users.get("ana").store.units if "teal" in u.fact))
    users.append_batch("ana", [(TURNS[1], "2024-05-01"), (TURNS[2], None)], key="b")
    entries = list(users.export("ana"))
    assert [list(e) for e in entries] == [["turns", "time"]] * 3 + [["forget"]] + [["turns", "time"]] * 2
    reply = users.import_user("bob", entries)
    assert reply == {"user": "bob", "imported": True, "lines": 6, "units": 4, "traces": 0, "sessions": 5}
    ana, bob = users.get("ana").store, users.get("bob").store
    assert [u.to_dict() | {"dialogue_id": None} for u in ana.units] == [u.to_dict() | {"dialogue_id": None}
                                                                         for u in bob.units]
    assert list(users.export("bob")) == entries
    assert _state(tmp_path, "bob") == _state(tmp_path, "ana")
    with pytest.raises(UserExists):
        users.import_user("ana", entries)
    with pytest.raises(UserError, match=r"entries\[1\]: field 'forget'"):
        users.import_user("carol", [entries[0], {"forget": "w0005.u0"}])
    assert not users.exists("carol") and list((tmp_path / "staging").iterdir()) == []


def test_an_import_killed_at_any_point_leaves_the_whole_user_or_nothing(tmp_path, rig):
    base = tmp_path / "base"
    entries = list(_ana(base).export("ana")) + [{"forget": "w0000.u0"}]
    expected = None
    step = 0
    while True:
        step += 1
        root = tmp_path / f"kill{step}"
        shutil.copytree(base, root)
        finished = rig.run(step, _users(root), f"users.import_user('bob', {entries!r})")
        state = _state(root, "bob")
        if finished:
            expected = state
        UserMemories(root, _Models())  # a start clears what the kill left in staging/
        assert not (root / "staging").exists()
        if state is None:
            UserMemories(root, _Models()).import_user("bob", entries)  # the retry imports it whole
        with pytest.raises(UserExists):
            UserMemories(root, _Models()).import_user("bob", entries)
        if finished:
            break
    assert expected is not None and step >= 3
    for s in range(1, step + 1):  # every kill, then its retry: the same memory as the import that finished
        assert _state(tmp_path / f"kill{s}", "bob") == expected, s
