"""Does the graph token carry sample-specific evidence? The paired ablation protocol behind the learning check.

One set of trained weights is evaluated three ways on the same held-out samples:

- ``own``: each sample's own graph token (the model as trained);
- ``shuffled``: the token of another sample's graph, from a derangement that never pairs a sample with
  its own graph nor with a graph identical to it (a token any graph would give equally is a soft
  prompt, and this condition exposes it);
- ``none``: no graph token at all.

The figure is the per-sample paired difference in answer NLL (``own − shuffled``, ``own − none``),
averaged over seeds per sample, with a bootstrap interval that resamples whole groups (dialogues), so
samples that share a conversation are not counted as independent evidence.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np
import torch

CONDITIONS = ("own", "shuffled", "none")
CONTRASTS = {"token_vs_shuffled": ("own", "shuffled"), "token_vs_none": ("own", "none")}


# --------------------------------------------------------------------------------------------------
# which graph goes with which sample


def graph_signature(graph) -> str:
    """A digest of everything the encoder reads from a graph: equal digests give equal tokens."""
    digest = hashlib.sha1()
    for name in ("x", "edge_index", "edge_attr", "edge_fact"):
        value = getattr(graph, name, None)
        if value is None:
            digest.update(f"{name}:none".encode())
            continue
        array = value.detach().cpu().contiguous().numpy()
        digest.update(f"{name}:{array.dtype}:{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


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


def paired_bootstrap(diffs: Sequence[float], groups: Sequence[str] | None = None, *, n_boot: int = 10_000,
                     seed: int = 0, level: float = 0.95) -> dict[str, Any]:
    """Mean of paired differences with a percentile bootstrap interval over groups (samples if ``None``).

    Each bootstrap draw resamples whole groups with replacement and takes the mean of the differences
    of all samples drawn, so correlated samples of one group move together.
    """
    d = np.asarray(diffs, dtype=np.float64)
    if d.size == 0:
        return {"mean": None, "ci95": [None, None], "n": 0, "groups": 0}
    keys = np.asarray(groups if groups is not None else np.arange(d.size).astype(str))
    uniq, inverse = np.unique(keys, return_inverse=True)
    sums = np.bincount(inverse, weights=d, minlength=len(uniq))
    sizes = np.bincount(inverse, minlength=len(uniq)).astype(np.float64)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(uniq), size=(n_boot, len(uniq)))
    means = sums[draws].sum(1) / sizes[draws].sum(1)
    alpha = (1 - level) / 2
    lo, hi = np.quantile(means, [alpha, 1 - alpha])
    return {"mean": float(d.mean()), "ci95": [float(lo), float(hi)], "n": int(d.size), "groups": int(len(uniq))}


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


def summarize(runs: Sequence[SampleScores], *, n_boot: int = 10_000, seed: int = 0) -> dict[str, Any]:
    """Contrasts over seeds: per sample, the seed-mean of ``own − other``; then bootstrap, overall and per category.

    Also the mean NLL per condition and EM/F1 per condition where generations exist. Every run must
    score the same samples (same ``qa_id`` order), which holds for seeds of one protocol.
    """
    from qgmem.text import exact_match, token_f1

    if not runs:
        raise ValueError("no runs to summarize")
    base = runs[0]
    for run in runs[1:]:
        if run.qa_id != base.qa_id:
            raise ValueError("runs scored different samples: seeds must share one evaluation split")
    nll = {c: np.mean([np.asarray(r.nll[c]) for r in runs], axis=0) for c in CONDITIONS if c in base.nll}
    out: dict[str, Any] = {"n": len(base.qa_id), "seeds": len(runs),
                           "nll": {c: float(v.mean()) for c, v in nll.items()}}
    categories = sorted(set(base.category))
    for name, (a, b) in CONTRASTS.items():
        if a not in nll or b not in nll:
            continue
        diff = nll[a] - nll[b]
        result = paired_bootstrap(diff, base.group, n_boot=n_boot, seed=seed)
        result["per_seed_mean"] = [float(np.mean(np.asarray(r.nll[a]) - np.asarray(r.nll[b]))) for r in runs]
        result["per_category"] = {}
        for cat in categories:
            keep = np.asarray([c == cat for c in base.category])
            result["per_category"][cat] = paired_bootstrap(diff[keep], np.asarray(base.group)[keep],
                                                           n_boot=n_boot, seed=seed)
        out[name] = result
    scores = {}
    for c in CONDITIONS:
        if all(c in r.predictions and r.predictions[c] for r in runs):
            em = [np.mean([exact_match(p, g) for p, g in zip(r.predictions[c], r.answer)]) for r in runs]
            f1 = [np.mean([token_f1(p, g) for p, g in zip(r.predictions[c], r.answer)]) for r in runs]
            scores[c] = {"em": float(np.mean(em)), "f1": float(np.mean(f1)),
                         "em_per_seed": [float(x) for x in em], "f1_per_seed": [float(x) for x in f1]}
    out["em_f1"] = scores
    out["per_category_n"] = {cat: int(sum(c == cat for c in base.category)) for cat in categories}
    return out


# --------------------------------------------------------------------------------------------------
# evaluation of one trained module


@torch.no_grad()
def score_conditions(module, items: Sequence[dict[str, Any]], collator, *, groups: Sequence[str] | None = None,
                     batch_size: int = 8, seed: int = 0, generate: Iterable[str] = (),
                     conditions: Sequence[str] = CONDITIONS) -> tuple[SampleScores, dict[str, Any]]:
    """Answer NLL of every item under each condition with ``module``'s current weights.

    ``shuffled`` pairs item ``i`` with the graph of item ``partner[i]`` (:func:`derangement` over the
    graphs' signatures, seeded by ``seed``); the text of the prompt is always the item's own.
    ``generate``: conditions whose greedy answers are also decoded (for EM/F1). Returns the scores and
    a report on the pairing (ties, how many partners differ).
    """
    from qgmem.model.fusion import answer_nll, insert_token
    from qgmem.prompting import final_answer, generate as generate_text

    module.eval()
    signatures = [graph_signature(it["graph"]) for it in items]
    partner = derangement(signatures, seed)
    report = {**tie_report(signatures),
              "shuffled_same_graph": sum(signatures[p] == signatures[i] for i, p in enumerate(partner))}
    scores = SampleScores(qa_id=[str(it.get("qa_id", i)) for i, it in enumerate(items)],
                          group=[str(g) for g in (groups or [it.get("qa_id", i) for i, it in enumerate(items)])],
                          category=[str(it.get("category", "")) for it in items],
                          answer=[str(it["answer"]) for it in items])
    generate = set(generate)
    for condition in conditions:
        rows, predictions = [], []
        for start in range(0, len(items), batch_size):
            index = range(start, min(start + batch_size, len(items)))
            chunk = [dict(items[i]) for i in index]
            if condition == "shuffled":
                for j, i in enumerate(index):
                    chunk[j]["graph"] = items[partner[i]]["graph"]
                    if "node_text" in items[partner[i]]:  # the graph's own node texts go with it
                        chunk[j]["node_text"] = items[partner[i]]["node_text"]
            batch = _to_device(collator(chunk), module.device)
            embeds = module.lm.get_input_embeddings()(batch["input_ids"])
            token = None if condition == "none" else module.net(batch["graph"])
            fused = insert_token(embeds, batch["attention_mask"], batch["graph_pos"], token, batch["labels"])
            rows.extend(answer_nll(module.lm, *fused, reduction="none", shared_prefix=module.shared_prefix(batch))
                        .float().cpu().tolist())
            if condition in generate:
                gen_embeds = module.lm.get_input_embeddings()(batch["gen_input_ids"])
                g_embeds, g_mask, _, _ = insert_token(gen_embeds, batch["gen_attention_mask"], batch["gen_graph_pos"],
                                                      token)
                enc = collator.encoder
                out = generate_text(module.lm, module.tokenizer, g_mask, inputs_embeds=g_embeds,
                                    max_new_tokens=module.hparams.max_new_tokens, stop_ids=enc.stop_ids,
                                    pad_id=enc.pad_id,
                                    stop_at_newline=enc.settings.first_line and not enc.settings.enable_thinking)
                predictions.extend(final_answer(t, enc.settings.first_line) for t in out.texts)
        if not all(math.isfinite(x) for x in rows):
            raise FloatingPointError(f"non-finite answer NLL under condition {condition!r}")
        scores.nll[condition] = rows
        if predictions:
            scores.predictions[condition] = predictions
    return scores, report


def _to_device(batch: dict[str, Any], device) -> dict[str, Any]:
    return {k: v.to(device) if hasattr(v, "to") else v for k, v in batch.items()}
