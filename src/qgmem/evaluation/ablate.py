"""The evidence-ablated store: the same dialogue's memory without the units grounded in the gold evidence.

The learning check's headline counterfactual holds the question (and so its topic) fixed and removes the
evidence: the question is activated again over a store from which every unit whose grounding span
(``source_turn_ids``) touches a gold evidence turn was dropped, with the traces rebuilt over the units
that are left (a trajectory must not keep pointing at a removed state).

Its control is the sham ablation (:func:`sham_unit_ids`): as many units removed, none of them grounded in
the evidence, taken where possible from the rank positions of the own working memory that the evidence
held, and the question activated again. ``sham − ablated`` is then the effect of the evidence itself,
beyond "any re-retrieved graph differs from the one the text describes".
"""

from __future__ import annotations

from typing import Any, Iterable

from qgmem.memory.remove import without_units  # noqa: F401  (the one rule; the study and the service share it)


def evidence_unit_ids(units: Iterable[Any], evidence_turn_ids: Iterable[str]) -> set[str]:
    """Ids of the units grounded in any of the gold evidence turns."""
    gold = set(evidence_turn_ids)
    return {u.id for u in units if gold.intersection(u.source_turn_ids)}


def sham_unit_ids(store_units: Iterable[Any], memory_units: Iterable[Any], drop: set[str],
                  seed: str | int = 0) -> tuple[set[str], dict[str, int]]:
    """Ids of as many non-evidence units as ``drop`` holds, matched to the evidence's ranks where possible.

    ``memory_units`` is the own working memory in rank order. Each evidence unit in it (taken in rank
    order) is matched to the not-yet-chosen non-evidence unit of the working memory nearest in rank
    (a tie goes to the lower-ranked one, the unit that would move up in its place). The rest of the
    count, the evidence units outside the working memory and those left unmatched, is drawn (seeded by
    ``seed``) from the store's other non-evidence units outside the working memory, then from any
    non-evidence unit left. With too few non-evidence units, fewer are removed (``short`` says how many).
    """
    import random

    store_units, ranked = list(store_units), list(memory_units)
    chosen: list[str] = []
    free = [r for r, u in enumerate(ranked) if u.id not in drop]
    for r in (r for r, u in enumerate(ranked) if u.id in drop):
        if not free:
            break
        best = min(free, key=lambda f: (abs(f - r), -f))
        free.remove(best)
        chosen.append(ranked[best].id)
    matched = len(chosen)
    in_memory = {u.id for u in ranked}
    rest = [u.id for u in store_units if u.id not in drop and u.id not in in_memory]
    random.Random(f"sham|{seed}").shuffle(rest)
    rest += [ranked[f].id for f in free]  # working-memory units only once the others run out
    chosen += rest[:max(0, len(drop) - len(chosen))]
    return set(chosen), {"sham_units": len(chosen), "sham_rank_matched": matched,
                         "sham_short": len(drop) - len(chosen)}


def evidence_only_nodes(graph: Any, units: list[Any], drop: set[str]) -> set[str]:
    """Node texts (case-folded) of a local graph that only units in ``drop`` contribute edges to."""
    from_evidence: set[int] = set()
    from_others: set[int] = set()
    for (head, tail), position in zip(graph.edge_index, graph.edge_unit):
        target = from_evidence if units[position].id in drop else from_others
        target.update((head, tail))
    return {graph.node_text[i].strip().casefold() for i in from_evidence - from_others}


__all__ = ["evidence_only_nodes", "evidence_unit_ids", "sham_unit_ids", "without_units"]
