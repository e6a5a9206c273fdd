from __future__ import annotations

import pytest

from qgmem.data.records import Turn
from qgmem.memory.config import ConstructionConfig
from qgmem.memory.extract_heuristic import HeuristicExtractor, find_entities, find_location, split_sentences
from qgmem.memory.windows import make_windows

from .helpers import make_dialogue


def _claims(speaker: str, text: str, listener: str = "Assistant"):
    turn = Turn(id="t0", session_id="s0", speaker=speaker, role=speaker.lower(), text=text)
    return HeuristicExtractor().sentence_claims(turn, listener)


@pytest.mark.parametrize("text,triple", [
    ("I'm allergic to shellfish.", ("User", "is allergic to", "shellfish")),
    ("Yeah, I actually have a system in place.", ("User", "actually has", "a system in place")),
    ("I use green for hot leads in my personal spreadsheet.",
     ("User", "uses", "green for hot leads in User's personal spreadsheet")),
    ("I live in Boston.", ("User", "lives in", "Boston")),
    ("I moved to Denver last month.", ("User", "moved to", "Denver last month")),
    ("My favorite color is blue.", ("User's favorite color", "is", "blue")),
    ("I've been using this method since my first sales job at StapleSource.",
     ("User", "has been using", "this method since User's first sales job at StapleSource")),
    ("I'm putting together a tailored presentation.", ("User", "is putting", "together a tailored presentation")),
])
def test_user_first_person_statements_give_a_triple(text, triple):
    [claim] = _claims("User", text)
    assert (claim.subject, claim.predicate, claim.object) == triple
    assert claim.fact.startswith(triple[0]) and "I " not in claim.fact


@pytest.mark.parametrize("speaker,text", [
    ("User", "Thanks!"), ("User", "Thanks so much for the help with the spreadsheet."),
    ("User", "Can you pull up my call log for today?"), ("User", "Hey, how are you?"),
    ("User", "Good morning."), ("User", "I know, I know."), ("User", "Please remind me about the call tomorrow."),
    ("Assistant", "That sounds incredibly frustrating."), ("Assistant", "I can imagine how tiring that is."),
    ("Assistant", "Efficiency is key in your line of work."), ("Assistant", "Is the process cumbersome?"),
])
def test_chit_chat_questions_and_requests_give_no_claim(speaker, text):
    assert _claims(speaker, text, listener="User" if speaker == "Assistant" else "Assistant") == []


@pytest.mark.parametrize("text,subject,predicate", [
    ("Today, you logged 87 outbound calls with an average talk time of 3 minutes.", "User", "logged"),
    ("Given your detailed spreadsheet, I'd recommend looking into Zapier.", "Assistant", "recommends"),
    ("Zapier has a free tier that allows 100 tasks per month.", "Zapier", "has"),
])
def test_assistant_facts_and_recommendations(text, subject, predicate):
    [claim] = _claims("Assistant", text, listener="User")
    assert (claim.subject, claim.predicate) == (subject, predicate)
    assert claim.object


def test_sentence_split_keeps_abbreviations_and_splits_on_list_word():
    assert split_sentences("I work at Acme Inc. in Ohio. Dr. Smith is my doctor! Not really, my list. Trying hard.") == [
        "I work at Acme Inc. in Ohio.", "Dr. Smith is my doctor!", "Not really, my list.", "Trying hard."]


@pytest.mark.parametrize("sentence,entities,location", [
    ("I moved to New York City with my dog Cooper.", ["New York City", "Cooper"], "New York City"),
    ("Our team is merging with the West Coast division at DataWeave Inc.", ["West Coast", "DataWeave Inc"],
     "West Coast"),
    ("Consistency is key in sales.", [], ""),
    ("The CRM is clunky and Salesforce is slow.", ["CRM", "Salesforce"], ""),
])
def test_entities_and_location(sentence, entities, location):
    assert find_entities(sentence) == entities
    assert find_location(sentence) == location


def test_units_are_grounded_in_their_own_new_turn_only():
    dialogue = make_dialogue([[
        ("User", "Hi there!"), ("Assistant", "Hello! How can I help?"),
        ("User", "I live in Boston with my wife."), ("Assistant", "Boston is lovely in the fall."),
        ("User", "Thanks."), ("Assistant", "You're welcome."),
        ("User", "I work at Acme Robotics as an engineer."), ("Assistant", "Great."),
        ("User", "My sister Anna lives in Chicago."), ("Assistant", "Noted!"),
    ]], times=["2023-05-08T10:00:00"])
    extractor = HeuristicExtractor(ConstructionConfig())
    windows = make_windows(dialogue, 6, 2)
    units = [u for w in windows for u in extractor.extract(w, dialogue.id, "User", None)]
    by_turn = {u.source_turn_ids[0]: u for u in units}
    assert sorted(by_turn) == ["s0:2", "s0:6", "s0:8"]
    assert all(len(u.source_turn_ids) == 1 for u in units)
    for w in windows:  # never grounded only in a window's context (overlap) turns
        for u in extractor.extract(w, dialogue.id, "User", None):
            assert u.source_turn_ids[0] in w.new_turn_ids and u.window_id == w.id
    assert by_turn["s0:2"].location == "Boston" and by_turn["s0:8"].subject == "User's sister Anna"
    assert by_turn["s0:6"].entities == ["Acme Robotics"] and by_turn["s0:6"].order == 6
    assert all(u.subject and u.predicate and u.object for u in units)
    assert by_turn["s0:2"].utterance_time == "2023-05-08T10:00:00"


def test_fact_time_kept_apart_from_utterance_time():
    dialogue = make_dialogue([[("User", "I moved to Denver yesterday.")]], times=["2023-05-08T13:56:00"])
    [window] = make_windows(dialogue)
    [unit] = HeuristicExtractor().extract(window, dialogue.id)
    assert (unit.fact_time, unit.utterance_time) == ("2023-05-07", "2023-05-08T13:56:00")


def test_extraction_is_deterministic(convomem_path):
    from qgmem.data.loaders import load_cases

    case = load_cases("convomem", convomem_path, distractor_conversations=0).cases[0]
    extractor = HeuristicExtractor()
    windows = make_windows(case.dialogue)
    first = [u.to_dict() for w in windows for u in extractor.extract(w, case.dialogue.id)]
    second = [u.to_dict() for w in windows for u in extractor.extract(w, case.dialogue.id)]
    assert first == second and len(first) > 0
