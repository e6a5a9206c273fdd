"""ConvoMem in the LoCoMo form: both speakers named, every question in the third person.

ConvoMem's speakers are *User* and *Assistant*, and its questions are the user's, asked in the first
person ("What did I say was the best part of my new townhouse?"). LoCoMo's speakers are two people,
and its questions name them ("What did Ingrid say was the best part of Ingrid's new townhouse?"). Speaker
names are what a question shares with every unit a speaker said, so how activation treats them
(``dense_speaker_names``, the swapped-speaker probe of
:mod:`qgmem.evaluation.adversarial`) can only be measured on the LoCoMo form. The one LoCoMo-form
fixture of this repository is a 69-unit dialogue; this rewrite gives the form at ConvoMem's scale, with
ConvoMem's gold turns (``qgmem eval-retrieval --name-speakers Ingrid,Tobias``).

The rewrite is a proxy, not a translation: turns keep their text and their role (so construction reads
them as before, with the names where it wrote *User* and *Assistant*), and questions are rewritten by
the rules of :data:`FIRST_PERSON` and :data:`SECOND_PERSON`: the common verb forms first ("am I", "do
you", their verbs agreeing by :data:`qgmem.text.pronouns.AGREEMENT`), then the pronouns themselves (the
singular words of :data:`qgmem.text.pronouns.PRONOUNS`: the asker is one person); the rest ("Ingrid need"
for "I need") is left to stemming and the encoder.
"""

from __future__ import annotations

import re
from dataclasses import replace

from qgmem.data.records import QA, Case, Dialogue
from qgmem.errors import as_user_error
from qgmem.text.pronouns import pronouns

#: the speakers a ConvoMem case has, in the order the two names are given
CONVOMEM_SPEAKERS = ("User", "Assistant")
#: names for them that no ConvoMem text holds, so a name in a question points at one speaker only
DEFAULT_NAMES = ("Ingrid", "Tobias")

_APOSTROPHE = "['’]"


def _any_word(words) -> str:
    """A pattern matching any of ``words`` as a whole word."""
    return r"\b(?:" + "|".join(sorted(words, key=lambda w: (-len(w), w))) + r")\b"


#: (pattern, replacement) for the asker's own words, applied in order; ``{name}`` is the user's name
FIRST_PERSON: tuple[tuple[str, str], ...] = (
    (r"\bam I\b", "is {name}"),
    (rf"\bI{_APOSTROPHE}m\b", "{name} is"),
    (r"\bI am\b", "{name} is"),
    (r"\bhave I\b", "has {name}"),
    (rf"\bI{_APOSTROPHE}ve\b", "{name} has"),
    (r"\bI have\b", "{name} has"),
    (r"\bdo I\b", "does {name}"),
    (r"\bI do\b", "{name} does"),
    (rf"\bI{_APOSTROPHE}d\b", "{name} would"),
    (rf"\bI{_APOSTROPHE}ll\b", "{name} will"),
    (r"\bI\b", "{name}"),  # as written: a lower-case "i" is no pronoun in a question
    (_any_word(pronouns(1, "object", "reflexive", plural=False)), "{name}"),
    (_any_word(pronouns(1, "possessive", plural=False)), "{name}'s"),
)
#: the same for the words the asker addresses to the assistant; ``{name}`` is the assistant's name
SECOND_PERSON: tuple[tuple[str, str], ...] = (
    (r"\bare you\b", "is {name}"),
    (rf"\byou{_APOSTROPHE}re\b", "{name} is"),
    (r"\byou are\b", "{name} is"),
    (r"\bwere you\b", "was {name}"),
    (r"\byou were\b", "{name} was"),
    (r"\bhave you\b", "has {name}"),
    (rf"\byou{_APOSTROPHE}ve\b", "{name} has"),
    (r"\byou have\b", "{name} has"),
    (r"\bdo you\b", "does {name}"),
    (rf"\byou{_APOSTROPHE}d\b", "{name} would"),
    (rf"\byou{_APOSTROPHE}ll\b", "{name} will"),
    (_any_word(pronouns(2, "reflexive", plural=False)), "{name}"),
    (_any_word(pronouns(2, "possessive")), "{name}'s"),
    (_any_word(pronouns(2, "subject")), "{name}"),
)
_SENTENCE_START = re.compile(r"(?:^|[.!?\"“(]\s*)$")


def _substitute(pattern: str, replacement: str, text: str) -> str:
    """``re.sub`` with the pronoun's case: "I" is matched as written; any other form is matched in lower
    case anywhere and capitalized only where a sentence opens ("My" there, but not "Mine Safety Act"), and
    a replacement that opens a sentence is capitalized."""
    def swap(match: re.Match) -> str:
        opens = bool(_SENTENCE_START.search(text[:match.start()]))
        if match.group(0)[0].isupper() and not opens and not match.group(0).startswith("I"):
            return match.group(0)
        return replacement[0].upper() + replacement[1:] if opens else replacement

    return re.sub(pattern, swap, text, flags=re.IGNORECASE if pattern[2:3] != "I" else 0)


def check_names(names) -> tuple[str, str]:
    """Two distinct single-word names (``ValueError`` otherwise): the user's, then the assistant's."""
    names = tuple(str(n).strip() for n in names)
    if len(names) != 2 or not all(re.fullmatch(r"[A-Z][A-Za-z]+", n) for n in names) or names[0] == names[1]:
        raise ValueError(f"speaker names must be two different capitalized words, as USER,ASSISTANT "
                         f"(got {','.join(names)!r})")
    return names  # type: ignore[return-value]


def third_person_question(question: str, user: str, assistant: str) -> str:
    """``question``, asked by ``user`` of ``assistant``, with its pronouns replaced by their names."""
    for rules, name in ((FIRST_PERSON, user), (SECOND_PERSON, assistant)):
        for pattern, replacement in rules:
            question = _substitute(pattern, replacement.format(name=name), question)
    return question


def named_speaker_cases(cases, names=DEFAULT_NAMES) -> list[Case]:
    """The ConvoMem ``cases`` in the LoCoMo form: *User* and *Assistant* renamed ``names`` in every turn,
    every question in the third person (same ids, categories and gold turns).

    A case whose speakers are not ConvoMem's two is a ``ValueError`` naming it: the rewrite reads "I"
    as the user, which holds for ConvoMem only.
    """
    user, assistant = check_names(names)
    rename = dict(zip(CONVOMEM_SPEAKERS, (user, assistant)))
    out: list[Case] = []
    for case in cases:
        speakers = {t.speaker for t in case.dialogue.turns()}
        if not speakers <= set(CONVOMEM_SPEAKERS):
            raise ValueError(f"case {case.id!r}: speakers {sorted(speakers)} are not ConvoMem's "
                             f"{' and '.join(CONVOMEM_SPEAKERS)}")
        sessions = [replace(s, meta=dict(s.meta), turns=[replace(t, speaker=rename[t.speaker]) for t in s.turns])
                    for s in case.dialogue.sessions]
        dialogue = Dialogue(id=case.dialogue.id, sessions=sessions,
                            meta={**case.dialogue.meta, "speaker_a": user, "speaker_b": assistant})
        qas = [QA(id=q.id, question=third_person_question(q.question, user, assistant), answer=q.answer,
                  category=q.category, evidence_turn_ids=list(q.evidence_turn_ids),
                  question_time=q.question_time, meta=dict(q.meta)) for q in case.qas]
        out.append(Case(id=case.id, dialogue=dialogue, qas=qas,
                        source={**case.source, "speaker_names": [user, assistant]}))
    return out


#: the flag of ``qgmem eval-retrieval`` and ``qgmem eval-qa`` that asks for this form
FLAG = "--name-speakers"


def names_from_flag(value: str) -> tuple[str, str]:
    """``USER,ASSISTANT`` as given to :data:`FLAG`, checked; a bad value is a user's error naming the flag."""
    with as_user_error(ValueError, prefix=f"{FLAG}: "):
        return check_names(value.split(","))


def cases_from_flag(cases, value: str) -> tuple[list[Case], list[str]]:
    """The ``cases`` in the form :data:`FLAG` ``value`` asks for, and the names (as the commands record them).

    A bad value, or a case whose speakers are not ConvoMem's, is a user's error naming the flag.
    """
    names = names_from_flag(value)
    with as_user_error(ValueError, prefix=f"{FLAG}: "):
        return named_speaker_cases(cases, names), list(names)


_SPEAKER_WORD = re.compile(r"\b(?:" + "|".join(CONVOMEM_SPEAKERS) + r")\b")


def named_speaker_item(item: dict, names=DEFAULT_NAMES) -> dict:
    """A stored ConvoMem sample (a contract item) in the same form, without replaying its case.

    Construction writes a speaker's name where it refers to them ("User started in Hanoi", "(User; turn
    11)", "Assistant mentions: ..."), so the memory text and the node texts get the two names where
    they hold the words *User* and *Assistant*; the question is rewritten by :func:`third_person_question`.
    The graph's features stay those of the plain sample (embedded from the plain text): the form reaches
    the prompt's text and the node words, not the sentence embeddings. A replay of
    :func:`named_speaker_cases` gives the whole form.
    """
    user, assistant = check_names(names)
    rename = dict(zip(CONVOMEM_SPEAKERS, (user, assistant)))

    def named(text: str) -> str:
        return _SPEAKER_WORD.sub(lambda m: rename[m.group(0)], text)

    return {**item, "memory_text": named(item["memory_text"]),
            "question": third_person_question(item["question"], user, assistant),
            **({"node_text": [named(t) for t in item["node_text"]]} if "node_text" in item else {})}
