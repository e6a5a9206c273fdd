"""Warm served answers with the default's export (the compact prompt) beside the former default: same
machine, same run.

The compact prompt (``configs/default.yaml`` since issue 63: the text holds the top 3 working-memory
units, the graph all 10, one graph token per unit: K = 11) against the former default
(``configs/nodes10.yaml``: 10 units of text, K = 17). Each export is written once under ``--exports`` with its preset's shapes and settings and
untrained graph-encoder weights (:func:`bench.serving.serve_load.untrained_export`): the LM reads the
same number of prompt and graph tokens as with the trained export, so the prefill, hence the latency,
is the trained export's; the answers, and so the number of tokens generated, are not (they are
reported). ``--rounds`` rounds, each starting ``qgmem serve`` on one export then the other (the order
alternates), remembering the same ConvoMem histories and asking the same ``--answers`` questions after
one warm-up (``bench.serving.serve_load.single``). Reports wall and server CPU seconds per answer, the
generation stage's seconds and the prompt, graph and generated tokens; prints a markdown table and one
JSON line::

    python -m bench.serving.compact_answer --answers 6 --rounds 2 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

import numpy as np

from bench.serving.serve_load import histories, single, start_server, untrained_export

PRESETS = ("nodes10", "default")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--exports", default="checkpoints/bench-exports", help="the untrained exports, one folder each")
    p.add_argument("--answers", type=int, default=6, help="warm answers per export and round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--users", type=int, default=3)
    p.add_argument("--sessions", type=int, default=3, help="20-turn sessions remembered per user")
    p.add_argument("--threads", type=int, default=1, help="the server's torch threads (qgmem serve --threads)")
    p.add_argument("--json", default=None, help="also write the result here")
    return p.parse_args(argv)


def serve_round(export: Path, data: list[dict], args) -> dict:
    """Start ``qgmem serve`` on ``export``, remember the histories, ``args.answers`` warm answers."""
    proc, url, client = start_server(str(export), args.threads)
    try:
        for u, history in enumerate(data):
            for session in history["sessions"][: args.sessions]:
                client.post(f"{url}/v1/users/u{u}/sessions", json={"turns": session}).raise_for_status()
        return single(client, url, data, args.answers, proc.pid)["each"]
    finally:  # the server never outlives the bench
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)


def summarise(each: list[dict]) -> dict:
    """Medians over every answer of every round of one export."""
    def med(values):
        return float(np.median(values)) if values else float("nan")

    answer = [s for r in each for s in r["answer_s"]]
    return {"answers": len(answer), "answer_s_p50": med(answer), "answer_s_p95": float(np.percentile(answer, 95)),
            "server_cpu_s_p50": med([s for r in each for s in r["server_cpu_s"]]),
            "generation_s_p50": med([s.get("generation", 0.0) for r in each for s in r["stages_s"]]),
            **{f"{k}_tokens_p50": med([t.get(k, 0) for r in each for t in r["tokens"]])
               for k in ("prompt", "graph", "generated", "total")}}


def main(argv=None) -> int:
    args = parse_args(argv)
    exports = {name: untrained_export(Path(args.exports) / name, name) for name in PRESETS}
    data = histories(args.users)
    each: dict[str, list[dict]] = {name: [] for name in PRESETS}
    for r in range(args.rounds):
        for name in (PRESETS if r % 2 == 0 else PRESETS[::-1]):
            each[name].append(serve_round(exports[name], data, args))
            print(f"  round {r + 1}/{args.rounds}: {name} done", file=sys.stderr, flush=True)
    result = {"presets": {name: summarise(each[name]) for name in PRESETS}, "rounds": args.rounds,
              "answers_per_round": args.answers, "threads": args.threads, "load_average": os.getloadavg()}
    d, c = result["presets"]["nodes10"], result["presets"]["default"]
    result["default_over_nodes10"] = {k: c[k] / d[k] for k in ("answer_s_p50", "server_cpu_s_p50", "generation_s_p50",
                                                                "prompt_tokens_p50") if d[k]}
    print("| export | answers | answer p50 / p95 (s) | server CPU p50 (s) | generation p50 (s) | prompt tokens | "
          "graph tokens | generated |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in PRESETS:
        s = result["presets"][name]
        print(f"| {name} | {s['answers']} | {s['answer_s_p50']:.3f} / {s['answer_s_p95']:.3f} | "
              f"{s['server_cpu_s_p50']:.3f} | {s['generation_s_p50']:.3f} | {s['prompt_tokens_p50']:.0f} | "
              f"{s['graph_tokens_p50']:.0f} | {s['generated_tokens_p50']:.0f} |")
    print(json.dumps(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
