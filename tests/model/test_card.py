"""The export card says what the LM reads of the working memory and why the export answers as it does."""

from __future__ import annotations

from qgmem.model.card import model_card

BASE = {"dataset": "convomem", "lm": {"id": "x/y"}, "graph_token": {"encoder": {}}}


def config(prompt: dict, graph_mode: str, trained: str | None = None) -> dict:
    """An export's config with this answer block (the graph budget k = 10) and the weights' trained mode."""
    return {**BASE, "answer": {"prompt": prompt, "activation": {"k": 10}, "graph_mode": graph_mode},
            "checkpoint": {"graph_mode": trained or graph_mode}}


def test_the_card_says_the_budgets_and_why_the_compact_prompt():
    compact = model_card(config({"memory_units": 3, "num_graph_tokens": 11}, "token"))
    assert "- reads: the top 3 working-memory units as text and 11 graph tokens over 10 units (the compact prompt;" in compact
    assert "lead-in lines" in compact and "answer-mode rule" not in compact
    full = model_card(config({"memory_units": None, "num_graph_tokens": 17}, "token"))
    assert "- reads: the whole working memory as text and 17 graph tokens over 10 units" in full
    assert "compact prompt" not in full


def test_a_text_prompt_default_says_which_rule_made_it_so():
    card = model_card(config({"memory_units": 3, "num_graph_tokens": 11}, "none", "token"))
    assert "The text prompt is the default answer: by the answer-mode rule" in card and "degenerate" in card
    untrained = model_card(config({}, "none", "none"))
    assert "answer-mode rule" not in untrained  # a text-only model was never a candidate for the rule
