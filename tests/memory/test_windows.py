from __future__ import annotations

import math

import pytest

from qgmem.memory.config import ConstructionConfig
from qgmem.memory.windows import make_windows

from .helpers import make_dialogue, numbered_dialogue


@pytest.mark.parametrize("n_turns,size,overlap", [(1, 6, 2), (6, 6, 2), (7, 6, 2), (10, 6, 2), (23, 6, 2),
                                                  (12, 4, 0), (9, 3, 1), (30, 8, 3)])
def test_windows_cover_each_turn_once_as_new(n_turns, size, overlap):
    dialogue = numbered_dialogue(n_turns)
    windows = make_windows(dialogue, size, overlap)
    step = size - overlap
    assert len(windows) == 1 + math.ceil(max(0, n_turns - size) / step)
    new_ids = [tid for w in windows for tid in w.new_turn_ids]
    assert new_ids == [t.id for t in dialogue.turns()]  # every turn is new in exactly one window
    for prev, cur in zip(windows, windows[1:]):
        assert cur.overlap == overlap
        expected_context = [t.id for t in prev.turns[len(prev.turns) - overlap:]]
        assert [t.id for t in cur.context_turns] == expected_context
        assert len(prev.turns) == size
    assert windows[0].overlap == 0 and all(len(w.turns) <= size for w in windows)


def test_default_windows_are_six_turns_step_four():
    config = ConstructionConfig()
    assert (config.window_size, config.window_overlap, config.window_step) == (6, 2, 4)
    windows = make_windows(numbered_dialogue(14), config.window_size, config.window_overlap)
    assert [[t.text for t in w.turns] for w in windows] == [
        [f"turn {i}" for i in range(0, 6)], [f"turn {i}" for i in range(4, 10)], [f"turn {i}" for i in range(8, 14)]]
    assert windows[1].new_turn_ids == ["s0:6", "s0:7", "s0:8", "s0:9"]


def test_windows_never_cross_sessions():
    dialogue = make_dialogue([[("User", f"a{i}") for i in range(7)], [("User", f"b{i}") for i in range(3)]])
    windows = make_windows(dialogue, 6, 2)
    assert [(w.session_id, len(w.turns), w.overlap) for w in windows] == [("s0", 6, 0), ("s0", 3, 2), ("s1", 3, 0)]
    assert len({w.id for w in windows}) == len(windows)


@pytest.mark.parametrize("size,overlap", [(6, 6), (6, -1), (0, 0)])
def test_bad_window_settings_are_rejected(size, overlap):
    with pytest.raises(ValueError, match="overlap|window_size"):
        ConstructionConfig(window_size=size, window_overlap=overlap)
