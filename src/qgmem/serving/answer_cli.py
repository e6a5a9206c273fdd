"""``qgmem answer``: one question (or several) about a dialogue history, answered from an export.

Prints the answer, the memory entries it cites (or, when it names none, the entries the LM read) and
the seconds per stage; ``--json`` prints everything the pipeline returns.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from typing import Literal

from qgmem.errors import UserError
from qgmem.model.graph_modes import GRAPH_MODES
from qgmem.older_records import ANSWER_FLAGS
from qgmem.serving.export_models import ModelSettings, load_pipeline
from qgmem.settings_flags import add_retired_arguments, add_settings_arguments, settings_from_args


@dataclass(kw_only=True)
class AnswerSettings:
    """What ``qgmem answer`` runs with; one field per flag (the export's and the engine's nested)."""

    models: ModelSettings = field(default_factory=ModelSettings)  # --export, --device, --max-new-tokens, --lm-*, --backbone …
    #: dialogue history: a JSON list of sessions, or a ConvoMem/LoCoMo/LongMemEval file
    history: str | None = None
    case: str | None = None  #: case id or index in a data set history file (default: the first)
    memory: str | None = None  #: reuse a store written by `qgmem build-memory` instead
    dialogue: str | None = None  #: which store of a --memory folder with several
    question: list[str] = field(metadata={"action": "append"})  #: the question (repeat for a batch)
    time: str | None = None  #: when the question is asked (ISO-8601), for 'last week' etc.
    #: graph tokens, none (the text prompt alone), or another question's graph (default: the export's field 'graph_mode')
    graph_mode: Literal[GRAPH_MODES] | None = None
    json: bool = False  #: print the full answers as JSON




def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_settings_arguments(parser, AnswerSettings)
    add_retired_arguments(parser, ANSWER_FLAGS)


def run(args: argparse.Namespace) -> int:
    s = settings_from_args(AnswerSettings, args)
    s.models.check()
    if not s.history and not s.memory:
        raise UserError("give --history FILE (a dialogue history) or --memory DIR (a built memory store)")
    if any(not q.strip() for q in s.question):
        raise UserError("--question is empty")
    case = None
    if not s.memory:  # a bad history file is named before any model is loaded
        from qgmem.serving.history_file import load_history

        case = load_history(s.history, case=s.case)
    pipe = load_pipeline(s.models)
    if s.memory:
        store = pipe.load_memory(s.memory, s.dialogue)
        where = f"memory {s.memory}"
    else:
        store = pipe.remember(case)
        where = f"history {s.history}" + (f" (case {case.id})" if case.qas else "")
    answers = pipe.answer(s.question, graph_mode=s.graph_mode, question_times=[s.time] * len(s.question))
    if s.json:
        # the store's size is store_units, as in the memory service (memory_units is the prompt's text budget m)
        print(json.dumps({"store_units": len(store), "source": where, "construction_seconds": pipe.memory.seconds,
                          "answers": [a.to_dict() for a in answers]}, indent=1, ensure_ascii=False))
        return 0
    for a in answers:
        print(f"question: {a.question}\nanswer:   {a.answer}")
        if a.error:
            print(f"error:    {a.error}")
        shown = [m for m in a.memory if m["label"] in a.cited]
        head = "cited memory" if shown else f"memory the LM read ({len(a.memory)} of {len(store)} units; none cited)"
        print(f"{head}:")
        for m in shown or a.memory:
            print(f"  [{m['label']}] {m['fact']}")
        if not a.memory:
            print("  (none)")
        stages = ", ".join(f"{k} {v:.2f}" for k, v in a.seconds.items())
        construction = pipe.memory.seconds.get("construction")
        print(f"graph: {len(a.graph['nodes'])} nodes, {len(a.graph['edges'])} edges; graph mode {a.graph_mode}")
        print(f"seconds: {stages}" + (f"; memory construction {construction:.2f} ({where})" if construction else
                                     f" ({where})"))
        print()
    return 0
