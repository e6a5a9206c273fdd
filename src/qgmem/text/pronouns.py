"""English personal pronouns by person and form, and the verb agreement a pronoun turned name needs.

Construction writes facts that stand alone ("I moved to Lyon" said by Priya -> "Priya moved to Lyon"),
and the named-form probe asks ConvoMem's questions in the third person ("What did I say" -> "What did
Ingrid say"). Both rewrite the words of this one table; each reader takes the forms it rewrites with
:func:`pronouns`. A first- or second-person subject that becomes a name takes a third-person verb:
:data:`AGREEMENT` holds the irregular forms ("am" -> "is", "'ve" -> "has").
"""

from __future__ import annotations

FORMS = ("subject", "object", "reflexive", "possessive", "informal")

#: word -> (person, form). "you" is written once, as a subject (it is also the object); "her" is left
#: out: it is the object of "she" or her possessive, and only a parse tells which. ``informal`` is a
#: spelling that is a pronoun only where a parser tags it one ("u" is also a letter).
PRONOUNS: dict[str, tuple[int, str]] = {
    "i": (1, "subject"), "we": (1, "subject"), "me": (1, "object"), "us": (1, "object"),
    "myself": (1, "reflexive"), "ourselves": (1, "reflexive"),
    "my": (1, "possessive"), "mine": (1, "possessive"), "our": (1, "possessive"), "ours": (1, "possessive"),
    "you": (2, "subject"), "yourself": (2, "reflexive"), "yourselves": (2, "reflexive"),
    "your": (2, "possessive"), "yours": (2, "possessive"), "ya": (2, "informal"), "u": (2, "informal"),
    "he": (3, "subject"), "she": (3, "subject"), "they": (3, "subject"), "him": (3, "object"),
    "them": (3, "object"), "himself": (3, "reflexive"), "herself": (3, "reflexive"),
    "themselves": (3, "reflexive"), "his": (3, "possessive"), "their": (3, "possessive"),
    "theirs": (3, "possessive"),
}
#: the plural words of the table (a speaker's "we" is still that speaker in a fact of theirs)
PLURAL = frozenset({"we", "us", "ourselves", "our", "ours", "yourselves", "they", "them", "themselves", "their",
                    "theirs"})

#: irregular third-person forms of a verb whose first/second-person subject became a name
AGREEMENT: dict[str, str] = {
    "am": "is", "'m": "is", "are": "is", "'re": "is", "'s": "is", "have": "has", "'ve": "has", "do": "does",
    "don't": "doesn't", "'d": "would", "'ll": "will", "were": "was", "aren't": "isn't", "haven't": "hasn't",
    "weren't": "wasn't",
}


def pronouns(person: int, *forms: str, plural: bool = True) -> frozenset[str]:
    """The words of ``person`` (1, 2, 3) in any of ``forms`` (all forms when none is named);
    ``plural=False`` leaves the plural ones out."""
    unknown = set(forms) - set(FORMS)
    if unknown or person not in (1, 2, 3):
        raise ValueError(f"person must be 1, 2 or 3 and forms among {FORMS}, got {person}, {sorted(unknown)}")
    return frozenset(word for word, (p, form) in PRONOUNS.items()
                     if p == person and (not forms or form in forms) and (plural or word not in PLURAL))
