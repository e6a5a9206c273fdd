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


def _turn(tid: str, speaker: str, text: str, role: str = "user") -> Turn:
    return Turn(id=tid, session_id="s0", speaker=speaker, role=role, text=text)


@pytest.mark.parametrize("speaker,text,triple,fact_start", [
    ("Daniel", "There's a grey greyhound called Biscuit who follows me everywhere.",
     ("Daniel", "mentions", "a grey greyhound called Biscuit who follows Daniel everywhere"), "There is a grey"),
    ("Daniel", "Priya, big news: I got offered a job as a data analyst at Northwind Logistics.",
     ("Daniel", "got offered", "a job as a data analyst at Northwind Logistics"), "Daniel got offered"),
    ("Daniel", "Work news from me: Helena left Northwind, so I report to Omar now.",
     ("Helena", "left", "Northwind"), "Helena left Northwind, so Daniel report to Omar"),
    ("Daniel", "Saturdays I'm taking a pottery class at the arts centre.",
     ("Daniel", "is taking", "a pottery class at the arts centre"), "Saturdays Daniel is taking"),
    ("Daniel", "Yesterday I made my first sourdough loaf.",
     ("Daniel", "made", "Daniel's first sourdough loaf"), "Yesterday Daniel made"),
    ("Daniel", "I have a small update too: I quit the pottery class.", ("Daniel", "quit", "the pottery class"),
     "Daniel quit"),
    ("Priya", "The physio says it's a mild sprain.", ("physio", "says", "it's a mild sprain"), "The physio says"),
    ("Daniel", "By the way, Biscuit got adopted by a retired teacher last Friday!",
     ("Biscuit", "got adopted by", "a retired teacher last Friday"), "Biscuit got adopted"),
    ("Priya", "Arjun and I did a 30 kilometre long run two days ago.",
     ("Arjun and Priya", "did", "a 30 kilometre long run two days ago"), "Arjun and Priya did"),
    ("Priya", "I was, but my lease doesn't allow dogs.", ("Priya's lease", "doesn't allow", "dogs"), "Priya's lease"),
    ("User", "Had a really positive first chat with their R&D lead yesterday.",
     ("User", "had", "a really positive first chat with their R&D lead yesterday"), "User Had a really"),
    ("User", "Cooper's been waiting by the door all day.",
     ("Cooper", "has been waiting by", "the door all day"), "Cooper has been waiting"),
])
def test_informative_sentences_that_were_missed_now_give_a_claim(speaker, text, triple, fact_start):
    listener = "Priya" if speaker != "Priya" else "Daniel"
    [claim] = HeuristicExtractor().sentence_claims(_turn("t1", speaker, text), listener)
    assert (claim.subject, claim.predicate, claim.object) == triple
    assert claim.fact.startswith(fact_start) and claim.fact.endswith(".")


@pytest.mark.parametrize("question,reply,fact", [
    ("Do you run alone?", "Usually with my running club, the Riverside Striders, every Tuesday evening.",
     'Priya, asked "Do Priya run alone?": Usually with Priya\'s running club, the Riverside Striders, every '
     "Tuesday evening."),
    ("Not again! Same leg as the knee?", "No, the other leg, the left ankle.",
     'Priya, asked "Same leg as the knee?": No, the other leg, the left ankle.'),
    ("Do they train on Tuesdays as well?", "No, Thursdays at 7 am on the promenade.",
     'Priya, asked "Do they train on Tuesdays as well?": No, Thursdays at 7 am on the promenade.'),
    ("Where would you go?", "Maybe Brighton.", 'Priya, asked "Where would Priya go?": Maybe Brighton.'),
])
def test_clause_less_reply_quotes_the_question_it_answers(question, reply, fact):
    previous = _turn("t0", "Daniel", question)
    [claim] = HeuristicExtractor().sentence_claims(_turn("t1", "Priya", reply), "Daniel", previous)
    assert claim.fact == fact
    assert (claim.subject, claim.predicate) == ("Priya", "answers")


@pytest.mark.parametrize("previous,text", [
    ("I adopted a cat.", "A family race, love it."),  # a fragment that answers nothing and names nothing
    ("Hi Daniel! How have you been?", "Busy but good."),  # a greeting question makes no claim of its reply
    ("My knee is better.", "That's frustrating with the marathon coming up."),
    ("I signed a lease!", "Wow, that was quick."),
    ("I signed a lease!", "Good idea, that should work well for you."),
    ("I'll be in Brighton.", "Greetings from Brighton!"),
    ("I ran 30 km.", "Is it near the beach?"),
])
def test_reactions_greetings_and_unanchored_fragments_give_nothing(previous, text):
    from collections import Counter

    counts: Counter = Counter()
    claims = HeuristicExtractor().sentence_claims(_turn("t1", "Daniel", text), "Priya", _turn("t0", "Priya", previous),
                                                  counts=counts)
    assert counts and not any(key.endswith("/read") for key in counts)  # the rules read nothing
    assert all(c.predicate == "mentions" for c in claims)  # at most the fallback grounds the turn


def test_the_default_grounds_an_unanchored_fragment_but_no_reaction():
    """The fallback's cost: a content fragment no rule reads is kept as a ``mentions`` unit; filtered
    sentences (reactions, greetings, questions) still give nothing."""
    previous = _turn("t0", "Priya", "I adopted a cat.")
    [claim] = HeuristicExtractor().sentence_claims(_turn("t1", "Daniel", "A family race, love it."), "Priya", previous)
    assert claim.fact == "Daniel mentions: A family race, love it." and claim.predicate == "mentions"
    for text in ("Wow, that was quick.", "Greetings from Brighton!", "Is it near the beach?"):
        assert HeuristicExtractor().sentence_claims(_turn("t1", "Daniel", text), "Priya", previous) == []


def test_he_she_they_resolve_to_the_last_name_mentioned():
    previous = _turn("t0", "Priya", "How is Omar?")
    claims = HeuristicExtractor().sentence_claims(
        _turn("t1", "Daniel", "Stricter. He wants weekly dashboards every Monday morning."), "Priya", previous)
    assert [(c.subject, c.predicate, c.object) for c in claims] == [
        ("Omar", "wants", "weekly dashboards every Monday morning")]


def test_each_claim_keeps_the_sentence_said_just_before_it():
    previous = _turn("t0", "Daniel", "Glad to hear it. Still on track for Lisbon?")
    claims = HeuristicExtractor().sentence_claims(
        _turn("t1", "Priya", "Yes, and my cousin Arjun decided to run it with me. Thanks! We booked a flat."),
        "Daniel", previous)
    assert [(c.context, c.context_speaker) for c in claims] == [
        ("Still on track for Lisbon?", "Daniel"), ("Thanks!", "Priya")]  # a skipped sentence counts too
    [first] = HeuristicExtractor().sentence_claims(_turn("t0", "Priya", "We booked a flat in Porto."), "Daniel")
    assert (first.context, first.context_speaker) == ("", "")


def test_shared_image_and_assistant_advice_become_claims():
    [image] = HeuristicExtractor().sentence_claims(
        _turn("t1", "Melanie", "[shares an image: a photo of three kids at a café]"), "Caroline")
    assert (image.subject, image.predicate, image.object) == ("Melanie", "shares an image of",
                                                             "a photo of three kids at a café")
    [advice] = _claims("Assistant", "When you're faced with a pricing objection, the best approach is to follow a "
                                    "three-step framework: first, acknowledge the concern.", listener="User")
    assert (advice.subject, advice.predicate) == ("Assistant", "recommends")
    assert advice.fact.startswith("Assistant recommends to follow a three-step framework")


def test_reply_to_a_question_in_the_overlap_is_grounded_in_the_reply_only():
    turns = [("Priya", "I adopted a cat called Mango."), ("Daniel", "Lovely name for a cat."),
             ("Priya", "She is orange and loud."), ("Daniel", "Ha, I believe it."),
             ("Priya", "I twisted my ankle on a pothole."), ("Daniel", "Not again! Same leg as the knee?"),
             ("Priya", "No, the other leg, the left ankle."), ("Daniel", "Take care of it.")]
    dialogue = make_dialogue([turns], times=["2023-08-12T09:00:00"])
    windows = make_windows(dialogue, 6, 2)
    assert windows[1].turns[1].id == "s0:5" and "s0:5" not in windows[1].new_turn_ids  # the question is context
    units = HeuristicExtractor().extract(windows[1], dialogue.id, "Priya", None)
    [reply] = [u for u in units if "left ankle" in u.fact]
    assert reply.source_turn_ids == ["s0:6"] and reply.window_id == windows[1].id
    assert reply.fact == 'Priya, asked "Same leg as the knee?": No, the other leg, the left ankle.'
    assert all(u.source_turn_ids[0] in windows[1].new_turn_ids for u in units)


def test_locomo_form_fixture_grounds_every_gold_turn():
    from pathlib import Path

    from qgmem.data.loaders import load_cases

    fixture = Path(__file__).resolve().parents[1] / "activation" / "fixtures" / "locomo_form.json"
    [case] = load_cases("locomo", str(fixture)).cases
    times = {s.id: s.time for s in case.dialogue.sessions}
    extractor = HeuristicExtractor()
    grounded = {tid for w in make_windows(case.dialogue)
                for u in extractor.extract(w, case.dialogue.id, session_time=times.get(w.session_id))
                for tid in u.source_turn_ids}
    gold = {tid for qa in case.qas for tid in qa.evidence_turn_ids}
    assert gold <= grounded
    filler = {t.id for s in case.dialogue.sessions for t in s.turns if t.text.rstrip().endswith("?")
              and "." not in t.text and "!" not in t.text}
    assert filler and not filler & grounded  # pure questions still give nothing


def test_each_sentence_is_counted_with_what_became_of_it():
    from collections import Counter

    from qgmem.memory.extract_heuristic import SENTENCE_OUTCOMES

    text = ("I live in Boston. Is it cold? That sounds lovely. Efficiency is key in your line of work. "
            "Hosting a late-night radio show must have made you comfortable with unscripted conversation. Ok.")
    counts: Counter = Counter()
    turn = Turn(id="t0", session_id="s0", speaker="Assistant", role="assistant", text=text)
    claims = HeuristicExtractor().sentence_claims(turn, "User", counts=counts)
    assert len(claims) == 1  # only the first sentence is read
    assert counts == Counter({"assistant/read": 1, "assistant/question": 1, "assistant/reaction": 1,
                              "assistant/phatic": 1, "assistant/unread": 1, "assistant/filler": 1})
    assert {key.split("/")[1] for key in counts} <= set(SENTENCE_OUTCOMES)
    # a user's hedge and a short fragment, and no counts where none are asked for
    user = Turn(id="t1", session_id="s0", speaker="User", role="user", text="I guess so. Mostly dogs.")
    mine: Counter = Counter()
    HeuristicExtractor().sentence_claims(user, "Assistant", counts=mine)
    assert mine == Counter({"user/non_fact": 1, "user/short": 1})
    assert HeuristicExtractor().sentence_claims(user, "Assistant") == []


UNREAD_TURN = ("Hosting a late-night radio show must have made you comfortable with unscripted conversation. "
               "Given your long background in copy-editing, spotting errors in data comes naturally.")


def test_unread_turn_fallback_grounds_a_turn_no_rule_reads():
    from collections import Counter

    turn = Turn(id="t0", session_id="s0", speaker="Assistant", role="assistant", text=UNREAD_TURN)
    on: Counter = Counter()
    [claim] = HeuristicExtractor().sentence_claims(turn, "User", counts=on)
    assert on == Counter({"assistant/fallback": 2})  # no rule read either sentence; the fallback grounds both
    assert claim.predicate == "mentions" and claim.subject == "Assistant"
    assert claim.fact.startswith("Assistant mentions: Hosting a late-night radio show")
    assert "made User comfortable" in claim.fact and "copy-editing" in claim.fact  # both sentences, names rewritten
    assert claim.sentence.startswith("Hosting") and claim.sentence.endswith("conversation.")  # the triple: the first


def test_unread_turn_fallback_leaves_turns_with_a_unit_alone():
    text = "I live in Boston. " + UNREAD_TURN
    turn = Turn(id="t0", session_id="s0", speaker="User", role="user", text=text)
    from collections import Counter

    counts: Counter = Counter()
    on = HeuristicExtractor().sentence_claims(turn, "Assistant", counts=counts)
    assert len(on) == 1 and on[0].predicate != "mentions"  # the turn's own unit, no fallback beside it
    assert counts == Counter({"user/read": 1, "user/unread": 2})
