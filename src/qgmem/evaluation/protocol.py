"""Does the graph token carry sample-specific evidence? The paired ablation protocol behind the learning check.

One set of trained weights is evaluated several ways on the same held-out samples; the text of the
prompt is always the sample's own, only the graph changes:

- ``own``: each sample's own graph token (the model as trained);
- ``ablated``: the graph activated for the same question over the same store after every unit grounded
  in a gold evidence turn was removed (:mod:`qgmem.evaluation.counterfactuals`). Topic and style are held fixed and the
  evidence is gone. Samples without an ablated graph (no gold evidence, or no evidence unit in the
  store) have no score here and drop out of this contrast;
- ``sham``: the ablation's control, the graph activated after as many *non*-evidence units were removed,
  at the evidence's ranks where possible (the same table). ``own − ablated`` mixes "the evidence
  matters" with "any re-retrieved graph disagrees with the text"; ``sham − ablated`` is the evidence's
  own effect, and ``own − sham`` the cost of re-retrieval alone;
- ``shuffled``: the token of another sample's graph, from a derangement that never pairs a sample with
  its own graph nor with a graph identical to it (a wrong, off-topic graph: it shows that a wrong graph
  hurts, not that the right one helps);
- ``norel``: the own graph with its edge (predicate and fact) features zeroed, same weights: what the
  relation-aware part of the encoder carries;
- ``none``: no graph token at all.

Every contrast is the per-sample paired difference in answer NLL. Its interval is a hierarchical
bootstrap of the crossed design (:func:`hierarchical_bootstrap` with ``design="crossed"``): every seed
scores the same samples, so each draw resamples the seeds and, once for all of them, the groups
(dialogues; a sample is its own group when its dialogue has one QA). The interval holds seed variance
as well as sample variance without counting one question once per seed.
"""

from __future__ import annotations

import copy
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import torch

from qgmem.activation.graph import graph_signature
from qgmem.evaluation.bootstrap import hierarchical_bootstrap, paired_bootstrap

CONDITIONS = ("own", "ablated", "sham", "shuffled", "norel", "none")
CONTRASTS = {"own_vs_ablated": ("own", "ablated"), "own_vs_none": ("own", "none"),
             "own_vs_shuffled": ("own", "shuffled"), "own_vs_norel": ("own", "norel"),
             "own_vs_sham": ("own", "sham"), "sham_vs_ablated": ("sham", "ablated")}
#: the category whose references are all one sentence ("no information"): a pooled figure leaves it out
#: too, so that an effect on saying "I don't know" does not pass for an effect on content
ABSTENTION = "abstention_evidence"


# --------------------------------------------------------------------------------------------------
# which graph goes with which sample


def derangement(signatures: Sequence[str], seed: int = 0) -> list[int]:
    """``partner[i] != i`` with ``signatures[partner[i]] != signatures[i]`` for every ``i``: a permutation.

    Indices are shuffled, grouped by signature (largest group first), and each position is mapped
    ``m`` places on, ``m`` being the largest group's size; since every group is a block of at most ``m``
    consecutive positions, and ``2m <= n``, no index lands in its own block. Impossible when one graph
    is shared by more than half of the samples (then an error says so).
    """
    n = len(signatures)
    if n < 2:
        raise ValueError(f"a shuffled graph needs at least 2 samples, got {n}")
    rng = np.random.default_rng(seed)
    groups: dict[str, list[int]] = defaultdict(list)
    for i in rng.permutation(n).tolist():
        groups[signatures[i]].append(i)
    blocks = list(groups.values())
    order_of_groups = rng.permutation(len(blocks)).tolist()
    blocks = sorted((blocks[g] for g in order_of_groups), key=len, reverse=True)
    m = len(blocks[0])
    if 2 * m > n:
        raise ValueError(f"{m} of {n} samples share one identical graph: no shuffling can give each "
                         "sample a different graph")
    order = [i for block in blocks for i in block]
    partner = [0] * n
    for p, i in enumerate(order):
        partner[i] = order[(p + m) % n]
    return partner


def tie_report(signatures: Sequence[str]) -> dict[str, int]:
    """How many samples share their graph with another sample (identical features, identical token)."""
    counts: dict[str, int] = defaultdict(int)
    for s in signatures:
        counts[s] += 1
    return {"samples": len(signatures), "distinct_graphs": len(counts),
            "samples_in_ties": sum(c for c in counts.values() if c > 1),
            "largest_tie": max(counts.values()) if counts else 0}


# --------------------------------------------------------------------------------------------------
# statistics


@dataclass
class SampleScores:
    """Per-sample results of one trained model on one split: NLL (and generations) per condition."""

    qa_id: list[str]
    group: list[str]
    category: list[str]
    answer: list[str]
    nll: dict[str, list[float]] = field(default_factory=dict)
    predictions: dict[str, list[str]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"qa_id": self.qa_id, "group": self.group, "category": self.category, "answer": self.answer,
                "nll": self.nll, "predictions": self.predictions}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SampleScores:
        return cls(**d)

    def only(self, qa_ids: Iterable[str]) -> SampleScores:
        """The same scores restricted to ``qa_ids`` (order kept), e.g. a matched subset of questions."""
        keep = set(qa_ids)
        idx = [i for i, q in enumerate(self.qa_id) if q in keep]

        def pick(values: list) -> list:
            return [values[i] for i in idx]

        return SampleScores(qa_id=pick(self.qa_id), group=pick(self.group), category=pick(self.category),
                            answer=pick(self.answer), nll={c: pick(v) for c, v in self.nll.items()},
                            predictions={c: pick(v) for c, v in self.predictions.items() if v})


def contrast(diff: Any, groups: Sequence[str], category: Sequence[str], *, n_boot: int = 10_000,
             seed: int = 0) -> dict[str, Any]:
    """A paired difference ``[seeds, samples]`` with its crossed interval, overall, per category and
    without abstention (``NaN``: a sample without a score in that seed)."""
    diff = np.atleast_2d(np.asarray(diff, dtype=np.float64))
    groups, cat = np.asarray(groups), np.asarray(category)
    result = hierarchical_bootstrap(diff, groups, design="crossed", n_boot=n_boot, seed=seed)
    result["per_category"] = {c: hierarchical_bootstrap(diff[:, cat == c], groups[cat == c], design="crossed",
                                                        n_boot=n_boot, seed=seed) for c in sorted(set(cat.tolist()))}
    content = cat != ABSTENTION
    result["without_abstention"] = hierarchical_bootstrap(diff[:, content], groups[content], design="crossed",
                                                          n_boot=n_boot, seed=seed)
    for r in [*result["per_category"].values(), result["without_abstention"]]:
        r.pop("per_seed", None)
    return result


def summarize(runs: Sequence[SampleScores], *, n_boot: int = 10_000, seed: int = 0) -> dict[str, Any]:
    """Contrasts over seeds with the crossed :func:`hierarchical_bootstrap`, overall and per category.

    Also the mean NLL per condition (over the samples it scores) and EM/F1 per condition where
    generations exist. Every run must score the same samples (same ``qa_id`` order), which holds for
    seeds of one protocol.
    """
    from qgmem.text import exact_match, token_f1

    if not runs:
        raise ValueError("no runs to summarize")
    base = runs[0]
    for run in runs[1:]:
        if run.qa_id != base.qa_id:
            raise ValueError("runs scored different samples: seeds must share one evaluation split")

    def matrix(condition: str) -> np.ndarray:
        return np.asarray([[np.nan if v is None else v for v in r.nll[condition]] for r in runs], dtype=np.float64)

    nll = {c: matrix(c) for c in CONDITIONS if all(c in r.nll for r in runs)}
    out: dict[str, Any] = {"n": len(base.qa_id), "seeds": len(runs),
                           "nll": {c: float(np.nanmean(v)) if np.isfinite(v).any() else None for c, v in nll.items()},
                           "nll_per_seed": {c: [float(np.nanmean(row)) if np.isfinite(row).any() else None for row in v]
                                            for c, v in nll.items()}}
    categories = sorted(set(base.category))
    cat = np.asarray(base.category)
    groups = np.asarray(base.group)
    for name, (a, b) in CONTRASTS.items():
        if a not in nll or b not in nll:
            continue
        diff = nll[a] - nll[b]
        result = contrast(diff, groups, cat, n_boot=n_boot, seed=seed)
        result["per_seed_mean"] = [p["mean"] for p in result["per_seed"]]
        scored = np.isfinite(diff).any(0)
        result["share_below_zero"] = (float((np.nanmean(diff[:, scored], 0) < 0).mean()) if scored.any() else None)
        out[name] = result
    scores = {}
    for c in CONDITIONS:
        if all(c in r.predictions and r.predictions[c] for r in runs):
            em = [np.mean([exact_match(p, g) for p, g in zip(r.predictions[c], r.answer)]) for r in runs]
            f1 = [np.mean([token_f1(p, g) for p, g in zip(r.predictions[c], r.answer)]) for r in runs]
            scores[c] = {"em": float(np.mean(em)), "f1": float(np.mean(f1)),
                         "em_per_seed": [float(x) for x in em], "f1_per_seed": [float(x) for x in f1]}
    out["em_f1"] = scores
    out["per_category_n"] = {c: int((cat == c).sum()) for c in categories}
    return out


# --------------------------------------------------------------------------------------------------
# evaluation of one trained module


def graph_for(item: dict[str, Any], condition: str, partner: dict[str, Any] | None = None,
              counterfactual: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The item as scored under ``condition`` (its text always its own), or ``None`` when it has no such graph.

    ``counterfactual`` holds the item's ``ablated_graph``/``sham_graph`` with their node texts
    (:func:`qgmem.evaluation.counterfactuals.to_item`), for those two conditions.
    """
    out = dict(item)
    if condition == "shuffled":
        out["graph"] = partner["graph"]
        if "node_text" in partner:  # the graph's own node texts go with it
            out["node_text"] = partner["node_text"]
    elif condition in ("ablated", "sham"):
        counterfactual = counterfactual or {}
        if counterfactual.get(f"{condition}_graph") is None:
            return None
        out["graph"] = counterfactual[f"{condition}_graph"]
        out["node_text"] = list(counterfactual.get(f"{condition}_node_text") or [])
    elif condition == "norel":
        graph = copy.copy(item["graph"])
        for name in ("edge_attr", "edge_fact"):
            value = getattr(graph, name, None)
            if value is not None:
                setattr(graph, name, torch.zeros_like(value))
        out["graph"] = graph
    return out


@torch.no_grad()
def score_conditions(module, items: Sequence[dict[str, Any]], collator, *, groups: Sequence[str] | None = None,
                     batch_size: int = 8, seed: int = 0, generate: Iterable[str] = (),
                     conditions: Sequence[str] = CONDITIONS,
                     counterfactuals: Mapping[str, dict[str, Any]] | None = None) -> tuple[SampleScores, dict[str, Any]]:
    """Answer NLL of every item under each condition with ``module``'s current weights.

    ``shuffled`` pairs item ``i`` with the graph of item ``partner[i]`` (:func:`derangement` over the
    graphs' signatures, seeded by ``seed``); ``ablated`` and ``sham`` use the graphs that
    ``counterfactuals`` (``qa_id`` -> :func:`qgmem.evaluation.counterfactuals.to_item`) holds for the
    item (items without one score ``None``); the text of the prompt is always the item's own. ``generate``:
    conditions whose greedy answers are also decoded (for EM/F1). Returns the scores and a report on
    the pairing (ties, how many partners differ, how many items have an ablated graph).
    """
    from qgmem.model.fusion import answer_nll, insert_token
    from qgmem.model.kv_prefix import reading
    from qgmem.prompting import final_answer, generate as generate_text

    unknown = sorted(set(conditions) - set(CONDITIONS))
    if unknown:
        raise ValueError(f"unknown condition(s) {unknown}; known: {list(CONDITIONS)}")
    module.eval()
    signatures = [graph_signature(it["graph"]) for it in items]
    counterfactuals = counterfactuals or {}
    extra = [counterfactuals.get(str(it.get("qa_id")), {}) for it in items]
    partner = derangement(signatures, seed) if "shuffled" in conditions else list(range(len(items)))
    report = {**tie_report(signatures),
              "shuffled_same_graph": sum(signatures[p] == signatures[i] for i, p in enumerate(partner))
              if "shuffled" in conditions else None,
              "with_ablated_graph": sum(c.get("ablated_graph") is not None for c in extra),
              "with_sham_graph": sum(c.get("sham_graph") is not None for c in extra)}
    scores = SampleScores(qa_id=[str(it.get("qa_id", i)) for i, it in enumerate(items)],
                          group=[str(g) for g in (groups or [it.get("qa_id", i) for i, it in enumerate(items)])],
                          category=[str(it.get("category", "")) for it in items],
                          answer=[str(it["answer"]) for it in items])
    generate = set(generate)
    for condition in conditions:
        scored = [(i, graph_for(items[i], condition, items[partner[i]], extra[i])) for i in range(len(items))]
        scored = [(i, it) for i, it in scored if it is not None]
        rows: list[float | None] = [None] * len(items)
        predictions: list[str | None] = [None] * len(items)
        for start in range(0, len(scored), batch_size):
            index = [i for i, _ in scored[start:start + batch_size]]
            chunk = [it for _, it in scored[start:start + batch_size]]
            batch = _to_device(collator(chunk), module.device)
            embeds = module.lm.get_input_embeddings()(batch["input_ids"])
            token = None if condition == "none" else module.net(batch["graph"])
            fused = insert_token(embeds, batch["attention_mask"], batch["graph_pos"], token, batch["labels"])
            with reading(module.lm, token, batch["graph_pos"]):
                values = answer_nll(module.lm, *fused, reduction="none", shared_prefix=module.shared_prefix(batch))
            for i, v in zip(index, values.float().cpu().tolist()):
                rows[i] = v
            if condition in generate:
                gen_embeds = module.lm.get_input_embeddings()(batch["gen_input_ids"])
                g_embeds, g_mask, _, _ = insert_token(gen_embeds, batch["gen_attention_mask"], batch["gen_graph_pos"],
                                                      token)
                enc = collator.encoder
                with reading(module.lm, token, batch["gen_graph_pos"]):
                    out = generate_text(module.lm, module.tokenizer, g_mask, inputs_embeds=g_embeds,
                                        max_new_tokens=module.generation.max_new_tokens, stop_ids=enc.stop_ids,
                                        pad_id=enc.pad_id,
                                        stop_at_newline=enc.settings.first_line and not enc.settings.enable_thinking)
                for i, t in zip(index, out.texts):
                    predictions[i] = final_answer(t, enc.settings.first_line)
        if not all(math.isfinite(x) for x in rows if x is not None):
            raise FloatingPointError(f"non-finite answer NLL under condition {condition!r}")
        scores.nll[condition] = rows
        if condition in generate and all(p is not None for p in predictions):
            scores.predictions[condition] = predictions
    return scores, report


def _to_device(batch: dict[str, Any], device) -> dict[str, Any]:
    return {k: v.to(device) if hasattr(v, "to") else v for k, v in batch.items()}
