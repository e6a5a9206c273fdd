"""Cross-fitted predictions: every usable question scored by a model that never saw it, nor its conversation.

The learning check scores one held-out split (55 questions). Cross-fitting splits the usable questions
into ``k`` folds grouped by evidence conversation; each fold is scored by models trained on the other
folds, so every usable question gets a held-out prediction. Two things keep a fold truly held out:

- **grouping**: questions that share an evidence conversation are in one fold (:func:`assign_folds`);
- **histories**: a ConvoMem history hides a case's evidence among distractor conversations of the same
  person. Drawn from the whole pool, a training history would hold a held-out question's evidence as a
  distractor. :func:`with_distractors` draws each case's distractors from its own fold, or from
  conversations that are no fold's evidence (the rubric categories', never scored); :func:`leaks` lists
  every held-out evidence conversation found in a training history (it must be empty).

Seeds: every fold is trained once per seed; seed ``s`` of all folds together forms one row of the
``[seeds, questions]`` matrix, so the crossed bootstrap resamples seed rows and question groups.

Text dropout (:class:`~qgmem.evaluation.text_dropout.TextDropout`, the study data module's ``text_dropout``) is
the training option aimed at evidence that the study compares with the product's training.
"""

from __future__ import annotations

import copy
import random
from collections import defaultdict
from dataclasses import replace
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from qgmem.evaluation.bootstrap import hierarchical_bootstrap, paired_bootstrap

def conversation_of(session_id: str) -> str:
    """The conversation of a history's session (a repeat, ``id~2``, is conversation ``id``)."""
    from qgmem.data.convomem_history import REPEAT

    return session_id.split(REPEAT, 1)[0]


def evidence_conversations(case: Any) -> set[str]:
    """The conversations that hold ``case``'s evidence (its own sessions when the source does not say)."""
    ids = case.source.get("evidence_session_ids")
    if ids is None:
        ids = [s.id for s in case.dialogue.sessions]
    return {conversation_of(i) for i in ids}


def assign_folds(cases: Sequence[Any], scored: Iterable[str], k: int = 5, seed: int = 0) -> dict[str, int]:
    """``{case id: fold}`` for the scored cases: grouped by evidence conversation, balanced per category.

    Cases that share an evidence conversation form one group (transitively). Groups are shuffled with
    ``seed`` and dealt, category by category (a group's category is its first case's), each to the fold
    with the fewest cases of that category so far (then the fewest cases, then the lowest index).
    """
    if k < 2:
        raise ValueError(f"cross-fitting needs at least 2 folds, got {k}")
    scored = set(scored)
    chosen = [c for c in cases if c.id in scored]
    parent = list(range(len(chosen)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[str, int] = {}
    for i, case in enumerate(chosen):
        for conv in evidence_conversations(case):
            if conv in owner:
                parent[root(i)] = root(owner[conv])
            else:
                owner[conv] = i
    groups: dict[int, list[int]] = defaultdict(list)
    for i in range(len(chosen)):
        groups[root(i)].append(i)
    by_category: dict[str, list[list[int]]] = defaultdict(list)
    for members in groups.values():
        by_category[str(chosen[members[0]].qas[0].category if chosen[members[0]].qas else "")].append(members)
    rng = random.Random(seed)
    sizes, per_category = [0] * k, defaultdict(lambda: [0] * k)
    folds: dict[str, int] = {}
    for category in sorted(by_category):
        members_list = sorted(by_category[category], key=lambda m: chosen[m[0]].id)
        rng.shuffle(members_list)
        for members in members_list:
            f = min(range(k), key=lambda j: (per_category[category][j], sizes[j], j))
            for i in members:
                folds[chosen[i].id] = f
            per_category[category][f] += len(members)
            sizes[f] += len(members)
    return folds


def with_distractors(cases: Sequence[Any], folds: dict[str, int], n: int, seed: int = 0) -> list[Any]:
    """The cases with ``n`` distractor conversations each, drawn so that no fold's evidence leaks.

    ``cases`` hold their evidence conversations only (loaded with no distractors). A case in fold ``f``
    draws from the evidence conversations of the other cases of fold ``f`` and of the cases in no fold;
    a case in no fold draws from the cases in no fold only. Draws and positions are seeded per case, as
    the loader's own are; evidence sessions keep their ids, so the gold turn ids stay valid.
    """
    from qgmem.data.convomem_history import case_rng, interleave, session_id
    from qgmem.data.records import Dialogue

    sessions_of = {c.id: [s for s in c.dialogue.sessions] for c in cases}
    pool: dict[int | None, list[tuple[str, Any]]] = defaultdict(list)
    for case in cases:
        for s in sessions_of[case.id]:
            pool[folds.get(case.id)].append((case.id, s))
    out = []
    for case in cases:
        fold = folds.get(case.id)
        own = evidence_conversations(case)
        candidates = [(cid, s) for cid, s in pool[fold] + (pool[None] if fold is not None else [])
                      if cid != case.id and conversation_of(s.id) not in own]
        rng = case_rng(seed, case.id)
        drawn = rng.sample(candidates, min(n, len(candidates)))
        evidence = [copy.deepcopy(s) for s in sessions_of[case.id]]
        distractors = [copy.deepcopy(s) for _, s in drawn]
        for s, (cid, _) in zip(distractors, drawn):
            s.meta = {**s.meta, "origin": "distractor", "source_item": cid}
        mixed, slots = interleave(evidence, distractors, rng)  # the loader's own mixing
        seen: dict[str, int] = defaultdict(int)
        for s in mixed:  # a conversation twice in one history is named as the loader names it
            seen[s.id] += 1
            if seen[s.id] > 1:
                s.id = session_id(s.id, seen[s.id])
                for t in s.turns:
                    t.session_id = s.id
                    t.id = f"{s.id}:{t.id.rsplit(':', 1)[-1]}"
        dialogue = Dialogue(id=case.dialogue.id, sessions=mixed, meta=dict(case.dialogue.meta))
        dialogue.reindex()
        source = {**case.source, "fold": fold, "distractor_sessions": len(distractors),
                  "evidence_session_positions": sorted(slots)}
        out.append(replace(case, dialogue=dialogue, source=source))
    return out


def leaks(cases: Sequence[Any], folds: dict[str, int]) -> list[tuple[int, str, str]]:
    """``(fold, training case, conversation)`` for every fold's evidence conversation in another case's history.

    A training case of fold ``f``'s models is any case not in fold ``f`` (cases in no fold included).
    """
    held: dict[int, set[str]] = defaultdict(set)
    for case in cases:
        if case.id in folds:
            held[folds[case.id]].update(evidence_conversations(case))
    found = []
    for case in cases:
        history = {conversation_of(s.id) for s in case.dialogue.sessions}
        for f, conversations in held.items():
            if folds.get(case.id) == f:
                continue
            found.extend((f, case.id, conv) for conv in sorted(history & conversations))
    return found


def fold_parts(folds: dict[str, int], fold: int, k: int, all_ids: Iterable[str]) -> dict[str, list[str]]:
    """Case ids of one fold's ``train`` / ``val`` / ``test``: test is the fold, val the next fold (its
    checkpoint selection and the text-dropout choice), train everything else (cases in no fold too)."""
    val_fold = (fold + 1) % k
    parts: dict[str, list[str]] = {"train": [], "val": [], "test": []}
    for cid in all_ids:
        f = folds.get(cid)
        parts["test" if f == fold else "val" if f == val_fold else "train"].append(cid)
    return parts


# --------------------------------------------------------------------------------------------------
# answers and graphs


def answer_scores(predictions: Sequence[str], references: Sequence[str]) -> dict[str, list[float]]:
    """Per question: token F1, exact match and the rule judge (``match``) of greedy answers."""
    from qgmem.llm.judge import MatchRule
    from qgmem.text import exact_match, token_f1

    rule = MatchRule()
    return {"f1": [float(token_f1(p, r)) for p, r in zip(predictions, references)],
            "em": [float(exact_match(p, r)) for p, r in zip(predictions, references)],
            "judge": [float(rule(p, r)) for p, r in zip(predictions, references)]}


def answer_contrasts(runs: Sequence[Any], a: str = "own", b: str = "none", *, categories_out: Iterable[str] = (),
                     n_boot: int = 10_000, against: Mapping[str, Sequence[float]] | None = None) -> dict[str, Any]:
    """Paired ``a − b`` of each answer score per question (crossed bootstrap over seeds and groups).

    ``runs`` are :class:`~qgmem.evaluation.protocol.SampleScores` of one question order with greedy
    answers under ``a`` and ``b``; questions of ``categories_out`` are left out. ``against`` gives ``b``'s
    scores instead (``{metric: [per question]}``, the same in every seed: a reference that is not trained,
    such as the frozen LM reading more text). Each ``diff`` is also given per category and without
    abstention (:func:`~qgmem.evaluation.protocol.contrast`).
    """
    from qgmem.evaluation.protocol import contrast

    base = runs[0]
    keep = np.asarray([c not in set(categories_out) for c in base.category])
    groups, cats = np.asarray(base.group)[keep], np.asarray(base.category)[keep]
    out: dict[str, Any] = {}
    for metric in ("f1", "em", "judge"):
        rows_a = np.asarray([answer_scores(r.predictions[a], r.answer)[metric] for r in runs])[:, keep]
        if against is not None:
            rows_b = np.tile(np.asarray(against[metric], dtype=np.float64)[keep], (len(runs), 1))
        else:
            rows_b = np.asarray([answer_scores(r.predictions[b], r.answer)[metric] for r in runs])[:, keep]
        diff = contrast(rows_a - rows_b, groups, cats, n_boot=n_boot)
        diff.pop("per_seed", None)
        out[metric] = {a: float(rows_a.mean()), b: float(rows_b.mean()), "diff": diff}
    return out


def same_size_removals(items: Sequence[dict[str, Any]], counterfactuals: Mapping[str, dict[str, Any]]) -> list[str]:
    """``qa_id`` of the items whose ablated and sham graphs (``counterfactuals[qa_id]``) have the same number
    of nodes and of edges.

    The sham removes as many units as the ablation, but the evidence units carry more relations than the
    units that replace them, so the ablated graph is a little smaller on average. On this subset the two
    removals left graphs of equal size, so ``sham − ablated`` there is not a difference of size (a
    matching by selection: the graphs are not trimmed or padded).
    """
    out = []
    for it in items:
        c = counterfactuals.get(it["qa_id"], {})
        if c.get("ablated_graph") is not None and c.get("sham_graph") is not None \
                and c["ablated_graph"].num_nodes == c["sham_graph"].num_nodes \
                and c["ablated_graph"].edge_index.shape[1] == c["sham_graph"].edge_index.shape[1]:
            out.append(it["qa_id"])
    return out


def graph_sizes(items: Sequence[dict[str, Any]], counterfactuals: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """Nodes and edges of the own, ablated and sham graphs over the items that have all three, paired."""
    have = [(it, counterfactuals[it["qa_id"]]) for it in items
            if counterfactuals.get(it["qa_id"], {}).get("ablated_graph") is not None
            and counterfactuals[it["qa_id"]].get("sham_graph") is not None]

    def size(graph: Any, what: str) -> float:
        return float(graph.num_nodes if what == "nodes" else graph.edge_index.shape[1])

    out: dict[str, Any] = {"n": len(have)}
    for what in ("nodes", "edges"):
        own = np.asarray([size(it["graph"], what) for it, _ in have])
        abl = np.asarray([size(c["ablated_graph"], what) for _, c in have])
        sham = np.asarray([size(c["sham_graph"], what) for _, c in have])
        out[what] = {"own": float(own.mean()) if len(have) else None,
                     "ablated": float(abl.mean()) if len(have) else None,
                     "sham": float(sham.mean()) if len(have) else None,
                     "ablated_minus_own": paired_bootstrap(abl - own, n_boot=2000),
                     "sham_minus_own": paired_bootstrap(sham - own, n_boot=2000),
                     "sham_minus_ablated": paired_bootstrap(sham - abl, n_boot=2000)}
    return out


# --------------------------------------------------------------------------------------------------
# the validation rule for a training option


#: a candidate must be lower on validation in at least this share of the paired units (7 of 10)
LOWER_IN_SHARE = 0.7


def validation_choice(baseline: dict[str, float], candidates: dict[str, dict[str, float]], units: int,
                      lower_in_share: float = LOWER_IN_SHARE) -> dict[str, Any]:
    """The rule named before the text-dropout runs, applied to best validation answer NLLs per unit.

    ``baseline`` and each candidate map a unit (``"fold-seed"``) to its best validation NLL; ``units`` is
    how many units the study has. A candidate **wins** when all ``units`` are recorded for it and the
    baseline, its mean is lower than the baseline's on them, and it is lower in at least
    ``ceil(lower_in_share * units)`` paired units; it **cannot win** as soon as its units still missing
    could not bring it there; otherwise it is **open**. Among winners the lowest mean is chosen;
    with none, the baseline stays (``chosen: None``).
    """
    need = int(np.ceil(lower_in_share * units - 1e-9))
    rows: dict[str, Any] = {}
    for name, values in candidates.items():
        shared = sorted(set(values) & set(baseline))
        lower = sum(values[u] < baseline[u] for u in shared)
        mean = float(np.mean([values[u] for u in shared])) if shared else None
        base = float(np.mean([baseline[u] for u in shared])) if shared else None
        if lower + (units - len(shared)) < need:
            status = "cannot win"
        elif len(shared) < units:
            status = "open"
        else:
            status = "wins" if lower >= need and mean < base else "cannot win"
        rows[name] = {"units": len(shared), "lower_in": lower, "mean": mean, "baseline_mean": base, "status": status}
    winners = [n for n, r in rows.items() if r["status"] == "wins"]
    return {"units": units, "need_lower_in": need, "candidates": rows,
            "chosen": min(winners, key=lambda n: rows[n]["mean"]) if winners else None,
            "decided": all(r["status"] != "open" for r in rows.values())}


#: the compact prompt's rule, named before its runs (docs/graph_token.md, *Compact prompt study at matched
#: budgets*)
COMPACT_RULE = ("Validation parts only. Among the compact variants with every (fold, seed) unit recorded, the one "
                "with the lowest mean best validation answer NLL is chosen. The compact prompt becomes the default "
                "if the chosen variant is not worse than the product on the same units: its mean best validation "
                "answer NLL is not higher and its mean validation greedy F1 (own graph, best weights) is not lower, "
                "paired by (fold, seed). Otherwise it ships as a preset.")


def _paired_difference(values: dict[str, dict[str, float]], baseline: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Mean ``values − baseline`` of validation NLL and F1 over the units (``"fold-seed"``) both hold."""
    shared = sorted(set(values) & set(baseline))
    return {"units": len(shared), **{k: float(np.mean([values[u][k] - baseline[u][k] for u in shared]))
                                     if shared else None for k in ("nll", "f1")}}


def compact_choice(baseline: dict[str, dict[str, float]], candidates: dict[str, dict[str, dict[str, float]]],
                   units: int) -> dict[str, Any]:
    """:data:`COMPACT_RULE` applied to per-unit validation figures.

    ``baseline`` (the product) and each candidate map a unit (``"fold-seed"``) to ``{"nll": best validation
    answer NLL, "f1": validation greedy F1}``; ``units`` is how many units the study has. ``chosen`` is
    ``None`` until some candidate has all its units; ``compact_default`` is ``None`` until the chosen one
    and the baseline share all of them, then whether the compact prompt becomes the default. Each
    candidate's ``paired_with_product`` (its mean differences over the units it shares with the product
    so far) describes a study in progress; the rule never reads it.
    """
    rows: dict[str, Any] = {}
    for name, values in candidates.items():
        paired = _paired_difference(values, baseline)  # a diagnostic while units are missing: chooses nothing
        rows[name] = {"units": len(values), "complete": len(values) >= units,
                      "val_nll_mean": float(np.mean([v["nll"] for v in values.values()])) if values else None,
                      "val_f1_mean": float(np.mean([v["f1"] for v in values.values()])) if values else None,
                      "paired_with_product": {"units": paired["units"], "nll_minus_product": paired["nll"],
                                              "f1_minus_product": paired["f1"]}}
    complete = [n for n, r in rows.items() if r["complete"]]
    chosen = min(complete, key=lambda n: rows[n]["val_nll_mean"]) if complete else None
    out: dict[str, Any] = {"rule": COMPACT_RULE, "units": units, "candidates": rows, "chosen": chosen,
                           "decided": bool(rows) and all(r["complete"] for r in rows.values()),
                           "comparison": None, "compact_default": None}
    if chosen is not None:
        shared = sorted(set(candidates[chosen]) & set(baseline))
        sources = {"chosen": candidates[chosen], "product": baseline}
        pick = {k: {m: [src[u][k] for u in shared] for m, src in sources.items()} for k in ("nll", "f1")}
        comparison = {"units": len(shared)}
        for k in ("nll", "f1"):
            a, b = (float(np.mean(pick[k][m])) if shared else None for m in ("chosen", "product"))
            comparison[k] = {"chosen": a, "product": b, "chosen_minus_product": None if a is None else a - b}
        out["comparison"] = comparison
        if len(shared) >= units:
            out["compact_default"] = bool(comparison["nll"]["chosen_minus_product"] <= 0
                                          and comparison["f1"]["chosen_minus_product"] >= 0)
        else:
            out["decided"] = False
    return out


ANSWER_MODE_RULE = ("Held-out answers, once the default is chosen. Its graph tokens ship only if (1) its held-out "
                    "greedy F1 with its own graph minus without a graph (paired by question) has a mean not below "
                    "zero both in ConvoMem's plain form and in its named-speaker form, and (2) in every form measured, "
                    "the share of degenerate replies with its graph tokens (empty, a lead-in line only, an echoed "
                    "memory entry; eval-qa's counts, before the answer cut repairs them) is not above the share "
                    "without them. Otherwise python train.py still trains and exports the encoder, and the export's "
                    "default answer mode is the text prompt at the default's budget (data.graph_mode: none).")


def f1_not_below_zero(plain: float | None, named: float | None) -> bool | None:
    """The answer check both rules share: held-out greedy F1 own − none is not below zero in ConvoMem's plain
    form and in its named-speaker form (``None`` while either is missing)."""
    return None if plain is None or named is None else bool(plain >= 0 and named >= 0)


def answer_mode(default: str | None, plain: float | None, named: float | None,
                degenerate: dict[str, dict[str, float | None]] | None = None) -> dict[str, Any]:
    """:data:`ANSWER_MODE_RULE` applied: ``graph_mode`` is ``"token"`` or ``"none"`` once the default
    (``None``: not chosen yet) has its mean held-out F1 own − none in both forms (``None``: not all units
    yet). ``degenerate``: per form, the share of degenerate replies ``{"token": .., "none": ..}``. A form
    that loses F1 decides ``none`` alone; ``token`` needs the shares too (without them: not decided)."""
    shares = {form: dict(pair) for form, pair in (degenerate or {}).items()}
    out: dict[str, Any] = {"rule": ANSWER_MODE_RULE, "default": default,
                           "f1_own_minus_none": {"plain": plain, "named": named}, "degenerate_share": shares,
                           "graph_mode": None}
    if default is None or plain is None or named is None:
        return out
    if not f1_not_below_zero(plain, named):
        out["graph_mode"] = "none"
        return out
    complete = bool(shares) and all(s.get("token") is not None and s.get("none") is not None for s in shares.values())
    if complete:
        out["graph_mode"] = "token" if all(s["token"] <= s["none"] for s in shares.values()) else "none"
    return out


DEEP_READER_RULE = ("Once every (fold, seed) unit of a kv_prefix variant is recorded, it becomes the default if "
                    "(1) its graph carries evidence on the held-out folds: sham - ablated and own - shuffled answer NLL "
                    "both have 95 % crossed intervals entirely below zero; (2) it is not worse than the default (the "
                    "compact prompt) on the validation parts, paired by (fold, seed): its mean best validation answer "
                    "NLL is not higher and its mean validation greedy F1 (own graph, best weights) not lower; and (3) "
                    "its held-out greedy F1 own - none has a mean not below zero in ConvoMem's plain form and in its "
                    "named-speaker form (the answer-mode rule, whose degenerate-reply shares eval-qa then measures on "
                    "its export). Among several, the lowest mean validation answer NLL. If no variant shows evidence, "
                    "kv_prefix stays a documented option.")


def _below_zero(contrast: Mapping[str, Any] | None) -> bool | None:
    ci = (contrast or {}).get("ci95")
    return None if ci is None or ci[1] is None else bool(ci[1] < 0)


def deep_reader_choice(default: dict[str, dict[str, float]], candidates: dict[str, dict[str, dict[str, float]]],
                       summaries: Mapping[str, Mapping[str, Any]], units: int) -> dict[str, Any]:
    """:data:`DEEP_READER_RULE` applied.

    ``default`` (the compact prompt's units) and each candidate map a unit (``"fold-seed"``) to ``{"nll": best
    validation answer NLL, "f1": validation greedy F1}``; ``summaries`` are the candidates' held-out summaries
    (``sham_vs_ablated``, ``own_vs_shuffled``, ``answers_own_vs_none`` and ``…_named``); ``units`` is how many
    units the study has. A candidate's ``passes`` is ``None`` until all its units are in; ``chosen`` is the
    passing candidate with the lowest mean validation NLL once every candidate is complete (``decided``).
    Figures over fewer units are reported as they stand and decide nothing."""
    rows: dict[str, Any] = {}
    for name, values in candidates.items():
        s = summaries.get(name) or {}
        diff = _paired_difference(values, default)
        f1 = {form: ((s.get(key) or {}).get("f1") or {}).get("diff", {}).get("mean")
              for form, key in (("plain", "answers_own_vs_none"), ("named", "answers_own_vs_none_named"))}
        evidence = {k: _below_zero(s.get(k)) for k in ("sham_vs_ablated", "own_vs_shuffled")}
        complete = len(values) >= units and diff["units"] >= units
        row = {"units": len(values), "complete": complete,
               "val_nll_mean": float(np.mean([v["nll"] for v in values.values()])) if values else None,
               "evidence": {**{k: (s.get(k) or {}).get("ci95") for k in evidence},
                            "shown": None if None in evidence.values() else all(evidence.values())},
               "validation_vs_default": {"units": diff["units"], "nll_minus_default": diff["nll"],
                                         "f1_minus_default": diff["f1"],
                                         "not_worse": None if diff["nll"] is None
                                         else bool(diff["nll"] <= 0 and diff["f1"] >= 0)},
               "f1_own_minus_none": {**f1, "not_below_zero": f1_not_below_zero(f1["plain"], f1["named"])}}
        checks = (row["evidence"]["shown"], row["validation_vs_default"]["not_worse"],
                  row["f1_own_minus_none"]["not_below_zero"])
        row["passes"] = (all(checks) if None not in checks else None) if complete else None
        rows[name] = row
    decided = bool(rows) and all(r["passes"] is not None for r in rows.values())  # every unit and figure in
    passing = [n for n, r in rows.items() if r["passes"]]
    chosen = min(passing, key=lambda n: rows[n]["val_nll_mean"]) if decided and passing else None
    if not decided:
        outcome = "not decided yet"
    elif chosen is not None:
        outcome = f"{chosen} becomes the default"
    elif not any(r["evidence"]["shown"] for r in rows.values()):
        outcome = "no variant shows evidence: kv_prefix stays a documented option"
    else:
        outcome = "a variant shows evidence but fails another check: kv_prefix stays a documented option"
    return {"rule": DEEP_READER_RULE, "units": units, "candidates": rows, "decided": decided, "chosen": chosen,
            "outcome": outcome}


__all__ = ["ANSWER_MODE_RULE", "COMPACT_RULE", "DEEP_READER_RULE", "deep_reader_choice", "f1_not_below_zero", "answer_mode", "validation_choice", "answer_contrasts", "answer_scores", "assign_folds",
           "compact_choice", "conversation_of", "evidence_conversations", "fold_parts", "graph_sizes", "leaks", "same_size_removals", "with_distractors"]
