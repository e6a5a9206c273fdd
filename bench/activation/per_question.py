"""Read the per-question files of ``bench/activation/activation_mechanisms.py`` (``--per-question-dir``).

    python -m bench.activation.per_question misses DIR/convomem_long.default.jsonl
    python -m bench.activation.per_question compare DIR/convomem_long.default.jsonl DIR/convomem_long.paper.jsonl
    python -m bench.activation.per_question speakers DIR/locomo_form_swapped.default.jsonl

``misses``: every gold turn outside the top k, as ungrounded (no unit grounds it), outside the fused pool
(with the question's per-channel pool recall beside it), or in the pool but ranked below k; with the ranks
the BM25 and dense baselines over raw turns give it. ``compare``: Recall@k per category, A → B, with the
paired bootstrap 95 % interval of the change (questions resampled), the same for nDCG@k over all
questions, how many questions' recall falls and rises, and every question whose recall moved.
``speakers``: for questions that name one speaker of the dialogue, the share of the top k spoken by that
speaker, over the questions whose gold turns all reach the top k and over the rest, beside the share of
gold turns the named speaker said: whether a name in the question pulls activation to that speaker.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from bench.common import paired_interval


def load(path: str) -> dict[str, dict]:
    rows = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    return {r["question_id"]: r for r in rows}


def misses(rows: dict[str, dict], k: int) -> Counter:
    kinds: Counter = Counter()
    for r in rows.values():
        for gold in r["gold_turn_ids"]:
            rank = r["gold_rank"].get(gold)
            if rank is not None and rank <= k:
                continue
            kind = ("ungrounded" if gold in r["ungrounded_gold_turn_ids"]
                    else "outside the fused pool" if rank is None else "ranked below k")
            kinds[kind] += 1
            dense = (r.get("gold_rank_dense_turns") or {}).get(gold)
            bm25 = (r.get("gold_rank_bm25_turns") or {}).get(gold)
            channels = ", ".join(f"{name} {value:.2f}" for name, value in r["pool_recall"].items())
            print(f"{kind:22s} rank {rank} | dense turns {dense} | BM25 turns {bm25} | pool recall: {channels} | "
                  f"{r['category']} | {r['question'][:70]}")
    gold = sum(len(r["gold_turn_ids"]) for r in rows.values())
    print(f"\n{sum(kinds.values())} of {gold} gold turns outside the top {k}: " + ", ".join(
        f"{n} {kind}" for kind, n in kinds.most_common()))
    return kinds


def compare(a: dict[str, dict], b: dict[str, dict], k: int) -> None:
    metric = f"recall@{k}"
    by_category: dict[str, list[str]] = defaultdict(list)
    for qid, row in a.items():
        by_category[row["category"]].append(qid)
    print(f"| category | n | {metric} A | {metric} B | change [95 % CI] |\n| --- | --- | --- | --- | --- |")
    for category, ids in sorted(by_category.items()):
        before, after = [a[i][metric] for i in ids], [b[i][metric] for i in ids]
        mean, lo, hi = paired_interval(before, after)
        print(f"| {category} | {len(ids)} | {np.mean(before):.3f} | {np.mean(after):.3f} | "
              f"{mean:+.3f} [{lo:+.3f}, {hi:+.3f}] |")
    ids = list(a)
    mean, lo, hi = paired_interval([a[i][metric] for i in ids], [b[i][metric] for i in ids])
    print(f"| all | {len(ids)} | {np.mean([a[i][metric] for i in ids]):.3f} | "
          f"{np.mean([b[i][metric] for i in ids]):.3f} | {mean:+.3f} [{lo:+.3f}, {hi:+.3f}] |")
    ndcg = f"ndcg@{k}"
    before, after = [a[i][ndcg] for i in ids], [b[i][ndcg] for i in ids]
    mean, lo, hi = paired_interval(before, after)
    print(f"| all, {ndcg} | {len(ids)} | {np.mean(before):.3f} | {np.mean(after):.3f} | "
          f"{mean:+.3f} [{lo:+.3f}, {hi:+.3f}] |\n")
    down = sum(b[i][metric] < a[i][metric] for i in ids)
    up = sum(b[i][metric] > a[i][metric] for i in ids)
    print(f"questions whose {metric} falls: {down}; rises: {up}")
    for qid in ids:
        if a[qid][metric] != b[qid][metric]:
            print(f"{a[qid]['category']}: {a[qid][metric]:.2f} -> {b[qid][metric]:.2f}  {a[qid]['question'][:80]}")


def speakers(rows: dict[str, dict], k: int) -> None:
    from qgmem.evaluation.adversarial import names_in

    names = sorted({u["speaker"] for r in rows.values() for u in r["activated"] if u["speaker"]})
    shares: dict[str, list[float]] = defaultdict(list)
    gold_by_named: list[float] = []
    for r in rows.values():
        named = names_in(r["question"], names)
        if len(named) != 1:
            continue
        top = r["activated"][:k]
        share = sum(u["speaker"] == named[0] for u in top) / max(len(top), 1)
        shares["all gold in the top k" if r[f"recall@{k}"] == 1.0 else "gold missed"].append(share)
        said = {t for u in r["activated"] for t in u["source_turn_ids"] if u["speaker"] == named[0]}
        gold_by_named.append(sum(g in said for g in r["gold_turn_ids"]) / max(len(r["gold_turn_ids"]), 1))
    print(f"speakers seen: {', '.join(names)}")
    for group, values in shares.items():
        print(f"{group}: {len(values)} questions, {np.mean(values):.2f} of their top {k} said by the named speaker")
    print(f"(of the gold turns in the top {k}, a share of {np.mean(gold_by_named):.2f} was said by the named speaker)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("misses", help="where the gold turns outside the top k are")
    one.add_argument("file")
    two = sub.add_parser("compare", help="per-category recall, A -> B, paired")
    two.add_argument("a")
    two.add_argument("b")
    two.add_argument("--shared", action="store_true",
                     help="compare the questions both files hold, their ids read without the swapped-speaker "
                          "probe's '/swapped' (a swapped file against the file it was made from)")
    three = sub.add_parser("speakers", help="whether the speaker a question names fills its top k")
    three.add_argument("file")
    for p in (one, two, three):
        p.add_argument("--k", type=int, default=10)
    args = parser.parse_args()
    if args.command == "misses":
        misses(load(args.file), args.k)
    elif args.command == "speakers":
        speakers(load(args.file), args.k)
    else:
        a, b = load(args.a), load(args.b)
        if args.shared:
            a, b = ({qid.removesuffix("/swapped"): row for qid, row in rows.items()} for rows in (a, b))
            shared = set(a) & set(b)
            print(f"{len(shared)} questions in both files ({len(a) - len(shared)} only in A, "
                  f"{len(b) - len(shared)} only in B)")
            a, b = ({qid: rows[qid] for qid in rows if qid in shared} for rows in (a, b))
        if set(a) != set(b):
            parser.error("the two files hold different questions")
        compare(a, b, args.k)
    return 0


if __name__ == "__main__":
    sys.exit(main())
