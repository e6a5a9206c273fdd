"""History files: plain JSON sessions (both session forms) and data set files; bad input named."""

from __future__ import annotations

import json

import pytest

from qgmem.errors import UserError
from qgmem.serving.history_file import load_history, sessions_to_dialogue


def test_plain_sessions_both_forms():
    dialogue = sessions_to_dialogue([
        [{"speaker": "User", "text": "Hi"}, {"speaker": "assistant", "text": "Hello"}],
        {"time": "2024-01-02T09:00:00", "turns": [{"speaker": "User", "text": "Later", "time": "2024-01-02T09:05:00"},
                                                  {"speaker": "Bot", "text": "Yes"}]},
    ])
    turns = dialogue.turns()
    assert [t.role for t in turns] == ["user", "assistant", "user", "assistant"]
    assert [t.index for t in turns] == [0, 1, 2, 3] and turns[0].id == "s0:0"
    assert dialogue.sessions[1].time == "2024-01-02T09:00:00"
    assert turns[2].time == "2024-01-02T09:05:00" and turns[3].time == "2024-01-02T09:00:00"


@pytest.mark.parametrize("bad,message", [
    ({"turns": []}, "a history is a list of sessions"),
    ([[{"speaker": "User"}]], r"session 0, turn 0: field 'text' must be a string"),
    ([{"turns": "x"}], r"session 0: field 'turns' must be a list"),
    ([[{"speaker": "User", "text": "hi", "time": 5}]], r"turn 0: field 'time' must be an ISO-8601 string"),
    (["oops"], r"session 0: a session is a list of turns"),
])
def test_bad_sessions_are_named(bad, message):
    with pytest.raises(UserError, match=message):
        sessions_to_dialogue(bad)


def test_files(tmp_path, convomem_path):
    plain = tmp_path / "history.json"
    plain.write_text(json.dumps([[{"speaker": "User", "text": "I keep bees."}]]))
    assert load_history(plain).dialogue.turns()[0].text == "I keep bees."
    convomem_file = next((convomem_path / "core_benchmark").rglob("*.json"))
    case = load_history(convomem_file)
    assert case.qas and case.dialogue.num_turns() > 0 and case.source.get("dataset") == "convomem"
    assert load_history(convomem_file, case=0).id == case.id
    with pytest.raises(UserError, match="no case 'nope'"):
        load_history(convomem_file, case="nope")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_history(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(UserError, match="malformed JSON"):
        load_history(tmp_path / "bad.json")


def test_a_history_that_is_not_utf8_is_a_user_error_naming_the_file(tmp_path, capsys):
    """Was: a UnicodeDecodeError traceback (exit 1). Through the command: exit 2, one line naming the file;
    the history is read before any model is loaded, so no export is needed to see it."""
    from qgmem.cli import main

    latin1 = tmp_path / "latin1.json"
    latin1.write_bytes(json.dumps([[{"speaker": "User", "text": "Je suis allé à Liège"}]],
                                  ensure_ascii=False).encode("latin-1"))
    with pytest.raises(UserError, match="latin1.json: not UTF-8 text"):
        load_history(latin1)
    rc = main(["answer", "--export", str(tmp_path / "no-export"), "--history", str(latin1), "--question", "Where?"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and str(latin1) in err[0] and "UTF-8" in err[0] and "Traceback" not in "\n".join(err)
    good = tmp_path / "good.json"  # control: the same history in UTF-8 loads
    good.write_text(latin1.read_bytes().decode("latin-1"), encoding="utf-8")
    assert load_history(good).dialogue.turns()[0].text == "Je suis allé à Liège"
