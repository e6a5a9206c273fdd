"""``qgmem build-memory``: build and save a memory store for every dialogue of a data set.

Stores go to ``OUT/stores/<dialogue folder>/`` (see :mod:`qgmem.memory.store` for the format) with an
``OUT/index.jsonl`` mapping dialogue ids to folders and ``OUT/summary.json`` with the build counts.
A store already in ``OUT`` with the same construction parameters is reused, and LLM replies are kept
in ``OUT/llm_cache.sqlite``, so an interrupted build run again finishes where it stopped. A store some of
whose windows got no usable LLM reply is built again on resume (its good replies come from the cache,
so only those windows are asked again); a dialogue with too many such windows (``--max-failed-windows``)
stops the build, exit 2, and saves nothing for it. One build writes an ``OUT`` at a time
(:func:`qgmem.memory.output.build_lock`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from qgmem.data.loaders import DATASETS, add_load_arguments, load_arguments
from qgmem.errors import UserError, as_user_error
from qgmem.integrity import write_text_atomic
from qgmem.llm.base import LLMConfig
from qgmem.memory.config import CONSOLIDATIONS, EXTRACTORS, MAX_FAILED_WINDOW_SHARE, ConstructionConfig
from qgmem.memory.output import STORES_DIR, SUMMARY_FILE, build_lock, check_out, write_index


def dialogue_folder(dialogue_id: str) -> str:
    """A file-system-safe, collision-free folder name for a dialogue id (ids may hold '/' or '#')."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", dialogue_id)[-60:].strip("._") or "dialogue"
    return f"{slug}-{hashlib.sha1(dialogue_id.encode('utf-8')).hexdigest()[:8]}"


#: flag dest -> the ``ConstructionConfig`` field it sets (the field's default is the flag's)
CONSTRUCTION_FLAGS = {"extractor": "extractor", "window_size": "window_size", "window_overlap": "window_overlap",
                      "consolidation": "consolidation"}
#: flag dest -> the ``LLMConfig`` field it sets (the field's default is the flag's)
LLM_FLAGS = {"llm_backend": "backend", "llm_model": "model", "llm_base_url": "base_url",
             "llm_api_key_env": "api_key_env", "llm_concurrency": "max_concurrency", "llm_batch_size": "batch_size",
             "llm_device": "device", "llm_timeout": "timeout_s", "llm_deadline": "deadline_s"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    construction, llm_defaults = ConstructionConfig(), LLMConfig()
    parser.add_argument("--dataset", required=True, choices=DATASETS)
    parser.add_argument("--path", required=True, help="data set file or folder")
    parser.add_argument("--out", required=True, help="output folder for the stores")
    parser.add_argument("--extractor", default=construction.extractor, choices=EXTRACTORS,
                        help=f"parser (rules + spaCy parse), heuristic (rules only) or llm "
                             f"(default {construction.extractor})")
    parser.add_argument("--limit", type=int, default=None, help="build only the first N dialogues")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object (last line)")
    add_load_arguments(parser)
    parser.add_argument("--encoder", default=None, help="sentence-transformers folder (default: embedded MiniLM)")
    parser.add_argument("--window-size", type=int, default=construction.window_size)
    parser.add_argument("--window-overlap", type=int, default=construction.window_overlap)
    parser.add_argument("--consolidation", default=construction.consolidation, choices=CONSOLIDATIONS)
    parser.add_argument("--no-resume", action="store_true", help="rebuild stores that already exist")
    parser.add_argument("--max-failed-windows", type=float, default=MAX_FAILED_WINDOW_SHARE, metavar="SHARE",
                        help="stop when more than this share of one dialogue's windows got no usable LLM reply "
                             f"(default {MAX_FAILED_WINDOW_SHARE:g}; a dialogue whose windows all failed always stops)")
    llm = parser.add_argument_group("LLM (for --extractor llm or --consolidation llm)")
    llm.add_argument("--llm-backend", default=llm_defaults.backend, choices=("transformers", "openai"))
    llm.add_argument("--llm-model", default=llm_defaults.model, help="model folder, hub id or served name")
    llm.add_argument("--llm-base-url", default=llm_defaults.base_url)
    llm.add_argument("--llm-api-key-env", default=llm_defaults.api_key_env,
                     help="NAME of the environment variable holding the API key (the key itself is never logged)")
    llm.add_argument("--llm-concurrency", type=int, default=llm_defaults.max_concurrency)
    llm.add_argument("--llm-batch-size", type=int, default=llm_defaults.batch_size)
    llm.add_argument("--llm-device", default=llm_defaults.device)
    llm.add_argument("--llm-cache", default=None, help="SQLite response cache (default: OUT/llm_cache.sqlite)")
    llm.add_argument("--refresh-llm-cache", default=None, metavar="KEYS",
                     help="drop these cached replies first so they are asked again: all, rejected (replies the "
                          "parser rejected, kept at temperature 0), a hex key prefix, "
                          "START..END (hex, end exclusive), model=NAME or since=UNIX_SECONDS")
    llm.add_argument("--llm-timeout", type=float, default=llm_defaults.timeout_s,
                     help=f"seconds per network read (default {llm_defaults.timeout_s:g})")
    llm.add_argument("--llm-deadline", type=float, default=llm_defaults.deadline_s,
                     help=f"seconds for a whole request, retries included (default {llm_defaults.deadline_s:g})")


def _sentences_line(sentences: dict[str, int]) -> str:
    """``sentences per role: assistant 120 (read 40, phatic 50, unread 30); user …`` (rule extractors)."""
    by_role: dict[str, dict[str, int]] = {}
    for key, n in sentences.items():
        role, _, outcome = key.partition("/")
        by_role.setdefault(role, {})[outcome] = n
    parts = []
    for role, outcomes in sorted(by_role.items()):
        ordered = sorted(outcomes.items(), key=lambda item: (item[0] != "read", -item[1], item[0]))
        parts.append(f"{role} {sum(outcomes.values())} (" + ", ".join(f"{o} {n}" for o, n in ordered) + ")")
    return "sentences per role: " + "; ".join(parts)


def _summary_line(stats: dict[str, Any]) -> str:
    return (f"dialogues {stats['dialogues']} (reused {stats['reused_dialogues']}, rebuilt corrupt "
            f"{stats.get('rebuilt_corrupt', 0)}), turns {stats['turns']}, "
            f"windows {stats['windows']} (skipped {stats['skipped_windows']}), units {stats['units']}, "
            f"traces {stats['traces']} (updates {stats['updates']}, supplements {stats['supplements']}), "
            f"LLM calls {stats['llm_calls']} (cache hits {stats['llm_cache_hits']}), tokens "
            f"{stats['prompt_tokens']} prompt + {stats['completion_tokens']} completion, "
            f"{stats['seconds']:.1f} s")


def run(args: argparse.Namespace) -> int:
    with ExitStack() as held:  # the OUT lock, taken once the data and the options are known to be good
        return _build(args, held)


def _build(args: argparse.Namespace, held: ExitStack) -> int:
    from tqdm import tqdm

    from qgmem.data.loaders import load_cases
    from qgmem.embed import SentenceEncoder
    from qgmem.memory.builder import BuildStats, ConstructionFailed, MemoryBuilder
    from qgmem.memory.store import MemoryStore, StoreMismatchError, clean_stale_temp

    started = time.perf_counter()
    out = check_out(args.out)  # a file of that name: one line, before any model or cache is opened
    with as_user_error(ValueError, prefix="bad option: "):
        config = ConstructionConfig(**{name: getattr(args, dest) for dest, name in CONSTRUCTION_FLAGS.items()})
    loaded = load_cases(args.dataset, args.path, **load_arguments(args))
    dialogues, seen = [], set()
    for case in loaded.cases:  # one store per dialogue, even when several cases share it
        if case.dialogue.id not in seen:
            seen.add(case.dialogue.id)
            dialogues.append(case.dialogue)
    if args.limit is not None:
        dialogues = dialogues[: args.limit]

    llm = None
    if args.refresh_llm_cache:
        from qgmem.llm.cache import KeyRange

        KeyRange.parse(args.refresh_llm_cache)  # a bad value stops here, before anything is built
    if args.llm_timeout <= 0 or args.llm_deadline <= 0:
        raise UserError("--llm-timeout and --llm-deadline must be > 0")
    if config.extractor == "llm" or config.consolidation == "llm":
        from qgmem.llm.backends import make_backend

        llm = make_backend(LLMConfig(**{name: getattr(args, dest) for dest, name in LLM_FLAGS.items()},
                                     cache_path=args.llm_cache or str(out / "llm_cache.sqlite")))
        if args.refresh_llm_cache:
            dropped = llm.drop(args.refresh_llm_cache)
            print(f"dropped {dropped} cached LLM replies ({args.refresh_llm_cache})", file=sys.stderr)
    with as_user_error(ValueError, prefix="bad option: --max-failed-windows: "):
        builder = MemoryBuilder(config, SentenceEncoder(args.encoder), llm=llm,
                                max_failed_share=args.max_failed_windows)
    expected = builder.expected_meta()
    held.enter_context(build_lock(out))  # a second build of the same OUT stops here, naming the lock
    (out / STORES_DIR).mkdir(parents=True, exist_ok=True)
    stale = clean_stale_temp(out / STORES_DIR)
    if stale:
        print(f"removed {len(stale)} half-written store folders of killed builds", file=sys.stderr)
    index, reused, rejected, retried, stopped = [], 0, [], 0, None
    bar = tqdm(dialogues, desc="build-memory", unit="dialogue", total=len(dialogues), file=sys.stderr,
               disable=not sys.stderr.isatty() and args.json)
    for dialogue in bar:
        folder = out / STORES_DIR / dialogue_folder(dialogue.id)
        store = None
        if not args.no_resume and (folder / "meta.json").exists():
            try:
                store = MemoryStore.load(folder, expected_meta={**expected, "dialogue_id": dialogue.id})
                if store.meta.get("counts", {}).get("skipped_windows", 0):  # ask its failed windows again
                    retried += 1
                    raise StoreMismatchError("windows to retry")
                reused += 1
                counts = {k: v for k, v in store.meta.get("counts", {}).items()
                          if k in BuildStats.__dataclass_fields__ and not k.startswith(("llm_", "prompt_", "completion_"))}
                builder.stats.merge(BuildStats(**{**counts, "skip_reasons": Counter(counts.get("skip_reasons", {})),
                                                  "sentences": Counter(counts.get("sentences", {}))}))
            except StoreMismatchError:  # other parameters: rebuilt, as asked
                store = None
            except (UserError, ValueError, OSError) as exc:  # corrupt, truncated, edited: rebuilt, reported
                rejected.append(f"{folder}: {exc}")
                store = None
        if store is None:
            try:
                store = builder.build(dialogue)
            except ConstructionFailed as exc:  # an outage is never saved as a finished store
                stopped = exc
                break
            store.save(folder)
        index.append({"dialogue_id": dialogue.id, "folder": f"{STORES_DIR}/{folder.name}", "units": len(store.units),
                      "traces": len(store.traces)})
        bar.set_postfix(units=builder.stats.units, reused=reused, refresh=False)
    write_index(out, index)
    stats = builder.stats.to_dict()
    stats.update(dialogues=len(dialogues), reused_dialogues=reused, rebuilt_corrupt=len(rejected),
                 rebuilt_corrupt_examples=rejected[:10], retried_failed_windows_stores=retried,
                 stopped=str(stopped) if stopped else None, removed_temp=len(stale), seconds=round(time.perf_counter() - started, 3),
                 dataset=args.dataset, extractor=config.extractor, out=str(out),
                 load_skipped=loaded.report.get("skipped", 0),
                 load_truncated_turns=loaded.report.get("truncated_turns", 0))
    if llm is not None:
        stats["llm"] = {"backend": llm.name, "model": llm.model_id}
        llm.close()
    write_text_atomic(out / SUMMARY_FILE, json.dumps(stats, indent=1, ensure_ascii=False))
    print(_summary_line(stats))
    if stats.get("sentences"):
        print(_sentences_line(stats["sentences"]))
    if stopped is not None:
        raise stopped
    if stats["load_skipped"]:
        print(f"skipped {stats['load_skipped']} bad records (--lenient): "
              + "; ".join(loaded.report["skip_reasons"][:3]))
    if stats["load_truncated_turns"]:
        print(f"warning: {stats['load_truncated_turns']} turns cut at --max-turn-chars {args.max_turn_chars}: "
              + "; ".join(loaded.report["truncated_examples"][:3]))
    if rejected:
        print(f"rebuilt {len(rejected)} stores that failed their integrity check: " + "; ".join(rejected[:3]))
    if stats["skipped_examples"]:
        print("skipped windows (first ones): " + "; ".join(stats["skipped_examples"][:5]))
    if args.json:
        print(json.dumps(stats, ensure_ascii=False))
    return 0
