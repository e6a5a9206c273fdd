"""The heuristic extractor: atomic units from rules, no LLM (the embedded default).

It runs inside the training-data pipeline over hundreds of long dialogues, so it is a handful of
compiled patterns per sentence and nothing else; ``dateparser`` is called only when a date pattern
matched. Per new (non-overlap) turn of a window:

1. split into sentences; drop questions, fillers ("Thanks!"), requests and sentences under
   ``min_words`` words;
2. user side: keep first-person statements ("I'm allergic to shellfish", "My manager reassigned it…");
   assistant side: keep recommendations and statements that carry a name or a number ("Zapier is an
   automation tool…", "Today, you logged 87 calls"), drop empathy and chit-chat;
3. read subject–predicate–object off the sentence (subject up to the first verb; predicate = auxiliaries
   + verb + a particle; object = the rest up to a clause boundary), rewriting first/second person to
   the speaker's or listener's name so the fact stands alone;
4. entities from capitalized spans, acronyms and quotes; a location from cue words ("moved to",
   "based in") or place-like heads ("West Coast"); factual time from :mod:`qgmem.memory.dates`.

Each unit is grounded in exactly the one turn its sentence came from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from qgmem.data.records import Turn
from qgmem.memory.config import ConstructionConfig
from qgmem.memory.dates import find_fact_time
from qgmem.memory.records import MemoryUnit
from qgmem.memory.windows import Window

_ABBREVIATIONS = frozenset({"mr.", "mrs.", "ms.", "dr.", "inc.", "ltd.", "co.", "corp.", "st.", "vs.", "e.g.", "i.e.",
                  "etc.", "jr.", "sr.", "u.s.", "approx.", "no."})
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])|\n+")
_LEADING = re.compile(
    r"^(?:(?:and|but|so|also|well|oh|ah|actually|honestly|anyway|plus|yeah|yes|yep|no|okay|ok|alright|"
    r"right|see|look|basically|fun fact|by the way|btw|just so you know|funny enough|speaking of which|"
    r"exactly|definitely|absolutely|sure|great|wow|hmm|ugh|haha|lol|then|now|still|hopefully|luckily|"
    r"unfortunately|fortunately|sadly|apparently|anyhow|besides|otherwise|meanwhile|however)\b[\s,:;.!-]*)+",
    re.IGNORECASE,
)
_FILLER = re.compile(
    r"^(?:thanks|thank you|thx|hi|hello|hey|good (?:morning|afternoon|evening|night)|bye|goodbye|see you|"
    r"talk (?:to you )?(?:soon|later)|you're welcome|no problem|no worries|sounds good|got it|of course|"
    r"have a (?:good|great|nice)|appreciate it|i appreciate|cheers|take care|you too|me too|same here)\b",
    re.IGNORECASE,
)
_REQUEST = re.compile(
    r"^(?:please|let me|let's|lets|remind me|tell me|help me|show me|give me|pull up|can you|could you|"
    r"would you|will you|do you|did you|what|how|why|where|when|which|who|is there|are there|any (?:tips|ideas)|"
    r"i (?:was wondering|wonder|need you|want you|'d like you|would like you)|i'm (?:curious|wondering))\b",
    re.IGNORECASE,
)
_NON_FACT_USER = re.compile(
    r"^i(?:'m| am)? (?:don't know|not sure|guess|hope|agree|understand|see|mean|suppose|can't wait|"
    r"appreciate|love that|like that|was just thinking|'ll try|will try|'ll think|will think|"
    r"know(?=[,.!]|$)|think so|wish)\b",
    re.IGNORECASE,
)
_PHATIC_ASSISTANT = re.compile(
    r"\b(?:sounds?|sounding|i can (?:imagine|see|understand)|i understand|i see|must be|glad|happy to|"
    r"i'm sorry|sorry to hear|good luck|congrat\w*|hope|that's (?:great|a great|wonderful|fantastic|"
    r"excellent|amazing|awesome|smart|clever|understandable|fair|incredibly|really|very|so|a (?:smart|"
    r"good|great|fantastic|solid|strong|huge))|it's (?:great|good|wonderful|understandable|interesting|"
    r"clear)|it seems|feel free|let me know|i'd be happy|absolutely|what a)\b",
    re.IGNORECASE,
)
_RECOMMEND = re.compile(
    r"\b(?:i(?:'d| would)? (?:recommend|suggest|advise)|(?:you|we) (?:could|might|should|can) (?:try|use|"
    r"consider|look into|set up)|consider (?:using|trying)|try (?:using|setting)|one option is|"
    r"a good option is|my suggestion is|the best (?:way|option|tool) is)\b",
    re.IGNORECASE,
)
# "Today, you logged…", "Last week, I moved…": a short lead-in before a personal subject.
_LEAD_IN = re.compile(r"^[^,]{1,32},\s+(?=(?:I|I'm|I've|I'd|I'll|we|We|you|You|my|My|our|Our|your|Your)\b)")
_FIRST_PERSON = re.compile(r"\b(?:i|i'm|i've|i'd|i'll|my|me|we|we're|we've|our)\b", re.IGNORECASE)
_HAS_NUMBER = re.compile(r"\d")
_WORD = re.compile(r"\S+")
_CLAUSE_CUT = re.compile(
    r"\s*(?:;|:|\s[-–—]\s|,\s*(?:but|so|which|because|although|though|while|since|and then|and i|and we|"
    r"and it|and they|and he|and she)\b|\s(?:because|although|though|whereas)\s)",
    re.IGNORECASE,
)

_AUX = {
    "am", "is", "are", "was", "were", "be", "been", "being", "have", "has", "had", "do", "does", "did",
    "will", "would", "shall", "should", "can", "could", "may", "might", "must", "'m", "'s", "'re", "'ve",
    "'d", "'ll", "don't", "doesn't", "didn't", "won't", "wouldn't", "can't", "couldn't", "isn't", "aren't",
    "wasn't", "weren't", "haven't", "hasn't", "hadn't", "shouldn't", "got", "gotta", "gonna",
}
_COPULA = {"am", "is", "are", "was", "were", "be", "been", "being", "'m", "'s", "'re"}
_ADVERBS = {
    "just", "really", "actually", "also", "still", "usually", "always", "never", "finally", "recently",
    "currently", "now", "definitely", "already", "often", "sometimes", "even", "only", "mostly", "totally",
    "officially", "basically", "literally", "probably", "typically", "generally", "not", "no", "longer",
    "personally", "mainly", "honestly", "absolutely", "completely", "simply", "then", "again", "all",
}
_NUMBER_WORDS = {"two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "several", "many",
                 "few", "no", "twenty", "thirty", "hundred", "dozen", "lots", "plenty", "more", "less"}
_CONNECTORS = {"why", "that", "what", "because", "so", "since", "and", "when", "where", "how", "which",
               "after", "before", "until", "once", "but", "where", "while"}
_EMPTY_OBJECTS = {"it", "that", "this", "so", "too", "them", "there", "here", "one", "not", "well"}
_PARTICLES = {"in", "to", "at", "for", "with", "on", "from", "about", "into", "up", "out", "back", "as",
              "by", "of", "off", "over", "onto", "through", "like"}
_IRREGULAR_PAST = {
    "went", "got", "had", "made", "took", "said", "told", "came", "saw", "found", "gave", "bought", "brought",
    "thought", "felt", "left", "met", "paid", "sent", "spent", "built", "began", "became", "ran", "wrote",
    "won", "lost", "kept", "heard", "held", "led", "set", "put", "quit", "sold", "taught", "understood",
    "drove", "flew", "grew", "knew", "threw", "ate", "fell", "forgot", "chose", "spoke", "woke", "wore",
    "did", "was", "were", "could", "would", "should", "might", "must", "read", "cut", "hit", "let", "shut",
}
_DETERMINERS = {"the", "a", "an", "this", "that", "these", "those", "their", "his", "her", "its", "our",
                "my", "your", "some", "every", "each", "one"}
_NOT_NAMES = {
    "i", "i'm", "i've", "i'd", "i'll", "the", "a", "an", "this", "that", "these", "those", "it", "it's",
    "there", "here", "what", "my", "our", "your", "we", "you", "he", "she", "they", "his", "her", "their",
    "if", "when", "while", "after", "before", "since", "so", "but", "and", "or", "also", "just", "today",
    "yesterday", "tomorrow", "tonight", "user", "assistant", "ok", "okay", "yes", "no", "yeah", "oh",
    "monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday", "january", "february",
    "march", "april", "june", "july", "august", "september", "october", "november", "december", "one",
    "two", "three", "both", "all", "some", "every", "each", "any", "as", "at", "in", "on", "for", "with",
    "from", "to", "of", "by", "not", "then", "now", "once", "even", "maybe", "perhaps", "thanks", "great",
}
_CAPITALIZED = re.compile(
    r"(?<![\w'])((?:[A-Z][\w&'’.-]*[\w]|[A-Z])(?:\s+(?:of|de|and|&|[A-Z][\w&'’.-]*[\w]|[A-Z]))*"
    r"(?:\s+(?:Inc|Corp|LLC|Ltd|Co)\.?)?)"
)
_NAME_SHAPE = re.compile(r"^.+[A-Z]|\d|^[A-Z]{2,}")
_QUOTED = re.compile(r"[\"“']([A-Z][^\"”']{1,40})[\"”']")
_LOCATION_CUE = re.compile(
    r"\b(?:live[sd]?|living|moved|moving|move|relocat\w+|based|born|grew up|raised|travel\w*|trip|flew|fly|"
    r"flying|visit\w*|vacation\w*|headed|heading|went|going|stay\w*|from|near|located|office)\s+"
    r"(?:\w+\s+){0,2}?(?:in|to|at|from|near|around)?\s*((?:the\s+)?[A-Z][\w'-]+(?:\s+[A-Z][\w'-]+){0,3})"
)
_PLACE_HEAD = re.compile(
    r"\b((?:North|South|East|West|Upper|Lower|New)?\s?[A-Z][\w'-]*\s+(?:Coast|City|County|State|Street|"
    r"Avenue|Park|Island|Islands|Valley|Beach|Lake|Mountains?|Bay|Harbor|Square|Village|Downtown|Airport))\b"
)
_ORG_SUFFIX = re.compile(r"\b(?:Inc|Corp|LLC|Ltd|Co|Company|Group|Labs|Systems|Solutions|Software)\b")


@dataclass
class Claim:
    """One sentence read as a claim: the triple, the rewritten fact and the sentence it came from."""

    subject: str
    predicate: str
    object: str
    fact: str
    sentence: str


def split_sentences(text: str) -> list[str]:
    """Sentences of a turn; abbreviations such as "Inc." or "Dr." do not end one."""
    parts = [p.strip() for p in _SENTENCE_END.split(text) if p and p.strip()]
    merged: list[str] = []
    for part in parts:
        if merged and merged[-1].rsplit(None, 1)[-1].lower() in _ABBREVIATIONS:
            merged[-1] = f"{merged[-1]} {part}"
        else:
            merged.append(part)
    return merged


def _normalize(text: str) -> str:
    return text.replace("’", "'").replace("‘", "'").replace("“", '"').replace("”", '"')


def _is_verb(token: str) -> bool:
    t = token.lower().strip(",.;:!")
    if t in _AUX or t in _IRREGULAR_PAST:
        return True
    if t in _DETERMINERS or t in _PARTICLES or len(t) < 3 or not t.isalpha():
        return False
    return t.endswith("ed") or (t.endswith("s") and not t.endswith(("ss", "us", "is", "ics", "ness")))


def _third_person(verb: str) -> str:
    """Agreement for a main verb after a first/second-person subject became a name ("use" -> "uses")."""
    low = verb.lower()
    fixed = {"am": "is", "'m": "is", "are": "is", "'re": "is", "have": "has", "'ve": "has", "do": "does",
             "don't": "doesn't", "'d": "would", "'ll": "will", "were": "was", "aren't": "isn't",
             "haven't": "hasn't", "weren't": "wasn't"}
    if low in fixed:
        return fixed[low]
    if low in _AUX or low in _IRREGULAR_PAST or not low.isalpha() or (low.endswith("ed") and not low.endswith("eed")) or (
            low.endswith("s") and not low.endswith("ss")):
        return verb
    if low.endswith(("sh", "ch", "x", "z", "o", "ss")):
        return verb + "es"
    if low.endswith("y") and len(low) > 2 and low[-2] not in "aeiou":
        return verb[:-1] + "ies"
    return verb + "s"


def _split_contraction(token: str) -> list[str]:
    low = token.lower()
    for suffix in ("'m", "'ve", "'d", "'ll", "'re"):
        if low.endswith(suffix) and len(low) > len(suffix):
            return [token[: -len(suffix)], suffix]
    if low in ("it's", "that's", "he's", "she's", "there's", "what's"):
        return [token[:-2], "'s"]
    return [token]


class _Rewriter:
    """Rewrites first person to the speaker and second person to the listener, as whole words."""

    def __init__(self, speaker: str, listener: str):
        self.map = {
            "i": speaker, "me": speaker, "myself": speaker, "my": f"{speaker}'s", "mine": f"{speaker}'s",
            "we": speaker, "us": speaker, "our": f"{speaker}'s", "ours": f"{speaker}'s",
            "you": listener, "your": f"{listener}'s", "yours": f"{listener}'s", "yourself": listener,
        }

    _EXPANDED = {"'m": "is", "'ve": "has", "'d": "would", "'ll": "will", "'re": "is", "'s": "is"}

    def __call__(self, tokens: list[str]) -> str:
        out: list[str] = []
        rewritten_before = False
        for tok in tokens:
            low = tok.lower()
            if low in self._EXPANDED and out:  # a contraction split off by the tokenizer
                if rewritten_before:
                    out.append(self._EXPANDED[low])
                else:
                    out[-1] += tok
                rewritten_before = False
                continue
            core = tok.strip(",.;:!\"")
            repl = self.map.get(core.lower())
            out.append(tok.replace(core, repl, 1) if repl and core else tok)
            rewritten_before = bool(repl)
        return " ".join(out)


def parse_claim(sentence: str, speaker: str, listener: str, *, assistant: bool) -> Claim | None:
    """Read subject–predicate–object off a declarative sentence, or ``None`` when there is no clause."""
    tokens: list[str] = []
    for tok in _WORD.findall(sentence):
        tokens.extend(_split_contraction(tok))
    if len(tokens) < 3:
        return None
    low = [t.lower().strip(",.;:!\"") for t in tokens]
    rewrite = _Rewriter(speaker, listener)

    start = 0
    if low[0] in ("i", "we"):
        subject, verb_at = speaker, 1
    elif low[0] in ("you",) and assistant:
        subject, verb_at = listener, 1
    elif low[0] in ("my", "our", "your", "the", "this", "his", "her", "their") or (
        tokens[0][:1].isupper() and low[0] not in _NOT_NAMES and not low[0].endswith(("ing", "ly"))
    ):
        verb_at = next((i for i in range(1, min(len(tokens), 7)) if _is_verb(tokens[i])), None)
        if verb_at is None:
            return None
        np = tokens[:verb_at]
        if low[0] in ("the", "this"):
            np = np[1:]
        subject = rewrite(np) if np else ""
    else:
        # "That's why I still keep my own spreadsheet": the claim starts at a later first-person clause.
        start = next((i for i in range(1, len(tokens) - 2)
                      if low[i] in ("i", "we") and low[i - 1] in _CONNECTORS), None)
        if start is None:
            return None
        subject, verb_at = speaker, start + 1
    subject = subject.strip(",.;:!\" ")
    if not subject:
        return None

    # Predicate: auxiliaries/adverbs, one main verb, then an optional "adjective + particle" or particle.
    i = verb_at
    pred: list[str] = []
    while i < len(tokens) and (low[i] in _AUX or low[i] in _ADVERBS):
        pred.append(tokens[i])
        i += 1
    if i < len(tokens) and not (pred and pred[-1].lower() in _COPULA):
        if low[i] in _DETERMINERS or low[i] in _PARTICLES or low[i] in _NUMBER_WORDS or not low[i].isalpha():
            if not pred:
                return None
        else:
            pred.append(tokens[i])
            i += 1
    elif i < len(tokens) and low[i].endswith("ing") and low[i].isalpha() and len(low[i]) > 4:
        pred.append(tokens[i])  # progressive: "is doing", "was thinking"
        i += 1
    elif i + 1 < len(tokens) and low[i + 1] in _PARTICLES and low[i] not in _DETERMINERS:
        pred.extend(tokens[i:i + 2])  # "am allergic to", "is based in"
        i += 2
    if i < len(tokens) and low[i] in _PARTICLES and low[i] not in ("of", "like", "as", "about", "up") and pred:
        pred.append(tokens[i])
        i += 1
    if not pred:
        return None
    if low[verb_at - 1] in ("i", "we", "you"):
        head = next((k for k, p in enumerate(pred) if p.lower() not in _ADVERBS), None)
        if head is not None:
            pred[head] = _third_person(pred[head])
    predicate = " ".join(p.strip(",.;:!\"") for p in pred).replace(" 's", " is").strip()
    predicate = {"'s": "is", "'re": "is", "'m": "is"}.get(predicate, predicate)

    rest_tokens = tokens[i:]
    rest = rewrite(rest_tokens)
    cut = _CLAUSE_CUT.search(rest)
    obj = (rest[: cut.start()] if cut else rest).strip(" ,.;:!\"'")
    if not obj or not predicate or obj.lower() in _EMPTY_OBJECTS or obj == subject:
        return None
    obj_words = obj.split()
    if len(obj_words) > 16:
        obj = " ".join(obj_words[:16])
    fact_rest = rest.strip().rstrip(".!")
    fact = f"{subject} {predicate} {fact_rest}".strip()
    return Claim(subject=subject, predicate=predicate.lower(), object=obj, fact=fact + ".", sentence=sentence)


def recommendation_claim(sentence: str, match: re.Match, speaker: str, listener: str) -> Claim | None:
    """An assistant's advice: "<speaker> recommends <what>", keeping a leading condition as context."""
    rewrite = _Rewriter(speaker, listener)
    rest = rewrite(sentence[match.end():].split()).strip(" ,.;:!")
    if not rest:
        return None
    cut = _CLAUSE_CUT.search(rest)
    obj = " ".join((rest[: cut.start()] if cut else rest).split()[:16]).strip(" ,.;:!")
    context = rewrite(sentence[: match.start()].split()).strip(" ,.;:!")
    fact = f"{speaker} recommends {rest}" + (f" ({context})" if len(context.split()) >= 3 else "")
    return Claim(subject=speaker, predicate="recommends", object=obj or rest, fact=fact + ".", sentence=sentence)


def find_entities(sentence: str) -> list[str]:
    """Capitalized spans (not sentence-initial function words), acronyms and quoted names, in order."""
    seen: dict[str, None] = {}
    for m in _CAPITALIZED.finditer(sentence):
        span = m.group(1).strip(" .'’-")
        words = span.split()
        if m.start(1) <= 1 and len(words) == 1 and not _NAME_SHAPE.search(span):
            continue  # a lone sentence-initial capital is just grammar ("Consistency is key")
        while words and words[0].lower().strip(".'’") in _NOT_NAMES:
            words = words[1:]
        while words and words[-1].lower() in ("of", "de", "and", "&"):
            words = words[:-1]
        if not words:
            continue
        span = " ".join(words)
        if len(span) > 1 or span.isupper():
            seen.setdefault(span, None)
    for m in _QUOTED.finditer(sentence):
        seen.setdefault(m.group(1).strip(), None)
    return [e for e in seen if e.lower() not in ("i", "user", "assistant")]


def find_location(sentence: str) -> str:
    """A place named after a motion/residence cue or with a place-like head word; ``""`` when none."""
    for pattern in (_LOCATION_CUE, _PLACE_HEAD):
        for m in pattern.finditer(sentence):
            span = m.group(1).strip()
            span = re.sub(r"^the\s+", "", span)
            first = span.split()[0].lower() if span else ""
            if not span or first in _NOT_NAMES or _ORG_SUFFIX.search(span) or span.isupper():
                continue
            return span
    return ""


class HeuristicExtractor:
    """Rule-based atomic units; deterministic and fast (see the module docstring for the rules)."""

    name = "heuristic"

    def __init__(self, config: ConstructionConfig | None = None):
        self.config = config or ConstructionConfig()

    def sentence_claims(self, turn: Turn, listener: str) -> list[Claim]:
        """The claims one turn states (empty for chit-chat, questions and requests)."""
        assistant = turn.role.lower() == "assistant"
        claims = []
        for raw in split_sentences(_normalize(turn.text)):
            sentence = original = raw.strip()
            if sentence.endswith("?") or _FILLER.match(sentence):
                continue
            sentence = _LEAD_IN.sub("", _LEADING.sub("", sentence).strip())
            if not sentence or len(sentence.split()) < self.config.min_words:
                continue
            if _FILLER.match(sentence) or _REQUEST.match(sentence):
                continue
            if assistant:
                recommends = _RECOMMEND.search(sentence) is not None
                if not recommends and (_PHATIC_ASSISTANT.search(sentence) or not (
                        _HAS_NUMBER.search(sentence) or find_entities(sentence))):
                    continue
            elif _NON_FACT_USER.match(sentence):
                continue
            elif not _FIRST_PERSON.search(sentence) and not (
                    _HAS_NUMBER.search(sentence) or find_entities(sentence)):
                continue
            recommendation = _RECOMMEND.search(sentence) if assistant else None
            if recommendation is not None:
                claim = recommendation_claim(sentence, recommendation, turn.speaker, listener)
            else:
                claim = parse_claim(sentence, turn.speaker, listener, assistant=assistant)
            if claim is not None:
                claim.sentence = original  # dates, names and places are read from the whole sentence
                claims.append(claim)
        return claims

    def extract(self, window: Window, dialogue_id: str, user_name: str = "User",
                session_time: str | None = None) -> list[MemoryUnit]:
        """Units for the window's new turns; each is grounded in exactly its own turn."""
        units: list[MemoryUnit] = []
        # "you" means whoever spoke just before (overlap turns included), else the other party.
        previous = {t.id: (window.turns[i - 1].speaker if i else None) for i, t in enumerate(window.turns)}
        for turn in window.new_turns:
            listener = previous[turn.id] or user_name
            if listener == turn.speaker:
                listener = user_name if turn.role.lower() == "assistant" else "Assistant"
            utterance_time = turn.time or session_time
            for claim in self.sentence_claims(turn, listener):
                fact_time, _ = find_fact_time(claim.sentence, utterance_time)
                units.append(MemoryUnit(
                    id=f"{window.id}.u{len(units)}", dialogue_id=dialogue_id, session_id=window.session_id,
                    window_id=window.id, fact=claim.fact, subject=claim.subject, predicate=claim.predicate,
                    object=claim.object, source_turn_ids=[turn.id], source_text=turn.text,
                    speaker=turn.speaker, entities=find_entities(claim.sentence),
                    location=find_location(claim.sentence), fact_time=fact_time,
                    utterance_time=utterance_time, order=turn.index,
                ))
        return units
