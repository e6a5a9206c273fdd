"""One warm answer in process, lever by lever: where its seconds go (prefill, each decoding step, the rest).

Loads the export's pipeline once (as ``qgmem serve`` does), remembers a real ConvoMem history, then
answers the same questions under each lever, round-robin (answer ``i`` of every lever runs before answer
``i + 1`` of any), so a shared machine's load falls on all of them alike:

- ``float32``: the pipeline as it was, every prompt prefilled whole;
- ``float32 + prefix``: the product's path, the system prompt and template head's KV cache reused
  (:func:`qgmem.prompting.generate.prefix_cache`);
- ``int8 dynamic + prefix``: the LM's Linear layers with int8 weights and int8 activations (torch's
  dynamic quantization, per-channel weights; the quality check is ``bench.serving.int8_quality``);
- ``int8 weight-only + prefix``: torchao's ``Int8WeightOnlyConfig`` (int8 weights, float activations).

Each LM forward is timed: the first of an answer is its prefill, the others its decoding steps; the rest
is activation, graph encoding and ``generate``'s own work. Wall and process CPU seconds are both
reported (on a loaded machine the CPU seconds are the steadier figure). Prints a markdown table and one
JSON line::

    python -m bench.serving.warm_answer --export checkpoints/export --answers 6
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time
import warnings

import numpy as np


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--export", default="checkpoints/export")
    p.add_argument("--answers", type=int, default=6, help="warm answers per lever")
    p.add_argument("--sessions", type=int, default=3, help="20-turn sessions of the history remembered")
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args(argv)


class ForwardClock:
    """Wall and CPU seconds of every forward of an LM, in order (one answer at a time)."""

    def __init__(self, lm):
        self.calls: list[tuple[int, float, float]] = []
        self._start = (0.0, 0.0)
        self._positions = 0
        lm.register_forward_pre_hook(self._pre, with_kwargs=True)
        lm.register_forward_hook(self._post)

    def _pre(self, module, args, kwargs):
        inputs = kwargs.get("inputs_embeds")
        inputs = kwargs.get("input_ids") if inputs is None else inputs
        self._positions = int((args[0] if args else inputs).shape[1])
        self._start = (time.perf_counter(), time.process_time())

    def _post(self, module, args, out):
        self.calls.append((self._positions, time.perf_counter() - self._start[0], time.process_time() - self._start[1]))


def int8_dynamic(model):
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return quantize_dynamic(model, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8,
                                inplace=True)


def int8_weight_only(model):
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    quantize_(model, Int8WeightOnlyConfig())
    return model


def main(argv=None) -> int:
    import torch

    import qgmem.serving.pipeline as pipeline_module
    from bench.serving.serve_load import histories
    from qgmem.serving.commands import load_models

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    pipe = load_models(args.export)
    data = histories(args.answers + 1)
    pipe.remember(data[0]["sessions"][: args.sessions])  # one user's memory; other users' questions vary the answers
    questions = [q for h in data for q in h["questions"][:1]]
    float_lm = pipe.lm
    levers = {"float32": (float_lm, False), "float32 + prefix": (float_lm, True),
              "int8 dynamic + prefix": (int8_dynamic(copy.deepcopy(float_lm)), True),
              "int8 weight-only + prefix": (int8_weight_only(copy.deepcopy(float_lm)), True)}
    clocks: dict[int, ForwardClock] = {}
    for lm, _ in levers.values():
        clocks.setdefault(id(lm), ForwardClock(lm))
    product_generate = pipeline_module.generate

    def whole_prefill(*a, **k):  # the pipeline as it was: no prefix cache
        k.pop("prefix_ids", None)
        return product_generate(*a, **k)

    rows = {name: [] for name in levers}
    for i in range(args.answers + 1):  # answer 0 warms each lever (first forward, prefix cache) and is dropped
        question = questions[i % len(questions)]
        for name, (lm, prefix) in levers.items():
            pipe.lm = lm
            pipeline_module.generate = product_generate if prefix else whole_prefill
            clock = clocks[id(lm)]
            clock.calls.clear()
            t, c = time.perf_counter(), time.process_time()
            answer = pipe.answer([question])[0]
            wall, cpu = time.perf_counter() - t, time.process_time() - c
            pipeline_module.generate = product_generate
            if i == 0:
                continue
            calls = clock.calls
            prefill, steps = calls[0], calls[1:]
            rows[name].append({"question": question, "answer": answer.answer, "wall": wall, "cpu": cpu,
                               "prefill_positions": prefill[0], "prefill_wall": prefill[1], "prefill_cpu": prefill[2],
                               "steps": len(steps), "step_wall": [s[1] for s in steps], "step_cpu": [s[2] for s in steps]})
            print(f"[warm-answer] {i}/{args.answers} {name}: {wall:.2f} s wall, {cpu:.2f} s CPU, "
                  f"{len(steps)} steps, load {os.getloadavg()[0]:.1f}", flush=True)
    pipe.lm = float_lm
    summary = {}
    for name, rs in rows.items():
        def med(key):
            return float(np.median([r[key] for r in rs]))

        step_wall = float(np.median([w for r in rs for w in r["step_wall"]])) if any(r["step_wall"] for r in rs) else 0.0
        step_cpu = float(np.median([w for r in rs for w in r["step_cpu"]])) if any(r["step_cpu"] for r in rs) else 0.0
        rest_wall = float(np.median([r["wall"] - r["prefill_wall"] - sum(r["step_wall"]) for r in rs]))
        rest_cpu = float(np.median([r["cpu"] - r["prefill_cpu"] - sum(r["step_cpu"]) for r in rs]))
        summary[name] = {"answer_wall_p50": med("wall"), "answer_cpu_p50": med("cpu"),
                         "prefill_positions": int(med("prefill_positions")), "prefill_wall_p50": med("prefill_wall"),
                         "prefill_cpu_p50": med("prefill_cpu"), "steps_p50": med("steps"),
                         "step_wall_p50": step_wall, "step_cpu_p50": step_cpu,
                         "rest_wall_p50": rest_wall, "rest_cpu_p50": rest_cpu,
                         "same_answers_as_float32": sum(a["answer"] == b["answer"] for a, b in zip(rs, rows["float32"]))}
    base = summary["float32"]
    print(f"\n{args.answers} warm answers per lever, one thread, load average {os.getloadavg()[0]:.1f}")
    print("| lever | answer p50 s (CPU s) | x float32 | prefill p50 s (CPU s), positions | step p50 s (CPU s) "
          "| steps | rest p50 s (CPU s) | answers equal to float32 |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, s in summary.items():
        print(f"| {name} | {s['answer_wall_p50']:.2f} ({s['answer_cpu_p50']:.2f}) | "
              f"{s['answer_wall_p50'] / base['answer_wall_p50']:.2f} ({s['answer_cpu_p50'] / base['answer_cpu_p50']:.2f}) | "
              f"{s['prefill_wall_p50']:.2f} ({s['prefill_cpu_p50']:.2f}), {s['prefill_positions']} | "
              f"{s['step_wall_p50']:.3f} ({s['step_cpu_p50']:.3f}) | {s['steps_p50']:.0f} | "
              f"{s['rest_wall_p50']:.2f} ({s['rest_cpu_p50']:.2f}) | {s['same_answers_as_float32']} of {len(rows[name])} |")
    print(json.dumps({"answers": args.answers, "threads": args.threads, "load_average": os.getloadavg(),
                      "levers": summary, "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
