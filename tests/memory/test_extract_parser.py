"""The parser extractor on real ConvoMem turns: relations inside claims, short nodes, NER attributes."""

from __future__ import annotations

import pytest

from qgmem.data.loaders import load_cases
from qgmem.memory.config import ConstructionConfig
from qgmem.memory.extract_heuristic import HeuristicExtractor
from qgmem.memory.extract_parser import ParserExtractor
from qgmem.memory.nlp import load_pipeline
from qgmem.memory.relations import MAX_NODE_CHARS, SPEECH_VERBS
from qgmem.memory.traces import lemma, traceable
from qgmem.memory.windows import make_windows

from .helpers import make_dialogue


@pytest.fixture(scope="module")
def extractor() -> ParserExtractor:
    return ParserExtractor(ConstructionConfig())


def _units(extractor, turns):
    dialogue = make_dialogue([turns])
    return extractor.extract_windows(make_windows(dialogue, 6, 2), dialogue.id, "User", {})


# Sentences of the ConvoMem sample (data/convomem), each after a turn of the other speaker.
@pytest.mark.parametrize("speaker,text,triple,relation", [
    ("User", "I use green for hot leads in my personal spreadsheet.",
     ("User", "uses", "green"), ["green", "use for", "hot leads"]),
    ("User", "I moved to this townhouse for more space and a backyard for the dog.",
     ("User", "moved to", "townhouse"), ["townhouse", "move for", "more space"]),
    ("User", "Well, my manager, Sarah, is all about the metrics.",
     ("User's manager", "is about", "metrics"), ["Sarah", "is", "User's manager"]),
    ("User", "Just had my performance review with my manager.",
     ("User", "had", "User's performance review"), ["User's performance review", "with", "User's manager"]),
    ("User", "I think I'll go with a dark walnut stain and a satin polyurethane finish.",
     ("User", "will go with", "dark walnut stain"), ["User", "will go with", "satin polyurethane finish"]),
    ("Assistant", "Given your detailed spreadsheet and the need to sync with the company CRM, I'd recommend "
                  "looking into Zapier.", ("User", "should look into", "Zapier"), None),
    ("Assistant", "For cable management, I'd recommend adhesive cable clips or a cable management sleeve.",
     ("User", "should consider", "adhesive cable clips"), ["User", "should consider", "cable management sleeve"]),
    ("User", "Cooper found a squirrel.", ("Cooper", "found", "squirrel"), None),
])
def test_relation_inside_the_claim(extractor, speaker, text, triple, relation):
    other = "Assistant" if speaker == "User" else "User"
    units = _units(extractor, [(other, "Tell me more."), (speaker, text)])
    assert len(units) == 1
    unit = units[0]
    assert (unit.subject, unit.predicate, unit.object) == triple
    assert unit.source_turn_ids == ["s0:1"] and unit.speaker == speaker
    if relation is not None:
        assert relation in unit.relations
    assert all(len(node) <= MAX_NODE_CHARS for r in unit.relations for node in (r[0], r[2]))


def test_advice_is_not_traced_as_the_listeners_state(extractor):
    units = _units(extractor, [("User", "My CRM is slow."),
                               ("Assistant", "I'd recommend looking into Zapier for the sync.")])
    unit = next(u for u in units if u.speaker == "Assistant")
    assert (unit.subject, unit.predicate, unit.object) == ("User", "should look into", "Zapier")
    assert not traceable(unit)


def test_ner_gives_entities_and_the_cue_rule_the_location(extractor):
    units = _units(extractor, [("User", "Zapier is a tool I keep hearing about."), (
        "Assistant", "A walk with Cooper is certainly a different adventure than backpacking through Vietnam."),
        ("User", "I moved to Denver last spring.")])
    assert "Zapier" in units[0].entities  # a sentence-initial name the capitalization rule skips
    assert {"Cooper", "Vietnam"} <= set(units[1].entities) and units[1].location == ""
    assert units[2].location == "Denver"


@pytest.mark.parametrize("question,reply,triple,relation", [
    ("What is your dog's name?", "Cooper, my golden retriever.", ("User's dog's name", "is", "Cooper"),
     ["User's golden retriever", "is", "Cooper"]),
    ("Where do you live now?", "Denver, since March.", ("User", "lives", "Denver"), ["Denver", "since", "March"]),
])
def test_reply_without_a_clause_takes_the_relation_of_the_question(extractor, question, reply, triple, relation):
    unit = _units(extractor, [("Assistant", question), ("User", reply)])[0]
    assert (unit.subject, unit.predicate, unit.object) == triple and relation in unit.relations
    assert unit.source_turn_ids == ["s0:1"] and unit.fact.startswith("User, asked")


# An object "it" takes the named thing of the earlier clause or of the sentence just before (the
# first two are the LoCoMo-form fixture's and ConvoMem's turns); an unnamed referent, a chain of "it"s,
# an idiom and a subject "it" stay as they are.
@pytest.mark.parametrize("turns,triple,relation,entity", [
    ([("Daniel", "Glad to hear it. Still on track for Lisbon?"),
      ("Priya", "Yes, and my cousin Arjun decided to run it with me.")],
     ("Priya's cousin", "run", "Lisbon"), ["Lisbon", "run with", "Priya"], "Lisbon"),
    ([("Assistant", "Is there anything else about your CRM workflow you'd like to discuss?"),
      ("User", "Their CRM was a clunky mess, and I couldn't rely on it.")],
     ("Their CRM", "was", "clunky mess"), ["User", "could not rely on", "Their CRM"], "CRM"),
    ([("User", "I bought a Trek bike last week and I love it.")],
     ("User", "bought", "Trek bike"), ["User", "loves", "Trek bike"], "Trek"),
    ([("User", "I finally got my new standing desk. I assembled it myself on Sunday.")],
     ("User", "assembled", "it"), None, None),
    ([("User", "The company CRM is so clunky. I have to export the list and then sort it myself.")],
     None, ["User", "sort", "it"], None),
    ([("Assistant", "Still on track for Lisbon?"), ("User", "I made it, and I am proud of it.")],
     ("User", "made", "it"), None, None),
])
def test_object_it_takes_a_named_referent(extractor, turns, triple, relation, entity):
    unit = _units(extractor, turns)[-1]
    triples = [(unit.subject, unit.predicate, unit.object), *map(tuple, unit.relations)]
    if triple is not None:
        assert triples[0] == triple
    if relation is not None:
        assert tuple(relation) in triples
    if entity is not None:
        assert entity in unit.entities and all("it" not in (head, tail) for head, _, tail in triples)
    else:  # the "it" stays, and no name is borrowed from another sentence
        assert any("it" in (head, tail) for head, _, tail in triples) and unit.entities == []


def test_same_claims_and_grounding_as_the_heuristic_rules_on_real_cases(extractor, convomem_path):
    cases = load_cases("convomem", convomem_path, distractor_conversations=0).cases[:2]
    heuristic = HeuristicExtractor(ConstructionConfig())
    edges = speech = 0
    for case in cases:
        windows = make_windows(case.dialogue, 6, 2)
        parsed = extractor.extract_windows(windows, case.dialogue.id, "User", {})
        ruled = [u for w in windows for u in heuristic.extract(w, case.dialogue.id, "User")]
        assert [(u.source_turn_ids, u.fact) for u in parsed] == [(u.source_turn_ids, u.fact) for u in ruled]
        for unit in parsed:
            triples = [(unit.subject, unit.predicate, unit.object), *map(tuple, unit.relations)]
            for head, rel, tail in triples:
                assert head and rel and tail and len(head) <= MAX_NODE_CHARS and len(tail) <= MAX_NODE_CHARS
                edges += 1
                speech += lemma(rel.split()[0]) in SPEECH_VERBS or rel in ("mentions", "answers")
    assert edges > 200 and speech / edges < 0.10


def test_parses_are_memoized_by_text(convomem_path):
    extractor = ParserExtractor(ConstructionConfig())
    case = load_cases("convomem", convomem_path, distractor_conversations=0).cases[0]
    windows = make_windows(case.dialogue, 6, 2)
    first = extractor.extract_windows(windows, case.dialogue.id, "User", {})
    parsed = extractor.parsed_sentences
    again = extractor.extract_windows(windows, case.dialogue.id, "User", {})
    assert parsed > 0 and extractor.parsed_sentences == parsed and extractor.memo_hits == len(first)
    assert [u.to_dict() for u in again] == [u.to_dict() for u in first]


def test_a_missing_model_package_is_named():
    with pytest.raises(RuntimeError, match="no spaCy English model found.*not_a_model"):
        load_pipeline("not_a_model")


def test_unread_turn_fallback_grounds_the_turn_through_the_parser():
    turns = [("User", "I host a late-night campus radio show."),
             ("Assistant", "Hosting a late-night radio show must have made you comfortable with unscripted "
                           "conversation, which is a skill to have.")]
    on = _units(ParserExtractor(ConstructionConfig()), turns)
    assert [u.source_turn_ids for u in on] == [["s0:0"], ["s0:1"]]
    fallback = on[1]
    assert fallback.fact.startswith("Assistant mentions: Hosting a late-night radio show")
    assert fallback.speaker == "Assistant" and fallback.subject and fallback.object  # the parse gave a triple
