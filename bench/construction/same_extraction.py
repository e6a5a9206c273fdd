"""Whether a change kept construction's output: units, named-form questions and the default cache key.

Extracts the units of the first ``--dialogues`` ConvoMem dialogues with the heuristic and the parser
extractors (no encoder: extraction alone), rewrites every ConvoMem question in the named form, and
computes the default preset's cache key, once with this checkout's code and once with ``--base``'s
(``git archive`` of ``src`` and ``configs`` into a temporary folder, run in a subprocess). Prints the
counts and whether each part is the same.

    python -m bench.construction.same_extraction --base fa4d8fc --dialogues 200
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from bench.common import REPO as ROOT


def dump(out: Path, data: Path, dialogues: int) -> None:
    """This interpreter's qgmem: units per extractor, named questions, the default cache key -> ``out``."""
    from qgmem.data.loaders import load_cases
    from qgmem.evaluation import named_form
    from qgmem.memory.builder import MemoryBuilder
    from qgmem.memory.config import ConstructionConfig
    from qgmem.training.build_cache import data_module

    cases = list(load_cases("convomem", data).cases)
    rewrite = getattr(named_form, "third_person_question", None) or getattr(named_form, "third_person")
    result: dict = {"questions": [rewrite(q.question, *named_form.DEFAULT_NAMES) for c in cases for q in c.qas],
                    "cache_key": data_module(["--config", "default"]).cache_spec.cache_key}
    seen: dict[str, object] = {}
    for case in cases:
        seen.setdefault(case.dialogue.id, case.dialogue)
    for extractor in ("heuristic", "parser"):
        builder, rows, started = MemoryBuilder(ConstructionConfig(extractor=extractor), None), [], time.time()
        for i, dialogue in enumerate(list(seen.values())[:dialogues]):
            rows += [[u.fact, u.subject, u.predicate, u.object, u.relations, u.entities, u.source_turn_ids]
                     for u in builder.extract(dialogue).units]
            if i % 25 == 0:
                print(f"  {extractor}: dialogue {i}, {time.time() - started:.0f} s", file=sys.stderr, flush=True)
        result[extractor] = rows
    out.write_text(json.dumps(result, default=str), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="git revision to compare with")
    parser.add_argument("--dialogues", type=int, default=200)
    parser.add_argument("--data", default=str(ROOT / "data" / "convomem"))
    parser.add_argument("--dump", default=None, help=argparse.SUPPRESS)  # the subprocess's own mode
    args = parser.parse_args()
    if args.dump:
        dump(Path(args.dump), Path(args.data), args.dialogues)
        return
    with tempfile.TemporaryDirectory(prefix="qgmem-same-") as tmp:
        tree = Path(tmp) / "base"
        tree.mkdir()
        archive = subprocess.run(["git", "archive", args.base, "src", "configs"], cwd=ROOT, check=True,
                                 capture_output=True).stdout
        (Path(tmp) / "base.tar").write_bytes(archive)
        with tarfile.open(Path(tmp) / "base.tar") as tar:
            tar.extractall(tree, filter="data")
        dumps = {}
        for name, src in (("base", tree / "src"), ("this", ROOT / "src")):
            print(f"{name}: {src}", file=sys.stderr)
            dumps[name] = Path(tmp) / f"{name}.json"
            subprocess.run([sys.executable, "-m", "bench.construction.same_extraction", "--base", args.base, "--dialogues", str(args.dialogues),
                            "--data", args.data, "--dump", str(dumps[name])], check=True, cwd=ROOT,
                           env={**os.environ, "PYTHONPATH": str(src)})
        base, this = (json.loads(dumps[n].read_text(encoding="utf-8")) for n in ("base", "this"))
    for part in ("heuristic", "parser", "questions", "cache_key"):
        size = len(this[part]) if isinstance(this[part], list) else 1
        print(f"{part}: {size} {'items' if size > 1 else 'item'}, same as {args.base}: {base[part] == this[part]}")


if __name__ == "__main__":
    main()
