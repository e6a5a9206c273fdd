"""Int8 weights of the frozen LM against float32, on quality: the usable ConvoMem questions answered by both.

Every usable ConvoMem question (the cross-fit's set: cases whose category has a reference answer, not a
rubric) is remembered and activated once; the same retrieved memory and graph are then answered greedily
by the export's LM in float32 and with int8 weights (:func:`int8_weights`: torch's dynamic quantization of
every Linear layer, int8 weights per output channel, the one int8 setting that made a CPU decoding step
cheaper, see docs/BENCHMARKS.md, *Serving*), and the reference answer's NLL is scored under both. The acceptance rule: token F1, the rule judge and the answer NLL with
int8 each within 0.01 of float32, as the paired ``int8 − float32`` 95 % interval over cases (a case's
questions move together) shows.

Resumable: one JSON line per question under ``--work``; a rerun skips what is there. ``--max-minutes``
stops at a case boundary. Cases run in a fixed shuffled order, so a cut-off run is a random subset::

    nice python -m bench.serving.int8_quality --export checkpoints/export --max-minutes 40 \\
        --out docs/results/int8_quality.json
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np

from bench.common import ci

TOLERANCE = 0.01


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--export", default="checkpoints/export")
    p.add_argument("--data", default="data/convomem")
    p.add_argument("--work", default="checkpoints/int8-quality", help="folder of the per-question JSON lines")
    p.add_argument("--out", default=None, help="write the summary JSON here")
    p.add_argument("--max-minutes", type=float, default=40.0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0, help="seed of the case order")
    return p.parse_args(argv)


def int8_weights(model):
    """``model`` with int8 Linear weights (per output channel; activations quantized at each call), in place."""
    import warnings

    import torch
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notices
        return quantize_dynamic(model, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8,
                                inplace=True)


def usable_cases(pipe, data: str, seed: int) -> list:
    """The ConvoMem cases with a scorable question, in a fixed shuffled order, loaded as the export's run
    loaded them (its distractor conversations and seed)."""
    from qgmem.data.loaders import load_cases
    from qgmem.llm.judge import RUBRIC_CATEGORIES

    split = pipe.encoder.export_config.get("data_split") or {}
    cases = load_cases("convomem", data, distractor_conversations=split.get("distractor_conversations") or 0,
                       seed=int(split.get("seed") or 0)).cases
    keep = []
    for case in cases:
        qas = [qa for qa in case.qas if qa.category not in RUBRIC_CATEGORIES and str(qa.answer).strip()]
        if qas:
            case.qas = qas
            keep.append(case)
    random.Random(seed).shuffle(keep)
    return keep


def answer_case(pipe, lms: dict, case) -> list[dict]:
    """One case's questions answered (greedy) and scored (reference NLL) under each LM."""
    from qgmem.evaluation.eval_qa import reference_nll

    pipe.remember(case.dialogue)
    retrieved = pipe.retrieve([qa.question for qa in case.qas],
                              [qa.question_time or qa.meta.get("reference_time") for qa in case.qas])
    rows = [{"qa_id": qa.id, "case_id": case.id, "category": qa.category, "reference": qa.answer}
            for qa in case.qas]
    for name, lm in lms.items():
        pipe.lm = lm
        t = time.perf_counter()
        answers = pipe.generate(retrieved, graph_mode="token")
        seconds = (time.perf_counter() - t) / len(rows)
        nll = reference_nll(pipe, retrieved, case.qas, "token")
        for row, a, v in zip(rows, answers, nll):
            row.update({f"answer_{name}": a.answer, f"nll_{name}": v, f"tokens_{name}": a.tokens["generated"],
                        f"seconds_{name}": round(seconds, 3)})
    return rows


def summarize(rows: list[dict], total: int) -> dict:
    """Means per LM and the paired ``int8 − float32`` interval of F1, the rule judge and the NLL."""
    from qgmem.evaluation.bootstrap import paired_bootstrap
    from qgmem.evaluation.crossfit import answer_scores

    refs = [r["reference"] for r in rows]
    groups = [r["case_id"] for r in rows]
    scores = {name: answer_scores([r[f"answer_{name}"] for r in rows], refs) for name in ("float32", "int8")}
    scores["float32"]["nll"] = [r["nll_float32"] for r in rows]
    scores["int8"]["nll"] = [r["nll_int8"] for r in rows]
    out = {"questions": len(rows), "of": total, "cases": len(set(groups)),
           "same_answer": float(np.mean([r["answer_float32"] == r["answer_int8"] for r in rows])) if rows else None,
           "seconds_per_answer": {n: float(np.mean([r[f"seconds_{n}"] for r in rows])) for n in ("float32", "int8")},
           "metrics": {}}
    for metric in ("f1", "judge", "em", "nll"):
        a, b = np.asarray(scores["float32"][metric]), np.asarray(scores["int8"][metric])
        diff = paired_bootstrap(b - a, groups)
        within = diff["n"] > 0 and -TOLERANCE <= diff["ci95"][0] and diff["ci95"][1] <= TOLERANCE
        out["metrics"][metric] = {"float32": float(a.mean()), "int8": float(b.mean()), "int8_minus_float32": diff,
                                  "within_tolerance": bool(within) if metric != "em" else None}
    return out


def print_table(s: dict) -> None:
    print(f"\n{s['questions']} of {s['of']} usable questions ({s['cases']} cases); same greedy answer "
          f"{s['same_answer']:.1%}")
    print("| metric | float32 | int8 | int8 − float32 [95 % paired interval] | within 0.01 |")
    print("| --- | --- | --- | --- | --- |")
    for name, m in s["metrics"].items():
        within = "-" if m["within_tolerance"] is None else ("yes" if m["within_tolerance"] else "no")
        print(f"| {name} | {m['float32']:.3f} | {m['int8']:.3f} | {ci(m['int8_minus_float32'])} | {within} |")


def main(argv=None) -> int:
    import copy

    import torch
    from tqdm.auto import tqdm

    from qgmem.serving.pipeline import QGMemPipeline

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    deadline = time.time() + 60 * args.max_minutes
    pipe = QGMemPipeline.from_pretrained(args.export, device="cpu")
    lms = {"float32": pipe.lm, "int8": int8_weights(copy.deepcopy(pipe.lm))}
    cases = usable_cases(pipe, args.data, args.seed)
    total = sum(len(c.qas) for c in cases)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    lines = work / "questions.jsonl"
    rows = [json.loads(x) for x in lines.read_text().splitlines()] if lines.exists() else []
    done = {r["case_id"] for r in rows}
    bar = tqdm(total=total, initial=len(rows), desc="int8 quality", unit="question")
    for case in cases:
        if case.id in done:
            continue
        if time.time() > deadline:
            print(f"[int8-quality] stopped at the time limit: {len(rows)} of {total} questions done", flush=True)
            break
        new = answer_case(pipe, lms, case)
        with open(lines, "a", encoding="utf-8") as fh:
            for row in new:
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
        rows.extend(new)
        bar.update(len(new))
    bar.close()
    summary = {"export": str(args.export), "tolerance": TOLERANCE, **summarize(rows, total)}
    print_table(summary)
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
