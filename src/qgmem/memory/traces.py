"""Dynamic memory traces: link units about one evolving subject–relation, order them, mark changes.

Candidates come from FAISS: each unit's ``neighbours`` nearest units by fact embedding. A candidate
pair links when the embeddings of their *subject–relation keys* ("User lives in") reach
``trace_threshold`` and their facts are at least ``min_fact_similarity`` alike. Linked groups
(connected components) of ``min_trace_size`` or more become traces, ordered by memory time.

Whether a later unit **updates** (replaces) or **supplements** (adds to) the state before it is decided
by a rule — same value → supplement; a change word ("moved", "no longer", "switched") or a differing
value of a single-valued relation (where someone lives, works, a favourite, a schedule) → update — or by
an LLM consolidation prompt that may also drop members that do not belong.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from qgmem.llm.base import LLMBackend
from qgmem.llm.parsing import JSONExtractionError, extract_json
from qgmem.llm.prompts import consolidation_messages, retry_messages
from qgmem.memory.config import ConstructionConfig
from qgmem.memory.records import MemoryTrace, MemoryUnit

# Predicate words that name the same relation (lemma -> canonical relation).
RELATION_CLASSES: dict[str, str] = {
    **dict.fromkeys(["live", "move", "relocate", "reside", "base", "settle", "house"], "lives in"),
    **dict.fromkeys(["work", "join", "hire", "employ", "start"], "works at"),
    **dict.fromkeys(["schedule", "reschedule", "book", "plan", "postpone", "move up"], "scheduled"),
    **dict.fromkeys(["assign", "reassign", "hand", "transfer"], "assigned to"),
    **dict.fromkeys(["like", "love", "enjoy", "prefer", "adore", "hate", "dislike"], "likes"),
    **dict.fromkeys(["own", "buy", "purchase", "acquire"], "owns"),
    **dict.fromkeys(["use", "switch", "adopt"], "uses"),
    **dict.fromkeys(["be", "become", "am", "is", "are", "was", "were"], "is"),
}
SINGLE_VALUED = {"lives in", "works at", "scheduled", "assigned to"}
# "X is Y" is single-valued only for attributes that hold one value at a time ("favorite color is").
SINGLE_VALUED_ATTRIBUTES = re.compile(
    r"\b(?:favou?rite|current|name|address|number|phone|email|status|password|job|title|role|age|"
    r"birthday|manager|boss|partner|deadline|budget|price|quota|goal|plan|owner)\b", re.IGNORECASE)
CHANGE_CUES = re.compile(
    r"\b(?:moved|moving|switched|switching|changed|changing|no longer|not anymore|anymore|instead|"
    r"now|new|reassigned|replaced|cancel(?:l)?ed|quit|left|stopped|updated|update|actually|"
    r"rescheduled|postponed|pushed|turned out|isn't|aren't|wasn't)\b",
    re.IGNORECASE,
)
# Relations that describe talk, thought or intent rather than a state that can change: never traced.
NON_STATE_RELATIONS = {
    "think", "thought", "feel", "need", "want", "try", "hope", "guess", "know", "remember", "keep", "let", "say",
    "said", "tell", "ask", "mean", "look", "see", "wonder", "wish", "go", "do", "make", "take", "come", "put",
    "give", "get", "recommend", "mention", "appreciate", "wait", "call", "talk", "hear", "find", "seem", "sound",
    "agree", "understand", "imagine", "bet", "suppose", "gotta", "gonna", "realize", "forget", "lean",
    "answer", "reply", "respond", "share", "show", "ask", "help", "here", "notice", "decide",
}
# Pronouns the extractors leave unresolved: "it is …" in two turns is rarely about one thing.
UNRESOLVED_SUBJECTS = {"it", "that", "this", "there", "they", "them", "these", "those", "something", "everything"}
# Advice and possibility ("should look into", "could try"): what someone might do, never a state.
ADVICE_PREDICATE = re.compile(r"^(?:should|could|might|may|ought to)\b", re.IGNORECASE)
# A person's own states that can change over time; a bare person's other relations are events ("User
# finished the report", "User got an email"), which are never superseded, so they are not traced.
PERSON_STATE_RELATIONS = {"lives in", "works at", "scheduled", "assigned to", "likes", "owns", "uses"}
_SKIP_WORDS = {"has", "have", "had", "been", "being", "will", "would", "can", "could", "should", "just", "really",
               "also", "still", "now", "actually", "finally", "recently", "currently", "not", "never", "always",
               "does", "do", "did", "to", "is", "am", "are", "was", "were", "be", "might", "may", "must"}


def lemma(word: str) -> str:
    """A cheap lemma for relation keys ("moved" -> "move", "lives" -> "live", "tries" -> "try")."""
    w = word.lower()
    if w in ("is", "am", "are", "was", "were", "been", "'s", "'m", "'re"):
        return "be"
    if w in ("has", "had", "'ve"):
        return "have"
    if len(w) > 4 and w.endswith("ies"):
        return w[:-3] + "y"
    if len(w) > 4 and w.endswith("ied"):
        return w[:-3] + "y"
    if len(w) > 4 and w.endswith("ed"):
        stem = w[:-2] if not w.endswith("eed") else w[:-1]
        if len(stem) > 2 and stem[-1] == stem[-2] and stem[-1] not in "ls":
            stem = stem[:-1]  # "planned" -> "plan"
        elif stem.endswith(("v", "at", "ur", "iz", "ag", "ok")) or stem[-1:] == "s" and not stem.endswith("ss"):
            stem += "e"  # "moved" -> "move", "based" -> "base"
        return stem
    if len(w) > 4 and w.endswith("ing") and re.search(r"[aeiouy]", w[:-3]):
        stem = w[:-3]
        if len(stem) > 2 and stem[-1] == stem[-2] and stem[-1] not in "ls":
            return stem[:-1]  # "planning" -> "plan"
        return stem + "e" if stem.endswith(("v", "at", "ur", "iz", "s")) and not stem.endswith("ss") else stem
    if len(w) > 3 and w.endswith(("sses", "shes", "ches", "xes", "zzes")):
        return w[:-2]
    if len(w) > 3 and w.endswith("s") and not w.endswith(("ss", "us", "is")):
        return w[:-1]
    return w


def canonical_relation(predicate: str) -> str:
    """The relation a predicate expresses: a known class, else its content words lemmatized."""
    words = [w for w in re.findall(r"[a-z']+", predicate.lower()) if w]
    content = [w for w in words if w not in _SKIP_WORDS] or words
    if not content:
        return predicate.lower().strip()
    head = lemma(content[0])
    if head in RELATION_CLASSES:
        return RELATION_CLASSES[head]
    if all(w in ("be", "is", "am", "are", "was", "were", "been", "'s") for w in words):
        return "is"
    return " ".join(lemma(w) for w in content)


def traceable(unit: MemoryUnit) -> bool:
    """Whether a unit can join a trace: a state relation, not talk, thought or a one-off event.

    A bare person ("User", the speaker) is traced only on relations that name a changeable state of a
    person (where they live or work, what they use, own or like, schedules, assignments); anything
    else ("User | finished | …", "Priya | answers | …") is an event. Other subjects ("User's manager
    | is | …", "Cooper | likes | …") are traced on any relation but talk and thought.
    """
    relation = canonical_relation(unit.predicate)
    if ADVICE_PREDICATE.match(unit.predicate):  # "User | should look into | Zapier": advice, not a state
        return False
    if unit.subject.strip().lower() in UNRESOLVED_SUBJECTS:  # "it | is | …": no referent to follow
        return False
    if relation.split(" ")[0] in NON_STATE_RELATIONS or relation in ("mention", "answer", "share an image of"):
        return False
    bare_person = unit.subject.strip() in (unit.speaker, "User", "Assistant") and "'s" not in unit.subject
    return not bare_person or relation in PERSON_STATE_RELATIONS


def relation_key(unit: MemoryUnit) -> str:
    """The text whose embedding says "same evolving subject–relation" (e.g. "user lives in")."""
    return f"{unit.subject.strip().lower()} {canonical_relation(unit.predicate)}"


def _norm_value(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def rule_transition(previous: MemoryUnit, later: MemoryUnit) -> str:
    """``"update"`` when ``later`` replaces ``previous``'s value, else ``"supplement"``."""
    a, b = _norm_value(previous.object), _norm_value(later.object)
    if a and b and (a == b or a in b or b in a):
        return "supplement"
    if CHANGE_CUES.search(later.fact) or CHANGE_CUES.search(later.predicate):
        return "update"
    relation = canonical_relation(later.predicate)
    if relation in SINGLE_VALUED or (relation == "is" and SINGLE_VALUED_ATTRIBUTES.search(later.subject)):
        return "update"
    return "supplement"


class _UnionFind:
    def __init__(self, n: int):
        self.parent = list(range(n))

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


@dataclass
class TraceIndex:
    """What trace linking reads about every unit, kept so an append costs the new rows only.

    ``keys[i]`` is the embedding of unit ``i``'s subject–relation key; ``neighbour_ids[i]`` /
    ``neighbour_sims[i]`` are its nearest units by fact embedding (itself included), best first, padded
    with -1. Appending units only adds rows and merges the new units into the old rows' lists, which
    gives the lists a search over the whole store would give (ties at the cut aside).
    """

    keys: np.ndarray
    neighbour_ids: np.ndarray
    neighbour_sims: np.ndarray
    allowed: np.ndarray | None = None  # traceable(unit) per row, so an append judges only its new units

    def __len__(self) -> int:
        return int(self.neighbour_ids.shape[0])

    @classmethod
    def empty(cls, dim: int, k: int) -> TraceIndex:
        return cls(np.zeros((0, dim), np.float32), np.zeros((0, k), np.int64), np.zeros((0, k), np.float32),
                   np.zeros(0, bool))

    @classmethod
    def build(cls, units: list[MemoryUnit], embeddings: np.ndarray, encode: Callable[[list[str]], np.ndarray],
              config: ConstructionConfig) -> TraceIndex:
        """The index of a whole store, from one search over all its units."""
        fact = np.ascontiguousarray(embeddings, dtype=np.float32)
        k = config.neighbours + 1
        dim = int(fact.shape[1]) if fact.ndim == 2 and fact.shape[1] else int(getattr(encode, "dim", 0) or 0)
        if not units:
            return cls.empty(dim, k)
        import faiss

        index = faiss.IndexFlatIP(fact.shape[1])
        index.add(fact)
        sims, ids = index.search(fact, min(k, len(units)))
        return cls(encode([relation_key(u) for u in units]), *_pad(ids, sims, k), _traceable(units))

    def extend(self, new_units: list[MemoryUnit], embeddings: np.ndarray,
               encode: Callable[[list[str]], np.ndarray], config: ConstructionConfig) -> TraceIndex:
        """The index after appending ``new_units``; ``embeddings`` are the fact embeddings of all units,
        old rows first. Cost: one search of the new rows over all units and one ``[old, new]`` product."""
        n_old, m = len(self), len(new_units)
        if m == 0:
            return self
        fact = np.ascontiguousarray(embeddings, dtype=np.float32)
        if fact.shape[0] != n_old + m:
            raise ValueError(f"{fact.shape[0]} embeddings for {n_old} indexed + {m} new units")
        import faiss

        k = config.neighbours + 1
        index = faiss.IndexFlatIP(fact.shape[1])
        index.add(fact)
        new_sims, new_ids = index.search(fact[n_old:], min(k, n_old + m))
        new_ids, new_sims = _pad(new_ids, new_sims, k)
        ids, sims = self.neighbour_ids, self.neighbour_sims
        if n_old:
            cross = fact[:n_old] @ fact[n_old:].T  # [old, new]: where a new unit enters an old unit's list
            all_ids = np.concatenate([ids, np.broadcast_to(np.arange(n_old, n_old + m), (n_old, m))], axis=1)
            all_sims = np.concatenate([np.where(ids >= 0, sims, -np.inf), cross], axis=1)
            order = np.argsort(-all_sims, axis=1, kind="stable")[:, :k]
            ids = np.take_along_axis(all_ids, order, axis=1)
            sims = np.take_along_axis(all_sims, order, axis=1)
            ids = np.where(np.isfinite(sims), ids, -1)
            sims = np.where(np.isfinite(sims), sims, 0.0).astype(np.float32)
        keys = np.concatenate([self.keys.reshape(n_old, -1) if n_old else np.zeros((0, fact.shape[1]), np.float32),
                               encode([relation_key(u) for u in new_units])])
        allowed = None if self.allowed is None else np.concatenate([self.allowed, _traceable(new_units)])
        return TraceIndex(keys.astype(np.float32), np.concatenate([ids, new_ids]), np.concatenate([sims, new_sims]),
                          allowed)


def _traceable(units: list[MemoryUnit]) -> np.ndarray:
    return np.fromiter((traceable(u) for u in units), dtype=bool, count=len(units))


def _pad(ids: np.ndarray, sims: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    if ids.shape[1] < k:
        fill = k - ids.shape[1]
        ids = np.concatenate([ids, np.full((ids.shape[0], fill), -1, ids.dtype)], axis=1)
        sims = np.concatenate([sims, np.zeros((sims.shape[0], fill), sims.dtype)], axis=1)
    return ids.astype(np.int64), sims.astype(np.float32)


def candidate_groups(units: list[MemoryUnit], embeddings: np.ndarray, encode: Callable[[list[str]], np.ndarray],
                     config: ConstructionConfig, index: TraceIndex | None = None) -> list[list[int]]:
    """Groups of unit indices (each sorted by memory time) that pass the linking rule.

    ``index``: the store's :class:`TraceIndex` when it is kept (appends); else one is built here.
    """
    n = len(units)
    if n < config.min_trace_size:
        return []
    if index is None:
        index = TraceIndex.build(units, embeddings, encode, config)
    keys, fact_sims, neighbours = index.keys, index.neighbour_sims, index.neighbour_ids
    allowed = np.fromiter((traceable(u) for u in units), dtype=bool, count=n) if index.allowed is None \
        else index.allowed
    # each pair once (j > i; -1 pads fall out), both ends traceable, facts alike enough: then the keys decide
    rows = np.broadcast_to(np.arange(n)[:, None], neighbours.shape)
    ok = (neighbours > rows) & (fact_sims >= config.min_fact_similarity) & allowed[:, None]
    ok &= allowed[np.where(neighbours >= 0, neighbours, 0)]
    heads, tails = rows[ok], neighbours[ok]
    key_sims = np.einsum("pd,pd->p", keys[heads], keys[tails]) if heads.size else np.zeros(0, np.float32)
    uf = _UnionFind(n)
    for i, j in zip(heads[key_sims >= config.trace_threshold].tolist(), tails[key_sims >= config.trace_threshold].tolist()):
        uf.union(i, j)
    groups: dict[int, list[int]] = {}
    for i in range(n):
        groups.setdefault(uf.find(i), []).append(i)
    ordered = [sorted(g, key=lambda i: (units[i].order, i)) for g in groups.values()
               if len(g) >= config.min_trace_size]
    return sorted(ordered, key=lambda g: g[0])


@dataclass
class TraceReport:
    traces: list[MemoryTrace] = field(default_factory=list)
    updates: int = 0
    supplements: int = 0
    llm_fallbacks: int = 0  # groups whose consolidation reply stayed invalid: the rule decided
    dissolved: int = 0  # groups the LLM reduced below the minimum size


def _validate_consolidation(reply: str, labels: list[str]) -> tuple[list[str], dict[str, str]]:
    try:
        data = extract_json(reply, expect=dict)
    except JSONExtractionError as e:
        raise ValueError(str(e)) from None
    members = data.get("members")
    transitions = data.get("transitions", {})
    if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
        raise ValueError('"members" must be a list of entry labels')
    unknown = [m for m in members if m not in labels]
    if unknown:
        raise ValueError(f"unknown labels in members: {unknown} (use {', '.join(labels)})")
    if not isinstance(transitions, dict) or any(v not in ("update", "supplement") for v in transitions.values()):
        raise ValueError('"transitions" must map labels to "update" or "supplement"')
    return members, transitions


def build_traces(units: list[MemoryUnit], embeddings: np.ndarray, encode: Callable[[list[str]], np.ndarray],
                 config: ConstructionConfig, llm: LLMBackend | None = None, trace_prefix: str = "t",
                 index: TraceIndex | None = None) -> TraceReport:
    """Group, order and classify; sets ``unit.trace_id`` on every member (others are set to ``None``).

    ``index``: the store's kept :class:`TraceIndex` (an append), so the neighbour search is not redone.
    """
    report = TraceReport()
    groups = candidate_groups(units, embeddings, encode, config, index)
    for unit in units:  # an append regroups the whole store: earlier trace ids may be renumbered
        unit.trace_id = None
    decisions: list[tuple[list[int], list[str]] | None] = [None] * len(groups)
    if llm is not None and groups:
        decisions = _llm_decisions(units, groups, llm, config, report)
    for g, group in enumerate(groups):
        members, transitions = decisions[g] if decisions[g] is not None else (group, None)
        if len(members) < config.min_trace_size:
            report.dissolved += 1
            continue
        if transitions is None:
            transitions = ["origin"] + [rule_transition(units[a], units[b]) for a, b in zip(members, members[1:])]
        trace_id = f"{trace_prefix}{len(report.traces):04d}"
        subject = Counter(units[i].subject for i in members).most_common(1)[0][0]
        trace = MemoryTrace(id=trace_id, dialogue_id=units[members[0]].dialogue_id, subject=subject,
                            relation=canonical_relation(units[members[0]].predicate),
                            unit_ids=[units[i].id for i in members], transitions=transitions,
                            latest_unit_id=units[members[-1]].id)
        for i in members:
            units[i].trace_id = trace_id
        report.updates += transitions.count("update")
        report.supplements += transitions.count("supplement")
        report.traces.append(trace)
    return report


def _llm_decisions(units, groups, llm, config, report) -> list[tuple[list[int], list[str]] | None]:
    prompts = []
    for group in groups:
        lines = [f"M{k + 1} ({units[i].fact_time or units[i].utterance_time or f'turn {units[i].order}'}): "
                 f"{units[i].fact}" for k, i in enumerate(group)]
        first = units[group[0]]
        prompts.append(consolidation_messages(first.subject, canonical_relation(first.predicate), lines))
    decisions: list[tuple[list[int], list[str]] | None] = [None] * len(groups)
    pending, conversations = list(range(len(groups))), prompts
    params = {"max_new_tokens": 256, "temperature": config.temperature}
    for attempt in range(config.llm_retries + 1):
        checks = [(lambda text, labels=[f"M{k + 1}" for k in range(len(groups[g]))]:
                   _validate_consolidation(text, labels)) for g in pending]
        replies = llm.chat([conversations[g] for g in pending], **params, validate=checks)
        retry, retry_prompts = [], {}
        for g, reply in zip(pending, replies):
            labels = [f"M{k + 1}" for k in range(len(groups[g]))]
            if reply.error is None or reply.unusable:  # unusable: it arrived but failed the check; ask again
                try:
                    members, transitions = _validate_consolidation(reply.text, labels)
                except ValueError as e:
                    if attempt < config.llm_retries:
                        retry.append(g)
                        retry_prompts[g] = retry_messages(prompts[g], reply.text, str(e))
                        continue
                else:
                    kept = [groups[g][labels.index(m)] for m in dict.fromkeys(members)]
                    kept.sort(key=lambda i: (units[i].order, i))
                    label_of = {groups[g][k]: labels[k] for k in range(len(labels))}
                    steps = ["origin"] + [transitions.get(label_of[i]) or rule_transition(units[a], units[i])
                                          for a, i in zip(kept, kept[1:])]
                    decisions[g] = (kept, steps)
                    continue
            report.llm_fallbacks += 1  # error, or invalid after the retries: the rule decides
        if not retry:
            break
        pending, conversations = retry, [retry_prompts.get(g) for g in range(len(groups))]
    return decisions
