"""Subject, relation and object of a claim, read from a spaCy dependency parse.

The local graph of a working memory has one node per entity or noun phrase and one edge per relation,
so this module turns a parsed sentence into short spans and the relation between them:

- the **main triple** follows the clause's verb: its subject (``nsubj``), the verb with its modals,
  negation, particle and preposition as the relation, and its first argument (direct object, copula
  attribute, adjective + preposition, prepositional object, clausal complement) as the object;
- a reporting or thinking verb ("said", "told", "I think", "I'd recommend") is looked through: the
  relation is the one *inside* its complement ("I think I'll switch to Notion" → ``User | will switch
  to | Notion``), not a speech act around the speaker;
- **extra relations** come from the same sentence: further arguments of the verb (linked to the first
  object), prepositional modifiers inside noun phrases ("chat | with | R&D lead"), appositions
  ("Omar | is | User's manager"), coordinated objects and a coordinated second clause;
- spans are compact: head noun plus compounds, adjectives, numbers and possessors, no determiners,
  relative clauses or prepositional tails (those become their own edges), at most ``MAX_NODE_CHARS``;
- first and second person become the speaker's and listener's names, "he/she/they" the last name
  mentioned before the sentence, and an object "it" the named thing it refers to in the earlier clause
  or the sentence just before, when there is one (:func:`thing_antecedents`).

Everything here is a pure function of the ``Doc`` and the names, so results can be memoized by text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from qgmem.memory.extract_heuristic import third_person_verb
from qgmem.text.pronouns import AGREEMENT, pronouns

MAX_NODE_CHARS = 40
MAX_NODE_TOKENS = 5
MAX_EXTRA_RELATIONS = 4

#: verbs of communication: an edge labelled with one of these is a speech act (``qgmem graph-stats``)
SPEECH_VERBS = frozenset({
    "say", "tell", "ask", "answer", "mention", "reply", "respond", "talk", "speak", "discuss", "explain",
    "describe", "state", "claim", "note", "remark", "comment", "recommend", "suggest", "advise", "remind",
    "inform", "announce", "confirm", "admit", "complain", "chat", "repeat",
})
#: reporting, thinking and advising verbs whose complement clause holds the claim
_LOOK_THROUGH = SPEECH_VERBS | {
    "think", "believe", "feel", "guess", "hope", "know", "realize", "realise", "notice", "find", "remember",
    "suppose", "mean", "wonder", "bet", "figure", "recall", "swear", "reckon", "imagine", "assume", "see",
    "understand", "worry", "learn", "hear", "read", "decide", "seem", "propose", "encourage",
}
_ADVICE_VERBS = frozenset({"recommend", "suggest", "advise", "propose", "encourage"})
_MODALS = {"will": "will", "'ll": "will", "wo": "will", "would": "would", "'d": "would", "should": "should",
           "can": "can", "ca": "can", "could": "could", "may": "may", "might": "might", "must": "must",
           "shall": "shall"}
_NEGATIONS = {"not": "not", "n't": "not", "never": "never", "no": "not"}
_FIRST = pronouns(1, "subject", "object", "reflexive")
_FIRST_POSS = pronouns(1, "possessive")
_SECOND = pronouns(2, "subject", "object", "reflexive", "informal")  # "ya", "u": only where tagged PRON
_SECOND_POSS = pronouns(2, "possessive")
_THIRD = pronouns(3, "subject", "object", "reflexive")
_THIRD_POSS = pronouns(3, "possessive")
_KEEP_LEFT = {"compound", "amod", "nummod", "poss", "nmod", "quantmod", "npadvmod"}
_OBJECT_DEPS = ("dobj", "obj", "attr", "oprd", "dative")
_SUBJECT_DEPS = ("nsubj", "nsubjpass", "csubj", "csubjpass")
_NOT_ENTITY_LABELS = {"DATE", "TIME", "CARDINAL", "ORDINAL", "PERCENT", "MONEY", "QUANTITY"}


@dataclass
class Reading:
    """What a parse says about one claim: the main triple and further relations between its spans."""

    subject: str
    predicate: str
    object: str
    relations: list[list[str]] = field(default_factory=list)  # [head, relation, tail]


class Names:
    """Who "I", "you" and "he/she/they" are for one sentence, and what its object "it"s refer to.

    ``things`` maps the token index of an object "it" in the sentence's ``doc`` to its antecedent's
    node text (:func:`thing_antecedents`).
    """

    def __init__(self, speaker: str, listener: str, antecedent: str | None = None,
                 things: dict[int, str] | None = None, doc=None):
        self.speaker, self.listener, self.antecedent = speaker, listener, antecedent
        self.things, self.doc = things or {}, doc

    def word(self, token) -> str:
        """The token's text with person resolved ("my" -> "User's") and a resolved "it" replaced."""
        low = token.lower_
        if low == "it" and self.things and token.doc is self.doc and token.i in self.things:
            return self.things[token.i]
        if low in _FIRST:
            return self.speaker
        if low in _FIRST_POSS:
            return f"{self.speaker}'s"
        if low in _SECOND and token.pos_ == "PRON":
            return self.listener
        if low in _SECOND_POSS:
            return f"{self.listener}'s"
        if self.antecedent and (low in _THIRD or (low == "her" and token.dep_ != "poss")):
            return self.antecedent
        if self.antecedent and (low in _THIRD_POSS or (low == "her" and token.dep_ == "poss")):
            return f"{self.antecedent}'s"
        return token.text

    def is_person(self, token) -> bool:
        low = token.lower_
        return low in _FIRST or low in _SECOND or (bool(self.antecedent) and low in _THIRD)


def _join(words: list[str]) -> str:
    text = ""
    for w in words:
        if not text or w in ("'s", "'", "’s") or w.startswith("'s") or w in ("-", "/") or text.endswith(("-", "/")):
            text += w
        else:
            text += " " + w
    return text.strip()


def _tidy(text: str) -> str:
    return text.strip(" ,.;:!?\"'()[]-–—")


def noun_span(head, names: Names, limit: int = MAX_NODE_TOKENS) -> str:
    """A compact node text for the phrase headed by ``head``: modifiers that name it, no tails."""
    if head.pos_ == "PRON" or head.lower_ in _FIRST | _SECOND | _THIRD:
        return _tidy(names.word(head))
    if head.pos_ in ("VERB", "AUX"):
        return verb_span(head, names)
    if head.ent_type_ and head.ent_type_ not in _NOT_ENTITY_LABELS:
        ent = next((e for e in head.doc.ents if e.start <= head.i < e.end), None)
        if ent is not None and len(ent) <= limit:
            words = [t.text for t in ent if t.dep_ != "det" and t.lower_ != "the"]
            poss = [c for c in head.lefts if c.dep_ == "poss" and c.i < ent.start]
            owner = names.word(poss[0]) if poss else ""
            if poss and not owner.endswith("'s") and not (poss[0].pos_ == "PRON" and owner == poss[0].text):
                owner += "'s"  # "my CRM" -> "User's CRM"; an unresolved "their CRM" stays as it is
            prefix = [owner] if poss else []
            text = _tidy(_join(prefix + words))
            if len(text) <= MAX_NODE_CHARS:
                return text
            return _tidy(_join(words))[:MAX_NODE_CHARS]

    tokens = [head]

    def collect(tok, depth: int) -> None:
        for child in tok.lefts:
            if child.dep_ in _KEEP_LEFT or (child.dep_ == "case" and tok.dep_ == "poss"):
                if child.dep_ == "npadvmod" and tok.pos_ not in ("ADJ",):
                    continue
                tokens.append(child)
                if depth < 2 and child.dep_ in ("compound", "poss", "nmod", "amod"):
                    collect(child, depth + 1)
        for child in tok.rights:
            if child.dep_ in ("compound", "case") and child.i == tok.i + 1:
                tokens.append(child)
            elif child.dep_ == "nummod" and tok.pos_ == "PROPN":
                tokens.append(child)

    collect(head, 0)
    tokens.sort(key=lambda t: t.i)
    # keep the tokens nearest the head within the limits (far-left adjectives go first)
    while len(tokens) > 1 and (len(tokens) > limit or len(_join([names.word(t) for t in tokens])) > MAX_NODE_CHARS):
        far = tokens[0] if tokens[0].i < head.i else tokens[-1]
        tokens.remove(far)
    words = []
    for t in tokens:
        w = names.word(t)
        if t.dep_ == "poss" and t.pos_ == "PRON" and not w.endswith("'s") and w != t.text:
            w += "'s"
        words.append(w)
    return _tidy(_join(words))


def verb_span(verb, names: Names) -> str:
    """A clause used as an argument ("getting home", "to run a marathon"): verb, particle, object head."""
    words = [verb.text.lower()]
    prt = [c for c in verb.rights if c.dep_ == "prt"]
    if prt:
        words.append(prt[0].text.lower())
    obj = next((c for c in verb.rights if c.dep_ in ("dobj", "obj", "attr")), None)
    if obj is not None:
        words.append(noun_span(obj, names, limit=3))
    else:
        prep = next((c for c in verb.rights if c.dep_ == "prep"), None)
        pobj = next((c for c in prep.rights if c.dep_ == "pobj"), None) if prep is not None else None
        if pobj is not None:
            words += [prep.text.lower(), noun_span(pobj, names, limit=3)]
        else:
            adv = next((c for c in verb.rights if c.dep_ in ("advmod", "npadvmod", "acomp")), None)
            if adv is not None:
                words.append(adv.text.lower())
    text = _tidy(_join(words))
    return text[:MAX_NODE_CHARS].rsplit(" ", 1)[0] if len(text) > MAX_NODE_CHARS else text


def _subject(verb):
    return next((c for c in verb.children if c.dep_ in _SUBJECT_DEPS), None)


def _inherited_subject(verb):
    """The subject a verb shares with the verb it is coordinated with or complements."""
    seen = 0
    while verb.dep_ in ("conj", "xcomp", "advcl", "ccomp", "pcomp") and verb.head.i != verb.i and seen < 4:
        verb = verb.head
        subj = _subject(verb)
        if subj is not None:
            return subj
        seen += 1
    return None


def _look_through(verb, advised: bool = False):
    """``(verb, advised)``: the verb of the complement a reporting/thinking/advising verb introduces (or
    ``verb`` itself), and whether an advising verb ("I'd recommend looking into …") was passed."""
    for _ in range(3):
        if verb.lemma_.lower() not in _LOOK_THROUGH:
            return verb, advised
        inner = next((c for c in verb.children if c.dep_ in ("ccomp", "xcomp") and c.pos_ in ("VERB", "AUX")), None)
        if inner is None:
            return verb, advised
        advised = advised or verb.lemma_.lower() in _ADVICE_VERBS
        verb = inner
    return verb, advised


def _verb_form(verb, person: bool) -> str:
    low = verb.text.lower()
    if verb.lemma_ == "be" and low in ("'s", "'m", "'re", "am", "are", "is", "be"):
        return "is" if low != "be" else "be"
    if person and verb.tag_ == "VBP":
        return third_person_verb(low)
    return AGREEMENT.get(low, low) if person and low in ("'m", "'re", "'ve") else low


def _predicate_words(verb, person: bool, advice: bool) -> list[str]:
    """Modals, negation, the verb and its particle ("should not move back", "is moving to")."""
    words = []
    for child in verb.lefts:
        low = child.lower_
        if child.dep_ == "aux" and low in _MODALS:
            words.append(_MODALS[low])
        elif child.dep_ == "neg" or (child.dep_ == "advmod" and low == "never"):
            words.append(_NEGATIONS.get(low, "not"))
    if advice and not any(w in _MODALS.values() for w in words):
        words.insert(0, "should")
        words.append(verb.lemma_.lower())
    else:
        progressive = verb.tag_ == "VBG" and any(c.dep_ == "aux" and c.lemma_ == "be" for c in verb.lefts)
        if progressive and not words:
            words.append("is")
        words.append(_verb_form(verb, person and not words))
    prt = next((c for c in verb.rights if c.dep_ == "prt"), None)
    if prt is not None:
        words.append(prt.text.lower())
    return words


def _pobj(prep):
    return next((c for c in prep.rights if c.dep_ in ("pobj", "pcomp")), None)


def _arguments(verb):
    """The verb's arguments in order of preference: ``[(label words, head token)]``."""
    args = []
    for child in verb.rights:
        if child.dep_ in _OBJECT_DEPS:
            args.append(([], child))
    for child in verb.children:
        if child.dep_ == "acomp":
            prep = next((c for c in child.rights if c.dep_ == "prep" and _pobj(c) is not None), None)
            if prep is not None:
                args.append(([child.text.lower(), prep.text.lower()], _pobj(prep)))
            else:
                args.append(([], child))
    for child in verb.rights:
        if child.dep_ == "xcomp" and child.pos_ in ("VERB", "AUX"):
            args.append(([], child))
    preps = [([child.text.lower()], _pobj(child)) for child in verb.rights
             if child.dep_ in ("prep", "agent") and _pobj(child) is not None]
    # a date is an attribute of the event (its fact time), not what the relation is about
    preps.sort(key=lambda arg: arg[1].ent_type_ in ("DATE", "TIME"))
    args += preps
    for child in verb.rights:
        if child.dep_ == "ccomp" and child.pos_ in ("VERB", "AUX"):
            args.append(([], child))
    if not args:  # "I work remotely", "I moved there": an adverb is the object only when nothing else is
        for child in verb.rights:
            if child.dep_ in ("advmod", "npadvmod") and child.pos_ in ("ADV", "NOUN", "PROPN") and child.lower_ not in (
                    "too", "so", "very", "really", "just", "also", "now", "then", "again", "already", "though",
                    "anyway", "either", "yet", "still", "definitely", "certainly", "probably", "honestly"):
                args.append(([], child))
                break
    return args


def _np_relations(head, names: Names, out: list[list[str]], depth: int = 0) -> None:
    """Relations inside a noun phrase: prepositional modifiers, appositions, coordinated nouns."""
    if head.pos_ in ("VERB", "AUX") or depth > 1:
        return
    node = noun_span(head, names)
    for child in head.rights:
        if child.dep_ == "prep":
            pobj = _pobj(child)
            if pobj is not None and pobj.pos_ in ("NOUN", "PROPN", "NUM", "PRON"):
                tail = noun_span(pobj, names)
                if tail and tail != node:
                    out.append([node, child.text.lower(), tail])
                    _np_relations(pobj, names, out, depth + 1)
        elif child.dep_ == "appos":
            tail = noun_span(child, names)
            if tail and tail != node:
                out.append([tail, "is", node])
        elif child.dep_ == "acl" and child.pos_ == "VERB":
            arg = next(((label, tok) for label, tok in _arguments(child) if tok.pos_ in ("NOUN", "PROPN")), None)
            if arg is not None:
                tail = noun_span(arg[1], names)
                if tail and tail != node:
                    out.append([node, _join([child.text.lower(), *arg[0]]), tail])


def read_clause(verb, names: Names, *, advice: bool = False, default_subject: str = "",
                depth: int = 0) -> Reading | None:
    """The relation of the clause headed by ``verb`` and the relations around it; ``None`` without one."""
    verb, advised = _look_through(verb)
    has_expl = any(c.dep_ == "expl" for c in verb.children)
    subj = _subject(verb) or (None if has_expl or advised else _inherited_subject(verb))
    advice = advice or advised
    own_advice = advice and (subj is None or subj.lower_ in _SECOND)
    if subj is not None and not own_advice:
        subject = noun_span(subj, names)
        person = names.is_person(subj)
    else:
        subject, person = (names.listener if advice else default_subject or names.speaker), True
    words = _predicate_words(verb, person, own_advice)
    args = _arguments(verb)
    if verb.lemma_.lower() in _ADVICE_VERBS and (subj is None or subj.lower_ in _FIRST):
        # "I'd recommend a cable sleeve": advice for the listener, not an act of the speaker
        subject, person, words = names.listener, True, ["should", "consider"]
    obj_tok = None
    if verb.lemma_ == "be" and subj is None:  # "There is a meeting on Friday"
        attr = next((tok for label, tok in args if not label), None)
        if attr is not None:
            subject, person = noun_span(attr, names), False
            args = [(label, tok) for label, tok in _arguments(verb) if tok.i != attr.i]
            args += [([c.text.lower()], _pobj(c)) for c in attr.rights if c.dep_ == "prep" and _pobj(c) is not None]
            words = ["is"]
    if not subject:
        return None
    relations: list[list[str]] = []
    obj = ""
    if args:
        label, obj_tok = args[0]
        if obj_tok.pos_ in ("VERB", "AUX") and obj_tok.dep_ == "xcomp" and depth < 2:
            # "wants to move to Denver": the relation runs through the complement verb
            inner = read_clause(obj_tok, names, default_subject=subject, depth=depth + 1)
            to = [c.text.lower() for c in obj_tok.lefts if c.dep_ == "aux" and c.lower_ == "to"]
            if inner is not None and inner.object:
                inner_pred = inner.predicate.split()
                inner_verb = [obj_tok.text.lower()] + inner_pred[inner_pred.index(obj_tok.text.lower()) + 1:] \
                    if obj_tok.text.lower() in inner_pred else inner_pred
                predicate = _join(words + to + inner_verb)
                relations = inner.relations
                return _finish(subject, predicate, inner.object, relations, verb, names, advice)
        words = words + label
        obj = noun_span(obj_tok, names)
    predicate = _join(words)
    if obj_tok is not None and obj_tok.pos_ not in ("VERB", "AUX"):
        _np_relations(obj_tok, names, relations)
    for label, tok in args[1:]:
        tail = noun_span(tok, names)
        if obj and tail and tail != obj:
            relations.append([obj, _join([verb.lemma_.lower(), *label]), tail])
    if subj is not None and subj.pos_ not in ("PRON",):
        _np_relations(subj, names, relations)
    return _finish(subject, predicate, obj, relations, verb, names, advice, depth=depth, obj_tok=obj_tok)


def _finish(subject: str, predicate: str, obj: str, relations: list[list[str]], verb, names: Names, advice: bool,
            depth: int = 0, obj_tok=None) -> Reading:
    # coordinated objects share the relation ("uses Trello and Slack", "go with a stain and a finish")
    if obj_tok is not None and obj_tok.pos_ not in ("VERB", "AUX"):
        for conj in obj_tok.conjuncts:
            tail = noun_span(conj, names)
            if tail and tail != obj:
                relations.append([subject, predicate, tail])
    # a coordinated second clause ("Helena left Northwind, and I report to Omar now"), or a clause with a
    # subject of its own beside the main one ("Helena left Northwind, so I report to Omar")
    if depth == 0:
        clauses = [c for c in verb.conjuncts if c.pos_ in ("VERB", "AUX") and c.i > verb.i]
        clauses += [c for c in verb.children if c.dep_ in ("ccomp", "advcl") and c.pos_ in ("VERB", "AUX")
                    and _subject(c) is not None and _subject(c).lower_ not in ("it", "that", "this")]
        for clause in clauses:
            second = read_clause(clause, names, advice=advice, default_subject=subject, depth=1)
            if second is not None and second.object:
                relations.append([second.subject, second.predicate, second.object])
                relations.extend(second.relations)
    seen, kept = set(), []
    for rel in relations:
        key = tuple(r.lower() for r in rel)
        if all(rel) and key not in seen and key != (subject.lower(), predicate.lower(), obj.lower()):
            seen.add(key)
            kept.append(rel)
    return Reading(subject=subject, predicate=predicate, object=obj, relations=kept[:MAX_EXTRA_RELATIONS])


def _clause_root(span):
    """The verb heading the claim inside ``span`` (the highest verb), or ``None`` when there is none."""
    tokens = list(span)
    tops = [t for t in tokens if t.head.i < span.start or t.head.i >= span.end or t.head.i == t.i]
    for t in tops + tokens:
        if t.pos_ in ("VERB", "AUX") and t.dep_ not in ("aux", "auxpass", "amod", "acl", "relcl"):
            return t
    return None


def _noun_root(span):
    tokens = list(span)
    tops = [t for t in tokens if t.head.i < span.start or t.head.i >= span.end or t.head.i == t.i]
    for t in tops + tokens:
        if t.pos_ in ("NOUN", "PROPN", "NUM", "PRON") and t.dep_ not in ("poss", "compound") and t.lower_ not in (
                "it", "that", "this", "one", "what", "something", "anything", "nothing"):
            return t
    return None


def body_span(doc, body: str):
    """The tokens of ``doc`` that cover ``body`` (a part of the parsed sentence); the whole doc if absent."""
    start = doc.text.find(body) if body else -1
    if start < 0:
        return doc[:]
    span = doc.char_span(start, start + len(body), alignment_mode="expand")
    return span if span is not None and len(span) else doc[:]


def read_claim(doc, body: str, kind: str, names: Names, *, question_doc=None, asker: str = "") -> Reading | None:
    """The triple and relations of one claim (see the module docstring); ``None`` when nothing parses."""
    span = body_span(doc, body)
    if kind in ("reply", "fragment"):  # "Still can't believe I pulled off the move": a clause after all
        verb = _clause_root(span)
        reading = read_clause(verb, names) if verb is not None else None
        if reading is not None and reading.object and reading.subject.lower() not in ("it", "that", "this"):
            return reading
    if kind in ("clause", "advice"):
        verb = _clause_root(span)
        if verb is not None:
            reading = read_clause(verb, names, advice=kind == "advice")
            if reading is not None and reading.object:
                return reading
            if reading is not None:  # no argument parsed: the first noun after the verb stands in
                noun = next((t for t in span if t.i > verb.i and t.pos_ in ("NOUN", "PROPN")
                             and t.dep_ not in ("poss", "compound")), None)
                if noun is not None:
                    return Reading(reading.subject, reading.predicate, noun_span(noun, names),
                                   reading.relations + _relations_of(noun, names))
        if kind == "advice":
            noun = _noun_root(span)
            if noun is not None:
                return Reading(names.listener, "should consider", noun_span(noun, names), _relations_of(noun, names))
    if kind == "image":
        noun = _noun_root(span)
        if noun is None:
            return None
        target = noun
        if noun.lower_ in ("photo", "picture", "image", "screenshot", "video", "pic", "selfie"):
            of = next((c for c in noun.rights if c.dep_ == "prep" and c.lower_ == "of" and _pobj(c) is not None), None)
            target = _pobj(of) if of is not None else noun
        return Reading(names.speaker, "shares an image of", noun_span(target, names), _relations_of(target, names))
    noun = _noun_root(span)
    if kind == "reply" and question_doc is not None:
        answer = noun_span(noun, names) if noun is not None else _tidy(" ".join(span.text.split()[:4]))
        asked = _question_relation(question_doc, Names(asker or names.listener, names.speaker, names.antecedent))
        if asked is not None and answer:
            subject, predicate = asked
            return Reading(subject, predicate, answer, _relations_of(noun, names) if noun is not None else [])
    if noun is not None:
        relations = _relations_of(noun, names)
        node = noun_span(noun, names)
        if relations:  # "Three meetings on Tuesday" -> meetings | on | Tuesday
            head, rel, tail = relations[0]
            return Reading(head, rel, tail, relations[1:])
        verb = _clause_root(span)
        if verb is not None:
            reading = read_clause(verb, names)
            if reading is not None and reading.object:
                return reading
        return Reading(names.speaker, "mentions", node)
    return None


def _relations_of(noun, names: Names) -> list[list[str]]:
    out: list[list[str]] = []
    _np_relations(noun, names, out)
    return out[:MAX_EXTRA_RELATIONS]


def _question_relation(doc, names: Names) -> tuple[str, str] | None:
    """Subject and relation a question asks about ("Where do you live?" -> Priya, lives in)."""
    verb = next((t for t in doc if t.dep_ == "ROOT"), None)
    if verb is None:
        return None
    if verb.pos_ in ("VERB", "AUX"):
        verb, _ = _look_through(verb)
        subj = _subject(verb)
        if subj is not None and subj.lower_ in ("what", "who", "which"):
            subj = None
        if verb.lemma_ == "be":
            attr = next((c for c in verb.children if c.dep_ in ("attr", "nsubj") and c.lower_ not in (
                "what", "who", "which", "it", "that")), None)
            if attr is not None:
                return noun_span(attr, names), "is"
        subject = noun_span(subj, names) if subj is not None else names.listener
        person = subj is None or names.is_person(subj)
        words = _predicate_words(verb, person, False)
        words = [w for w in words if w not in ("does", "do", "did")]
        if person and verb.tag_ == "VB" and words and words[-1] == verb.text.lower():  # "do you live" -> lives
            words[-1] = third_person_verb(words[-1])
        prep = next((c for c in verb.rights if c.dep_ == "prep" and _pobj(c) is None), None)
        if prep is not None:
            words.append(prep.text.lower())
        return subject, _join(words)
    if verb.pos_ in ("NOUN", "PROPN"):
        return noun_span(verb, names), "is"
    return None


def _entity_texts(ents, exclude: set[str] | frozenset[str]) -> list[str]:
    seen: dict[str, None] = {}
    low_exclude = {e.lower() for e in exclude} | {"user", "assistant", "i"}
    for ent in ents:
        if ent.label_ in _NOT_ENTITY_LABELS:
            continue
        words = [t for t in ent if not (t.i == ent.start and t.lower_ in ("the", "a", "an"))]
        text = " ".join(t.text for t in words)
        if text.endswith((" 's", "'s")):
            text = text[:-2].strip()
        text = text.strip(" .,'\"")
        if len(text) > 1 and text.lower() not in low_exclude:
            seen.setdefault(text, None)
    return list(seen)


def entities(doc, exclude: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """Named entities (people, organisations, places, products, works; not dates or numbers), in order."""
    return _entity_texts(doc.ents, exclude)


#: "it" as an object names a thing ("run it", "take care of it"); as a subject it is mostly expletive or a
#: whole situation ("it's raining", "it was great"), and after these verbs mostly an idiom ("made it",
#: "do it", "call it a day", "you name it", "top it off", "go for it")
_IT_OBJECT_DEPS = ("dobj", "obj", "pobj", "dative")
_IDIOM_IT_VERBS = {"make", "do", "mean", "call", "name", "top", "cut", "hit", "go"}
_THING_POS = ("NOUN", "PROPN")


def _named_thing(tok, exclude: set[str]):
    """The head of the noun phrase a named thing (not a person, date or number) heads or modifies
    ("Lisbon" in "the Lisbon half marathon" → marathon), or ``None``."""
    if not tok.ent_type_ or tok.ent_type_ in _NOT_ENTITY_LABELS or tok.ent_type_ == "PERSON" or tok.text in exclude:
        return None
    head = tok
    while head.dep_ == "compound" and head.head.pos_ in _THING_POS and head.head.i != head.i:
        head = head.head
    return head if head.pos_ in _THING_POS else None


def _referent(tokens, exclude: set[str]):
    """``(head, settled)``: the named thing an object "it" after ``tokens`` refers to, and whether
    ``tokens`` settle the question (so no earlier sentence is searched).

    The most recent direct object or predicate noun that is a thing decides (a predicate noun stands
    for the subject it describes: "Their CRM was a clunky mess" → CRM); it counts only when it holds a
    name ("I export the list and sort it": no name, so none). Without one, the last phrase that holds a
    name. ``tokens`` that say "it" themselves settle it with none: that chain starts further back.
    """
    if any(t.lower_ in ("it", "its") and t.pos_ == "PRON" for t in tokens):
        return None, True
    named = {h.i: h for h in (_named_thing(t, exclude) for t in tokens) if h is not None}
    objects = [t for t in tokens if t.dep_ in ("dobj", "obj", "attr") and t.pos_ in _THING_POS
               and t.ent_type_ not in _NOT_ENTITY_LABELS | {"PERSON"}]
    if objects:
        last = objects[-1]
        if last.dep_ == "attr" and last.i not in named:
            subj = _subject(last.head)
            last = subj if subj is not None and subj.i in named else last
        return named.get(last.i), True
    return (list(named.values())[-1], True) if named else (None, False)


def thing_antecedents(doc, names: Names, context=None, context_names: Names | None = None
                      ) -> dict[int, tuple[str, list[str]]]:
    """``{token index: (node text, named entities)}`` for each object "it" of ``doc`` that refers to a
    named thing.

    Light coreference, the counterpart of the last-name rule for "he/she/they", precision first: the
    referent must hold a name (an organisation, place, product, event, work…; a person is "he/she"),
    and is looked for in the earlier clauses of the same sentence ("I bought a Trek bike and I love
    it"), then in the sentence said just before (``context``: earlier in the turn, or the other
    speaker's last sentence: "Still on track for Lisbon?" — "My cousin decided to run it with me").
    Unnamed referents ("the desk") are left as "it": a recency guess over every noun phrase was right
    only about half the time on ConvoMem. The entities are the names inside the referent's phrase, so
    a unit that says "it" is found by the name it stands for.
    """
    exclude = {names.speaker, names.listener}
    out: dict[int, tuple[str, list[str]]] = {}
    for tok in doc:
        if tok.lower_ != "it" or tok.pos_ != "PRON" or tok.dep_ not in _IT_OBJECT_DEPS:
            continue
        verb = tok.head.head if tok.dep_ == "pobj" else tok.head
        if verb.lemma_.lower() in _IDIOM_IT_VERBS:
            continue
        # not the verb's own arguments, nor the phrase the "it" sits in ("a stickler for it")
        earlier = [t for t in doc[:tok.i] if t.head.i != verb.i and not t.is_ancestor(tok)]
        (head, settled), who = _referent(earlier, exclude), names
        if not settled and context is not None:
            (head, _), who = _referent(list(context), exclude), context_names or names
        if head is None:
            continue
        text = noun_span(head, who)
        if text and text.lower() != "it":
            inside = [e for e in head.doc.ents if e.root.i == head.i or (
                e.root.head.i == head.i and e.root.dep_ in ("compound", "amod", "nmod"))]
            out[tok.i] = (text, _entity_texts(inside, exclude))
    return out


def date_phrases(doc) -> list[str]:
    """The date and time expressions NER finds ("last week", "May 3rd"), in order."""
    return [ent.text for ent in doc.ents if ent.label_ in ("DATE", "TIME")]
