"""Prompt lengths of the learning check's cache when the text holds the top ``m`` memory units whole.

Sizes ``--max-prompt-tokens`` for a budget point such as m = 10 (the cap must hold every prompt, or
the point is not m). It reads the cache only: no training, no scores::

    python bench/prompt_lengths.py --memory-units 10 --cap 2048
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/default.yaml")
    p.add_argument("--memory-units", type=int, default=10)
    p.add_argument("--cap", type=int, default=2048, help="a prompt cap large enough to cut nothing")
    args = p.parse_args(argv)
    from learning_check import load_config, module_default, usable

    from qgmem.training.datamodule import QGMemDataModule

    data = dict(load_config(args.config).get("data") or {})
    data.update(num_cases=None, answer_filter="none", memory_units=args.memory_units, max_prompt_tokens=args.cap,
                lm=module_default("lm"))
    dm = QGMemDataModule(**data)
    dm.prepare_data()
    dm.setup()
    print(f"cache {dm.cache_key}, m = {args.memory_units}, cap {args.cap}")
    for split in ("val", "test"):
        items, _, _ = usable(dm.split(split))
        encoded = [dm.collator.encoder.prompt(it["memory_text"], it["question"]) for it in items]
        lengths = sorted(len(e.ids) for e in encoded)
        n = len(lengths)
        print(f"{split}: {n} samples, prompt tokens mean {sum(lengths) / n:.0f}, median {lengths[n // 2]}, "
              f"max {lengths[-1]}; memory tokens mean {sum(e.memory_tokens for e in encoded) / n:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
