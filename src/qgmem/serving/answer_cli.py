"""``qgmem answer``: one question (or several) about a dialogue history, answered from an export.

Prints the answer, the memory entries it cites (or, when it names none, the entries the LM read) and
the seconds per stage; ``--json`` prints everything the pipeline returns.
"""

from __future__ import annotations

import argparse
import json

from qgmem.errors import UserError
from qgmem.model.graph_modes import GRAPH_MODES
from qgmem.serving.export_models import add_export_arguments, load_pipeline


#: flags also come from a --config YAML file, and --print_config shows them (jsonargparse)
TAKES_CONFIG = True

def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_export_arguments(parser)
    parser.add_argument("--history", default=None,
                        help="dialogue history: a JSON list of sessions, or a ConvoMem/LoCoMo/LongMemEval file")
    parser.add_argument("--case", default=None, help="case id or index in a data set history file (default: the first)")
    parser.add_argument("--memory", default=None, help="reuse a store written by `qgmem build-memory` instead")
    parser.add_argument("--dialogue", default=None, help="which store of a --memory folder with several")
    parser.add_argument("--question", action="append", required=True, help="the question (repeat for a batch)")
    parser.add_argument("--time", default=None, help="when the question is asked (ISO-8601), for 'last week' etc.")
    parser.add_argument("--graph", choices=GRAPH_MODES, default=None,
                        help="graph tokens, none (the text prompt alone), or another question's graph "
                             "(default: the export's field 'graph_mode')")
    parser.add_argument("--json", action="store_true", help="print the full answers as JSON")


def run(args: argparse.Namespace) -> int:
    if not args.history and not args.memory:
        raise UserError("give --history FILE (a dialogue history) or --memory DIR (a built memory store)")
    if any(not q.strip() for q in args.question):
        raise UserError("--question is empty")
    case = None
    if not args.memory:  # a bad history file is named before any model is loaded
        from qgmem.serving.history_file import load_history

        case = load_history(args.history, case=args.case)
    pipe = load_pipeline(args)
    if args.memory:
        store = pipe.load_memory(args.memory, args.dialogue)
        where = f"memory {args.memory}"
    else:
        store = pipe.remember(case)
        where = f"history {args.history}" + (f" (case {case.id})" if case.qas else "")
    answers = pipe.answer(args.question, graph=args.graph, question_times=[args.time] * len(args.question))
    if args.json:
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
