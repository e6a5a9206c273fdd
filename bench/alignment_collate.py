"""What the node-token alignment stage pays to collate a batch: the run's whole collator against graphs alone.

The stage reads only ``batch["graph"]`` (with ``node_word_ids``). It used to call the run's collator,
which also tokenizes every prompt and answer and tokenized the node texts again at every step;
now it calls ``GraphTextCollator.graphs``, whose node word pieces are memoized per graph. Both are
timed on the training split of the config's cache (built or reused first), one batch of
``model.align_batch_size`` items, side by side in one run (interleaved repeats, medians). The batches' graphs are checked equal.

    python bench/alignment_collate.py                      # configs/default.yaml
    python bench/alignment_collate.py --repeats 50
"""

from __future__ import annotations

import argparse
import inspect
import json
import os

from reliability_overhead import interleaved  # the timer of the bench beside this one


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="default")
    parser.add_argument("--repeats", type=int, default=20)
    args, overrides = parser.parse_known_args()  # the rest: --data.KEY VALUE flags

    import torch
    import yaml

    from qgmem.configs import resolve_config
    from qgmem.training.build_cache import data_module
    from qgmem.training.module import QGMemModule

    dm = data_module(["--config", args.config, *overrides])
    dm.prepare_data()
    dm.setup("fit")
    model_cfg = (yaml.safe_load(open(resolve_config(args.config), encoding="utf-8")) or {}).get("model") or {}
    default = inspect.signature(QGMemModule).parameters["align_batch_size"].default
    size = int(model_cfg.get("align_batch_size", default))
    loader = dm.train_dataloader()
    collator, dataset = loader.collate_fn, loader.dataset
    items = [dataset[i] for i in range(min(size, len(dataset)))]

    def before():  # the stage's old batch: the whole collator, node texts tokenized again
        collator._word_memo.clear()
        return collator(items)

    full, alone = before()["graph"], collator.graphs(items)["graph"]
    same = all(torch.equal(full[k], alone[k]) for k in ("x", "edge_index", "edge_attr", "batch", "node_word_ids"))
    seconds = interleaved({"before": before, "graphs": lambda: collator.graphs(items)}, args.repeats)
    figures = {"config": args.config, "batch_items": len(items),
               "before_s_per_batch": round(seconds["before"], 4), "graphs_s_per_batch": round(seconds["graphs"], 4),
               "same_graphs": same, "cpu_threads": torch.get_num_threads(),
               "load_avg_1m": round(os.getloadavg()[0], 2)}
    figures["speedup"] = round(figures["before_s_per_batch"] / max(figures["graphs_s_per_batch"], 1e-9), 1)
    for key, value in figures.items():
        print(f"{key:>20}: {value}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
