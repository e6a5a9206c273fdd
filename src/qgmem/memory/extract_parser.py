"""The parser extractor: the heuristic extractor's claims, with their triples read from spaCy.

Which sentences become units, and the fact each unit states, are the heuristic extractor's (its
filters decide coverage: questions, greetings, reactions and platitudes give nothing, one unit per
claim, each grounded in its own turn). What changes is what the *graph* gets: subject, relation and
object come from a dependency parse (:mod:`qgmem.memory.relations`), so "User said X" becomes the
relation inside X, nodes are short entity and noun-phrase spans, and a claim adds further relations
between its spans; entities and date phrases come from spaCy's NER (with the heuristic rules adding
what NER misses, such as acronyms and quoted names). The location stays the heuristic cue rule (a place
after "moved to", "based in", …): NER tags every place a sentence names, and as the unit's location
such a mention ("a flat in Brighton" for a question about a running club before moving to Brighton)
outranked the evidence on the LoCoMo-form fixture; the place is still one of the unit's entities.

Parses are the costly part (~1–3 ms a sentence), so a dialogue's claim sentences are parsed in one
``nlp.pipe`` batch, and readings are memoized by text and names: the same distractor conversations
recur across training cases, and each is parsed once per process.
"""

from __future__ import annotations

import re
from collections import Counter

from qgmem.memory.config import ConstructionConfig
from qgmem.timeexpr import find_fact_time
from qgmem.memory.extract_heuristic import Claim, HeuristicExtractor, find_entities, find_location
from qgmem.memory.nlp import load_pipeline, parse_texts
from qgmem.memory.records import MemoryUnit
from qgmem.memory.relations import Names, Reading, date_phrases, entities, read_claim, thing_antecedents
from qgmem.memory.windows import Window

_MEMO_LIMIT = 200_000
_IT = re.compile(r"\bit\b", re.IGNORECASE)


def _mentions_it(sentence: str) -> bool:
    """Whether a sentence has an "it" to resolve (only then is the sentence before it parsed too)."""
    return _IT.search(sentence) is not None


class ParserExtractor:
    """Claims chosen by the heuristic rules, read by spaCy (see the module docstring)."""

    name = "parser"

    def __init__(self, config: ConstructionConfig | None = None, nlp=None, batch_size: int = 256):
        self.config = config or ConstructionConfig()
        self.heuristic = HeuristicExtractor(self.config)
        self._nlp = nlp
        self.batch_size = batch_size
        self._memo: dict[tuple, tuple[Reading | None, list[str], list[str]]] = {}
        self.parsed_sentences = 0
        self.memo_hits = 0

    @property
    def nlp(self):
        if self._nlp is None:
            self._nlp = load_pipeline()
        return self._nlp

    def _key(self, claim: Claim, speaker: str, listener: str) -> tuple:
        context = (claim.context, claim.context_speaker) if _mentions_it(claim.sentence) else ("", "")
        return (claim.kind, claim.sentence, claim.body, claim.question, claim.asker, speaker, listener,
                claim.antecedent, *context)

    def read(self, items: list[tuple[Claim, str, str]]) -> list[tuple[Reading | None, list[str], list[str]]]:
        """``(reading, entities, date phrases)`` per ``(claim, speaker, listener)``, parsing misses in one batch."""
        keys = [self._key(c, s, li) for c, s, li in items]
        missing = [(k, item) for k, item in zip(keys, items) if k not in self._memo]
        self.memo_hits += len(items) - len(missing)
        if missing:
            texts = [c.sentence for _, (c, _, _) in missing] + [c.question for _, (c, _, _) in missing if c.question]
            texts += [c.context for _, (c, _, _) in missing if c.context and _mentions_it(c.sentence)]
            docs = parse_texts(self.nlp, texts, self.batch_size)
            self.parsed_sentences += len(docs)
            if len(self._memo) + len(missing) > _MEMO_LIMIT:
                self._memo.clear()
            for key, (claim, speaker, listener) in missing:
                doc = docs[claim.sentence]
                names = Names(speaker, listener, claim.antecedent)
                things = {}
                if _mentions_it(claim.sentence):
                    context = docs.get(claim.context) if claim.context else None
                    said_by = claim.context_speaker
                    context_names = names if said_by in ("", speaker) else Names(said_by, speaker)
                    things = thing_antecedents(doc, names, context, context_names)
                    names = Names(speaker, listener, claim.antecedent, {i: t for i, (t, _) in things.items()}, doc)
                reading = read_claim(doc, claim.body or claim.sentence, claim.kind, names,
                                     question_doc=docs.get(claim.question) if claim.question else None,
                                     asker=claim.asker)
                found = entities(doc, {speaker, listener}) + [e for _, ents in things.values() for e in ents]
                self._memo[key] = (reading, list(dict.fromkeys(found)), date_phrases(doc))
        return [self._memo[k] for k in keys]

    def extract_windows(self, windows: list[Window], dialogue_id: str, user_name: str = "User",
                        session_times: dict[str, str | None] | None = None,
                        counts: Counter | None = None) -> list[MemoryUnit]:
        """Units for every window of one dialogue (one parse batch for all of them); ``counts`` gets what
        became of each sentence (:meth:`HeuristicExtractor.sentence_claims`)."""
        session_times = session_times or {}
        pending = []
        for window in windows:
            for turn, listener, utterance_time, claim in self.heuristic.window_claims(
                    window, user_name, session_times.get(window.session_id), counts):
                pending.append((window, turn, listener, utterance_time, claim))
        readings = self.read([(claim, turn.speaker, listener) for _, turn, listener, _, claim in pending])
        units: list[MemoryUnit] = []
        counters: dict[str, int] = {}
        for (window, turn, listener, utterance_time, claim), (reading, ents, dates) in zip(pending, readings):
            if reading is None or not (reading.subject and reading.predicate and reading.object):
                # nothing parsed: the heuristic triple, its object cut to a short span
                obj = " ".join(claim.object.split()[:4]).strip(" ,.;:!\"'")
                reading = Reading(claim.subject, claim.predicate, obj or claim.object)
            fact_time = ""
            for phrase in dates:
                fact_time, _ = find_fact_time(phrase, utterance_time)
                if fact_time:
                    break
            if not fact_time:
                fact_time, _ = find_fact_time(claim.sentence, utterance_time)
            names = {turn.speaker, listener}
            found = list(dict.fromkeys(ents + [e for e in find_entities(claim.sentence) if e not in names]))
            index = counters.get(window.id, 0)
            counters[window.id] = index + 1
            units.append(MemoryUnit(
                id=f"{window.id}.u{index}", dialogue_id=dialogue_id, session_id=window.session_id,
                window_id=window.id, fact=claim.fact, subject=reading.subject, predicate=reading.predicate,
                object=reading.object, relations=[list(r) for r in reading.relations],
                source_turn_ids=[turn.id], source_text=turn.text, speaker=turn.speaker, entities=found,
                location=find_location(claim.sentence), fact_time=fact_time,
                utterance_time=utterance_time, order=turn.index,
            ))
        return units

    def extract(self, window: Window, dialogue_id: str, user_name: str = "User",
                session_time: str | None = None) -> list[MemoryUnit]:
        """Units for one window's new turns (same interface as the heuristic extractor)."""
        return self.extract_windows([window], dialogue_id, user_name, {window.session_id: session_time})
