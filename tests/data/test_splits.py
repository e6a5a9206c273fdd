"""Deterministic sampling and grouped train/val/test splits."""

from __future__ import annotations

import pytest

from qgmem.data.records import QA, Case, Dialogue
from qgmem.data.splits import run_splits, sample_cases, split_cases


def make_cases(n_persons: int, per_person: int) -> list[Case]:
    return [
        Case(id=f"p{p}-c{c}", dialogue=Dialogue(id=f"d-p{p}-c{c}"),
             qas=[QA(id=f"p{p}-c{c}#q0", question="q", answer="a", category="x")],
             source={"person_id": f"p{p}"})
        for p in range(n_persons) for c in range(per_person)
    ]


@pytest.mark.parametrize(("n", "expected"), [(None, 12), (0, 0), (5, 5), (12, 12), (50, 12)])
def test_sample_cases_sizes(n, expected):
    assert len(sample_cases(make_cases(4, 3), n)) == expected


def test_sample_cases_deterministic_and_in_input_order():
    cases = make_cases(10, 5)
    a, b, c = sample_cases(cases, 20, seed=1), sample_cases(cases, 20, seed=1), sample_cases(cases, 20, seed=2)
    assert [x.id for x in a] == [x.id for x in b] != [x.id for x in c]
    positions = [cases.index(x) for x in a]
    assert positions == sorted(positions) and len(set(positions)) == 20


@pytest.mark.parametrize("ratios", [(0.7, 0.15, 0.15), (0.8, 0.1, 0.1), (0.5, 0.5, 0.0), (2, 1, 1)])
@pytest.mark.parametrize("seed", [0, 3])
def test_split_by_person_has_no_shared_person(ratios, seed):
    cases = make_cases(20, 4)
    splits = split_cases(cases, ratios, seed=seed)
    assert set(splits) == {"train", "val", "test"}
    persons = {k: {c.source["person_id"] for c in v} for k, v in splits.items()}
    assert not (persons["train"] & persons["val"] or persons["train"] & persons["test"]
                or persons["val"] & persons["test"])
    assert sorted(c.id for v in splits.values() for c in v) == sorted(c.id for c in cases)
    total = sum(ratios)
    for name, ratio in zip(("train", "val", "test"), ratios):
        assert abs(len(splits[name]) - ratio / total * len(cases)) <= 4  # within one group of 4 cases
        assert (len(splits[name]) > 0) == (ratio > 0)


def test_split_is_deterministic_and_seeded():
    cases = make_cases(20, 2)
    ids = lambda s: {k: [c.id for c in v] for k, v in s.items()}  # noqa: E731
    assert ids(split_cases(cases, seed=5)) == ids(split_cases(cases, seed=5))
    assert ids(split_cases(cases, seed=5)) != ids(split_cases(cases, seed=6))


def test_split_keeps_input_order():
    cases = make_cases(10, 3)
    for part in split_cases(cases).values():
        positions = [cases.index(c) for c in part]
        assert positions == sorted(positions)


@pytest.mark.parametrize("n_persons", [1, 2])
def test_too_few_persons_falls_back_to_dialogue_with_a_warning(n_persons, caplog):
    cases = make_cases(n_persons, 10)
    with pytest.warns(UserWarning, match="splitting by 'dialogue'"):
        splits = split_cases(cases)
    assert "splitting by 'dialogue'" in caplog.text
    assert all(len(v) > 0 for v in splits.values())
    assert sum(len(v) for v in splits.values()) == len(cases)


def test_missing_person_falls_back_to_dialogue():
    cases = make_cases(5, 2)
    cases[3].source.pop("person_id")
    with pytest.warns(UserWarning, match="some cases have none"):
        splits = split_cases(cases)
    dialogues = [c.dialogue.id for v in splits.values() for c in v]
    assert len(dialogues) == len(set(dialogues)) == 10


def test_dialogue_key_groups_shared_dialogues():
    shared = Dialogue(id="shared")
    cases = make_cases(6, 1) + [Case(id=f"s{i}", dialogue=shared, source={"person_id": f"q{i}"}) for i in range(3)]
    splits = split_cases(cases, group_key="dialogue")
    holding = [k for k, v in splits.items() if any(c.dialogue.id == "shared" for c in v)]
    assert len(holding) == 1


@pytest.mark.parametrize(("kwargs", "message"), [({"ratios": (0.5, 0.5)}, "ratios"),
                                                  ({"ratios": (1, -1, 1)}, "ratios"),
                                                  ({"ratios": (0, 0, 0)}, "ratios"),
                                                  ({"group_key": "city"}, "group_key")])
def test_bad_split_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        split_cases(make_cases(3, 1), **kwargs)


def test_run_splits_samples_then_splits_with_one_seed():
    cases = make_cases(10, 5)
    parts = run_splits(cases, 20, seed=1, ratios=(0.5, 0.25, 0.25), group_key="person")
    ids = [c.id for name in ("train", "val", "test") for c in parts[name]]
    assert sorted(ids) == sorted(c.id for c in sample_cases(cases, 20, seed=1))  # a partition of the sample
    assert run_splits(cases, 20, seed=1, ratios=(0.5, 0.25, 0.25), group_key="person") == parts
    # the seed reaches the sample as well as the split
    assert run_splits(cases, 20, seed=2, ratios=(0.5, 0.25, 0.25), group_key="person") != parts
    assert sum(len(v) for v in run_splits(cases, None, 0, (0.7, 0.15, 0.15), "person").values()) == len(cases)
