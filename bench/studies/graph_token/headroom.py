"""The compact prompt's headroom: the frozen LM without graph tokens at text budgets of m units.

What a compact prompt (the top ``m`` units as text, the graph holding the rest) has to recover, before
anything is trained: on the cross-fitted study's questions (:mod:`bench.studies.graph_token.crossfit`:
the same folds, fold-bound distractors and sample cache under ``--root``), the embedded LM reads the
product's prompt with its textual working memory cut to the top ``m`` entries (``data.memory_units``)
and no graph token (the ``none`` condition of :func:`qgmem.evaluation.protocol.score_conditions`, which
also decodes the greedy answers). Per budget: answer NLL, greedy F1, EM and the rule judge
(:func:`qgmem.evaluation.crossfit.answer_scores`), and the prompt's tokens; per category and without
abstention, with paired differences ``m − M`` (``M`` the largest budget) and their intervals.

Nothing is trained, so there are no seeds: the interval is the crossed bootstrap of one row
(:func:`qgmem.evaluation.protocol.contrast`), which resamples the dialogues only. The prompt cap is
raised (``--max-prompt-tokens``) so that the largest budget's entries fit whole; the JSON counts the
prompts whose memory text was still trimmed.

Resumable: every batch of questions is scored at every budget and appended to
``ROOT/headroom-KEY/scores.jsonl`` (KEY: the samples, the budgets, the cap and the LM's settings), so a
run cut off by ``--max-minutes`` (or killed) loses at most one batch; the same command goes on
(``--summary-only`` then writes the JSON and prints the tables from what is recorded, scoring nothing;
:func:`per_question` reads one budget's rows by ``qa_id``). Two
copies of it (``--threads 1`` each, one per core) share the work::

    python -m bench.studies.graph_token.headroom --root checkpoints/crossfit --max-minutes 40 \\
        --out docs/results/headroom_text_budget.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import REPO, ci
from bench.studies.graph_token import crossfit as X

METRICS = ("nll", "f1", "em", "judge")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default="checkpoints/crossfit", help="the cross-fitted study's root (its sample cache)")
    p.add_argument("--config", default=str(REPO / "configs" / "nodes10.yaml"))  # the product (10 units of text)
    p.add_argument("--cache-dir", default=None, help="sentence-embedding memo folder (default: the data module's)")
    p.add_argument("--folds", type=int, default=5)
    p.add_argument("--fold-seed", type=int, default=0, help="seed of the fold assignment and the distractor draw")
    p.add_argument("--units", type=int, nargs="+", default=[0, 1, 3, 5, 10], help="text budgets m (units)")
    p.add_argument("--max-prompt-tokens", type=int, default=1024,
                   help="prompt cap, raised from the product's so that the largest budget fits")
    p.add_argument("--max-minutes", type=float, default=40.0)
    p.add_argument("--saved-only", action="store_true",
                   help="score only the cases whose samples are saved (replay none; crossfit.py --samples-only "
                        "may be filling the cache meanwhile)")
    p.add_argument("--summary-only", action="store_true")
    p.add_argument("--out", default=None, help="write the summary JSON here")
    p.add_argument("--n-boot", type=int, default=10_000)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    if min(args.units) < 0:
        p.error(f"--units must be >= 0, got {min(args.units)}")
    args.units = sorted(set(args.units))
    return args


def scores_file(folder: Path, setting: dict[str, Any], args) -> Path:
    """Where this setting's per-question scores go: keyed on everything that changes them."""
    key = hashlib.sha256(json.dumps({"samples": folder.name, "units": args.units, "cap": args.max_prompt_tokens,
                                     "data": {k: setting["data"].get(k) for k in ("max_answer_tokens",)},
                                     "model": {k: setting["model"].get(k) for k in ("lm", "generation")}},
                                    sort_keys=True).encode()).hexdigest()[:12]
    return Path(args.root) / f"headroom-{key}" / "scores.jsonl"


def read_scores(path: Path) -> dict[str, dict[str, Any]]:
    """``{qa_id: record}`` of the questions scored so far (a torn last line is dropped)."""
    out = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            out[r["qa_id"]] = r
    return out


def per_question(path: Path, m: int) -> dict[str, dict[str, Any]]:
    """``{qa_id: scores}`` of the text-only prompt at budget ``m``, read from a scores file.

    The matched-budget study's reference (``m = 10`` units of text, no graph token) pairs with its own
    conditions by ``qa_id``; each row holds ``group`` and ``category`` with the budget's ``nll``, ``f1``,
    ``em``, ``judge``, ``prediction`` and ``prompt_tokens``. The summary JSON names the file under
    ``--root`` (``scores``): ``per_question(Path(root) / summary["scores"], 10)``.
    A budget the file does not hold raises ``KeyError`` naming it.
    """
    rows = read_scores(path)
    missing = [q for q, r in rows.items() if str(m) not in r["units"]]
    if missing:
        raise KeyError(f"{path}: budget m={m} not scored (e.g. question {missing[0]})")
    return {q: {"group": r["group"], "category": r["category"], **r["units"][str(m)]} for q, r in rows.items()}


#: questions per unit of work: two copies of one command share the windows (a window being scored is
#: locked, as crossfit.py locks its units); inside one, batches are cut by memory length to spare
#: padding and run in a seeded random order
WINDOW = 64


def score(items: list[dict[str, Any]], setting: dict[str, Any], args, path: Path, deadline: float) -> bool:
    """Score every item not yet in ``path`` at every budget; ``False`` when the deadline stopped it first."""
    from qgmem.evaluation.crossfit import answer_scores
    from qgmem.evaluation.protocol import score_conditions
    from qgmem.training.datamodule import InMemoryDataModule
    from qgmem.training.module import QGMemModule

    done = read_scores(path)
    if all(it["qa_id"] in done for it in items):
        return True
    data, model_cfg = setting["data"], setting["model"]
    print(f"[headroom] {len(done)} of {len(items)} questions scored; scoring the rest at m = {args.units}, "
          f"prompt cap {args.max_prompt_tokens}", flush=True)
    module = QGMemModule(**{**model_cfg, "feature_dim": int(items[0]["graph"].x.shape[1])})
    collators = {m: InMemoryDataModule(items[:1], max_prompt_tokens=args.max_prompt_tokens,
                                       max_answer_tokens=int(data["max_answer_tokens"]), memory_units=m,
                                       tokenizer=module.tokenizer).collator for m in args.units}
    batch = int(data.get("eval_batch_size", 8))
    path.parent.mkdir(parents=True, exist_ok=True)
    started, scored = time.perf_counter(), 0
    for w in range(0, len(items), WINDOW):
        window = [it for it in items[w:w + WINDOW] if it["qa_id"] not in read_scores(path)]
        lock = path.with_name(f"window-{w // WINDOW}.lock")
        if not window or not X.claim(lock):  # done, or another copy is scoring it
            continue
        try:
            window.sort(key=lambda it: len(it["memory_text"]))
            chunks = [window[i:i + batch] for i in range(0, len(window), batch)]
            random.Random(w).shuffle(chunks)  # a window cut off part-way is not its shortest questions
            for chunk in chunks:
                if time.time() > deadline:
                    print("[headroom] stopped at the time limit; rerun to go on", flush=True)
                    return False
                records = [{"qa_id": it["qa_id"], "group": it["group"], "category": it["category"],
                            "answer": it["answer"], "units": {}} for it in chunk]
                for m, collator in collators.items():
                    scores, _ = score_conditions(module, chunk, collator, groups=[it["group"] for it in chunk],
                                                 batch_size=batch, generate=["none"], conditions=["none"])
                    answers = answer_scores(scores.predictions["none"], scores.answer)
                    for i, (it, rec) in enumerate(zip(chunk, records)):
                        prompt = collator.encoder.prompt(it["memory_text"], it["question"])
                        rec["units"][str(m)] = {"nll": scores.nll["none"][i],
                                                "prediction": scores.predictions["none"][i],
                                                **{k: answers[k][i] for k in ("f1", "em", "judge")},
                                                "prompt_tokens": len(prompt.ids), "memory_tokens": prompt.memory_tokens,
                                                "memory_tokens_dropped": prompt.memory_tokens_dropped}
                append(path, "".join(json.dumps(rec) + "\n" for rec in records))
                scored += len(chunk)
                rate = (time.perf_counter() - started) / scored
                print(f"[headroom] {len(read_scores(path))}/{len(items)} questions scored "
                      f"({rate:.0f} s a question here, all budgets)", flush=True)
        finally:
            lock.unlink(missing_ok=True)
    return all(it["qa_id"] in read_scores(path) for it in items)


def append(path: Path, text: str) -> None:
    """Append ``text`` in one write: two copies of the command append to the same file."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def summary(records: list[dict[str, Any]], units: list[int], n_boot: int) -> dict[str, Any]:
    """Means per budget (overall, without abstention, per category) and each ``m − max`` with its interval."""
    from qgmem.evaluation.protocol import ABSTENTION, contrast

    groups = [r["group"] for r in records]
    cats = np.asarray([r["category"] for r in records])
    value = {(m, k): np.asarray([r["units"][str(m)][k] for r in records], dtype=np.float64)
             for m in units for k in (*METRICS, "prompt_tokens", "memory_tokens", "memory_tokens_dropped")}
    content = cats != ABSTENTION
    out: dict[str, Any] = {"n": len(records), "per_category_n": {c: int((cats == c).sum()) for c in sorted(set(cats))},
                           "units": units, "budgets": {}, "contrasts": {}}
    for m in units:
        row: dict[str, Any] = {}
        for k in (*METRICS, "prompt_tokens", "memory_tokens"):
            v = value[(m, k)]
            row[k] = {"all": float(v.mean()), "without_abstention": float(v[content].mean()),
                      "per_category": {c: float(v[cats == c].mean()) for c in sorted(set(cats))}}
        row["prompts_trimmed"] = int((value[(m, "memory_tokens_dropped")] > 0).sum())
        out["budgets"][str(m)] = row
    top = max(units)
    for m in units[:-1]:
        out["contrasts"][f"m{m}_vs_m{top}"] = {k: contrast(value[(m, k)] - value[(top, k)], groups, cats, n_boot=n_boot)
                                              for k in METRICS}
        for r in out["contrasts"][f"m{m}_vs_m{top}"].values():
            r.pop("per_seed", None)
    return out


def print_table(s: dict[str, Any]) -> None:
    cats = sorted(s["per_category_n"])
    units = s["units"]
    print(f"\n{s['n']} questions; frozen LM, no graph token, prompt cap {s['max_prompt_tokens']} tokens\n")
    print("| m | prompt tokens | answer NLL | F1 | EM | judge | NLL without abstention | F1 without abstention "
          "| prompts trimmed |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for m in units:
        b = s["budgets"][str(m)]
        print(f"| {m} | {b['prompt_tokens']['all']:.0f} | {b['nll']['all']:.3f} | {b['f1']['all']:.3f} | "
              f"{b['em']['all']:.3f} | {b['judge']['all']:.3f} | {b['nll']['without_abstention']:.3f} | "
              f"{b['f1']['without_abstention']:.3f} | {b['prompts_trimmed']} |")
    for name, c in s["contrasts"].items():
        print(f"\n{name.replace('_vs_', ' − ')} (95 % CI, dialogues resampled)\n")
        print("| metric | all | without abstention | " + " | ".join(f"{c_} (n={s['per_category_n'][c_]})" for c_ in cats)
              + " |\n| --- | --- | --- |" + " --- |" * len(cats))
        for k in METRICS:
            r = c[k]
            print(f"| {k} | {ci(r)} | {ci(r['without_abstention'])} | "
                  + " | ".join(ci(r["per_category"][c_]) for c_ in cats) + " |")


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    started = time.time()
    deadline = started + 60 * args.max_minutes
    setting = X.product_setting(args.config)
    cases, folds, scored = X.fold_cases(setting, args)
    spec = X.sample_spec(setting, args)
    folder = X.samples_folder(spec, args)
    chosen = [c for c in cases if c.id in scored]
    print(f"[headroom] {len(chosen)} scored cases of {len(cases)}; samples in {folder}", flush=True)
    if not (args.summary_only or args.saved_only) and not X.build_samples(chosen, spec, folder, deadline):
        return 0
    items, _ = X.load_items([c for c in chosen if X.case_file(folder, c.id).exists()], folder)
    # a fixed hashed order, not the loader's (which runs category by category): a run cut off early has
    # scored a sample of every category
    questions = sorted((it for c in chosen if c.id in items for it in items[c.id]),
                       key=lambda it: hashlib.sha256(it["qa_id"].encode()).hexdigest())
    path = scores_file(folder, setting, args)
    print(f"[headroom] {len(questions)} questions; scores in {path}", flush=True)
    if not args.summary_only and not score(questions, setting, args, path, deadline):
        return 0
    done = read_scores(path)
    records = [done[it["qa_id"]] for it in questions if it["qa_id"] in done]
    if not records:
        return 0
    out = {**summary(records, args.units, args.n_boot), "max_prompt_tokens": args.max_prompt_tokens,
           "questions": len(questions), "complete": len(records) == len(questions) == len(scored),
           "interval": "crossed bootstrap of one row (nothing trained, no seeds): dialogues resampled",
           "samples_key": spec.samples_key, "scores": str(path.relative_to(args.root)), "folds": args.folds, "fold_seed": args.fold_seed,
           "wall_s": round(time.time() - started, 1)}
    print_table(out)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
