"""``QGMemDataModule``: replay construction and activation once into a cache, then serve batches.

``prepare_data`` (Lightning calls it once per node, on local rank 0) loads the configured cases,
samples and splits them, replays offline construction and query-time activation for every QA, answers
the training QAs with the frozen LM and filters them (see :mod:`qgmem.training.answer_filter`), and
writes everything to the cache (:mod:`qgmem.training.cache`). It writes files only and assigns no state,
because under DDP the other ranks never run it. Lightning then puts a barrier before ``setup``, which
every rank runs to load the splits from the cache: other ranks wait for rank 0's build instead of
building themselves. With one cache folder shared by several nodes (a network file system), set
``prepare_data_per_node=False`` so only global rank 0 builds.
"""

from __future__ import annotations

import json
import logging
import time
import warnings
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from qgmem.activation.config import ActivationConfig
from qgmem.lm import EMBEDDED_LM
from qgmem.llm.base import LLMConfig
from qgmem.memory.config import ConstructionConfig
from qgmem.prompting import GRAPH_ONLY_SYSTEM_PROMPT, PromptSettings
from qgmem.training import cache as C
from qgmem.training.answer_filter import (RUBRIC_CATEGORIES, RULES, FilterReport, JudgeItem, LMAnswerer, MatchRule,
                                          decide, make_judge)

log = logging.getLogger(__name__)

DEFAULT_SENTENCE_ENCODER = "embedded:all-MiniLM-L6-v2"


# --------------------------------------------------------------------------------------------------
# datasets


class QGMemDataset(Dataset):
    """A split read from the cache: Arrow rows (memory-mapped) turned into contract items on access."""

    def __init__(self, rows):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return C.row_to_item(self.rows[int(index)])

    def row(self, index: int) -> dict[str, Any]:
        """The full cached row (ids, node/edge texts, the LM's answer, the verdict)."""
        return self.rows[int(index)]


def synthetic_items(n: int, feature_dim: int = 8, *, seed: int = 0, max_nodes: int = 5,
                    categories: Sequence[str] = ("user_evidence", "changing_evidence")) -> list[dict[str, Any]]:
    """Random contract items (graph + texts) for model-side tests that must not build memory."""
    from torch_geometric.data import Data

    gen = torch.Generator().manual_seed(seed)
    fact_gen = torch.Generator().manual_seed(seed + 7919)  # its own stream: the graphs do not depend on it
    items = []
    for i in range(n):
        nodes = int(torch.randint(1, max_nodes + 1, (1,), generator=gen))
        edges = int(torch.randint(0, 2 * nodes, (1,), generator=gen))
        graph = Data(x=torch.randn(nodes, feature_dim, generator=gen),
                     edge_index=torch.randint(0, nodes, (2, edges), generator=gen),
                     edge_attr=torch.randn(edges, feature_dim, generator=gen),
                     edge_fact=torch.randn(edges, feature_dim, generator=fact_gen))
        color = ["green", "blue", "red", "amber"][i % 4]
        items.append({"graph": graph, "memory_text": f"[M1] The user marks hot leads {color} in the spreadsheet.",
                      "question": "Which color marks hot leads?", "answer": color.capitalize(),
                      "category": categories[i % len(categories)], "qa_id": f"synthetic#{i}"})
    return items


# --------------------------------------------------------------------------------------------------
# the data module


class QGMemDataModule(L.LightningDataModule):
    """Training samples for the graph token: cached replay of construction + activation + answer filter.

    Defaults are the embedded setting (the real ConvoMem sample, heuristic extractor, MiniLM,
    SmolLM2-135M-Instruct, ``match`` filter) sized to build in a few minutes on a 2-core CPU; the
    paper's setting raises ``num_cases`` to 1,200 and swaps the models. ``answer_batch_size``,
    ``answer_max_new_tokens`` and ``answer_device`` control answer generation for the filter.
    ``data_fingerprint`` is ``content`` (hash file bytes) or ``stat`` (path, size, mtime; for huge
    local copies). ``rebuild=True`` discards this key's dataset folder (not its shards or answers).
    ``graph_only=True`` leaves the textual working memory out of the prompts (the question alone, under
    ``GRAPH_ONLY_SYSTEM_PROMPT``), so the graph token is the only evidence; the cache is the same.
    """

    def __init__(
        self,
        dataset: str = "convomem",
        data_path: str = "data/convomem",
        num_cases: int | None = 60,
        split_ratios: tuple[float, float, float] = (0.7, 0.15, 0.15),
        group_key: Literal["person", "dialogue"] = "person",
        seed: int = 0,
        distractor_conversations: int | None = 2,
        construction: ConstructionConfig | None = None,
        activation: ActivationConfig | None = None,
        construction_llm: LLMConfig | None = None,
        sentence_encoder: str = DEFAULT_SENTENCE_ENCODER,
        lm: str = EMBEDDED_LM,
        answer_filter: Literal["none", "match", "llm"] = "match",
        judge: LLMConfig | None = None,
        match_min_tokens: int = 2,
        match_f1_threshold: float | None = None,
        cache_dir: str = "data/cache",
        batch_size: int = 4,
        eval_batch_size: int = 8,
        num_workers: int = 0,
        max_prompt_tokens: int = 320,
        max_answer_tokens: int = 48,
        enable_thinking: bool = False,
        answer_batch_size: int = 8,
        answer_max_new_tokens: int = 32,
        answer_device: str | None = None,
        strict: bool = True,
        data_fingerprint: Literal["content", "stat"] = "content",
        rebuild: bool = False,
        prepare_data_per_node: bool = True,
        graph_only: bool = False,
    ):
        super().__init__()
        if answer_filter not in RULES:
            raise ValueError(f"answer_filter must be one of {RULES}, got {answer_filter!r}")
        if answer_filter == "llm" and judge is None:
            raise ValueError("answer_filter='llm' needs judge: LLMConfig(...) (the shared LLM backend settings)")
        if len(split_ratios) != 3 or any(r < 0 for r in split_ratios) or abs(sum(split_ratios) - 1.0) > 1e-6:
            raise ValueError(f"split_ratios must be three non-negative numbers summing to 1, got {split_ratios}")
        if num_cases is not None and num_cases < 1:
            raise ValueError(f"num_cases must be >= 1 or None (all cases), got {num_cases}")
        self.dataset, self.data_path = dataset, data_path
        self.num_cases, self.split_ratios = num_cases, tuple(float(r) for r in split_ratios)
        self.group_key, self.seed = group_key, seed
        self.distractor_conversations = _resolve_distractors(dataset, distractor_conversations)
        self.construction = construction or ConstructionConfig()
        self.activation = activation or ActivationConfig()
        self.construction_llm, self.sentence_encoder, self.lm = construction_llm, sentence_encoder, lm
        self.answer_filter, self.judge = answer_filter, judge
        self.match_rule = MatchRule(min_tokens=match_min_tokens, f1_threshold=match_f1_threshold)
        self.cache_dir = Path(cache_dir)
        self.batch_size, self.eval_batch_size, self.num_workers = batch_size, eval_batch_size, num_workers
        self.max_prompt_tokens, self.max_answer_tokens = max_prompt_tokens, max_answer_tokens
        self.enable_thinking = enable_thinking
        self.answer_batch_size, self.answer_max_new_tokens = answer_batch_size, answer_max_new_tokens
        self.answer_device, self.strict, self.rebuild = answer_device, strict, rebuild
        self.data_fingerprint = data_fingerprint
        self.prepare_data_per_node = prepare_data_per_node
        self.graph_only = graph_only
        self.feature_dim = sentence_encoder_dim(sentence_encoder)
        self._items: dict[str, Any] | None = None  # from_items
        self._tokenizer = None
        self._collator = None
        self._splits: dict[str, Dataset] = {}
        self._summary: dict[str, Any] | None = None
        # Keys are computed here (cheap: hashing the sample's files takes milliseconds) so that every
        # rank knows them and ``prepare_data`` need not assign anything.
        self.samples_key = C.stable_hash(self.sample_settings())
        self.answers_key = C.stable_hash(self.answerer().settings)
        self.cache_key = C.stable_hash({"samples": self.samples_key, **self.filter_settings()})

    # ---- settings that make up the keys -----------------------------------------------------------

    def sample_settings(self) -> dict[str, Any]:
        """Everything the cached samples depend on (data, sampling, splits, construction, activation, encoder)."""
        llm = None if self.construction_llm is None else {
            k: v for k, v in asdict(self.construction_llm).items() if k in ("backend", "model", "dtype", "extra_body")}
        return {
            "format": C.CACHE_FORMAT_VERSION, "dataset": self.dataset,
            "data": C.fingerprint_data(self.data_path, self.data_fingerprint),
            "num_cases": self.num_cases, "split_ratios": self.split_ratios, "group_key": self.group_key,
            "seed": self.seed, "distractor_conversations": self.distractor_conversations, "strict": self.strict,
            "construction": asdict(self.construction), "activation": asdict(self.activation),
            "construction_llm": llm, "sentence_encoder": self.sentence_encoder,
            "store_format": _store_format_version(),
        }

    def filter_settings(self) -> dict[str, Any]:
        """What the filtered splits add on top of the samples (the rule, the answers' LM, the judge)."""
        judge = None if self.judge is None else {
            k: v for k, v in asdict(self.judge).items() if k in ("backend", "model", "dtype", "extra_body")}
        return {"format": C.CACHE_FORMAT_VERSION, "answer_filter": self.answer_filter,
                "answers": self.answers_key if self.answer_filter != "none" else None,
                "judge": judge if self.answer_filter == "llm" else None,
                "match": asdict(self.match_rule) if self.answer_filter == "match" else None}

    @property
    def prompt_settings(self) -> PromptSettings:
        """The run's one prompt contract: the collator, the answer filter, the model and the export use it."""
        graph_only = getattr(self, "graph_only", False)
        extra = {"include_memory_text": False, "system_prompt": GRAPH_ONLY_SYSTEM_PROMPT} if graph_only else {}
        return PromptSettings(max_prompt_tokens=self.max_prompt_tokens, max_answer_tokens=self.max_answer_tokens,
                              enable_thinking=self.enable_thinking, **extra)

    def answerer(self) -> LMAnswerer:
        return LMAnswerer(self.lm, prompt=self.prompt_settings, batch_size=self.answer_batch_size,
                          max_new_tokens=self.answer_max_new_tokens, device=self.answer_device)

    @property
    def samples_dir(self) -> Path:
        return self.cache_dir / f"samples-{self.samples_key}"

    @property
    def answers_dir(self) -> Path:
        return self.cache_dir / f"answers-{self.answers_key}"

    @property
    def dataset_dir(self) -> Path:
        return self.cache_dir / f"dataset-{self.cache_key}"

    # ---- building ----------------------------------------------------------------------------------

    def prepare_data(self) -> None:
        """Build (or reuse, or resume) the cache for these settings. Writes files only; no state."""
        if self._items is not None:
            return
        final = C.DatasetCache(self.dataset_dir)
        if final.complete and not self.rebuild:
            log.info("cache %s reused (%s)", self.cache_key, self.dataset_dir)
            return
        build_cache(self)

    def setup(self, stage: str | None = None) -> None:
        """Load the splits from the cache (every rank; after ``prepare_data`` and Lightning's barrier)."""
        if self._items is not None:
            self._splits = {k: v for k, v in self._items.items()}
            return
        final = C.DatasetCache(self.dataset_dir)
        if not final.complete:
            raise RuntimeError(f"no complete cache at {self.dataset_dir}: run prepare_data() first "
                               "(Lightning does, before setup)")
        splits = final.load()
        self._splits = {name: QGMemDataset(splits[name]) for name in C.SPLITS}
        self._summary = final.summary()
        if stage == "fit" and len(self._splits["train"]) == 0:
            raise RuntimeError(f"the training split is empty after answer filtering ({self.answer_filter!r}); "
                               f"see {self.dataset_dir / 'summary.json'}")

    @property
    def summary(self) -> dict[str, Any]:
        """Counts per split and category, the filtering outcome, skips and left-out categories."""
        if self._items is not None:
            return {"cache_key": None, "source": "from_items",
                    "samples": {k: _count_categories(v) for k, v in self._items.items()}}
        if self._summary is None:
            final = C.DatasetCache(self.dataset_dir)
            if not final.complete:
                raise RuntimeError("no summary yet: the cache is built by prepare_data()")
            self._summary = final.summary()
        return self._summary

    def split(self, name: str) -> Dataset:
        if not self._splits:
            self.setup()
        return self._splits[name]

    # ---- batches -----------------------------------------------------------------------------------

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from qgmem.lm import load_tokenizer

            self._tokenizer = load_tokenizer(self.lm)
        return self._tokenizer

    @property
    def collator(self) -> Callable[[list[dict[str, Any]]], dict[str, Any]]:
        if self._collator is None:
            from qgmem.training.collate import GraphTextCollator

            self._collator = GraphTextCollator(self.tokenizer, self.prompt_settings)
        return self._collator

    def _loader(self, name: str, batch_size: int, shuffle: bool) -> DataLoader:
        if shuffle:  # the train loader: an order fixed by (seed, epoch) and a position saved in checkpoints
            from qgmem.training.resume import EpochRandomSampler, ResumableDataLoader

            return ResumableDataLoader(self.split(name), batch_size=batch_size,
                                       sampler=EpochRandomSampler(self.split(name), getattr(self, "seed", 0)),
                                       num_workers=self.num_workers, collate_fn=self.collator,
                                       persistent_workers=self.num_workers > 0)
        return DataLoader(self.split(name), batch_size=batch_size, shuffle=False, num_workers=self.num_workers,
                          collate_fn=self.collator, persistent_workers=self.num_workers > 0)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", self.eval_batch_size, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", self.eval_batch_size, shuffle=False)

    # ---- a tiny module for tests -------------------------------------------------------------------

    @classmethod
    def from_items(cls, train_items: Sequence[dict[str, Any]], val_items: Sequence[dict[str, Any]] = (),
                   test_items: Sequence[dict[str, Any]] = (), *, tokenizer=None, lm: str = EMBEDDED_LM,
                   batch_size: int = 2, eval_batch_size: int | None = None, max_prompt_tokens: int = 256,
                   max_answer_tokens: int = 32, feature_dim: int | None = None,
                   graph_only: bool = False) -> QGMemDataModule:
        """A data module over in-memory contract items: no data files, no memory building, no cache.

        ``feature_dim`` defaults to the first item's node-feature width. ``tokenizer`` defaults to
        ``lm``'s tokenizer (loaded on first use).
        """
        module = cls.__new__(cls)
        L.LightningDataModule.__init__(module)
        items = {"train": list(train_items), "val": list(val_items), "test": list(test_items)}
        first = next((it for split in items.values() for it in split), None)
        module._items = items
        module.feature_dim = int(feature_dim if feature_dim is not None else first["graph"].x.shape[1])
        module.lm, module._tokenizer, module._collator = lm, tokenizer, None
        module.batch_size, module.eval_batch_size = batch_size, eval_batch_size or batch_size
        module.num_workers, module.max_prompt_tokens, module.max_answer_tokens = 0, max_prompt_tokens, max_answer_tokens
        module.enable_thinking = False
        module._splits, module._summary, module.cache_key = dict(items), None, None
        module.sentence_encoder, module.answer_filter = None, "none"
        module.graph_only = graph_only
        return module


# --------------------------------------------------------------------------------------------------
# the build (rank 0)


def build_cache(dm: QGMemDataModule, *, encoder: Any = None, answerer: Any = None, judge: Any = None,
                progress: bool = True) -> dict[str, Any]:
    """Build the three cache parts for ``dm``'s settings, reusing whatever is already on disk.

    ``encoder`` (anything with ``dim`` and ``encode``), ``answerer`` (anything with ``answer(pairs)``)
    and ``judge`` (a :class:`~qgmem.training.answer_filter.Judge`) replace the configured sentence
    encoder, frozen LM and judge, for tests that must not load real models or reach a server; the
    cache keys still name the configured ones. An interrupted build (an exception, Ctrl-C, a killed
    job) leaves whole case shards and answer chunks behind; calling this again continues from there.
    Returns the summary (also written to ``dataset-<key>/summary.json``).
    """
    timings: dict[str, float] = {}
    started = time.perf_counter()
    samples = C.SampleCache(dm.samples_dir)
    build_samples(dm, samples, encoder=encoder, progress=progress)
    timings["samples_s"] = round(time.perf_counter() - started, 2)
    t = time.perf_counter()
    rows = samples.load()
    splits, report, answer_info = filter_samples(dm, rows, answerer=answerer, judge=judge, progress=progress)
    timings["answers_and_filter_s"] = round(time.perf_counter() - t, 2)
    summary = {
        "cache_key": dm.cache_key, "samples_key": dm.samples_key, "dataset_dir": str(dm.dataset_dir),
        "settings": {**dm.sample_settings(), **dm.filter_settings(), "lm": dm.lm},
        **samples.completion_info(),
        "samples": {name: _count_categories(rows_) for name, rows_ in splits.items()},
        "filter": report.to_dict(), "answers": answer_info,
        "left_out_categories": report.left_out_categories,
        "seconds": {**samples.completion_info().get("seconds", {}), **timings},
    }
    C.DatasetCache(dm.dataset_dir).save(splits, summary)
    return summary


def _count_categories(rows: Sequence[dict[str, Any]]) -> dict[str, int]:
    return dict(sorted(Counter(str(r.get("category", "")) for r in rows).items()))


def _store_format_version() -> Any:
    """The memory store's code version: a change in construction output invalidates cached samples."""
    from qgmem.memory import store

    return getattr(store, "STORE_FORMAT_VERSION", None)


def _resolve_distractors(dataset: str, value: int | None) -> int | None:
    if value is None and dataset == "convomem":
        from qgmem.data.history import DEFAULT_DISTRACTORS

        return int(DEFAULT_DISTRACTORS)
    return value


def plan_cases(dm: QGMemDataModule) -> tuple[list[tuple[str, Any]], dict[str, Any]]:
    """Load, sample and split the cases: ``[(split, case)]`` in train/val/test order, and what happened.

    A split that had to fall back from person to dialogue grouping (too few persons, as in the
    one-persona sample) says so: the warning text is kept in the summary.
    """
    from qgmem.data.loaders import load_cases
    from qgmem.data.splits import sample_cases, split_cases

    options: dict[str, Any] = {}
    if dm.distractor_conversations is not None:
        options["distractor_conversations"] = dm.distractor_conversations
    if dm.dataset == "convomem":
        options["seed"] = dm.seed
    loaded = load_cases(dm.dataset, dm.data_path, strict=dm.strict, **options)
    cases = list(loaded.cases)
    chosen = sample_cases(cases, dm.num_cases, dm.seed) if dm.num_cases is not None else cases
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parts = split_cases(chosen, dm.split_ratios, dm.seed, dm.group_key)
    split_warnings = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    plan = [(name, case) for name in C.SPLITS for case in parts.get(name, [])]
    shared, used = _shared_groups(parts, dm.group_key), dm.group_key
    if shared:  # the splitter fell back to dialogue grouping (it warned; the warning is in the summary)
        used, shared = "dialogue", _shared_groups(parts, "dialogue")
    groups = {name: len({_group(case, used) for case in parts.get(name, [])}) for name in C.SPLITS}
    info = {
        "cases": {"loaded": len(cases), "sampled": len(chosen), **{n: len(parts.get(n, [])) for n in C.SPLITS}},
        "qas": {n: sum(len(c.qas) for c in parts.get(n, [])) for n in C.SPLITS},
        "split": {"group_key": dm.group_key, "group_key_used": used, "groups": groups,
                  "groups_shared_across_splits": shared, "warnings": split_warnings},
        "load_report": _jsonable(getattr(loaded, "report", {})),
    }
    return plan, info


def _shared_groups(parts: dict[str, list[Any]], key: str) -> int:
    """How many groups (under ``key``) occur in more than one split."""
    seen: Counter[str] = Counter()
    for name in C.SPLITS:
        seen.update({_group(case, key) for case in parts.get(name, [])})
    return sum(1 for n in seen.values() if n > 1)


def _group(case: Any, key: str) -> str:
    try:
        return case.group_key(key)
    except KeyError:
        return case.group_key("dialogue")


def _jsonable(obj: Any) -> Any:
    if hasattr(obj, "summary") and callable(obj.summary):
        obj = obj.summary()
    return json.loads(json.dumps(obj, default=str))


class _Replayer:
    """Construction + activation for one case at a time, with the models loaded once."""

    def __init__(self, dm: QGMemDataModule, encoder: Any = None):
        from qgmem.embed import SentenceEncoder
        from qgmem.memory.builder import MemoryBuilder

        self.dm = dm
        self.encoder = encoder or SentenceEncoder(
            None if dm.sentence_encoder == DEFAULT_SENTENCE_ENCODER else dm.sentence_encoder)
        if self.encoder.dim != dm.feature_dim:
            raise RuntimeError(f"sentence encoder {dm.sentence_encoder!r} embeds in {self.encoder.dim} dims, but its "
                               f"config says {dm.feature_dim}")
        self.llm = None
        if dm.construction_llm is not None:
            from qgmem.llm.backends import make_backend

            self.llm = make_backend(dm.construction_llm)
        self.builder = MemoryBuilder(dm.construction, self.encoder, llm=self.llm)
        self.reranker = None
        if dm.activation.reranker != "embedding":  # a model reranker loads once, not once per dialogue
            import numpy as np

            from qgmem.activation.rerank import make_reranker

            a = dm.activation
            self.reranker = make_reranker(a.reranker, embeddings=np.zeros((0, self.encoder.dim), np.float32),
                                          path=a.reranker_path, batch_size=a.reranker_batch_size,
                                          max_doc_tokens=a.reranker_max_doc_tokens)

    def rows(self, split: str, case: Any) -> list[dict[str, Any]]:
        from qgmem.activation.activator import Activator
        from qgmem.activation.graph import graph_to_data

        dm = self.dm
        store = self.builder.build(case.dialogue)
        activator = Activator(store, self.encoder, dm.activation, reranker=self.reranker, llm=self.llm)
        group = _group(case, dm.group_key)
        rows = []
        for qa in case.qas:
            # LoCoMo questions carry no time of their own: the last session's date stands in for it
            memory = activator.activate(qa.question, qa.question_time or qa.meta.get("reference_time"))
            data = graph_to_data(memory.graph, self.encoder, facts=[u.fact for u in memory.units])
            rows.append(C.sample_row(
                qa_id=qa.id, case_id=case.id, dialogue_id=case.dialogue.id, group=group, split=split,
                category=qa.category, question=qa.question, question_time=qa.question_time, reference=qa.answer,
                memory_text=memory.text, graph=data, feature_dim=self.encoder.dim,
                node_text=getattr(data, "node_text", memory.graph.node_text),
                edge_text=getattr(data, "edge_text", memory.graph.edge_text),
                edge_unit=memory.graph.edge_unit))
        return rows


def build_samples(dm: QGMemDataModule, samples: C.SampleCache, *, encoder: Any = None,
                  progress: bool = True) -> dict[str, Any]:
    """Write one shard per planned case that has none yet; mark the samples complete when all exist."""
    from tqdm.auto import tqdm

    if samples.complete:
        return samples.completion_info()
    t0 = time.perf_counter()
    plan, info = plan_cases(dm)
    samples.start(dm.sample_settings(), [{"split": s, "case_id": c.id} for s, c in plan])
    todo = [i for i in range(len(plan)) if not samples.has_shard(i)]
    replayer = _Replayer(dm, encoder) if todo else None
    built = 0
    bar = tqdm(total=len(plan), initial=len(plan) - len(todo), desc="cache: cases", unit="case", disable=not progress)
    for index in todo:
        split, case = plan[index]
        meta: dict[str, Any] = {"case_id": case.id, "split": split, "qas": len(case.qas)}
        try:
            rows = replayer.rows(split, case)
        except Exception as exc:  # noqa: BLE001 - lenient mode records the case as skipped
            if dm.strict:
                raise RuntimeError(f"case {index} ({case.id!r}, split {split}): construction/activation failed: "
                                   f"{type(exc).__name__}: {exc}") from exc
            rows, meta["skipped"] = [], f"{type(exc).__name__}: {exc}"
        samples.write_shard(index, rows, meta)
        built += 1
        bar.update(1)
    bar.close()
    skipped = [samples.shard_meta(i) for i in range(len(plan))]
    skipped = [{"case_id": m["case_id"], "split": m["split"], "reason": m["skipped"]} for m in skipped if "skipped" in m]
    done = {**info, "skipped_cases": skipped,
            "seconds": {"replay_s": round(time.perf_counter() - t0, 2), "cases_built_this_run": built}}
    samples.mark_complete(done)
    return done


def filter_samples(dm: QGMemDataModule, rows, *, answerer: Any = None, judge: Any = None, progress: bool = True
                   ) -> tuple[dict[str, list[dict[str, Any]]], FilterReport, dict[str, Any]]:
    """Answer (cached), judge and filter the training samples; pass validation and test through."""
    from tqdm.auto import tqdm

    rule = dm.answer_filter
    report = FilterReport(rule)
    for category in sorted({r["category"] for r in rows} & RUBRIC_CATEGORIES):
        if rule != "llm":
            report.left_out_categories[category] = (
                "reference is a grading rubric and no LLM judge is configured (answer_filter="
                f"{rule!r}): left out of training; kept in val/test with the rubric as reference")
    all_rows = [dict(r) for r in rows]
    train = [r for r in all_rows if r["split"] == "train"]
    need = [r for r in train if rule != "none" and (rule == "llm" or r["category"] not in RUBRIC_CATEGORIES)]
    answer_info: dict[str, Any] = {"lm": dm.lm, "needed": len(need), "generated": 0, "reused": 0}
    answers: dict[str, str] = {}
    if need:
        answerer = answerer or dm.answerer()
        store = C.AnswerCache(dm.answers_dir, dm.answerer().settings)
        keys = [C.answer_key(r["memory_text"], r["question"]) for r in need]
        known = store.load()
        missing = [(k, r) for k, r in dict(zip(keys, need)).items() if k not in known]
        answer_info["reused"] = len(set(keys)) - len(missing)
        t = time.perf_counter()
        chunk = max(1, dm.answer_batch_size) * 4  # persist every few batches so a killed build loses little
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
    judge = judge if judge is not None or rule == "none" else make_judge(rule, dm.judge, dm.match_rule)
    if judge is not None and need:
        items = [JudgeItem(r["question"], r["reference"], answers[C.answer_key(r["memory_text"], r["question"])],
                           r["category"]) for r in need]
        verdicts = {r["qa_id"]: v for r, v in zip(need, judge(items))}
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


# --------------------------------------------------------------------------------------------------
# the encoder's dimension without loading it


def sentence_encoder_dim(name_or_path: str | None) -> int:
    """The sentence encoder's output dimension, read from its folder's config (no model load).

    A sentence-transformers folder ends in a Pooling module (``word_embedding_dimension``), possibly
    followed by a Dense projection (``out_features``). Falls back to loading the model for a hub id.
    """
    from qgmem.embed import resolve_encoder_path

    path = Path(resolve_encoder_path(None if name_or_path == DEFAULT_SENTENCE_ENCODER else name_or_path))
    if path.is_dir():
        dim = _dim_from_folder(path)
        if dim is not None:
            return dim
    from qgmem.embed import SentenceEncoder

    return int(SentenceEncoder(str(path)).dim)


def _dim_from_folder(path: Path) -> int | None:
    modules_file = path / "modules.json"
    dim = None
    if modules_file.exists():
        for module in json.loads(modules_file.read_text()):
            config = path / module.get("path", "") / "config.json"
            if not module.get("path") or not config.exists():
                continue
            cfg = json.loads(config.read_text())
            kind = module.get("type", "")
            if kind.endswith("Pooling") and "word_embedding_dimension" in cfg:
                dim = int(cfg["word_embedding_dimension"])
            elif kind.endswith("Dense") and "out_features" in cfg:
                dim = int(cfg["out_features"])
    if dim is None and (path / "config.json").exists():
        cfg = json.loads((path / "config.json").read_text())
        dim = cfg.get("hidden_size") or cfg.get("d_model")
    return int(dim) if dim else None


__all__ = ["QGMemDataModule", "QGMemDataset", "build_cache", "plan_cases", "sentence_encoder_dim", "synthetic_items"]
