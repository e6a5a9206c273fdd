"""The prompt wording and PromptSettings: messages, graph-only prompts, saved settings."""

from __future__ import annotations

import pytest

from qgmem.prompting import NO_MEMORY_TEXT, SYSTEM_PROMPT, PromptSettings, build_messages, user_content


def test_prompt_puts_memory_before_question():
    messages = build_messages("[M1] User lives in Zürich", "Where does the user live?")
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"] == SYSTEM_PROMPT
    content = messages[1]["content"]
    assert content.index("[M1]") < content.index("Question: Where does the user live?")
    assert build_messages("", "Q?", system_prompt=None)[0]["content"] == f"Memory:\n{NO_MEMORY_TEXT}\n\nQuestion: Q?"


def test_graph_only_prompt_leaves_memory_text_out():
    assert user_content("[M1] fact", " Where? ", include_memory=False) == "Question: Where?"


def test_settings_round_trip_and_refuse_unknown_fields():
    settings = PromptSettings(max_prompt_tokens=96, enable_thinking=True, num_graph_tokens=4, include_memory_text=False,
                              system_prompt=None)
    assert PromptSettings.from_dict(settings.to_dict()) == settings
    assert PromptSettings.from_dict({}) == PromptSettings()
    with pytest.raises(ValueError, match=r"unknown prompt setting\(s\) \['max_promt_tokens'\]"):
        PromptSettings.from_dict({"max_promt_tokens": 3})


@pytest.mark.parametrize("field,value", [("max_prompt_tokens", 0), ("max_answer_tokens", 0), ("num_graph_tokens", 0)])
def test_settings_refuse_non_positive_sizes(field, value):
    with pytest.raises(ValueError, match=field):
        PromptSettings(**{field: value})


@pytest.mark.parametrize("text, graph, message", [
    (-1, 10, "data.memory_units must be >= 0 (or null: every unit of data.activation.k), got -1"),
    (11, 10, "data.memory_units = 11 is more than data.activation.k = 10"),
    (None, 0, "data.activation.k must be >= 1 (units the graph is built over), got 0"),
])
def test_check_budgets_refuses_what_cannot_hold_together_naming_the_setting(text, graph, message):
    from qgmem.errors import SettingError
    from qgmem.prompting.contract import check_budgets

    with pytest.raises(SettingError) as info:
        check_budgets(text, graph)
    assert message in str(info.value)


@pytest.mark.parametrize("text, graph", [(None, 10), (0, 10), (3, 10), (10, 10), (3, None)])
def test_check_budgets_accepts_a_text_budget_within_the_graphs(text, graph):
    from qgmem.prompting.contract import check_budgets

    check_budgets(text, graph)


def test_prompt_settings_refuse_a_negative_text_budget_naming_the_export_field():
    from qgmem.errors import SettingError

    with pytest.raises(SettingError, match=r"prompt.memory_units must be >= 0"):
        PromptSettings(memory_units=-1)


def test_memory_entries_are_the_labelled_lines_in_order():
    from qgmem.prompting.contract import first_entries, memory_entries

    text = "[M1] Ana is the user's sister (user; turn 2)\n[M2] The user keeps bees.\n  more of M2\n[M10] Last one"
    assert memory_entries(text) == [(1, "Ana is the user's sister (user; turn 2)"),
                                    (2, "The user keeps bees.\n  more of M2"), (10, "Last one")]
    assert memory_entries(first_entries(text, 1)) == memory_entries(text)[:1]  # one parser for both
    assert memory_entries("no entries here") == [] and memory_entries("") == []
