"""``qgmem eval-qa``: answer a data set's questions with an export and score them, one row per graph mode.

Every selected question is activated once; the answers of each graph mode (``token``, ``none``,
``shuffled``) come from the same weights in the same run, so the graph token's effect is one table.
Scores use the one normalizer (:mod:`qgmem.text`): exact match and token F1 against the reference, and
a judge: ``rule`` (the normalized match rule) or ``llm`` (an LLM through the shared backend, with the
grading rules of :mod:`qgmem.samples.judge`). Rubric categories (ConvoMem's preference and implicit
connection) have no reference answer: only the LLM judge scores them; otherwise they are counted as
not scored. The efficiency columns are the paper's: retrieved-context tokens, total online tokens
and seconds per QA by stage (memory construction amortized over the case's questions).
"""

from __future__ import annotations

import argparse
import json
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

from qgmem.errors import UserError
from qgmem.serving.commands import add_export_arguments, api_config, load_pipeline
from qgmem.text import exact_match, token_f1
from qgmem.samples.judge import RUBRIC_CATEGORIES, JudgeItem, LLMJudge, MatchJudge, backend_completer

SPLITS = ("train", "val", "test", "all")
STAGES = ("construction", "activation", "graph_features", "graph_encoding", "generation")


#: flags also come from a --config YAML file, and --print_config shows them (jsonargparse)
CONFIG_FILE = True

def add_arguments(parser: argparse.ArgumentParser) -> None:
    from qgmem.data.loaders import DATASETS, add_load_arguments

    add_export_arguments(parser)
    parser.add_argument("--dataset", required=True, choices=DATASETS)
    parser.add_argument("--path", required=True, help="the data set's file or folder")
    parser.add_argument("--split", choices=SPLITS, default="test",
                        help="cases of this split of the export's training run (its sampling and split are "
                             "recorded in the export); 'all': every case (default: test)")
    parser.add_argument("--limit", type=int, default=6,
                        help="at most this many questions, taken round-robin over the categories (default 6: a few "
                             "minutes on a 2-core CPU; 0 = all)")
    parser.add_argument("--graph", default="token,none,shuffled", help="comma-separated graph modes (one row each)")
    parser.add_argument("--judge", choices=("rule", "llm"), default="rule",
                        help="rule: normalized match (rubric categories not scored); llm: an LLM judge")
    parser.add_argument("--judge-model", default="gpt-4o-mini", help="model of the LLM judge")
    parser.add_argument("--judge-base-url", default="http://127.0.0.1:8000/v1",
                        help="OpenAI-compatible server of the LLM judge")
    parser.add_argument("--out", default="checkpoints/eval-qa", help="folder for predictions.jsonl and results.json")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    add_load_arguments(parser)


def parse_modes(text: str) -> list[str]:
    from qgmem.serving.records import GRAPH_MODES

    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in GRAPH_MODES]
    if bad or not modes:
        raise UserError(f"--graph: unknown mode(s) {bad or [text]}; choose from {', '.join(GRAPH_MODES)}")
    return list(dict.fromkeys(modes))


def select_cases(cases: list, split: str, data_split: dict[str, Any] | None, dataset: str) -> tuple[list, str]:
    """The cases of ``split`` as the training run split them; a note saying how they were chosen."""
    from qgmem.data.splits import sample_cases, split_cases

    if split == "all":
        return cases, "all cases"
    if not data_split or data_split.get("dataset") not in (None, dataset):
        raise UserError(f"--split {split}: the export records no split of {dataset!r} cases (trained on "
                        f"{(data_split or {}).get('dataset')!r}); use --split all")
    num = data_split.get("num_cases")
    chosen = sample_cases(cases, num, int(data_split.get("seed") or 0)) if num else cases
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the one-persona sample falls back to dialogue grouping, as in training
        parts = split_cases(chosen, tuple(data_split.get("split_ratios") or (0.7, 0.15, 0.15)),
                            int(data_split.get("seed") or 0), data_split.get("group_key") or "person")
    return list(parts.get(split, [])), f"the {split} split of the training run ({len(parts.get(split, []))} cases)"


def abstention_flag(qa: Any) -> bool | None:
    """Whether a question's history lacks its answer (``None``: judge from the reference's wording)."""
    if qa.category in ("abstention_evidence",) or str(qa.id).endswith("_abs"):
        return True
    return None


def select_questions(cases: list, limit: int) -> list[tuple[Any, list[Any]]]:
    """``(case, questions)`` in case order; with a ``limit``, questions are taken round-robin over the
    categories, so a small run still covers every category."""
    if not limit:
        return [(c, list(c.qas)) for c in cases if c.qas]
    by_category: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for ci, case in enumerate(cases):
        for qi, qa in enumerate(case.qas):
            by_category[qa.category].append((ci, qi))
    queues, picked = [list(v) for v in by_category.values()], set()
    while len(picked) < limit and any(queues):
        for queue in queues:
            if queue and len(picked) < limit:
                picked.add(queue.pop(0))
    return [(case, [qa for qi, qa in enumerate(case.qas) if (ci, qi) in picked])
            for ci, case in enumerate(cases) if any((ci, qi) in picked for qi in range(len(case.qas)))]


def run_eval(pipe, cases: list, dataset: str, modes: list[str], limit: int, judge: Any) -> dict[str, Any]:
    """Predictions (one per question and mode) and the per-category table."""
    plan = select_questions(cases, limit)
    retrieved, meta = [], []
    for case, qas in plan:
        pipe.remember(case.dialogue)
        share = pipe.seconds.get("construction", 0.0) / len(qas)
        for r, qa in zip(pipe.retrieve([qa.question for qa in qas],
                                       [qa.question_time or qa.meta.get("reference_time") for qa in qas]), qas):
            r.seconds = {"construction": share, **r.seconds}
            retrieved.append(r)
            meta.append((case, qa))
    predictions = []
    for mode in modes:
        answers = pipe.generate(retrieved, graph=mode)
        rows = [prediction_row(case, qa, a, dataset) for (case, qa), a in zip(meta, answers)]
        score_with_judge(rows, judge, dataset)
        predictions.extend(rows)
    return {"predictions": predictions, "table": summarize(predictions, modes)}


def prediction_row(case: Any, qa: Any, answer: Any, dataset: str) -> dict[str, Any]:
    rubric = qa.category in RUBRIC_CATEGORIES
    return {"qa_id": qa.id, "case_id": case.id, "category": qa.category, "graph_mode": answer.graph_mode,
            "question": qa.question, "reference": qa.answer, "prediction": answer.answer,
            "rubric": rubric, "abstention": abstention_flag(qa),
            "em": None if rubric else exact_match(answer.answer, qa.answer),
            "f1": None if rubric else token_f1(answer.answer, qa.answer),
            "correct": None, "cited": answer.cited, "tokens": answer.tokens, "seconds": answer.seconds,
            "error": answer.error}


def score_with_judge(rows: list[dict[str, Any]], judge: Any, dataset: str) -> None:
    """Fill ``correct``; rubric rows stay ``None`` (not scored) unless the judge is an LLM."""
    can_grade_rubrics = isinstance(judge, LLMJudge)
    todo = [r for r in rows if not r["rubric"] or can_grade_rubrics]
    items = [JudgeItem(r["question"], r["reference"], r["prediction"], r["category"], dataset, r["abstention"])
             for r in todo]
    for row, verdict in zip(todo, judge(items) if items else []):
        row["correct"] = bool(verdict)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(rows: list[dict[str, Any]], modes: list[str]) -> list[dict[str, Any]]:
    """One row per (category, graph mode), then the overall row per mode."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["category"], r["graph_mode"])].append(r)
        groups[("all", r["graph_mode"])].append(r)
    categories = sorted({r["category"] for r in rows}) + ["all"]
    table = []
    for category in categories:
        for mode in modes:
            group = groups.get((category, mode), [])
            if not group:
                continue
            scored = [r for r in group if r["correct"] is not None]
            answered = [r for r in group if r["em"] is not None]
            table.append({
                "category": category, "graph": mode, "questions": len(group),
                "judged": len(scored), "not_scored": len(group) - len(scored),
                "accuracy": _mean([float(r["correct"]) for r in scored]),
                "em": _mean([r["em"] for r in answered]), "f1": _mean([r["f1"] for r in answered]),
                "retrieved_context_tokens": _mean([r["tokens"]["retrieved_context"] for r in group]),
                "online_tokens": _mean([r["tokens"]["total"] for r in group]),
                "seconds": {s: _mean([r["seconds"].get(s, 0.0) for r in group]) for s in (*STAGES, "total")},
                "errors": sum(1 for r in group if r["error"]),
            })
    return table


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_table(table: list[dict[str, Any]], judge_name: str) -> str:
    head = (f"| category | graph | n | judged | not scored | acc ({judge_name}) | EM | F1 | context tok | online tok "
            "| s/QA construct | s/QA activate | s/QA graph | s/QA generate | s/QA total |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for row in table:
        s = row["seconds"]
        lines.append(f"| {row['category']} | {row['graph']} | {row['questions']} | {row['judged']} | "
                     f"{row['not_scored']} | {_fmt(row['accuracy'])} | {_fmt(row['em'])} | {_fmt(row['f1'])} | "
                     f"{_fmt(row['retrieved_context_tokens'], 0)} | {_fmt(row['online_tokens'], 0)} | "
                     f"{_fmt(s['construction'], 2)} | {_fmt(s['activation'], 2)} | "
                     f"{_fmt((s['graph_features'] or 0) + (s['graph_encoding'] or 0), 2)} | {_fmt(s['generation'], 2)} | "
                     f"{_fmt(s['total'], 2)} |")
    return "\n".join(lines)


def make_judge(args: argparse.Namespace) -> Any:
    if args.judge == "rule":
        return MatchJudge()
    from qgmem.llm.backends import make_backend

    return LLMJudge(backend_completer(make_backend(api_config(args, args.judge_model, args.judge_base_url))))


def run(args: argparse.Namespace) -> int:
    from qgmem.data.loaders import load_cases

    if not Path(args.path).exists():  # before the (slow) export load
        from qgmem.errors import InputPathError

        raise InputPathError(f"data set path {args.path} does not exist")
    modes = parse_modes(args.graph)
    if args.limit < 0:
        raise UserError(f"--limit must be >= 0, got {args.limit}")
    judge = make_judge(args)
    pipe = load_pipeline(args)
    data_split = pipe.encoder.export_config.get("data_split")
    options: dict[str, Any] = {}
    if args.dataset == "convomem" and data_split and data_split.get("dataset") == "convomem":
        options = {"distractor_conversations": data_split.get("distractor_conversations") or 0,
                   "seed": int(data_split.get("seed") or 0)}
    loaded = load_cases(args.dataset, args.path, strict=args.strict, **options)
    cases, how = select_cases(list(loaded.cases), args.split, data_split, args.dataset)
    if not cases:
        raise UserError(f"no cases in {how} of {args.path}")
    result = run_eval(pipe, cases, args.dataset, modes, args.limit, judge)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "predictions.jsonl", "w", encoding="utf-8") as fh:
        for row in result["predictions"]:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    summary = {"export": str(args.export), "dataset": args.dataset, "path": str(args.path), "cases": how,
               "questions": len(result["predictions"]) // len(modes), "graph_modes": modes, "judge": args.judge,
               "backbone": args.backbone, "unparsed_verdicts": getattr(judge, "unparsed", 0),
               "skipped_records": (loaded.report or {}).get("skipped", 0), "table": result["table"]}
    (out / "results.json").write_text(json.dumps(summary, indent=1) + "\n")
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    print(f"{summary['questions']} questions from {how}; graph modes {', '.join(modes)}; judge {args.judge}; "
          f"backbone {args.backbone}")
    print(format_table(result["table"], args.judge))
    not_scored = sum(r["not_scored"] for r in result["table"] if r["category"] == "all")
    if not_scored:
        print(f"not scored: {not_scored} answers (rubric categories need --judge llm)")
    print(f"predictions: {out / 'predictions.jsonl'}\nresults:     {out / 'results.json'}")
    return 0
