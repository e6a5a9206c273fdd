"""Construction windows: session boundaries first, then sliding windows with context-only overlap."""

from __future__ import annotations

from dataclasses import dataclass, field

from qgmem.data.records import Dialogue, Turn


@dataclass
class Window:
    """``turns`` in order; the first ``overlap`` of them repeat the previous window (context only).

    ``new_turn_ids`` are the turns this window is responsible for: every unit extracted from it must
    include at least one of them, so each turn is grounded by exactly one window.
    """

    id: str
    session_id: str
    turns: list[Turn]
    overlap: int = 0
    new_turn_ids: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.new_turn_ids = [t.id for t in self.turns[self.overlap:]]

    @property
    def context_turns(self) -> list[Turn]:
        return self.turns[:self.overlap]

    @property
    def new_turns(self) -> list[Turn]:
        return self.turns[self.overlap:]


def make_windows(dialogue: Dialogue, size: int = 6, overlap: int = 2) -> list[Window]:
    """Windows of ``size`` turns, step ``size - overlap``, never crossing a session boundary.

    A session of ``n`` turns gives ``1 + ceil(max(0, n - size) / step)`` windows; the last one may be
    shorter. Window ids ``w0000``… count across the whole dialogue, so they are unique within it.
    """
    if not 0 <= overlap < size:
        raise ValueError(f"need 0 <= overlap < size, got overlap={overlap}, size={size}")
    step = size - overlap
    windows: list[Window] = []
    for session in dialogue.sessions:
        turns = session.turns
        start = 0
        while start < len(turns):
            chunk = turns[start:start + size]
            windows.append(Window(id=f"w{len(windows):04d}", session_id=session.id, turns=chunk,
                                  overlap=overlap if start > 0 else 0))
            if start + size >= len(turns):
                break
            start += step
    return windows
