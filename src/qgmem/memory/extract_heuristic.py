"""The heuristic extractor: atomic units from rules, no LLM (its claims are what the parser extractor reads).

It runs inside the training-data pipeline over hundreds of long dialogues, so it is a handful of
compiled patterns per sentence and nothing else (factual time comes from :mod:`qgmem.timeexpr`'s own
patterns; no date-parsing library is called). Per new (non-overlap) turn of a window:

1. split into sentences; shared images (``[shares an image: …]``) become a claim of their own; drop
   questions, greetings/thanks, requests, reactions to the other speaker ("That's lovely.") and, on
   the assistant side, empathy and platitudes;
2. strip what carries no content: interjections, a vocative ("Priya, …"), an announcement before a
   colon ("Big news: …") and a short lead-in before a personal subject ("Saturdays I'm …");
3. read subject–predicate–object off every remaining declarative clause (subject up to the first
   verb, or the speaker for subject-less "Had a chat with…"; predicate = auxiliaries + verb + a
   particle; object = the rest up to a clause boundary), rewriting first/second person to the
   speaker's or listener's name and "he/she/they" to the last name mentioned, so the fact stands alone;
4. a sentence with no clause ("Mostly the older dogs.", "No, the other leg, the left ankle.") is kept
   when it answers the other speaker's question — the question (a context turn, possibly from the
   window's overlap) is quoted in the fact so the reply is readable alone — or when it names something;
5. entities from capitalized spans, acronyms and quotes; a location from cue words ("moved to",
   "based in") or place-like heads ("West Coast"); factual time from :mod:`qgmem.timeexpr`.

Each unit is grounded in exactly the one turn its sentence came from; a quoted question only explains
it.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from qgmem.data.records import Turn
from qgmem.memory.config import ConstructionConfig
from qgmem.text.pronouns import AGREEMENT, pronouns
from qgmem.timeexpr import find_fact_time
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
    r"have a (?:good|great|nice)|appreciate it|i appreciate|cheers|take care|you too|me too|same here|"
    r"greetings|long time no see|welcome back|nice to (?:see|hear|meet))\b",
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
    r"a good option is|my suggestion is|the (?:best|easiest|simplest|most effective) (?:way|option|tool|approach|"
    r"strategy|practice|move|bet) (?:is|would be)|a good (?:way|approach|strategy|idea) (?:is|would be)|"
    r"it's (?:best|a good idea|worth) to)\b",
    re.IGNORECASE,
)
# Advice phrased as an imperative at the start of an assistant sentence ("Try something like this: …").
_IMPERATIVE_ADVICE = re.compile(
    r"^(?:try|use|consider|start|focus on|keep|make sure|remember to|aim|set up|schedule|follow|highlight|"
    r"emphasize|mention|include|avoid|don't forget|reach out|prioritize|block|break|add|create|draft|lead with|"
    r"open with|frame|position|ask (?:them|about|for))\b",
    re.IGNORECASE,
)
# Reactions to what the other speaker said: no claim of their own.
_REACTION = re.compile(
    r"^(?:that(?:'s| is| was| sounds| must| seems)|this (?:is|sounds) (?:so |really )?(?:great|amazing|awesome|"
    r"wonderful|exciting|fun|cool)|it (?:sounds|must be)|sounds|what a|how (?:nice|cool|great|fun|lovely|"
    r"sweet|exciting|awful|sad|wonderful)|so (?:happy|glad|sorry|proud)|(?:i'm|i am) (?:so |really )?(?:happy|"
    r"glad|sorry|proud) (?:for|to hear|of)|glad|sorry|good (?:for you|idea|luck|call|point|question|job)|"
    r"happy (?:for|news|to hear)|proud of|love (?:that|it|this)|congrat\w*|well done|nice|cool|awesome|"
    r"amazing|wonderful|fantastic|brilliant|lovely|perfect|cute|smart|classic|ouch|jealous|no way|not again|"
    r"take care|you (?:must|should) (?:be|feel|miss)|i bet|i can (?:imagine|tell)|makes sense|fair enough|"
    r"practice makes|it's (?:great|good|nice|wonderful|awesome|amazing|so good|lovely) (?:to|that))\b",
    re.IGNORECASE,
)
# Generic advice with no content of its own ("Efficiency is key in your line of work").
_PLATITUDE = re.compile(
    r"\b(?:is|are|can be|'s|'re) (?:so |really |absolutely |incredibly )?(?:key|crucial|important|essential|vital|"
    r"everything|tough|hard|challenging|tricky|normal|common|natural|understandable|lovely|beautiful|great|"
    r"wonderful|amazing|fantastic|awesome|nice|gorgeous|stunning)\b",
    re.IGNORECASE,
)
# Greeting questions do not make the next turn an answer ("How have you been?").
_GREETING_QUESTION = re.compile(
    r"^(?:(?:hi|hey|hello)\b.*)?(?:how (?:are|have) you(?: been| doing)?|how's it going|how are things|"
    r"what's up|how is everything|how's everything|how's life)\W*$",
    re.IGNORECASE,
)
_IMAGE = re.compile(
    r"\[(?:shares?|shared|sends?|sent|posts?|posted)\s+(?:an?\s+)?(?:image|photo|picture|video|screenshot)"
    r"(?:\s+of)?\s*:?\s*([^\]]*)\]",
    re.IGNORECASE,
)
# "Big news: …", "Work news from me: …", "I have a small update too: …": the claim follows the colon.
_ANNOUNCEMENT = re.compile(
    r"\b(?:news|update|fun fact|guess what|heads up|fyi|reminder|confession|plot twist|good news|bad news)\b",
    re.IGNORECASE,
)
_EDGE_PUNCT = ",.;:!\" "
_CONTRACTED = {"'s": "is", "'re": "are", "'m": "is", "'ve": "have", "'d": "would", "'ll": "will"}
_CONJUNCTION = re.compile(r",\s*(?:but|and|so)\s+", re.IGNORECASE)
_PERSONAL_PRONOUNS = pronouns(3, "subject")
_TIME_WORDS = {
    "mondays", "tuesdays", "wednesdays", "thursdays", "fridays", "saturdays", "sundays", "weekends", "mornings",
    "evenings", "nights", "afternoons", "weekdays", "lately", "recently", "usually", "mostly", "only", "about",
    "around", "almost", "nearly", "roughly", "maybe", "perhaps", "probably", "still", "sometimes", "often",
    "always", "never", "last", "next", "every", "this", "yesterday", "today", "tonight", "tomorrow", "earlier",
    "later", "once", "twice", "since", "until", "after", "before", "during", "in", "on", "at", "for",
}
_SUBJECT_DETERMINERS = {"my", "our", "your", "the", "this", "his", "her", "their", "a", "an", "these", "those",
                        "its", "some", "each", "every", "many", "most", "both", "another"}
_NP_BREAKERS = {"but", "so", "because", "if", "when", "while", "than"}
_NOT_PAST_FIRST = {"was", "were", "did", "could", "would", "should", "might", "must", "read", "let", "set", "put",
                   "cut", "hit", "shut", "need", "indeed", "used", "based", "red", "bed", "speed", "seed", "feed"}
# "Today, you logged…", "Last week, I moved…": a short lead-in before a personal subject.
_LEAD_IN = re.compile(r"^[^,]{1,32},\s+(?=(?:I|I'm|I've|I'd|I'll|we|We|you|You|my|My|our|Our|your|Your)\b)")
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
    "did", "does", "do", "is", "are", "was", "were", "has", "have", "can", "could", "will", "would", "should",
    "how", "where", "why", "who", "which", "greetings", "morning", "mondays", "tuesdays", "wednesdays",
    "thursdays", "fridays", "saturdays", "sundays", "weekends",
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
    # How the sentence was read, for the parser extractor, which re-reads the triple from a parse:
    # ``kind`` is clause | advice | reply | fragment | image; ``body`` the part of the sentence that
    # states the claim (after interjections, vocatives and lead-ins); ``question`` what a reply answers.
    kind: str = "clause"
    body: str = ""
    question: str = ""
    asker: str = ""
    antecedent: str | None = None
    # the sentence said just before this one (earlier in the turn, else the turn before's last) and
    # who said it: where the parser extractor looks for what an object "it" refers to
    context: str = ""
    context_speaker: str = ""


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


def third_person_verb(verb: str) -> str:
    """Agreement for a main verb after a first/second-person subject became a name ("use" -> "uses")."""
    low = verb.lower()
    if low in AGREEMENT:
        return AGREEMENT[low]
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
        self.map = {}
        for person, name in ((1, speaker), (2, listener)):
            # without a parse: no informal spellings ("u"), and only the singular reflexive ("ourselves"
            # stays as written, as it always has)
            self.map.update(dict.fromkeys(pronouns(person, "subject", "object")
                                          | pronouns(person, "reflexive", plural=False), name))
            self.map.update(dict.fromkeys(pronouns(person, "possessive"), f"{name}'s"))

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


def _subjectless_verb(low: list[str]) -> int | None:
    """Index of the past-tense verb opening a subject-less sentence ("Had a great chat with…"), else ``None``."""
    i = 0
    while i < len(low) - 1 and low[i] in ("just", "finally", "also", "actually", "recently", "already"):
        i += 1
    word = low[i]
    if word in _NOT_PAST_FIRST or not word.isalpha():
        return None
    if word in _IRREGULAR_PAST or (len(word) > 4 and word.endswith("ed")):
        return i
    return None


def _verb_here(low: list[str], i: int) -> bool:
    """Whether a verb-looking word is the verb here: "am" needs "I"; "years"/"insights" before an
    auxiliary ("Six years is…") or after a number ("Ten minutes…") are plural nouns."""
    word = low[i]
    if word in ("am", "'m"):
        return low[i - 1] == "i"
    if word in _AUX or word in _IRREGULAR_PAST:
        return True
    if i + 1 < len(low) and low[i + 1] in _AUX:
        return False
    return not (low[i - 1] in _NUMBER_WORDS or low[i - 1].isdigit() or low[i - 1] in ("ten", "one"))


def _np_is_plausible(np_low: list[str]) -> bool:
    """A subject noun phrase: no conjunction or bare number inside, no dangling determiner at its end
    ("A bit, but the shelter", "the other leg, the" are not subjects)."""
    return (not any(w in _NP_BREAKERS or w.isdigit() for w in np_low[1:]) and not np_low[0].isdigit()
            and np_low[-1] not in _DETERMINERS)


def parse_claim(sentence: str, speaker: str, listener: str, *, assistant: bool,
                antecedent: str | None = None) -> Claim | None:
    """Read subject–predicate–object off a declarative sentence, or ``None`` when there is no clause.

    ``antecedent`` is the last name mentioned before the sentence: it replaces a subject "he/she/they".
    """
    raw = _WORD.findall(sentence)
    tokens: list[str] = []
    for k, tok in enumerate(raw):
        following = raw[k + 1].lower() if k + 1 < len(raw) else ""
        if (tok.lower().endswith("'s") and len(tok) > 3 and tok[:1].isupper() and k < 4
                and (following in ("been", "got", "gotten", "going", "getting", "always", "never", "just", "not")
                     or (following.endswith("ing") and len(following) > 4))):
            tokens.extend([tok[:-2], "'s"])  # "Cooper's been waiting": a contraction, not a possessive
        else:
            tokens.extend(_split_contraction(tok))
    if len(tokens) < 3:
        return None
    low = [t.lower().strip(",.;:!\"") for t in tokens]
    rewrite = _Rewriter(speaker, listener)

    start = 0
    fact_subject = ""
    lead: list[str] = []  # a short lead-in kept in the fact ("Saturdays", "Yesterday")
    personal = next((j for j in range(min(4, len(tokens) - 1)) if low[j] in ("i", "we")), None)
    if personal is not None and personal > 0 and not all(
            low[j] in _TIME_WORDS or low[j] == "and" or not _is_verb(tokens[j]) for j in range(personal)):
        personal = None
    subjectless = _subjectless_verb(low) if tokens[0][:1].isupper() else None
    if personal is not None and personal > 0 and low[personal - 1] == "and":
        subject, verb_at = rewrite(tokens[: personal + 1]), personal + 1  # "Arjun and I did…"
    elif personal is not None:
        subject, verb_at, lead = speaker, personal + 1, tokens[:personal]
    elif low[0] == "you" and assistant:
        subject, verb_at = listener, 1
    elif low[0] in _PERSONAL_PRONOUNS:
        subject, verb_at = (antecedent or tokens[0]), 1
    elif subjectless is not None:
        subject, verb_at = speaker, subjectless
    elif low[0] in ("there", "here") and low[1] in ("'s", "is", "are", "was", "were"):
        rest = rewrite(tokens[2:]).strip(" ,.;:!\"'")
        cut = _CLAUSE_CUT.search(rest)
        obj = " ".join((rest[: cut.start()] if cut else rest).split()[:16]).strip(" ,.;:!\"'")
        if not obj or obj.lower() in _EMPTY_OBJECTS:
            return None
        fact = rewrite(tokens).replace(" 's ", " is ").rstrip(".!")
        fact = re.sub(r"^(There|Here)'s\b", r"\1 is", fact)
        return Claim(subject=speaker, predicate="mentions", object=obj, fact=fact + ".", sentence=sentence)
    elif low[0] in _SUBJECT_DETERMINERS or (
        tokens[0][:1].isupper() and low[0] not in _NOT_NAMES and low[0] not in _TIME_WORDS
        and not low[0].endswith(("ing", "ly"))
    ):
        verb_at = next((i for i in range(1, min(len(tokens), 7)) if _is_verb(tokens[i]) and _verb_here(low, i)), None)
        if verb_at is None:
            return None
        np = tokens[:verb_at]
        if not _np_is_plausible([w.lower().strip(",.") for w in np]):
            return None
        fact_subject = rewrite(np)
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
    if not subject or verb_at >= len(tokens):
        return None

    # Predicate: auxiliaries/adverbs, one main verb, then an optional "adjective + particle" or particle.
    i = verb_at
    pred: list[str] = []
    while i < len(tokens) and (low[i] in _AUX or low[i] in _ADVERBS):
        pred.append(tokens[i])
        i += 1
    if i < len(tokens) and not (pred and low[i - 1] in _COPULA):
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
    if not pred or (pred[-1].endswith(",") and i < len(tokens) and low[i] in ("but", "and", "so")):
        return None
    if low[verb_at - 1] in ("i", "we", "you"):
        head = next((k for k, p in enumerate(pred) if p.lower() not in _ADVERBS), None)
        if head is not None:
            pred[head] = third_person_verb(pred[head])
    words = [p.strip(",.;:!\"") for p in pred]
    if words[0] in _CONTRACTED:  # "Cooper 's been waiting" -> "Cooper has been waiting"
        perfect = len(words) > 1 and words[1].lower() in ("been", "got", "gotten", "had")
        words[0] = "has" if words[0] == "'s" and perfect else _CONTRACTED[words[0]]
    predicate = " ".join(words).replace(" 's", " is").strip()

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
    fact_subject = fact_subject.strip(_EDGE_PUNCT) or subject
    fact = f"{fact_subject} {predicate} {fact_rest}".strip()
    if lead:
        fact = f"{rewrite(lead).strip(' ,')} {fact}"
    fact = fact[:1].upper() + fact[1:]
    return Claim(subject=subject, predicate=predicate.lower(), object=obj, fact=fact + ".", sentence=sentence)


def fragment_claim(text: str, speaker: str, listener: str, question: str | None = None,
                   asker: str | None = None) -> Claim | None:
    """A sentence without a clause, kept as what ``speaker`` says; a reply quotes the question it answers.

    "No, the other leg, the left ankle." after "Same leg as the knee?" becomes
    ``Priya, asked "Same leg as the knee?": No, the other leg, the left ankle.`` — the question makes
    the reply readable alone, while the unit stays grounded in the reply's own turn.
    """
    body = _Rewriter(speaker, listener)(text.split()).strip(" ,;:")
    body = body.rstrip(".!")
    if not body:
        return None
    obj = " ".join(body.split()[:16]).strip(" ,.;:!\"'")
    if question:
        asked = _Rewriter(asker or listener, speaker)(question.split()).strip()
        return Claim(subject=speaker, predicate="answers", object=obj,
                     fact=f'{speaker}, asked "{asked}": {body}.', sentence=text)
    return Claim(subject=speaker, predicate="mentions", object=obj, fact=f"{speaker} mentions: {body}.",
                 sentence=text)


def image_claim(caption: str, speaker: str, context: str = "") -> Claim | None:
    """A shared image as a claim: its caption is what the turn shows ("Melanie shares an image: …")."""
    caption = caption.strip(" .:")
    if not caption:
        return None
    fact = f"{speaker} shares an image: {caption}"
    if context:
        fact += f" ({context.strip()})"
    obj = " ".join(caption.split()[:16])
    return Claim(subject=speaker, predicate="shares an image of", object=obj, fact=fact + ".", sentence=caption)


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
        cut = next((k for k, w in enumerate(words) if w.lower() in ("i", "i'm", "i've", "i'd", "i'll")), None)
        if cut is not None:
            words = words[:cut]  # "Arjun and I" -> "Arjun"
        if words and words[-1].endswith(("'s", "’s")):
            words[-1] = words[-1][:-2]  # "Omar's dashboards" -> "Omar"
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


#: what construction does with a sentence of a turn: ``read`` gives a claim; the rest give none —
#: ``question``, ``filler`` (interjections, greetings), ``reaction`` (to the other speaker), ``request``,
#: ``phatic`` (assistant empathy and platitudes), ``non_fact`` (user hedges), ``short`` (under
#: ``min_words`` and not a reply) and ``unread`` (content no rule could read: a clause the reader misses);
#: ``fallback``: unread sentences of a turn that gave no other unit, joined into one ``mentions`` unit
#: (always on; docs/memory.md)
SENTENCE_OUTCOMES = ("read", "question", "filler", "reaction", "request", "phatic", "non_fact", "short", "unread",
                     "fallback")
#: words of a fallback unit's fact (the unread sentences of its turn, in order)
FALLBACK_WORDS = 60


def new_turns(window: Window, user_name: str = "User"):
    """``(turn, previous turn, listener)`` for each of the window's new (non-overlap) turns.

    "you" means whoever spoke just before (overlap turns included), else the other party.
    """
    for i, turn in enumerate(window.turns):
        if i < window.overlap:
            continue
        previous = window.turns[i - 1] if i else None
        listener = previous.speaker if previous is not None else user_name
        if listener == turn.speaker:
            listener = user_name if turn.role.lower() == "assistant" else "Assistant"
        yield turn, previous, listener


class HeuristicExtractor:
    """Rule-based atomic units; deterministic and fast (see the module docstring for the rules)."""

    name = "heuristic"

    def __init__(self, config: ConstructionConfig | None = None):
        self.config = config or ConstructionConfig()

    def sentence_claims(self, turn: Turn, listener: str, previous: Turn | None = None,
                        names: frozenset[str] | set[str] = frozenset(), counts: Counter | None = None) -> list[Claim]:
        """The claims one turn states (empty for chit-chat, questions, requests and reactions).

        ``previous`` is the turn before it (a window's context turn counts): a clause-less reply quotes
        its question, and its last name resolves "he/she/they". ``names`` are the dialogue's speakers
        (vocatives such as "Priya, big news: …" are not subjects). ``counts``, when given, gets one
        ``"role/outcome"`` per sentence (:data:`SENTENCE_OUTCOMES`): what became of it, and why.
        """
        def count(outcome: str) -> None:
            if counts is not None:
                counts[f"{turn.role.lower() or 'unknown'}/{outcome}"] += 1

        assistant = turn.role.lower() == "assistant"
        names = set(names) | {turn.speaker, listener}
        question = asker = None
        antecedent: str | None = None
        last_said, last_by = "", ""  # the sentence before the current one, and its speaker
        if previous is not None:
            said = split_sentences(_normalize(_IMAGE.sub("", previous.text)))
            last_said, last_by = (said[-1], previous.speaker) if said else ("", "")
        if previous is not None and previous.speaker != turn.speaker:
            asked = [q for q in split_sentences(_normalize(_IMAGE.sub("", previous.text))) if q.endswith("?")]
            if asked and not _GREETING_QUESTION.match(asked[-1]):
                question, asker = _strip_vocative(asked[-1], names), previous.speaker
            antecedent = _last_name(previous.text, names)
        text = _normalize(turn.text)
        claims: list[Claim] = []
        unread: list[tuple[str, str, str | None, str, str]] = []  # (sentence, bare, antecedent, context, by)
        for m in _IMAGE.finditer(text):
            context = _Rewriter(turn.speaker, listener)(_IMAGE.sub("", text).split()) if len(claims) == 0 else ""
            claim = image_claim(m.group(1), turn.speaker, context if len(context.split()) >= 3 else "")
            if claim is not None:
                claim.kind, claim.body = "image", m.group(1).strip(" .:")
                claims.append(claim)
        for raw in split_sentences(_IMAGE.sub("", text)):
            original = raw.strip()
            said_before, said_by = last_said, last_by
            if original:
                last_said, last_by = original, turn.speaker
            if not original or original.endswith("?") or _FILLER.match(original):
                if original:
                    count("question" if original.endswith("?") else "filler")
                continue
            bare = _strip_vocative(original, names)
            sentence = _strip_announcement(_LEAD_IN.sub("", _LEADING.sub("", bare).strip()))
            words = sentence.split()
            recommendation = (_RECOMMEND.search(sentence) or _IMPERATIVE_ADVICE.match(sentence)) if assistant else None
            dropped = ("filler" if not words or _FILLER.match(sentence) else "reaction" if _REACTION.match(sentence)
                       else "request" if recommendation is None and _REQUEST.match(sentence) else None)
            if dropped is not None:
                count(dropped)
                antecedent = _last_name(original, names) or antecedent
                continue
            if assistant and recommendation is None and (
                    _PHATIC_ASSISTANT.search(sentence) or _PLATITUDE.search(sentence)):
                count("phatic")
                continue
            if not assistant and _NON_FACT_USER.match(sentence):
                count("non_fact")
                continue
            claim = None
            kind, body = "clause", sentence
            if recommendation is not None:
                claim = recommendation_claim(sentence, recommendation, turn.speaker, listener)
                kind = "advice"
            elif len(words) >= self.config.min_words:
                claim = parse_claim(sentence, turn.speaker, listener, assistant=assistant, antecedent=antecedent)
            if claim is None and question is None and len(words) >= self.config.min_words:
                conj = _CONJUNCTION.search(sentence)  # "A bit, but the shelter sent me a photo"
                if conj is not None and len(sentence[conj.end():].split()) >= self.config.min_words:
                    claim = parse_claim(sentence[conj.end():], turn.speaker, listener, assistant=assistant,
                                        antecedent=antecedent)
                    body = sentence[conj.end():]
            if claim is None:
                body = bare
                if question is not None and (len(words) >= 2 or len(bare.split()) >= 3):
                    claim = fragment_claim(bare, turn.speaker, listener, question, asker)
                    kind = "reply"
                elif len(words) >= self.config.min_words and (
                        _HAS_NUMBER.search(sentence) or find_entities(sentence)):
                    claim = fragment_claim(bare, turn.speaker, listener)
                    kind = "fragment"
            if claim is None and len(words) >= self.config.min_words:
                unread.append((original, bare, antecedent, said_before, said_by))  # counted below
            elif claim is None:
                count("short")
            else:
                count("read")
            if claim is not None:
                claim.sentence = original  # dates, names and places are read from the whole sentence
                claim.kind, claim.body, claim.antecedent = kind, body, antecedent
                if kind == "reply":
                    claim.question, claim.asker = question or "", asker or ""
                claim.context, claim.context_speaker = said_before, said_by
                claims.append(claim)
            antecedent = _last_name(original, names) or antecedent
        fallback = self._fallback_claim(turn, listener, unread) if (
            unread and not claims) else None
        if fallback is not None:
            claims.append(fallback)
        for _ in unread:
            count("fallback" if fallback is not None else "unread")
        return claims

    def _fallback_claim(self, turn: Turn, listener: str,
                        unread: list[tuple[str, str, str | None, str, str]]) -> Claim | None:
        """One ``mentions`` unit for a turn whose content sentences no rule could read: the turn is then
        grounded (its raw text is what the source channel searches), its fact the unread sentences."""
        words = " ".join(bare for _, bare, _, _, _ in unread).split()
        claim = fragment_claim(" ".join(words[:FALLBACK_WORDS]), turn.speaker, listener)
        if claim is None:
            return None
        original, bare, antecedent, said_before, said_by = unread[0]  # the graph's triple: the first one
        claim.sentence, claim.kind, claim.body, claim.antecedent = original, "fragment", bare, antecedent
        claim.context, claim.context_speaker = said_before, said_by
        return claim

    def window_claims(self, window: Window, user_name: str = "User", session_time: str | None = None,
                      counts: Counter | None = None) -> list[tuple[Turn, str, str | None, Claim]]:
        """``(turn, listener, utterance time, claim)`` for every claim of the window's new turns."""
        out: list[tuple[Turn, str, str | None, Claim]] = []
        names = frozenset(t.speaker for t in window.turns)
        for turn, previous, listener in new_turns(window, user_name):
            utterance_time = turn.time or session_time
            for claim in self.sentence_claims(turn, listener, previous, names, counts):
                out.append((turn, listener, utterance_time, claim))
        return out

    def extract(self, window: Window, dialogue_id: str, user_name: str = "User",
                session_time: str | None = None, counts: Counter | None = None) -> list[MemoryUnit]:
        """Units for the window's new turns; each is grounded in exactly its own turn."""
        units: list[MemoryUnit] = []
        for turn, _, utterance_time, claim in self.window_claims(window, user_name, session_time, counts):
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


def _strip_vocative(sentence: str, names: set[str] | frozenset[str]) -> str:
    """Drop a leading or trailing form of address ("Priya, big news: …", "Of course, Alex.")."""
    m = re.match(r"^(?:(?:hey|hi|hello|morning|good morning|oh)\s+)?([A-Z][\w'-]*)\s*[,!:]\s+(?=\S)", sentence)
    if m and m.group(1) in names:
        sentence = sentence[m.end():]
    m = re.search(r",\s*([A-Z][\w'-]*)\s*([.!?]?)$", sentence)
    if m and m.group(1) in names:
        sentence = sentence[:m.start()] + m.group(2)
    return sentence


def _strip_announcement(sentence: str) -> str:
    """The claim after an announcement colon ("Work news from me: Helena left …" -> "Helena left …")."""
    before, sep, after = sentence.partition(": ")
    if sep and len(after.split()) >= 3 and len(before.split()) <= 7 and (
            _ANNOUNCEMENT.search(before) or len(before.split()) <= 2):
        return _LEADING.sub("", after.strip())
    return sentence


def _last_name(text: str, names: set[str] | frozenset[str]) -> str | None:
    """The last name mentioned in ``text`` other than the speakers' own (antecedent of "he/she/they")."""
    found = [e for e in find_entities(text) if e not in names and " " not in e.strip() and not e.isupper()]
    return found[-1] if found else None
