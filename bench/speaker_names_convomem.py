"""Whether ``dense_speaker_names`` can change anything on ConvoMem, the data ``python train.py`` runs.

    python bench/speaker_names_convomem.py [--path data/convomem] [--pq-dir DIR] [--cache]

1. Counts the questions of the whole data set (with its distractor conversations) that name one of
   their dialogue's speakers: the setting acts only on those.
2. With ``--pq-dir`` (``bench/activation_mechanisms.py --per-question-dir``): for each ConvoMem set
   there, how many questions got the same top k under ``names_keep`` as under ``default`` (names
   dropped; the per-question files of one run).
3. With ``--cache``: builds the default training cache twice (``qgmem build-cache --config default``,
   ``dense_speaker_names`` ``drop`` and ``keep``, in temporary folders) and compares one SHA-256 over
   each built train/val/test dataset's files, with the cache keys beside.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def questions_naming_a_speaker(path: Path, distractors: int) -> tuple[int, int]:
    from qgmem.evaluation.adversarial import names_in
    from qgmem.data.loaders import load_cases

    cases = load_cases("convomem", path, distractor_conversations=distractors).cases
    total = named = 0
    for case in cases:
        speakers = sorted({t.speaker for t in case.dialogue.turns() if t.speaker})
        for qa in case.qas:
            total += 1
            named += bool(names_in(qa.question, speakers))
    return named, total


def same_top_k(pq_dir: Path) -> None:
    for default in sorted(pq_dir.glob("convomem_*.default.jsonl")):
        set_name = default.name.split(".")[0]
        base = [json.loads(line) for line in default.read_text().splitlines() if line.strip()]
        for variant in ("names_keep",):
            other_file = pq_dir / f"{set_name}.{variant}.jsonl"
            if not other_file.is_file():
                continue
            other = {r["question_id"]: r for r in map(json.loads, other_file.read_text().splitlines())}
            same = sum([u["unit_id"] for u in r["activated"]] == [u["unit_id"] for u in other[r["question_id"]]["activated"]]
                       for r in base)
            print(f"{set_name}: {variant} gives the default's top k on {same} of {len(base)} questions")


def dataset_digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for split in ("train", "val", "test"):
        for file in sorted((folder / split).rglob("*")):
            if file.is_file():
                digest.update(file.relative_to(folder).as_posix().encode())
                digest.update(file.read_bytes())
    return digest.hexdigest()


def cache_digests() -> None:
    for mode in ("drop", "keep"):
        with tempfile.TemporaryDirectory(prefix=f"cache-{mode}-") as tmp:
            print(f"building the default cache with dense_speaker_names {mode} ...", file=sys.stderr, flush=True)
            subprocess.run([sys.executable, "-m", "qgmem", "build-cache", "--config", "default",
                            "--data.cache_dir", tmp, "--data.activation.dense_speaker_names", mode, "--no-progress"],
                           check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
            (dataset,) = Path(tmp).glob("dataset-*")
            print(f"{mode}: cache key {dataset.name.split('-', 1)[1]}, datasets sha256 {dataset_digest(dataset)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", default=str(ROOT / "data" / "convomem"))
    parser.add_argument("--distractors", type=int, default=2, help="distractor conversations per history (train.py: 2)")
    parser.add_argument("--pq-dir", default=None, help="per-question files of bench/activation_mechanisms.py")
    parser.add_argument("--cache", action="store_true", help="build the default cache under drop and keep and compare")
    args = parser.parse_args()
    named, total = questions_naming_a_speaker(Path(args.path), args.distractors)
    print(f"ConvoMem questions naming one of their dialogue's speakers: {named} of {total}")
    if args.pq_dir:
        same_top_k(Path(args.pq_dir))
    if args.cache:
        cache_digests()
    return 0


if __name__ == "__main__":
    sys.exit(main())
