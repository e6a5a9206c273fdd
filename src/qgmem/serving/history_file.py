"""Dialogue histories for serving: a data set file (ConvoMem, LoCoMo, LongMemEval) or plain JSON sessions.

The plain form is a JSON list of sessions; a session is a list of turns ``{"speaker", "text",
"time"?}`` or an object ``{"time"?, "turns": [...]}``. A turn's role is ``assistant`` when its speaker
is ``assistant`` (or ``ai``/``bot``), else ``user``. A data set file holds cases; one is chosen by id
or index (the first by default), and its questions are available to ``qgmem answer`` and examples.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from qgmem.data.records import Case, Dialogue, Session, Turn
from qgmem.errors import InputPathError, UserError

ASSISTANT_SPEAKERS = frozenset({"assistant", "ai", "bot"})


class HistoryFormatError(UserError, ValueError):
    """A history that is neither a data set file nor a list of sessions; the message names the field."""


def _turn(raw: Any, where: str, session_id: str, index: int, session_time: str | None) -> Turn:
    if not isinstance(raw, dict):
        raise HistoryFormatError(f"{where}: a turn must be an object with 'speaker' and 'text', "
                                 f"got {type(raw).__name__}")
    for key in ("speaker", "text"):
        if not isinstance(raw.get(key), str):
            raise HistoryFormatError(f"{where}: field '{key}' must be a string, got {type(raw.get(key)).__name__}")
    time = raw.get("time", session_time)
    if time is not None and not isinstance(time, str):
        raise HistoryFormatError(f"{where}: field 'time' must be an ISO-8601 string, got {type(time).__name__}")
    role = "assistant" if raw["speaker"].strip().lower() in ASSISTANT_SPEAKERS else "user"
    return Turn(id=f"{session_id}:{index}", session_id=session_id, speaker=raw["speaker"], role=role,
                text=raw["text"], time=time)


def sessions_to_dialogue(sessions: Any, dialogue_id: str = "history", source: str = "history") -> Dialogue:
    """A :class:`Dialogue` from the plain JSON form (see the module docstring); bad entries are named."""
    if not isinstance(sessions, list):
        raise HistoryFormatError(f"{source}: a history is a list of sessions, got {type(sessions).__name__}")
    out = []
    for s, raw in enumerate(sessions):
        where, session_id = f"{source}: session {s}", f"s{s}"
        time = None
        if isinstance(raw, dict):
            time = raw.get("time")
            if time is not None and not isinstance(time, str):
                raise HistoryFormatError(f"{where}: field 'time' must be an ISO-8601 string")
            if not isinstance(raw.get("turns"), list):
                raise HistoryFormatError(f"{where}: field 'turns' must be a list of turns")
            raw = raw["turns"]
        elif not isinstance(raw, list):
            raise HistoryFormatError(f"{where}: a session is a list of turns or an object with 'turns', "
                                     f"got {type(raw).__name__}")
        turns = [_turn(t, f"{where}, turn {i}", session_id, i, time) for i, t in enumerate(raw)]
        out.append(Session(id=session_id, turns=turns, time=time))
    dialogue = Dialogue(id=dialogue_id, sessions=out)
    dialogue.reindex()
    return dialogue


def as_dialogue(history: Any) -> Dialogue:
    """``history`` as a :class:`Dialogue`: a ``Dialogue`` or ``Case``, a plain list of sessions, or a path
    to a history file (the first case of a data set file)."""
    if isinstance(history, (str, Path)):
        history = load_history(history)
    if isinstance(history, Case):
        history = history.dialogue
    return history if isinstance(history, Dialogue) else sessions_to_dialogue(history)


def _is_plain(data: Any) -> bool:
    return isinstance(data, list) and (not data or isinstance(data[0], list) or
                                       (isinstance(data[0], dict) and "turns" in data[0]))


def load_history(path: str | Path, *, case: str | int | None = None, dataset: str | None = None,
                 strict: bool = True) -> Case:
    """The history in ``path`` as a :class:`Case` (plain sessions give a case without questions).

    ``dataset`` names the data set format (default: plain sessions when the JSON looks like them, else
    each data set loader in turn); ``case`` picks a case of a data set file by id or index.
    """
    path = Path(path)
    if not path.exists():
        raise InputPathError(f"history {path} does not exist")
    if dataset in (None, "sessions") and path.is_file():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as exc:
            raise HistoryFormatError(f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                                     f"{exc.start}); save the file as UTF-8") from None
        except json.JSONDecodeError as exc:
            raise HistoryFormatError(f"{path}: malformed JSON ({exc.msg}, line {exc.lineno})") from exc
        except RecursionError:
            raise HistoryFormatError(f"{path}: JSON nested too deep") from None
        if dataset == "sessions" or _is_plain(data):
            return Case(id=path.stem, dialogue=sessions_to_dialogue(data, path.stem, str(path)),
                        source={"dataset": "sessions", "file": str(path)})
    cases = _load_dataset_cases(path, dataset, strict)
    return _pick(cases, case, path)


def _load_dataset_cases(path: Path, dataset: str | None, strict: bool) -> list[Case]:
    from qgmem.data.loaders import DATASETS, load_cases

    names = [dataset] if dataset else list(DATASETS)
    problems = []
    for name in names:
        try:
            loaded = load_cases(name, path, strict=strict, **({"distractor_conversations": 0}
                                                             if name == "convomem" else {}))
        except Exception as exc:  # noqa: BLE001 - try the next format; all failures are reported together
            if dataset:
                raise
            problems.append(f"{name}: {exc}")
            continue
        if loaded.cases:
            return list(loaded.cases)
        problems.append(f"{name}: no cases")
    raise HistoryFormatError(f"{path}: not a list of sessions and not a file of any data set "
                             f"({'; '.join(problems)})")


def _pick(cases: list[Case], case: str | int | None, path: Path) -> Case:
    if case is None:
        return cases[0]
    for i, c in enumerate(cases):
        if c.id == str(case) or str(i) == str(case):
            return c
    raise UserError(f"{path}: no case {case!r} (it holds {len(cases)} cases; pass an id or an index "
                    f"0..{len(cases) - 1})")
