"""Small builders shared by the memory tests: a deterministic encoder and hand-made dialogues."""

from __future__ import annotations

import re
import zlib

import numpy as np

from qgmem.data.records import Dialogue, Session, Turn


class BagOfWordsEncoder:
    """Hashed bag of words, L2-normalized: identical texts embed identically, disjoint ones orthogonally."""

    model_id = "test:bag-of-words"

    def __init__(self, dim: int = 512):
        self.dim = dim
        self.calls = 0

    def encode(self, texts: list[str]) -> np.ndarray:
        self.calls += len(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"[a-z0-9']+", text.lower()):
                out[row, zlib.crc32(word.encode()) % self.dim] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms == 0, 1.0, norms)


def make_dialogue(sessions: list[list[tuple[str, str]]], dialogue_id: str = "d1",
                  times: list[str | None] | None = None) -> Dialogue:
    """``sessions`` of ``(speaker, text)``; speaker "User"/"Assistant" sets the role; ids ``s<k>:<i>``."""
    out, index = [], 0
    for k, turns in enumerate(sessions):
        time = times[k] if times else None
        session = Session(id=f"s{k}", time=time)
        for i, (speaker, text) in enumerate(turns):
            session.turns.append(Turn(id=f"s{k}:{i}", session_id=session.id, speaker=speaker,
                                      role=speaker.lower() if speaker in ("User", "Assistant") else "user",
                                      text=text, time=time, index=index))
            index += 1
        out.append(session)
    return Dialogue(id=dialogue_id, sessions=out)


def numbered_dialogue(n_turns: int, sessions: int = 1) -> Dialogue:
    """Alternating User/Assistant turns "turn <i>" split evenly into ``sessions`` sessions."""
    per = n_turns // sessions
    return make_dialogue([[("User" if i % 2 == 0 else "Assistant", f"turn {s * per + i}") for i in range(per)]
                          for s in range(sessions)])
