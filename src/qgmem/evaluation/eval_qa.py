"""``qgmem eval-qa``: answer a data set's questions with an export and score them, one row per graph mode.

Every selected question is activated once; the answers of each graph mode (``token``, ``none``,
``shuffled``, ``ablated``) come from the same weights in the same run, so the graph token's effect is one
table. ``ablated`` keeps the question's own prompt text and swaps in the graph activated for it over the
store without the units grounded in its gold evidence turns (ConvoMem, LoCoMo and LongMemEval carry
gold evidence); questions without gold evidence, or whose ablated graph equals their own, have no
ablated row (counted). Greedy answers of a small LM rarely separate the modes, so every row also has
the reference answer's NLL under that mode, and the overall row holds the paired ``own − other``
differences with a bootstrap interval over cases (``nll``: ``own_vs_none``, ``own_vs_ablated``,
``own_vs_shuffled``).
Scores use the one normalizer (:mod:`qgmem.text`): exact match and token F1 against the reference, and
a judge: ``rule`` (the normalized match rule) or ``llm`` (an LLM through the shared backend, with the
grading rules of :mod:`qgmem.llm.judge`). Rubric categories (ConvoMem's preference and implicit
connection) have no reference answer: only the LLM judge scores them; otherwise they are counted as
not scored. The efficiency columns are the paper's: retrieved-context tokens, total online tokens
and seconds per QA by stage (memory construction amortized over the case's questions). ``degenerate``
counts the raw replies of each graph mode that the answer cut had to repair or could not
(:func:`qgmem.prompting.reply_shape`: empty, a lead-in line, an echoed memory entry): the counts show
what the graph tokens do to the replies, the F1 is of the repaired answers.
``--name-speakers`` asks the same questions in the LoCoMo form (:mod:`qgmem.evaluation.named_form`,
shared with ``eval-retrieval``).
"""

from __future__ import annotations

import argparse
import inspect
import json
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from qgmem.data.loaders import DATASETS, add_load_arguments, load_arguments
from qgmem.errors import UserError
from qgmem.older_records import EVAL_QA_FLAGS
from qgmem.serving.export_models import ModelSettings, load_pipeline
from qgmem.settings_flags import add_retired_arguments, add_settings_arguments, settings_from_args
from qgmem.text import exact_match, token_f1
from qgmem.llm.judge import RUBRIC_CATEGORIES, JudgeItem, LLMJudge, MatchJudge, backend_completer

SPLITS = ("train", "val", "test", "all")
STAGES = ("construction", "activation", "graph_features", "graph_encoding", "generation")


@dataclass(kw_only=True)
class EvalQASettings:
    """What ``qgmem eval-qa`` runs with; one field per flag (beside ``--strict``/``--lenient``, ``--max-turn-chars``)."""

    models: ModelSettings = field(default_factory=ModelSettings)  # --export, --device, --max-new-tokens, --lm-*, --backbone …
    dataset: Literal[DATASETS]  #: the data set's form
    path: str  #: the data set's file or folder
    #: cases of this split of the export's training run (its sampling and split are recorded in the export); 'all': every case (default: test)
    split: Literal[SPLITS] = "test"
    #: at most this many questions, taken round-robin over the categories (default 6: a few minutes on a 2-core CPU; 0 = all)
    limit: int = 6
    graph_modes: str = "token,none,shuffled"  #: comma-separated graph modes (one row each): token, none, shuffled, ablated
    #: rule: normalized match (rubric categories not scored); llm: an LLM judge
    judge: Literal["rule", "llm"] = "rule"
    judge_model: str = "gpt-4o-mini"  #: model of the LLM judge
    judge_base_url: str = "http://127.0.0.1:8000/v1"  #: OpenAI-compatible server of the LLM judge
    #: ConvoMem in the LoCoMo form: name its two speakers and ask every question in the third person (as eval-retrieval --name-speakers; docs/evaluation.md)
    name_speakers: str | None = field(default=None, metadata={"metavar": "USER,ASSISTANT"})
    out: str = "checkpoints/eval-qa"  #: folder for predictions.jsonl and results.json
    json: bool = False  #: print the results as JSON




def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_settings_arguments(parser, EvalQASettings)
    add_load_arguments(parser)
    add_retired_arguments(parser, EVAL_QA_FLAGS)


def eval_modes() -> tuple[str, ...]:
    from qgmem.serving.records import GRAPH_MODES

    return (*GRAPH_MODES, "ablated")


def parse_modes(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in eval_modes()]
    if bad or not modes:
        raise UserError(f"--graph-modes: unknown mode(s) {bad or [text]}; choose from {', '.join(eval_modes())}")
    return list(dict.fromkeys(modes))


def training_split_cases(cases: list, split: str, data_split: dict[str, Any] | None,
                         dataset: str) -> tuple[list, str]:
    """The cases of ``split`` as the training run split them (:func:`qgmem.data.splits.run_splits` with the
    export's recorded settings); a note saying how they were chosen."""
    from qgmem.data.splits import run_splits, split_cases

    if split == "all":
        return cases, "all cases"
    if not data_split or data_split.get("dataset") not in (None, dataset):
        raise UserError(f"--split {split}: the export records no split of {dataset!r} cases (trained on "
                        f"{(data_split or {}).get('dataset')!r}); use --split all")
    defaults = inspect.signature(split_cases).parameters
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the one-persona sample falls back to dialogue grouping, as in training
        parts = run_splits(cases, data_split.get("num_cases") or None, int(data_split.get("seed") or 0),
                           tuple(data_split.get("split_ratios") or defaults["ratios"].default),
                           data_split.get("group_key") or defaults["group_key"].default)
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


def run_eval(pipe, cases: list, dataset: str, modes: list[str], limit: int, judge: Any,
             progress: bool = True) -> dict[str, Any]:
    """Predictions (one per question and mode, with the reference's NLL) and the per-category table."""
    from tqdm.auto import tqdm

    from qgmem.evaluation.counterfactuals import STATUSES

    plan = select_questions(cases, limit)
    total = sum(len(qas) for _, qas in plan)
    retrieved, ablated, meta = [], [], []
    counts = dict.fromkeys(STATUSES, 0)
    bar = tqdm(total=total, desc="eval-qa: memory + activation", unit="qa", disable=not progress)
    for case, qas in plan:
        memory = pipe.build_memory(case.dialogue)
        share = memory.seconds.get("construction", 0.0) / len(qas)
        for r, qa in zip(pipe.retrieve([qa.question for qa in qas],
                                       [qa.question_time or qa.meta.get("reference_time") for qa in qas], memory), qas):
            r.seconds = {"construction": share, **r.seconds}
            retrieved.append(r)
            meta.append((case, qa))
        if "ablated" in modes:
            ablated.extend(ablated_retrieved(pipe, memory, qas, retrieved[-len(qas):], counts))
        bar.update(len(qas))
    bar.close()
    predictions = []
    bar = tqdm(total=total * len(modes), desc="eval-qa: answers", unit="answer", disable=not progress)
    for graph_mode in modes:
        if graph_mode == "ablated":
            index = [i for i, a in enumerate(ablated) if a is not None]
            batch = [ablated[i] for i in index]
            answers = pipe.generate(batch, graph_mode="token") if batch else []
            nll = reference_nll(pipe, batch, [meta[i][1] for i in index], "token")
            for a in answers:
                a.graph_mode = "ablated"
            rows = [prediction_row(meta[i][0], meta[i][1], a, dataset) for i, a in zip(index, answers)]
            bar.update(total - len(index))
        else:
            answers = pipe.generate(retrieved, graph_mode=graph_mode)
            nll = reference_nll(pipe, retrieved, [qa for _, qa in meta], graph_mode)
            rows = [prediction_row(case, qa, a, dataset) for (case, qa), a in zip(meta, answers)]
        for row, value in zip(rows, nll):
            row["nll"] = value
        score_with_judge(rows, judge, dataset)
        predictions.extend(rows)
        bar.update(len(rows))
    bar.close()
    table = summarize(predictions, modes)
    contrasts = nll_contrasts(predictions, modes)
    for row in table:
        if row["category"] == "all":
            row["nll"] = contrasts
    return {"predictions": predictions, "table": table, "nll": contrasts,
            "ablation": {**counts, "ablated": sum(a is not None for a in ablated)} if "ablated" in modes else None}


def ablated_retrieved(pipe, memory, qas: list, own: list, counts: dict[str, int]) -> list:
    """Per question: its own retrieval with the graph swapped for the evidence-ablated one, or ``None``.

    The ablated graph is the same question activated over ``memory``'s store without the units grounded
    in its gold evidence turns (traces rebuilt); the prompt text stays the question's own. Which questions
    have one, and why the others have none (``counts``), is the study's rule
    (:func:`qgmem.evaluation.counterfactuals.evidence_ablation`).
    """
    from dataclasses import replace

    from qgmem.evaluation.ablate import without_units
    from qgmem.evaluation.counterfactuals import evidence_ablation

    store = memory.store
    out = []
    for qa, mine in zip(qas, own):
        def retrieve_without(drop, qa=qa, mine=mine):
            ablated = pipe.open_memory(without_units(store, set(drop), pipe.sentence_encoder.encode,
                                                     pipe.construction, llm=pipe.llm))
            return pipe.retrieve_one(ablated, qa.question, mine.question_time)

        other, _, status = evidence_ablation(store.units, qa, mine.graph, retrieve_without,
                                             graph_of=lambda r: r.graph)
        if other is None:
            counts[status] += 1
            out.append(None)
            continue
        out.append(replace(mine, graph=other.graph))
    return out


def reference_nll(pipe, retrieved: list, qas: list, graph_mode: str) -> list[float | None]:
    """The reference answer's NLL (mean over its tokens) per question under ``graph_mode``.

    ``None`` for rubric references (a grading text, not an answer) and where no LM is at hand (an
    API backbone, or an engine behind ``--lm-url``, scores no likelihood).
    """
    import torch

    from qgmem.serving.remote_lm import RemoteLM

    if getattr(pipe, "backbone", None) is not None or isinstance(pipe.lm, RemoteLM) or not retrieved:
        return [None] * len(retrieved)
    graphs = pipe._graphs_for(retrieved, graph_mode)
    with torch.no_grad():
        return _reference_nll(pipe, retrieved, qas, graph_mode, graphs)


def _reference_nll(pipe, retrieved: list, qas: list, graph_mode: str, graphs: list) -> list[float | None]:
    import torch

    from qgmem.model.fusion import IGNORE_INDEX, answer_nll, insert_token
    from qgmem.model.kv_prefix import reading

    out: list[float | None] = [None] * len(retrieved)
    todo = [i for i, qa in enumerate(qas) if qa.category not in RUBRIC_CATEGORIES and str(qa.answer).strip()]
    device = pipe.lm.device
    for start in range(0, len(todo), pipe.batch_size):
        index = todo[start:start + pipe.batch_size]
        prompts = pipe.encode_prompts([retrieved[i] for i in index])
        answers = [pipe.prompts.answer(str(qas[i].answer)) for i in index]
        T = max(len(p.ids) + len(a) for p, a in zip(prompts, answers))
        ids = torch.full((len(index), T), pipe.prompts.pad_id, dtype=torch.long)
        mask = torch.zeros((len(index), T), dtype=torch.long)
        labels = torch.full((len(index), T), IGNORE_INDEX, dtype=torch.long)
        for b, (p, a) in enumerate(zip(prompts, answers)):
            n, m = len(p.ids), len(a)
            ids[b, : n + m] = torch.tensor(p.ids + a)
            mask[b, : n + m] = 1
            labels[b, n: n + m] = torch.tensor(a)
        pos = torch.tensor([p.graph_pos for p in prompts])
        token = None if graph_mode == "none" else pipe.encoder.encode([graphs[i] for i in index])
        embeds = pipe.lm.get_input_embeddings()(ids.to(device))
        fused = insert_token(embeds, mask.to(device), pos.to(device), token, labels.to(device))
        with reading(pipe.lm, token, pos):
            values = answer_nll(pipe.lm, *fused, reduction="none")
        for i, v in zip(index, values.float().cpu().tolist()):
            out[i] = float(v)
    return out


def nll_contrasts(rows: list[dict[str, Any]], modes: list[str], n_boot: int = 10_000) -> dict[str, Any]:
    """Paired ``own − other`` reference NLL per question, with a bootstrap interval over cases."""
    from qgmem.evaluation.bootstrap import paired_bootstrap

    by_mode = {m: {r["qa_id"]: r for r in rows if r["graph_mode"] == m and r.get("nll") is not None} for m in modes}
    out: dict[str, Any] = {}
    if "token" not in by_mode:
        return out
    own = by_mode["token"]
    for other in ("none", "ablated", "shuffled"):
        if other not in by_mode:
            continue
        pairs = [(q, own[q]["nll"] - r["nll"], r["case_id"]) for q, r in by_mode[other].items() if q in own]
        result = paired_bootstrap([d for _, d, _ in pairs], [g for _, _, g in pairs], n_boot=n_boot)
        out[f"own_vs_{other}"] = {"mean": result["mean"], "ci95": result["ci95"], "n": result["n"]}
    return out


def prediction_row(case: Any, qa: Any, answer: Any, dataset: str) -> dict[str, Any]:
    rubric = qa.category in RUBRIC_CATEGORIES
    return {"qa_id": qa.id, "case_id": case.id, "category": qa.category, "graph_mode": answer.graph_mode,
            "question": qa.question, "reference": qa.answer, "prediction": answer.answer,
            "rubric": rubric, "abstention": abstention_flag(qa),
            "em": None if rubric else exact_match(answer.answer, qa.answer),
            "f1": None if rubric else token_f1(answer.answer, qa.answer),
            "correct": None, "nll": None, "cited": answer.cited, "tokens": answer.tokens,
            "seconds": answer.seconds, "error": answer.error, "reply_shape": answer.reply_shape}


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
        for graph_mode in modes:
            group = groups.get((category, graph_mode), [])
            if not group:
                continue
            scored = [r for r in group if r["correct"] is not None]
            answered = [r for r in group if r["em"] is not None]
            table.append({
                "category": category, "graph_mode": graph_mode, "questions": len(group),
                "judged": len(scored), "not_scored": len(group) - len(scored),
                "accuracy": _mean([float(r["correct"]) for r in scored]),
                "em": _mean([r["em"] for r in answered]), "f1": _mean([r["f1"] for r in answered]),
                "answer_nll": _mean([r["nll"] for r in group if r.get("nll") is not None]),
                "retrieved_context_tokens": _mean([r["tokens"]["retrieved_context"] for r in group]),
                "online_tokens": _mean([r["tokens"]["total"] for r in group]),
                "seconds": {s: _mean([r["seconds"].get(s, 0.0) for r in group]) for s in (*STAGES, "total")},
                "errors": sum(1 for r in group if r["error"]),
                "degenerate": degenerate_counts(group),
            })
    return table


def degenerate_counts(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Raw replies of each degenerate shape (:data:`qgmem.prompting.answer.SHAPES`), before the answer cut
    repaired them, their total and share of the rows: what the graph tokens do to the replies, while the
    F1 beside it is of the repaired answers. A failed backend request is not counted."""
    from qgmem.prompting.answer import SHAPES

    counts: dict[str, Any] = {shape: sum(1 for r in rows if r.get("reply_shape") == shape and not r["error"])
                              for shape in SHAPES}
    counts["all"] = sum(counts[shape] for shape in SHAPES)
    counts["share"] = counts["all"] / len(rows) if rows else None
    return counts


def answer_mode_figures(summary: dict[str, Any], own: str = "token", other: str = "none") -> dict[str, Any]:
    """What the answer-mode rule (:func:`qgmem.evaluation.crossfit.answer_mode`) reads from one eval-qa
    run's results: F1 ``own`` − ``other`` (every question is answered in every mode, so the difference of
    the overall rows' means is the mean paired difference) and both modes' degenerate shares."""
    rows = {row["graph_mode"]: row for row in summary["table"] if row["category"] == "all"}
    if own not in rows or other not in rows:
        raise UserError(f"the answer-mode rule needs graph modes {own} and {other} (--graph-modes {own},{other}); "
                        f"this run has {', '.join(rows) or 'none'}")
    f1 = None if rows[own]["f1"] is None or rows[other]["f1"] is None else rows[own]["f1"] - rows[other]["f1"]
    return {"f1_own_minus_none": f1, "degenerate_share": {own: rows[own]["degenerate"]["share"],
                                                          other: rows[other]["degenerate"]["share"]}}


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_table(table: list[dict[str, Any]], judge_name: str) -> str:
    head = (f"| category | graph mode | n | judged | not scored | acc ({judge_name}) | EM | F1 | answer NLL | context tok "
            "| online tok "
            "| s/QA construct | s/QA activate | s/QA graph | s/QA generate | s/QA total "
            "| degenerate: empty / lead-in / entry (share) |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for row in table:
        s = row["seconds"]
        lines.append(f"| {row['category']} | {row['graph_mode']} | {row['questions']} | {row['judged']} | "
                     f"{row['not_scored']} | {_fmt(row['accuracy'])} | {_fmt(row['em'])} | {_fmt(row['f1'])} | "
                     f"{_fmt(row.get('answer_nll'))} | "
                     f"{_fmt(row['retrieved_context_tokens'], 0)} | {_fmt(row['online_tokens'], 0)} | "
                     f"{_fmt(s['construction'], 2)} | {_fmt(s['activation'], 2)} | "
                     f"{_fmt((s['graph_features'] or 0) + (s['graph_encoding'] or 0), 2)} | {_fmt(s['generation'], 2)} | "
                     f"{_fmt(s['total'], 2)} | {_degenerate(row['degenerate'])} |")
    contrasts = next((row["nll"] for row in table if row["category"] == "all" and row.get("nll")), {})
    for name, r in contrasts.items():
        if r["mean"] is not None:
            lines.append(f"\nanswer NLL, {name.replace('_', ' ')} (n={r['n']}): {r['mean']:+.3f} "
                         f"[{r['ci95'][0]:+.3f}, {r['ci95'][1]:+.3f}] (95 % bootstrap over cases)")
    return "\n".join(lines)


def _degenerate(d: dict[str, Any]) -> str:
    return f"{d['empty']} / {d['lead_in']} / {d['entry']} ({_fmt(d['share'], 2)})"


def export_budgets(pipe) -> dict[str, int | None]:
    """The export's text and graph budgets the answers were given (its ``prompt.memory_units`` and
    ``activation.k``; eval-qa has no flag of its own for either): ``text_units`` ``None`` is all k."""
    contract = pipe.contract  # what the answers depended on, one object
    return {"text_units": contract.prompt.memory_units, "graph_units": contract.activation.k}


def make_judge(settings: EvalQASettings) -> Any:
    if settings.judge == "rule":
        return MatchJudge()
    from qgmem.llm.backends import make_backend

    config = settings.models.api_config(settings.judge_model, settings.judge_base_url)
    return LLMJudge(backend_completer(make_backend(config)))


def run(args: argparse.Namespace) -> int:
    from qgmem.data.loaders import load_cases

    s = settings_from_args(EvalQASettings, args)
    s.models.check()
    if not Path(s.path).exists():  # before the (slow) export load
        from qgmem.errors import InputPathError

        raise InputPathError(f"data set path {s.path} does not exist")
    modes = parse_modes(s.graph_modes)
    if s.limit < 0:
        raise UserError(f"--limit must be >= 0, got {s.limit}")
    if s.name_speakers is not None:  # the names are checked before the (slow) export load
        from qgmem.evaluation.named_form import names_from_flag

        names_from_flag(s.name_speakers)
    judge = make_judge(s)
    pipe = load_pipeline(s.models)
    data_split = pipe.encoder.export_config.get("data_split")
    options: dict[str, Any] = {}
    if s.dataset == "convomem" and data_split and data_split.get("dataset") == "convomem":
        options = {"distractor_conversations": data_split.get("distractor_conversations") or 0,
                   "seed": int(data_split.get("seed") or 0)}
    loaded = load_cases(s.dataset, s.path, **load_arguments(args), **options)
    cases, how = training_split_cases(list(loaded.cases), s.split, data_split, s.dataset)
    if not cases:
        raise UserError(f"no cases in {how} of {s.path}")
    named = None
    if s.name_speakers is not None:  # after the split: the rewrite keeps every case's id
        from qgmem.evaluation.named_form import cases_from_flag

        cases, named = cases_from_flag(cases, s.name_speakers)
    if "ablated" in modes and not any(qa.evidence_turn_ids for c in cases for qa in c.qas):
        raise UserError(f"--graph-modes ablated needs gold evidence turns; no question of {how} in {s.path} has any")
    result = run_eval(pipe, cases, s.dataset, modes, s.limit, judge)
    out = Path(s.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "predictions.jsonl", "w", encoding="utf-8") as fh:
        for row in result["predictions"]:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    summary = {"export": str(s.models.load.export), "dataset": s.dataset, "path": str(s.path), "cases": how,
               "questions": len(result["predictions"]) // len(modes), "graph_modes": modes,
               "named_speakers": named, "budgets": export_budgets(pipe), "judge": s.judge,
               "backbone": s.models.backbone, "unparsed_verdicts": getattr(judge, "unparsed", 0),
               "skipped_records": (loaded.report or {}).get("skipped", 0), "nll": result["nll"],
               "ablation": result["ablation"], "table": result["table"],
               "degenerate": {row["graph_mode"]: row["degenerate"] for row in result["table"] if row["category"] == "all"}}
    (out / "results.json").write_text(json.dumps(summary, indent=1) + "\n")
    if s.json:
        print(json.dumps(summary, indent=1))
        return 0
    named_note = f" in the named form ({', '.join(named)})" if named else ""
    text_units = summary["budgets"]["text_units"]
    print(f"{summary['questions']} questions from {how}{named_note}; graph modes {', '.join(modes)}; "
          f"judge {s.judge}; backbone {s.models.backbone}; the export's budgets: "
          f"{'all' if text_units is None else text_units} units of text, {summary['budgets']['graph_units']} in the graph")
    print(format_table(result["table"], s.judge))
    print("degenerate: raw replies before the answer cut (empty, a lead-in line, an echoed memory entry); "
          "EM and F1 are of the repaired answers")
    not_scored = sum(r["not_scored"] for r in result["table"] if r["category"] == "all")
    if not_scored:
        print(f"not scored: {not_scored} answers (rubric categories need --judge llm)")
    print(f"predictions: {out / 'predictions.jsonl'}\nresults:     {out / 'results.json'}")
    return 0
