"""Learning check: train the graph token and its two ablations the same way and compare them.

Runs ``train.py`` once per ``--model.graph`` mode (``token``, ``none``, ``shuffled``) with the same data,
seed and settings, then prints one Markdown table of validation/test answer NLL, EM and F1 read from each
run's ``metrics.json``. Extra arguments are passed to every run, e.g.::

    python bench/learning_check.py --root checkpoints/learning-check -- --data.num_cases 180 --trainer.max_steps 60
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

MODES = ("token", "none", "shuffled")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="checkpoints/learning-check", help="one sub-folder per mode")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("train_args", nargs="*", help="arguments for train.py (after --)")
    args = parser.parse_args()
    train = Path(__file__).resolve().parents[1] / "train.py"
    rows = []
    for mode in args.modes:
        out = Path(args.root) / mode
        start = time.perf_counter()
        cmd = [sys.executable, str(train), "--model.graph", mode, "--trainer.default_root_dir", str(out),
               *args.train_args]
        print("$ " + " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
        metrics = json.loads((out / "metrics.json").read_text())
        rows.append((mode, metrics, time.perf_counter() - start))
    print("\n| graph | val NLL | val EM | val F1 | test NLL | test EM | test F1 | train samples | wall s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for mode, m, seconds in rows:
        v, t = m.get("val", {}), m.get("test", {})
        kept = (((m.get("data") or {}).get("filter") or {}).get("totals") or {}).get("train", {}).get("kept", "?")
        cells = [v.get("val/nll"), v.get("val/em"), v.get("val/f1"), t.get("test/nll"), t.get("test/em"), t.get("test/f1")]
        print(f"| `{mode}` | " + " | ".join("-" if c is None else f"{c:.3f}" for c in cells)
              + f" | {kept} | {seconds:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
