"""Building a training cache: plan the cases, replay construction + activation, answer and filter.

One :class:`~qgmem.samples.spec.CacheSpec` fixes what is built and where
(:mod:`qgmem.samples.cache` is the on-disk format). The build has three parts, each reused when it
is already on disk and resumed when it was interrupted:

1. samples: one Arrow shard per planned case (construction of its dialogue, activation for each QA,
   the working memory's graph), with the sentence embeddings memoized per text
   (:mod:`qgmem.samples.embedding_memo`);
2. answers: the frozen LM's answer to each training prompt, appended in chunks;
3. the dataset: the filtered train/val/test splits and their summary, which ``setup`` reads.

The samples can be built by many processes at once: a :class:`Shard` ``I/N`` owns the cases whose plan
index is ``I`` modulo ``N``. Every process derives the same plan from the same settings, writes only its
own case shards, and the merge is the ``datasets`` concatenation of all shards in plan order; the
COMPLETE marker is written once every case shard exists (:func:`build_on_ranks` for the ranks of one
run, ``qgmem build-cache --shard I/N`` for a job array).
"""

from __future__ import annotations

import json
import logging
import re
import time
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from qgmem.ranks import raise_on_every_rank
from qgmem.samples import cache as C
from qgmem.samples.answer_filter import RUBRIC_CATEGORIES, FilterReport, JudgeItem, decide, make_judge
from qgmem.samples.spec import DEFAULT_SENTENCE_ENCODER, CacheSpec

log = logging.getLogger(__name__)

#: a case's construction counts kept in its shard's meta and added up in the build's summary (``construction``)
CONSTRUCTION_COUNTS = ("windows", "skipped_windows", "unavailable_windows", "skip_reasons", "retried_windows", "units", "llm_requests",
                       "llm_calls", "llm_cache_hits")


@dataclass(frozen=True)
class Shard:
    """One slice of the case plan: case ``i`` belongs to shard ``i % count`` (round-robin keeps the
    slices' sizes and their mix of splits even)."""

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ValueError(f"shard must be I/N with 0 <= I < N, got {self.index}/{self.count}")

    @classmethod
    def parse(cls, text: str) -> "Shard":
        match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
        if match is None:
            raise ValueError(f"shard must be written I/N (e.g. 0/4), got {text!r}")
        return cls(int(match.group(1)), int(match.group(2)))

    def owns(self, case_index: int) -> bool:
        return case_index % self.count == self.index

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def as_spec(target: Any) -> CacheSpec:
    """A :class:`CacheSpec`, or the spec of anything that holds one (a data module)."""
    spec = target if isinstance(target, CacheSpec) else getattr(target, "cache_spec", None)
    if not isinstance(spec, CacheSpec):
        raise TypeError(f"expected a CacheSpec or a data module with one, got {type(target).__name__}")
    return spec


def build_cache(target: CacheSpec | Any, *, encoder: Any = None, answerer: Any = None, judge: Any = None,
                progress: bool = True, shard: Shard | None = None) -> dict[str, Any]:
    """Build the three cache parts for ``target``'s settings, reusing whatever is already on disk.

    ``target`` is a :class:`CacheSpec` or a data module. ``encoder`` (anything with ``dim`` and
    ``encode``), ``answerer`` (anything with ``answer(pairs)``) and ``judge`` (a
    :class:`~qgmem.samples.answer_filter.Judge`) replace the configured sentence encoder, frozen LM
    and judge, for tests that must not load real models or reach a server; the cache keys still name
    the configured ones. An interrupted build (an exception, Ctrl-C, a killed job) leaves whole case
    shards and answer chunks behind; calling this again continues from there. Returns the summary
    (also written to ``dataset-<key>/summary.json``).

    With a ``shard`` of more than one slice, only that slice's case shards are built and the state of
    the samples is returned (``planned``, ``present``, ``complete``); a run without a shard (or the
    last slice to finish) completes the samples, and a run without a shard then answers and filters.
    """
    spec = as_spec(target)
    timings: dict[str, float] = {}
    started = time.perf_counter()
    C.remove_stale_temp(spec.cache_dir)  # what killed builds left behind
    samples = C.SampleCache(spec.samples_dir)
    state = build_samples(spec, samples, encoder=encoder, progress=progress, shard=shard or Shard())
    if shard is not None and shard.count > 1:
        return state
    timings["samples_s"] = round(time.perf_counter() - started, 2)
    return finish_cache(spec, samples, answerer=answerer, judge=judge, progress=progress, timings=timings)


def finish_cache(spec: CacheSpec, samples: C.SampleCache, *, answerer: Any = None, judge: Any = None,
                 progress: bool = True, timings: dict[str, float] | None = None) -> dict[str, Any]:
    """From complete samples: answer, filter and write the dataset with its summary."""
    timings = dict(timings or {})
    t = time.perf_counter()
    rows = samples.load()
    splits, report, answer_info = filter_samples(spec, rows, answerer=answerer, judge=judge, progress=progress)
    timings["answers_and_filter_s"] = round(time.perf_counter() - t, 2)
    summary = {
        "cache_key": spec.cache_key, "samples_key": spec.samples_key, "dataset_dir": str(spec.dataset_dir),
        "settings": {**spec.sample_settings(), **spec.filter_settings(), "lm": spec.lm},
        **samples.completion_info(),
        "samples": {name: count_categories(rows_) for name, rows_ in splits.items()},
        "filter": report.to_dict(), "answers": answer_info,
        "left_out_categories": report.left_out_categories,
        "seconds": {**samples.completion_info().get("seconds", {}), **timings},
    }
    C.DatasetCache(spec.dataset_dir).save(splits, summary)
    return summary


def count_categories(rows: Sequence[dict[str, Any]]) -> dict[str, int]:
    return dict(sorted(Counter(str(r.get("category", "")) for r in rows).items()))


# --------------------------------------------------------------------------------------------------
# the plan


def plan_cases(spec: CacheSpec) -> tuple[list[tuple[str, Any]], dict[str, Any]]:
    """Load, sample and split the cases: ``[(split, case)]`` in train/val/test order, and what happened.

    A split that had to fall back from person to dialogue grouping (too few persons, as in the
    one-persona sample) says so: the warning text is kept in the summary.
    """
    from qgmem.data.loaders import load_cases
    from qgmem.data.splits import run_splits

    spec = as_spec(spec)
    options: dict[str, Any] = {}
    if spec.distractor_conversations is not None:
        options["distractor_conversations"] = spec.distractor_conversations
    if spec.dataset == "convomem":
        options["seed"] = spec.seed
    loaded = load_cases(spec.dataset, spec.data_path, strict=spec.strict, **options)
    cases = list(loaded.cases)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parts = run_splits(cases, spec.num_cases, spec.seed, spec.split_ratios, spec.group_key)
    split_warnings = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    plan = [(name, case) for name in C.SPLITS for case in parts.get(name, [])]
    shared, used = _shared_groups(parts, spec.group_key), spec.group_key
    if shared:  # the splitter fell back to dialogue grouping (it warned; the warning is in the summary)
        used, shared = "dialogue", _shared_groups(parts, "dialogue")
    groups = {name: len({group_of(case, used) for case in parts.get(name, [])}) for name in C.SPLITS}
    info = {
        "cases": {"loaded": len(cases), "sampled": sum(len(part) for part in parts.values()),
                  **{n: len(parts.get(n, [])) for n in C.SPLITS}},
        "qas": {n: sum(len(c.qas) for c in parts.get(n, [])) for n in C.SPLITS},
        "split": {"group_key": spec.group_key, "group_key_used": used, "groups": groups,
                  "groups_shared_across_splits": shared, "warnings": split_warnings},
        "load_report": _jsonable(getattr(loaded, "report", {})),
    }
    return plan, info


def _shared_groups(parts: dict[str, list[Any]], key: str) -> int:
    """How many groups (under ``key``) occur in more than one split."""
    seen: Counter[str] = Counter()
    for name in C.SPLITS:
        seen.update({group_of(case, key) for case in parts.get(name, [])})
    return sum(1 for n in seen.values() if n > 1)


def group_of(case: Any, key: str) -> str:
    try:
        return case.group_key(key)
    except KeyError:
        return case.group_key("dialogue")


def _jsonable(obj: Any) -> Any:
    if hasattr(obj, "summary") and callable(obj.summary):
        obj = obj.summary()
    return json.loads(json.dumps(obj, default=str))


# --------------------------------------------------------------------------------------------------
# replay


class Replayer:
    """Construction + activation for one case at a time, with the models loaded once.

    Every encoder call goes through an :class:`~qgmem.samples.embedding_memo.EmbeddingMemo` under
    the cache folder (``memo=False`` turns it off, e.g. to time the encoder itself).
    """

    def __init__(self, spec: CacheSpec, encoder: Any = None, *, memo: bool = True):
        from qgmem.activation.rerank import shared_reranker
        from qgmem.embed import SentenceEncoder
        from qgmem.memory.builder import MemoryBuilder
        from qgmem.samples.embedding_memo import EmbeddingMemo

        self.spec = spec = as_spec(spec)
        if encoder is None:  # the memo below replaces the encoder's own in-process one
            encoder = SentenceEncoder(None if spec.sentence_encoder == DEFAULT_SENTENCE_ENCODER
                                      else spec.sentence_encoder, max_cache_entries=0 if memo else 500_000)
        if encoder.dim != spec.feature_dim:
            raise RuntimeError(f"sentence encoder {spec.sentence_encoder!r} embeds in {encoder.dim} dims, but its "
                               f"config says {spec.feature_dim}")
        self.memo = EmbeddingMemo(encoder, memo_dir(spec, encoder)) if memo else None
        self.encoder = self.memo or encoder
        self.llm = None
        if spec.construction_llm is not None:
            from qgmem.llm.backends import make_backend

            self.llm = make_backend(spec.construction_llm)
        self.builder = MemoryBuilder(spec.construction, self.encoder, llm=self.llm)
        self.construction_counts: dict[str, dict[str, Any]] = {}  # case id -> its construction's counts
        self.reranker = shared_reranker(spec.activation)  # a model reranker loads once, not once per dialogue

    @property
    def cases_in_flight(self) -> int:
        """How many cases :func:`build_samples` keeps in flight: more than one only for the LLM extractor
        over a backend that serves concurrent callers (an OpenAI-compatible server)."""
        if self.llm is None or self.spec.construction.extractor != "llm" or not self.llm.concurrent_callers:
            return 1
        setting = self.spec.construction_cases_in_flight
        return max(1, int(self.spec.construction_llm.max_concurrency if setting is None else setting))

    def extract(self, case: Any):
        """The LLM extraction of ``case``'s dialogue alone (safe to run on several threads at once)."""
        return self.builder.extract(case.dialogue)

    def rows(self, split: str, case: Any, extraction: Any = None,
             on_question: Callable[[Any, Any, str | None, Any, Any], None] | None = None) -> list[dict[str, Any]]:
        """The samples of ``case``; ``extraction`` is :meth:`extract`'s result when it was run ahead.

        ``on_question(store, qa, when, memory, graph)`` is called after each question is activated, with
        the case's store, the question's working memory and its graph: a study replays the same plan
        through it to build what it needs beside the samples (the counterfactual graphs of
        :mod:`qgmem.evaluation.counterfactuals`) without being part of them.
        """
        from qgmem.activation.memory import Memory

        spec = self.spec
        dialogue_memory = Memory.build(self.builder, case.dialogue, spec.activation, reranker=self.reranker,
                                       extraction=extraction)
        store = dialogue_memory.store
        counts = store.meta.get("counts") or {}
        if counts.get("unavailable_windows"):  # a case one outage short would be kept and reused by every resume
            from qgmem.memory.builder import ConstructionFailed

            raise ConstructionFailed(f"dialogue {case.dialogue.id!r}: {counts['unavailable_windows']} of "
                                     f"{counts.get('windows')} windows got no reply from the LLM server; the case "
                                     "is not stored", hint="check the server, then run again: finished cases are "
                                     "kept and the replies so far are cached")
        self.construction_counts[case.id] = {k: counts[k] for k in CONSTRUCTION_COUNTS if k in counts}
        group = group_of(case, spec.group_key)
        rows = []
        for qa in case.qas:
            # LoCoMo questions carry no time of their own: the last session's date stands in for it
            when = qa.question_time or qa.meta.get("reference_time")
            memory, data, _ = dialogue_memory.recall(qa.question, when)
            if on_question is not None:
                on_question(store, qa, when, memory, data)
            rows.append(C.sample_row(
                qa_id=qa.id, case_id=case.id, dialogue_id=case.dialogue.id, group=group, split=split,
                category=qa.category, question=qa.question, question_time=qa.question_time, reference=qa.answer,
                memory_text=memory.text, graph=data, feature_dim=self.encoder.dim,
                node_text=getattr(data, "node_text", memory.graph.node_text),
                edge_text=getattr(data, "edge_text", memory.graph.edge_text),
                edge_unit=memory.graph.edge_unit))
        return rows

    def close(self) -> None:
        """Persist the vectors encoded since the last flush; release the construction backend."""
        if self.memo is not None:
            self.memo.flush()
        if self.llm is not None:
            self.llm.close()


class CasesAhead:
    """The LLM extraction of the next cases, run on threads while the current case is finished.

    Only the extraction runs ahead (it waits on the server); embedding, consolidation, activation and
    the shard write stay on the calling thread in plan order, so every encoder call and every shard is
    the serial build's, and a failure surfaces at its own case (:meth:`extraction` re-raises it there).
    At most ``width`` cases are extracted at once; the backend's ``max_concurrency`` bounds the
    requests of all of them together. ``width`` 1 runs nothing ahead.
    """

    def __init__(self, replayer: Replayer, plan: list[tuple[str, Any]], todo: list[int], width: int):
        from collections import deque
        from concurrent.futures import ThreadPoolExecutor

        self.replayer, self.plan, self.width = replayer, plan, max(1, width)
        self._queue = deque(todo)
        self._running: dict[int, Any] = {}
        self._pool = ThreadPoolExecutor(self.width, thread_name_prefix="qgmem-case") if self.width > 1 else None

    def _fill(self) -> None:
        while self._queue and len(self._running) < self.width:
            index = self._queue.popleft()
            self._running[index] = self._pool.submit(self.replayer.extract, self.plan[index][1])

    def extraction(self, index: int) -> Any:
        """Case ``index``'s extraction (waiting for it), or ``None`` when nothing runs ahead."""
        if self._pool is None:
            return None
        self._fill()
        future = self._running.pop(index)
        self._fill()  # the next case starts while this one is finished
        return future.result()

    def close(self) -> None:
        """Drop what was started ahead (a failure or an interrupt); nothing of it was written."""
        for future in self._running.values():
            future.cancel()
        self._running.clear()
        self._queue.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


def memo_dir(spec: CacheSpec, encoder: Any):
    """The memo folder of the encoder actually used (a stand-in encoder never shares the real one's)."""
    model_id = getattr(encoder, "model_id", type(encoder).__name__)
    return spec.cache_dir / f"embeddings-{C.stable_hash({'encoder': model_id, 'dim': int(encoder.dim)})}"


def build_samples(spec: CacheSpec, samples: C.SampleCache, *, encoder: Any = None,
                  progress: bool = True, shard: Shard = Shard(), processes: int | None = None) -> dict[str, Any]:
    """Write one shard per planned case of ``shard``'s slice that has none yet; mark the samples complete
    when every case's shard exists (whichever slice finishes last). Returns the completion info, or,
    while other slices are missing, ``{"complete": False, "planned", "present", "built", "shard",
    "processes"}``.

    ``processes`` (default: the spec's ``cache_processes``) replays the slice's cases on that many
    worker processes (:func:`qgmem.samples.replay_pool.replay_in_processes`); 1 replays them here,
    in plan order.
    """
    from tqdm.auto import tqdm

    spec = as_spec(spec)
    if samples.complete and not samples.damaged_shards(len(samples.plan())):
        return samples.completion_info()
    t0 = time.perf_counter()
    plan, info = plan_cases(spec)
    samples.start(spec.sample_settings(), [{"split": s, "case_id": c.id} for s, c in plan])
    rebuilt = rebuild_damaged_shards(samples, len(plan))
    mine = [i for i in range(len(plan)) if shard.owns(i)]
    todo = [i for i in mine if not samples.has_shard(i)]
    width = min(max(1, spec.cache_processes if processes is None else int(processes)), max(1, len(todo)))
    bar = tqdm(total=len(mine), initial=len(mine) - len(todo), desc=f"cache: cases (shard {shard})"
               if shard.count > 1 else "cache: cases", unit="case", disable=not progress)
    memo_stats: dict[str, int] | None = None
    in_flight: int | None = None
    try:
        if width > 1:
            bar.set_postfix_str(f"{width} processes")
            from qgmem.samples.replay_pool import replay_in_processes

            memo_stats = replay_in_processes(spec, samples, plan, todo, width, shard, encoder=encoder,
                                             replayer=Replayer, replay=replay_case, on_case=lambda _: bar.update(1))
            in_flight = 1
        elif todo:
            replayer = Replayer(spec, encoder)
            ahead = CasesAhead(replayer, plan, todo, replayer.cases_in_flight)
            in_flight = replayer.cases_in_flight
            try:
                for index in todo:
                    replay_case(replayer, samples, plan, index, shard, lambda i=index: ahead.extraction(i))
                    bar.update(1)
            finally:
                ahead.close()
                replayer.close()
            memo_stats = replayer.memo.stats() if replayer.memo is not None else None
    finally:
        bar.close()
    built = len(todo)
    present = sum(samples.has_shard(i) for i in range(len(plan)))
    if present < len(plan):  # other slices are still being built (or were killed): no COMPLETE yet
        return {"complete": False, "planned": len(plan), "present": present, "built": built, "shard": str(shard),
                "processes": width if todo else None}
    metas = [samples.shard_meta(i) for i in range(len(plan))]
    skipped = [{"case_id": m["case_id"], "split": m["split"], "reason": m["skipped"]} for m in metas if "skipped" in m]
    seconds: dict[str, Any] = {"replay_s": round(time.perf_counter() - t0, 2), "cases_built_this_run": built,
                               "case_s_sum": round(sum(m.get("seconds", 0.0) for m in metas), 2),
                               "cases_in_flight": in_flight, "processes": width if todo else None}
    if memo_stats is not None:
        seconds["embedding_memo"] = memo_stats
    done = {**info, "skipped_cases": skipped, "rebuilt_shards": rebuilt, "seconds": seconds,
            "construction": construction_totals(metas)}
    samples.mark_complete(done)
    return done


def replay_case(replayer: Replayer, samples: C.SampleCache, plan: Sequence[tuple[str, Any]] | dict[int, Any], index: int,
                shard: Shard, extraction: Callable[[], Any] | None = None) -> None:
    """Replay case ``index`` of ``plan`` and write its shard: the one per-case step of every build.

    ``extraction`` gives the case's LLM extraction when it ran ahead (:class:`CasesAhead`); its failure
    is the case's. A failed case stops a strict build (a ``RuntimeError`` naming the case); a lenient
    one writes an empty shard whose meta says why, so the completion record counts it as skipped.
    """
    split, case = plan[index]
    meta: dict[str, Any] = {"case_id": case.id, "split": split, "qas": len(case.qas),
                            "turns": _turns(case), "shard": str(shard)}
    started = time.perf_counter()
    try:
        rows = replayer.rows(split, case, extraction() if extraction is not None else None)
    except Exception as exc:  # noqa: BLE001 - lenient mode records the case as skipped
        if replayer.spec.strict:
            raise RuntimeError(f"case {index} ({case.id!r}, split {split}): construction/activation failed: "
                               f"{type(exc).__name__}: {exc}") from exc
        rows, meta["skipped"] = [], f"{type(exc).__name__}: {exc}"
    meta["seconds"] = round(time.perf_counter() - started, 3)
    counts = getattr(replayer, "construction_counts", {}).pop(case.id, None)
    if counts:
        meta["construction"] = counts
    samples.write_shard(index, rows, meta)


def construction_totals(metas: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The construction counts of every case's shard added up: windows, skipped windows and why, LLM calls.

    Why: a weak model's malformed replies cost windows, not the build; this is where the build says how many.
    """
    totals: dict[str, Any] = {"cases": 0, "skip_reasons": {}}
    for meta in metas:
        counts = meta.get("construction")
        if not counts:
            continue
        totals["cases"] += 1
        for key, value in counts.items():
            if key == "skip_reasons":
                for reason, n in value.items():
                    totals["skip_reasons"][reason] = totals["skip_reasons"].get(reason, 0) + n
            elif isinstance(value, (int, float)):
                totals[key] = totals.get(key, 0) + value
    return totals


def _turns(case: Any) -> int:
    return int(case.dialogue.num_turns())


def build_on_ranks(spec: CacheSpec, rank: int, world: int, *, any_rank: Callable[[bool], bool],
                   rebuild: bool = False, progress: bool = True, **models: Any) -> dict[str, Any] | None:
    """The cache build of one distributed run: every rank builds its slice, rank 0 merges and filters.

    ``rank``/``world`` index the processes that share one cache folder (all ranks on a shared file
    system, the local ranks of a node on a node-local one). ``any_rank(flag)`` ("is ``flag`` true on any
    rank", every rank calling it) comes from the run's strategy (Lightning's, so torchrun, SLURM and
    ``devices × num_nodes`` all work); it is also the barrier between the steps, and it carries their
    failures (:func:`qgmem.ranks.raise_on_every_rank`): a rank whose step fails raises its error, every
    other rank :class:`~qgmem.ranks.OtherRankFailed`, and none waits for a rank that will not come.
    Every rank returns only after the dataset exists; rank 0 returns its summary.
    ``models`` (``encoder``, ``answerer``, ``judge``) are test stand-ins, as in :func:`build_cache`.
    """
    spec = as_spec(spec)
    need = rebuild or not C.DatasetCache(spec.dataset_dir).complete
    if not any_rank(need):
        return None
    error, summary = None, None
    try:
        if need:
            build_samples(spec, C.SampleCache(spec.samples_dir), encoder=models.get("encoder"), progress=progress,
                          shard=Shard(rank, world), processes=1)  # each rank is already one of the processes
    except Exception as exc:  # noqa: BLE001 -- raised below, on this rank and (as OtherRankFailed) on the others
        error = exc
    raise_on_every_rank(error, any_rank, "the sample cache's slices")  # the barrier before the merge
    try:
        if rank == 0 and need:
            summary = build_cache(spec, progress=progress, **models)
    except Exception as exc:  # noqa: BLE001
        error = exc
    raise_on_every_rank(error, any_rank, "the sample cache's merge on rank 0")
    return summary


def rebuild_damaged_shards(samples: C.SampleCache, count: int) -> list[dict[str, Any]]:
    """Remove the shards that fail their checksums (or, once complete, are missing) so they are built again.

    Returns what was found, for the completion record; each is also logged with the file and the cause.
    A shard merely not built yet (an interrupted build) is not damaged and not listed.
    """
    was_complete, rebuilt = samples.complete, []
    for index, why in samples.damaged_shards(count).items():
        if not samples.shard_dir(index).exists() and not was_complete:
            continue
        log.warning("cache shard %d is rebuilt: %s", index, why)
        samples.remove_shard(index)
        rebuilt.append({"shard": index, "reason": why})
    if rebuilt:
        samples.unmark_complete()
    return rebuilt


# --------------------------------------------------------------------------------------------------
# answers and the filter


def filter_samples(spec: CacheSpec, rows, *, answerer: Any = None, judge: Any = None, progress: bool = True
                   ) -> tuple[dict[str, list[dict[str, Any]]], FilterReport, dict[str, Any]]:
    """Answer (cached), judge and filter the training samples; pass validation and test through."""
    from tqdm.auto import tqdm

    spec = as_spec(spec)
    rule = spec.answer_filter
    report = FilterReport(rule)
    for category in sorted({r["category"] for r in rows} & RUBRIC_CATEGORIES):
        if rule != "llm":
            report.left_out_categories[category] = (
                "reference is a grading rubric and no LLM judge is configured (answer_filter="
                f"{rule!r}): left out of training; kept in val/test with the rubric as reference")
    all_rows = [dict(r) for r in rows]
    train = [r for r in all_rows if r["split"] == "train"]
    need = [r for r in train if rule != "none" and (rule == "llm" or r["category"] not in RUBRIC_CATEGORIES)]
    answer_info: dict[str, Any] = {"lm": spec.lm, "needed": len(need), "generated": 0, "reused": 0}
    answers: dict[str, str] = {}
    if need:
        answerer = answerer or spec.answerer()
        store = C.AnswerCache(spec.answers_dir, spec.answerer().settings)
        keys = [C.answer_key(r["memory_text"], r["question"]) for r in need]
        known = store.load()
        answer_info["damaged_chunks_dropped"] = len(store.dropped)
        missing = [(k, r) for k, r in dict(zip(keys, need)).items() if k not in known]
        answer_info["reused"] = len(set(keys)) - len(missing)
        t = time.perf_counter()
        chunk = max(1, spec.answer_batch_size) * 4  # persist every few batches so a killed build loses little
        bar = tqdm(total=len(missing), desc="cache: frozen-LM answers", unit="qa", disable=not progress or not missing)
        for start in range(0, len(missing), chunk):
            part = missing[start:start + chunk]
            texts = answerer.answer([(r["memory_text"], r["question"]) for _, r in part])
            store.add({k: text for (k, _), text in zip(part, texts)})
            bar.update(len(part))
        bar.close()
        answer_info["generated"] = len(missing)
        answer_info["generate_s"] = round(time.perf_counter() - t, 2)
        answers = {k: store.get(k) or "" for k in keys}
    verdicts: dict[str, bool] = {}
    judge = judge if judge is not None or rule == "none" else make_judge(rule, spec.judge, spec.match_rule)
    if judge is not None and need:
        items = [JudgeItem(r["question"], r["reference"], answers[C.answer_key(r["memory_text"], r["question"])],
                           r["category"]) for r in need]
        verdicts = {r["qa_id"]: v for r, v in zip(need, judge(items))}
        if getattr(judge, "failed", 0):  # an outage is not a verdict: never write it into the dataset
            from qgmem.errors import UserError

            where = getattr(spec.judge, "base_url", None) or getattr(spec.judge, "model", "the judge")
            raise UserError(f"answer filter: {judge.failed} of {len(items)} judge requests to {where} got no "
                            "reply; no dataset was written",
                            hint="check the judge's server, then run again: the frozen LM's answers and the "
                                 "judge's replies so far are cached, the cases' shards are kept")
        answer_info["judge"] = getattr(judge, "name", rule)
        if hasattr(judge, "unparsed"):
            answer_info["judge_unparsed"] = judge.unparsed
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in C.SPLITS}
    for r in all_rows:
        key = C.answer_key(r["memory_text"], r["question"])
        r["lm_answer"] = answers.get(key, "") if r["split"] == "train" else ""
        judged = r["qa_id"] in verdicts
        correct = bool(verdicts.get(r["qa_id"], False))
        if r["split"] != "train":
            r.update(answer=r["reference"], judged=False, correct=False)
            out[r["split"]].append(r)
            report.add(r["split"], r["category"], judged=False, correct=False, kept=True)
            continue
        decision = decide(r["category"], r["reference"], r["lm_answer"], correct if judged else None, rule)
        report.add("train", r["category"], judged=judged, correct=correct, kept=decision.keep)
        if decision.keep:
            r.update(answer=decision.target, judged=judged, correct=correct)
            out["train"].append(r)
    return out, report, answer_info


__all__ = ["CasesAhead", "Replayer", "Shard", "as_spec", "build_cache", "build_on_ranks", "build_samples", "count_categories",
           "filter_samples", "finish_cache", "plan_cases", "replay_case"]
