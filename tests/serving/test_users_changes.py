"""What agents ask of a user's memory, through the Python API (``UserMemories``) on every backend:
forgetting one unit, batch appends, export and import; each killed (SIGKILL in a forked child) after
every SQL statement, so before each commit and after it, without losing, doubling or half-applying
anything."""

from __future__ import annotations

import pytest

from qgmem.errors import UserError
from qgmem.serving.users import IdempotencyConflict, UnknownUnit, UserExists, UserMemories

from .conftest import clone
from .server_helpers import KillRig
from .test_users import TURNS, _Models, _sql, state

COLOURS = [[{"speaker": "User", "text": f"My favourite colour is {c}."}] for c in ("teal", "red")]


@pytest.fixture(scope="module")
def rig():
    rig = KillRig("from serving.test_users import _Models\nfrom qgmem.serving.users import UserMemories")
    yield rig
    rig.close()


def _users(url: str) -> str:
    """Python source that opens the store at ``url`` as ``users`` (run before the kill points count)."""
    return f"users = UserMemories({url!r}, _Models())"


def _ana(url: str) -> UserMemories:
    users = UserMemories(url, _Models())
    for turns in (*COLOURS, TURNS[0]):
        users.append("ana", turns)
    return users


def _closed(users: UserMemories) -> None:
    users.store.close()  # a store copied (a file, or a Postgres database made from it) has no one connected


# ------------------------------------------------------------------------------------------ forget
def test_a_forgotten_unit_leaves_the_store_and_its_trace_and_stays_gone_after_a_restart(store_url):
    users = _ana(store_url)
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
    kinds = [("forget" in e) for e in users.store.changes("ana", 0)]
    assert kinds == [False, False, False, True, False]
    live = users.get("ana").store
    assert state(store_url, "ana")[:2] == ([(u.id, u.fact, u.trace_id) for u in live.units], [])
    _sql(store_url, "DELETE FROM snapshots")  # replayed from the changes alone
    assert state(store_url, "ana")[0] == [(u.id, u.fact, u.trace_id) for u in live.units]


def test_a_forget_killed_at_any_point_leaves_the_unit_either_there_or_gone(store_url, rig, request, tmp_path):
    users = _ana(store_url)
    red = next(u.id for u in users.get("ana").store.units if "red" in u.fact)
    _closed(users)
    before = state(store_url, "ana")
    step, outcomes, states = 0, [], set()
    while True:
        step += 1
        url = clone(store_url, request, tmp_path, f"kill{step}")
        finished = rig.run(step, _users(url), f"users.forget('ana', {red!r})")
        after = state(url, "ana")
        gone = red not in [uid for uid, _, _ in after[0]]
        assert after == before or gone, step
        outcomes.append(gone)
        retry = UserMemories(url, _Models())
        if gone:  # committed: a retry is a 404
            with pytest.raises(UnknownUnit):
                retry.forget("ana", red)
        else:
            retry.forget("ana", red)
        _closed(retry)
        states.add(str(state(url, "ana")))
        if finished:
            break
    assert step >= 3 and outcomes[0] is False and outcomes[-1] is True
    assert len(states) == 1  # every kill, then its retry: the same memory


# ------------------------------------------------------------------------------------------- batch
def test_a_batch_is_one_change_per_session_idempotent_as_a_whole_and_equal_to_single_appends(store_url, tmp_path):
    users = UserMemories(store_url, _Models())
    users.append("ana", TURNS[0])
    batch = [(TURNS[1], "2024-05-01"), (COLOURS[0], None), (COLOURS[1], "2024-06-01T10:00:00")]
    first = users.append_batch("ana", batch, key="b-1")
    assert [s["session"] for s in first["sessions"]] == [1, 2, 3] and first["units"] == 4
    again = users.append_batch("ana", batch, key="b-1")
    assert again["replayed"] and {k: v for k, v in again.items() if k != "replayed"} == \
        {k: v for k, v in first.items() if k != "seconds"}  # the first result, without the first request's times
    with pytest.raises(IdempotencyConflict):
        users.append_batch("ana", batch[:2], key="b-1")
    with pytest.raises(IdempotencyConflict):  # one key space for single and batch appends
        users.append("ana", *batch[0], key="b-1")
    assert len(users.store.changes("ana", 0)) == 4
    single_url = f"sqlite:///{tmp_path / 'single.db'}"
    single = UserMemories(single_url, _Models())
    single.append("ana", TURNS[0])
    for turns, when in batch:
        single.append("ana", turns, when)
    assert state(store_url, "ana") == state(single_url, "ana")
    restarted = UserMemories(store_url, _Models())  # the key is in the database
    assert restarted.append_batch("ana", batch, key="b-1")["replayed"]


def test_a_batch_killed_at_any_point_is_stored_whole_or_not_at_all_and_its_retry_stores_it_once(
        store_url, rig, request, tmp_path):
    users = UserMemories(store_url, _Models())
    users.append("ana", TURNS[0])
    _closed(users)
    batch = [(TURNS[1], None), (TURNS[2], None), (TURNS[3], None)]
    step, seen = 0, set()
    while True:
        step += 1
        url = clone(store_url, request, tmp_path, f"kill{step}")
        finished = rig.run(step, _users(url), f"users.append_batch('ana', {batch!r}, key='k')")
        units = len(state(url, "ana")[0])
        assert units in (1, 4), (step, units)  # all of the batch or none of it
        seen.add(units)
        again = UserMemories(url, _Models())
        assert again.append_batch("ana", batch, key="k").get("replayed", False) == (units == 4)
        assert len(again.store.changes("ana", 0)) == 4
        _closed(again)
        assert len(state(url, "ana")[0]) == 4
        if finished:
            break
    assert seen == {1, 4} and step >= 3


def test_an_append_killed_at_any_point_is_stored_or_not_and_its_retry_stores_it_once(store_url, rig, request, tmp_path):
    users = UserMemories(store_url, _Models())
    users.append("ana", TURNS[0])
    _closed(users)
    step, seen = 0, set()
    while True:
        step += 1
        url = clone(store_url, request, tmp_path, f"kill{step}")
        finished = rig.run(step, _users(url), f"users.append('ana', {TURNS[1]!r}, None, 'k')")
        units = len(state(url, "ana")[0])
        assert units in (1, 2), (step, units)
        seen.add(units)
        again = UserMemories(url, _Models())
        assert again.append("ana", TURNS[1], None, "k").get("replayed", False) == (units == 2)
        assert len(again.store.changes("ana", 0)) == 2 and again.store.load("ana")[1] == 2  # the snapshot with it
        _closed(again)
        if finished:
            break
    assert seen == {1, 2} and step >= 3


# ------------------------------------------------------------------------------------ export, import
def test_an_export_imported_as_a_new_user_gives_the_same_memory(store_url):
    users = _ana(store_url)
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
    assert state(store_url, "bob") == state(store_url, "ana")
    with pytest.raises(UserExists):
        users.import_user("ana", entries)
    with pytest.raises(UserError, match=r"entries\[1\]: field 'forget'"):
        users.import_user("carol", [entries[0], {"forget": "w0005.u0"}])
    assert not users.exists("carol")


def test_an_import_killed_at_any_point_leaves_the_whole_user_or_nothing(store_url, rig, request, tmp_path):
    users = _ana(store_url)
    entries = list(users.export("ana")) + [{"forget": "w0000.u0"}]
    _closed(users)
    expected, step, urls = None, 0, []
    while True:
        step += 1
        url = clone(store_url, request, tmp_path, f"kill{step}")
        urls.append(url)
        finished = rig.run(step, _users(url), f"users.import_user('bob', {entries!r})")
        after = state(url, "bob")
        if finished:
            expected = after
        again = UserMemories(url, _Models())
        if after is None:
            again.import_user("bob", entries)  # the retry imports it whole
        with pytest.raises(UserExists):
            again.import_user("bob", entries)
        _closed(again)
        if finished:
            break
    assert expected is not None and step >= 3
    for s, url in enumerate(urls, start=1):  # every kill, then its retry: the same memory as the import that finished
        assert state(url, "bob") == expected, s
