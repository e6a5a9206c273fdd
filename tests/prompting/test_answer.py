"""The answer cut on the reply shapes graph tokens produced (issue 63 §0), and the shape classifier."""

from __future__ import annotations

import pytest

from qgmem.activation.serialize import serialize_unit
from qgmem.memory.records import MemoryUnit
from qgmem.prompting import final_answer, reply_shape
from qgmem.prompting.answer import answer_line, holds_answer_line, is_lead_in
from qgmem.prompting.entries import is_entry_echo, strip_entry

#: the echoed entry quoted in the issue, cut short by the answer length as it was
ECHO = "[M5] Books have such an awesome power. (Caroline; turn 98; said 20"


@pytest.mark.parametrize("text,expected", [
    ("The answer is:\nBecoming by Michelle Obama.", "Becoming by Michelle Obama."),
    ("The answer is:", ""),
    ("Answer:\n\nNo.", "No."),
    ("**Answer:**\nPottery", "Pottery"),
    ("The answer is: pottery.", "pottery."),
    ("The answer is pottery.", "pottery."),
    ("Answer - pottery", "pottery"),
    (ECHO, "Books have such an awesome power."),
    ("[M5] Books have such an awesome power. (Caroline; turn 98; said 2023-05-08) Trajectory: origin: x.",
     "Books have such an awesome power."),
    ("[M2] She moved to Lisbon (Mel; turns 4-5; happened 2022; said 2023-01-02)", "She moved to Lisbon"),
    ("[M3] She paints (Mel", "She paints"),
    ("The answer is:\n[M5] Books have such an awesome power. (Caroline; turn 98)", "Books have such an awesome power."),
    ('User, asked "Which call is that?": It\'s the one with the StapleSource referral. (User;',
     'User, asked "Which call is that?": It\'s the one with the StapleSource referral.'),
    ("User; turn 97", "User; turn 97"),  # a provenance alone: nothing to keep but what was said
    ("She moved in May (after the wedding).", "She moved in May (after the wedding)."),
    ("She moved in May (after the wedding", "She moved in May (after the wedding"),
    ("She likes [M3] a lot.", "She likes [M3] a lot."),
    ("[M3]", "[M3]"),
    ("  Green.\nAnd then more.", "Green."),
    ("", ""),
])
def test_the_cut_skips_lead_ins_and_reduces_echoed_entries(text, expected):
    assert final_answer(text) == expected


def test_the_whole_reply_without_the_first_line_rule_is_repaired_too():
    assert final_answer("The answer is: Green.\nMore", first_line=False) == "Green.\nMore"


@pytest.mark.parametrize("text,shape", [
    ("", "empty"), ("\n  \n", "empty"), ("<think>unfinished", "empty"),
    ("The answer is:", "lead_in"), ("The answer is:\nPottery", "lead_in"), ("Answer:", "lead_in"),
    ("The answer is", "lead_in"), ("Here is the answer.", "lead_in"), ("Caroline said:\nyes", "lead_in"),
    (ECHO, "entry"), ("[M1]: the user keeps bees", "entry"), ("Books are powerful (Caroline; turn 98)", "entry"),
    ("It's the one with the StapleSource referral. (User;", "entry"), ("User; turn 97", "entry"),
    ("(turns 4-5; said 2023-01-02)", "entry"), ("She moved in May (after the wedding", None),
    ("Pottery.", None), ("The answer is pottery.", None), ("She likes [M3] a lot.", None),
])
def test_reply_shapes(text, shape):
    assert reply_shape(text) == shape


def test_lead_ins_and_answer_lines():
    assert is_lead_in("The answer is:") and is_lead_in("  **Answer** ") and not is_lead_in("Pottery.")
    assert answer_line("Answer:\nThe answer is\nPottery.\nMore") == "Pottery."
    assert not holds_answer_line("The answer is:\n") and not holds_answer_line("Pottery.")
    assert holds_answer_line("The answer is:\nPottery.\n")


def test_the_echo_pattern_is_the_writers_form():
    """The provenance the cut takes off is the one serialization writes: an entry the working memory
    holds, echoed whole, reads back as its fact, whatever parts its provenance has."""
    common = {"dialogue_id": "d", "session_id": "s", "window_id": "w", "subject": "", "predicate": "", "object": ""}
    units = [MemoryUnit(id="u1", fact="Books have such an awesome power.", speaker="Caroline", order=98,
                        source_turn_ids=["t98"], source_text="Caroline: books!", utterance_time="2023-05-08T10:00:00",
                        **common),
             MemoryUnit(id="u2", fact="She moved to Lisbon.", order=4, source_turn_ids=["t4", "t5"],
                        source_text="Mel: I moved to Lisbon.", fact_time="2022-03", **common)]
    for position, unit in enumerate(units, 1):
        line = serialize_unit(position, unit, source_chars=20)
        assert is_entry_echo(line) and final_answer(line) == unit.fact
        assert strip_entry(line[:len(line) - 3]) == unit.fact  # cut short anywhere in its tail
