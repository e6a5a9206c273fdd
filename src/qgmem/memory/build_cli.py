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
from dataclasses import dataclass
from typing import Any, Literal

from qgmem.data.loaders import DATASETS, add_load_arguments, load_arguments
from qgmem.errors import UserError, as_user_error
from qgmem.integrity import write_text_atomic
from qgmem.llm.base import LLMConfig
from qgmem.memory.config import CONSOLIDATIONS, EXTRACTORS, MAX_FAILED_WINDOW_SHARE, ConstructionConfig
from qgmem.memory.output import STORES_DIR, SUMMARY_FILE, build_lock, check_out, write_index
from qgmem.settings_flags import add_settings_arguments, settings_from_args


def dialogue_folder(dialogue_id: str) -> str:
    """A file-system-safe, collision-free folder name for a dialogue id (ids may hold '/' or '#')."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", dialogue_id)[-60:].strip("._") or "dialogue"
    return f"{slug}-{hashlib.sha1(dialogue_id.encode('utf-8')).hexdigest()[:8]}"


@dataclass
class BuildMemorySettings:
    """What ``qgmem build-memory`` runs with; one field per flag (beside ``--strict``/``--lenient``, ``--max-turn-chars``).

    The construction and LLM fields default to ``ConstructionConfig``'s and ``LLMConfig``'s, their one home.
    """

    dataset: Literal[DATASETS]  #: the data set's form
    path: str  #: data set file or folder
    out: str  #: output folder for the stores
    #: parser (rules + spaCy parse), heuristic (rules only) or llm
    extractor: Literal[EXTRACTORS] = ConstructionConfig.extractor
    window_size: int = ConstructionConfig.window_size  #: turns per construction window
    window_overlap: int = ConstructionConfig.window_overlap  #: turns consecutive windows share
    #: update vs supplement of traces: rule, llm, or auto (llm when the extractor is)
    consolidation: Literal[CONSOLIDATIONS] = ConstructionConfig.consolidation
    encoder: str | None = None  #: sentence-transformers folder (default: embedded MiniLM)
    limit: int | None = None  #: build only the first N dialogues
    no_resume: bool = False  #: rebuild stores that already exist
    #: stop when more than this share of one dialogue's windows got no usable LLM reply (a dialogue whose windows all failed always stops)
    max_failed_windows: float = MAX_FAILED_WINDOW_SHARE
    #: LLM (for --extractor llm or --consolidation llm): transformers (local) or openai (an OpenAI-compatible server)
    llm_backend: Literal["transformers", "openai"] = LLMConfig.backend
    llm_model: str = LLMConfig.model  #: LLM: model folder, hub id or served name
    llm_base_url: str = LLMConfig.base_url  #: LLM: the server's URL (openai backend)
    #: LLM: NAME of the environment variable holding the API key (the key itself is never logged)
    llm_api_key_env: str | None = LLMConfig.api_key_env
    llm_concurrency: int = LLMConfig.max_concurrency  #: LLM: requests in flight at most
    llm_batch_size: int = LLMConfig.batch_size  #: LLM: windows per local batch
    llm_device: str | None = LLMConfig.device  #: LLM: device of a local model
    llm_cache: str | None = None  #: LLM: SQLite response cache (default: OUT/llm_cache.sqlite)
    #: LLM: drop these cached replies first so they are asked again: all, rejected (replies the parser rejected, kept at temperature 0), a hex key prefix, START..END (hex, end exclusive), model=NAME or since=UNIX_SECONDS
    refresh_llm_cache: str | None = None
    llm_timeout: float = LLMConfig.timeout_s  #: LLM: seconds per network read
    llm_deadline: float = LLMConfig.deadline_s  #: LLM: seconds for a whole request, retries included
    json: bool = False  #: print the summary as one JSON object (last line)

    def construction(self) -> ConstructionConfig:
        return ConstructionConfig(extractor=self.extractor, window_size=self.window_size,
                                  window_overlap=self.window_overlap, consolidation=self.consolidation)

    def llm(self, out: Path) -> LLMConfig:
        """The LLM's settings; its response cache defaults to ``OUT/llm_cache.sqlite``."""
        return LLMConfig(backend=self.llm_backend, model=self.llm_model, base_url=self.llm_base_url,
                         api_key_env=self.llm_api_key_env, max_concurrency=self.llm_concurrency,
                         batch_size=self.llm_batch_size, device=self.llm_device, timeout_s=self.llm_timeout,
                         deadline_s=self.llm_deadline, cache_path=self.llm_cache or str(out / "llm_cache.sqlite"))




def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_settings_arguments(parser, BuildMemorySettings)
    add_load_arguments(parser)


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
        return _build(settings_from_args(BuildMemorySettings, args), args, held)


def _build(s: BuildMemorySettings, args: argparse.Namespace, held: ExitStack) -> int:
    """Build with the settings ``s``; ``args`` holds the loading flags (``load_arguments``)."""
    from tqdm import tqdm

    from qgmem.data.loaders import load_cases
    from qgmem.embed import SentenceEncoder
    from qgmem.memory.builder import BuildStats, ConstructionFailed, MemoryBuilder
    from qgmem.memory.store import MemoryStore, StoreMismatchError, clean_stale_temp

    started = time.perf_counter()
    out = check_out(s.out)  # a file of that name: one line, before any model or cache is opened
    with as_user_error(ValueError, prefix="bad option: "):
        config = s.construction()
    loaded = load_cases(s.dataset, s.path, **load_arguments(args))
    dialogues, seen = [], set()
    for case in loaded.cases:  # one store per dialogue, even when several cases share it
        if case.dialogue.id not in seen:
            seen.add(case.dialogue.id)
            dialogues.append(case.dialogue)
    if s.limit is not None:
        dialogues = dialogues[: s.limit]

    llm = None
    if s.refresh_llm_cache:
        from qgmem.llm.cache import KeyRange

        KeyRange.parse(s.refresh_llm_cache)  # a bad value stops here, before anything is built
    if s.llm_timeout <= 0 or s.llm_deadline <= 0:
        raise UserError("--llm-timeout and --llm-deadline must be > 0")
    if config.extractor == "llm" or config.consolidation == "llm":
        from qgmem.llm.backends import make_backend

        llm = make_backend(s.llm(out))
        if s.refresh_llm_cache:
            dropped = llm.drop(s.refresh_llm_cache)
            print(f"dropped {dropped} cached LLM replies ({s.refresh_llm_cache})", file=sys.stderr)
    with as_user_error(ValueError, prefix="bad option: --max-failed-windows: "):
        builder = MemoryBuilder(config, SentenceEncoder(s.encoder), llm=llm,
                                max_failed_share=s.max_failed_windows)
    expected = builder.expected_meta()
    held.enter_context(build_lock(out))  # a second build of the same OUT stops here, naming the lock
    (out / STORES_DIR).mkdir(parents=True, exist_ok=True)
    stale = clean_stale_temp(out / STORES_DIR)
    if stale:
        print(f"removed {len(stale)} half-written store folders of killed builds", file=sys.stderr)
    index, reused, rejected, retried, stopped = [], 0, [], 0, None
    bar = tqdm(dialogues, desc="build-memory", unit="dialogue", total=len(dialogues), file=sys.stderr,
               disable=not sys.stderr.isatty() and s.json)
    for dialogue in bar:
        folder = out / STORES_DIR / dialogue_folder(dialogue.id)
        store = None
        if not s.no_resume and (folder / "meta.json").exists():
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
                 dataset=s.dataset, extractor=config.extractor, out=str(out),
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
    if s.json:
        print(json.dumps(stats, ensure_ascii=False))
    return 0
