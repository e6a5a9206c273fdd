"""Cache build, cache reuse and data-loading throughput of ``QGMemDataModule``.

Builds the cache for the given settings into a fresh folder (replay of construction + activation, then
frozen-LM answers and the filter), runs ``prepare_data`` again to time reuse, then times item reads
and collated batches. Prints one line per figure and, last, one JSON object with all of them.

    python -m bench.training.dataloader                      # the embedded default (real sample, MiniLM, SmolLM2)
    python -m bench.training.dataloader --num-cases 8 --answer-filter none
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-path", default="data/convomem")
    parser.add_argument("--num-cases", type=int, default=None, help="default: the data module's default")
    parser.add_argument("--distractors", type=int, default=None, help="default: the data module's default")
    parser.add_argument("--answer-filter", default="match", choices=["none", "match"])
    parser.add_argument("--lm", default=None, help="answer LM (default: the embedded SmolLM2)")
    parser.add_argument("--max-prompt-tokens", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--cache-dir", default=None, help="default: a temporary folder, removed afterwards")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from qgmem.training.datamodule import QGMemDataModule

    kwargs = {"data_path": args.data_path, "answer_filter": args.answer_filter, "batch_size": args.batch_size}
    for key, value in (("num_cases", args.num_cases), ("distractor_conversations", args.distractors),
                       ("lm", args.lm), ("max_prompt_tokens", args.max_prompt_tokens)):
        if value is not None:
            kwargs[key] = value
    cache_dir = args.cache_dir or tempfile.mkdtemp(prefix="qgmem-bench-cache-")
    figures: dict[str, object] = {"cpu_threads": torch.get_num_threads(), "load_avg_1m": round(os.getloadavg()[0], 2)}
    try:
        t = time.perf_counter()
        dm = QGMemDataModule(cache_dir=cache_dir, **kwargs)
        figures["init_s"] = round(time.perf_counter() - t, 3)
        t = time.perf_counter()
        dm.prepare_data()
        figures["build_s"] = round(time.perf_counter() - t, 1)
        summary = dm.summary
        figures.update({
            "num_cases": dm.num_cases, "distractor_conversations": dm.distractor_conversations,
            "max_prompt_tokens": dm.max_prompt_tokens,
            "replay_s": summary["seconds"].get("replay_s"),
            "answers_and_filter_s": summary["seconds"].get("answers_and_filter_s"),
            "answers_generated": summary["answers"]["generated"],
            "answer_s_per_qa": round(summary["answers"].get("generate_s", 0.0) / max(1, summary["answers"]["generated"]), 2),
            "cases": summary["cases"], "samples": {k: sum(v.values()) for k, v in summary["samples"].items()},
            "train_filter": summary["filter"]["totals"].get("train", {}),
            "left_out_categories": sorted(summary["left_out_categories"]),
        })
        t = time.perf_counter()
        again = QGMemDataModule(cache_dir=cache_dir, **kwargs)
        again.prepare_data()
        again.setup()
        figures["reuse_s"] = round(time.perf_counter() - t, 2)
        split = again.split("val") if len(again.split("train")) == 0 else again.split("train")
        n = len(split)
        t = time.perf_counter()
        reps = max(1, 200 // max(1, n))
        for _ in range(reps):
            for i in range(n):
                split[i]
        figures["items_per_s"] = round(reps * n / (time.perf_counter() - t), 1)
        loader = again.val_dataloader() if split is again.split("val") else again.train_dataloader()
        collator = again.collator  # build (tokenizer load) outside the timed loop
        t = time.perf_counter()
        batches = 0
        for _ in range(max(1, 40 // max(1, len(loader)))):
            for _batch in loader:
                batches += 1
        figures["collated_batches_per_s"] = round(batches / (time.perf_counter() - t), 1)
        figures["batch_size"] = loader.batch_size
        del collator
    finally:
        if args.cache_dir is None:
            shutil.rmtree(cache_dir, ignore_errors=True)
    for key, value in figures.items():
        print(f"{key:>26}: {value}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
