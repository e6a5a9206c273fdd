"""The one pronoun table: what each reader takes from it, and the verb agreement."""

from __future__ import annotations

import pytest

from qgmem.text.pronouns import AGREEMENT, PLURAL, PRONOUNS, pronouns


def test_the_table_by_person_and_form():
    assert pronouns(1, "subject") == {"i", "we"} and pronouns(3, "subject") == {"he", "she", "they"}
    assert pronouns(1, "possessive", plural=False) == {"my", "mine"}
    assert pronouns(2, "reflexive", plural=False) == {"yourself"} and pronouns(2, "reflexive") == {"yourself",
                                                                                                   "yourselves"}
    assert pronouns(2, "informal") == {"ya", "u"} and "u" not in pronouns(2, "subject", "object", "reflexive")
    every = pronouns(1) | pronouns(2) | pronouns(3)
    assert every == set(PRONOUNS) and PLURAL <= every and "her" not in every  # "her": only a parse tells


def test_bad_person_or_form():
    with pytest.raises(ValueError, match="person"):
        pronouns(4)
    with pytest.raises(ValueError, match="possesive"):
        pronouns(1, "possesive")


def test_agreement_is_third_person_singular():
    assert AGREEMENT["am"] == AGREEMENT["'re"] == "is" and AGREEMENT["'ve"] == "has" and AGREEMENT["don't"] == "doesn't"
    assert not set(AGREEMENT.values()) & set(AGREEMENT)  # an agreed form is never agreed again
