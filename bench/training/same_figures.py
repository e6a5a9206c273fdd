"""Whether two training runs logged the same figures: every TensorBoard scalar at every step, the val and
test metrics and the data cache key of ``metrics.json``.

A refactor of the training module must leave a seeded run's numbers as they were. Run the same short
job on the code before and after, each into its own root (the same ``--data.cache_dir``), e.g.

    python train.py --data.num_cases 16 --data.cache_dir /tmp/cmp/cache --trainer.default_root_dir /tmp/cmp/after \\
        --trainer.max_steps 4 --trainer.val_check_interval 2 --trainer.log_every_n_steps 1 \\
        --model.stages.steps 3 --export false
    python bench/training/same_figures.py /tmp/cmp/before /tmp/cmp/after --only-in-b train/loss_step

(the code before the stages took ``--model.align_steps 3``; it logged ``train/loss`` only with distillation.)

It prints each series of both runs and exits 1 when a figure differs (bit for bit) or is missing from one
run; a tag only one run logs is listed, and ``--only-in-b TAG`` accepts one the second run adds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def scalars(root: Path) -> dict[str, list[tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` of every event file under ``root`` (in step order)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    series: dict[str, list[tuple[int, float]]] = {}
    for events in sorted(root.rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            series.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return {tag: sorted(values, key=lambda sv: sv[0]) for tag, values in series.items()}


def figures(root: Path) -> dict[str, object]:
    """The scalars, plus the metrics and cache key of ``metrics.json``."""
    metrics = json.loads((root / "metrics.json").read_text())
    out: dict[str, object] = {f"scalar {tag}": values for tag, values in scalars(root).items() if tag != "epoch"}
    out["val"], out["test"] = metrics.get("val"), metrics.get("test")
    out["cache_key"] = (metrics.get("data") or {}).get("cache_key")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", type=Path, help="the first run's trainer.default_root_dir (the code before)")
    p.add_argument("b", type=Path, help="the second run's (the code after)")
    p.add_argument("--only-in-b", action="append", default=[], help="a tag the second run may add")
    args = p.parse_args(argv)
    a, b = figures(args.a), figures(args.b)
    differ = 0
    for key in sorted(set(a) | set(b)):
        if key not in a and key.removeprefix("scalar ") in args.only_in_b:
            print(f"only in b (accepted): {key} {b[key]}")
            continue
        same = a.get(key) == b.get(key)
        differ += not same
        print(f"{'same ' if same else 'DIFF '} {key}: {a.get(key)}" + ("" if same else f"\n       b: {b.get(key)}"))
    print(f"{differ} of {len(set(a) | set(b))} figures differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
