"""A control for ``bench/cache/cache_processes.py --compare``: can it tell two datasets apart?

Copies a built dataset folder, changes one validation sample's question and moves one node feature of
another by 0.5, reseals the copy (so it loads like a real cache), and compares the original with the
copy (expected: 1 sample differing in ``question``, largest feature difference 0.5) and with itself
(expected: the same samples, difference 0.0).

    python -m bench.cache.compare_control data/cache/dataset-KEY
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from bench.cache.cache_processes import compare


def altered_copy(dataset: Path, folder: Path) -> Path:
    import datasets

    from qgmem.samples import cache as C

    copy = folder / dataset.name
    shutil.copytree(dataset, copy)
    val = C.DatasetCache(dataset).load()["val"]
    if len(val) < 2:
        raise SystemExit(f"{dataset}: the control needs at least 2 validation samples, found {len(val)}")
    rows = [dict(row) for row in val]
    rows[0]["x"] = list(rows[0]["x"])
    rows[0]["x"][0] += 0.5
    rows[1]["question"] += " (changed)"
    shutil.rmtree(copy / "val")
    datasets.Dataset.from_list(rows, features=val.features).save_to_disk(str(copy / "val"))
    C.seal(copy)
    return copy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", type=Path, help="a dataset-KEY folder of a built cache")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="qgmem-compare-control-") as tmp:
        copy = altered_copy(args.dataset, Path(tmp))
        figures = {"altered": compare(str(args.dataset), str(copy)),
                   "itself": compare(str(args.dataset), str(args.dataset))}
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
