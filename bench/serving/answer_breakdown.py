"""Where the time of one ``qgmem answer`` goes: process start, model load, construction, activation, generation.

Runs the command once as a user would (a fresh process: its wall time), then repeats its steps in this
process with a timer around each: imports, the graph encoder, the sentence encoder and the LM loaded
(:func:`qgmem.serving.export_models.load_models`, the path ``answer``, ``eval-qa`` and ``serve`` share),
the memory built from the history, and the answer's own stages (activation, graph features + encoding,
generation). A second question on the warm pipeline is what a long-running server pays.

    python -m bench.serving.answer_breakdown --export checkpoints/export [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HISTORY = ("data/convomem/core_benchmark/evidence_questions/user_evidence/1_evidence/"
           "0050e213-5032-42a0-8041-b5eef2f8ab91_Telemarketer.json")
QUESTION = "What color do I use for hot leads in my personal spreadsheet?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export", required=True)
    parser.add_argument("--history", default=HISTORY)
    parser.add_argument("--question", default=QUESTION)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    t = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "qgmem", "answer", "--export", args.export, "--history", args.history,
                           "--question", args.question], capture_output=True, text=True)
    command_s = time.perf_counter() - t
    if done.returncode:
        sys.exit(done.stderr)

    t0 = time.perf_counter()
    from qgmem.model.pretrained import GraphTokenEncoder
    from qgmem.serving.export_models import load_models
    from qgmem.serving.history_file import load_history
    from qgmem.serving.pipeline import load_lm_for
    from qgmem.embed import SentenceEncoder

    t1 = time.perf_counter()
    encoder = GraphTokenEncoder.from_pretrained(args.export, device="cpu")
    t2 = time.perf_counter()
    SentenceEncoder((encoder.export_config.get("sentence_encoder") or {}).get("id"))
    t3 = time.perf_counter()
    load_lm_for(encoder, None, None, "cpu")
    t4 = time.perf_counter()
    pipe = load_models(args.export, device="cpu")  # all of it through the shared path, once per process
    t5 = time.perf_counter()
    case = load_history(args.history)
    pipe.remember(case)
    t6 = time.perf_counter()
    [first] = pipe.answer([args.question])
    t7 = time.perf_counter()
    [warm] = pipe.answer([args.question])
    again = load_models(args.export, device="cpu")  # a second caller in the process: no model loads again
    t8 = time.perf_counter()
    del again
    s = first.seconds
    result = {
        "command_wall_s": round(command_s, 2),
        "imports_s": round(t1 - t0, 2), "graph_encoder_load_s": round(t2 - t1, 2),
        "sentence_encoder_load_s": round(t3 - t2, 2), "lm_load_s": round(t4 - t3, 2),
        "load_models_s": round(t5 - t4, 2), "construction_s": round(t6 - t5, 2),
        "units": len(pipe.memory), "turns": case.dialogue.num_turns(),
        "activation_s": round(s["activation"], 3), "graph_s": round(s["graph_features"] + s["graph_encoding"], 3),
        "generation_s": round(s["generation"], 3), "first_answer_total_s": round(t7 - t6, 3),
        "warm_answer_s": round(warm.seconds["total"], 3), "second_load_models_s": round(t8 - t7 - warm.seconds["total"], 3),
        "load_average": os.getloadavg(),
    }
    print("| stage | seconds |\n|---|---|")
    for key in ("command_wall_s", "imports_s", "graph_encoder_load_s", "sentence_encoder_load_s", "lm_load_s",
                "load_models_s", "construction_s", "activation_s", "graph_s", "generation_s", "warm_answer_s"):
        print(f"| {key[:-2].replace('_', ' ')} | {result[key]} |")
    print(f"({result['turns']} turns -> {result['units']} units; load average {result['load_average'][0]:.1f})")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
