"""Does the data pipeline keep up with the training step? Samples/s of both, on the same machine.

The loader side is the run's own ``train_dataloader()`` (cache → ``QGMemDataset`` → ``GraphTextCollator``:
graphs batched, prompts tokenized) with the config's settings, and with 0, 1 and 2 worker processes.
The step side is the project's training step (``QGMemModule`` forward + backward to the graph token +
AdamW) on the config's frozen LM, on one batch from that loader. The cache is built (or reused) first
with the config's data settings; ``--data.KEY VALUE`` flags override them (as for ``qgmem build-cache``).

    python -m bench.training.loader_vs_step                                  # configs/default.yaml, 6 cases
    python -m bench.training.loader_vs_step --config qwen3_8b --device cuda num_cases=60
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def loader_rate(dm, workers: int, min_batches: int) -> float:
    dm.num_workers = workers
    loader = dm.train_dataloader()
    next(iter(loader))  # worker start-up and the tokenizer load are not the steady state
    batches = samples = 0
    start = time.perf_counter()
    while batches < min_batches:
        for batch in loader:
            batches += 1
            samples += batch["input_ids"].size(0)
    return samples / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="default")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workers", default="0,1,2")
    parser.add_argument("--min-batches", type=int, default=40)
    parser.add_argument("--steps", type=int, default=2, help="timed training steps (median) after a warm-up")
    args, args.overrides = parser.parse_known_args()  # the rest: --data.KEY VALUE flags

    import torch
    import yaml

    from qgmem.configs import resolve_config
    from qgmem.training.build_cache import data_module
    from qgmem.training.module import QGMemModule

    overrides = ["--data.num_cases", "6", "--data.answer_filter", "none", *args.overrides]
    dm = data_module(["--config", args.config, *overrides])
    t = time.perf_counter()
    dm.prepare_data()
    build_s = time.perf_counter() - t
    dm.setup("fit")
    figures: dict[str, object] = {"config": args.config, "overrides": overrides, "batch_size": dm.batch_size,
                                  "train_samples": len(dm.split("train")), "cache_build_s": round(build_s, 1),
                                  "cpu_threads": torch.get_num_threads()}
    rates = {w: loader_rate(dm, w, args.min_batches) for w in (int(x) for x in args.workers.split(","))}
    figures["loader_samples_per_s"] = {str(w): round(r, 1) for w, r in rates.items()}

    model_cfg = (yaml.safe_load(open(resolve_config(args.config), encoding="utf-8")) or {}).get("model") or {}
    # the one-token network these figures were measured with (the defaults insert 16 node tokens)
    module = QGMemModule(lm=dm.cache_spec.lm, lm_dtype=model_cfg.get("lm_dtype", "auto"),
                         feature_dim=dm.feature_dim, features="text", readout="mean",
                         num_graph_tokens=1).to(args.device)
    module.adopt_contract(dm.answer_contract)
    module.train()
    dm.num_workers = 0
    batch = next(iter(dm.train_dataloader()))
    batch = {k: (v.to(args.device) if hasattr(v, "to") else v) for k, v in batch.items()}
    optimizer = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=1e-4)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)

    def step():
        loss = module(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()

    step()
    times = []
    for _ in range(args.steps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    step_rate = batch["input_ids"].size(0) / statistics.median(times)
    figures["step_samples_per_s"] = round(step_rate, 3)
    figures["loader_over_step"] = {str(w): round(r / step_rate, 1) for w, r in rates.items()}
    figures["device"] = args.device
    figures["load_avg_1m"] = round(os.getloadavg()[0], 2)
    for key, value in figures.items():
        print(f"{key:>22}: {value}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
