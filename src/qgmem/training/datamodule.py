"""``QGMemDataModule``: ask for the training cache, then serve its splits as collated batches.

What the cache holds and how it is built lives elsewhere: :mod:`qgmem.samples.spec` (settings,
keys, folders), :mod:`qgmem.samples.build` (plan, replay, answers, filter) and
:mod:`qgmem.samples.cache` (the on-disk format). ``prepare_data`` (Lightning calls it once per node,
on local rank 0) builds or reuses the cache; it writes files only and assigns no state, because under
DDP the other ranks never run it. Lightning then puts a barrier before ``setup``, which every rank runs
to load the splits. With one cache folder shared by several nodes (a network file system), set
``prepare_data_per_node=False`` so only global rank 0 builds.

:class:`InMemoryDataModule` serves in-memory contract items through the same loaders, for tests.
"""

from __future__ import annotations

import logging
from dataclasses import fields
from typing import Any, Callable, Literal, Sequence

import lightning as L
from torch.utils.data import DataLoader, Dataset

from qgmem.activation.answer_contract import AnswerContract
from qgmem.activation.config import ActivationConfig
from qgmem.embed import sentence_encoder_dim
from qgmem.errors import IntegrityError
from qgmem.lm import EMBEDDED_LM
from qgmem.llm.base import LLMConfig
from qgmem.memory.config import ConstructionConfig
from qgmem.model.graph_modes import GraphMode
from qgmem.prompting import PromptSettings
from qgmem.prompting.contract import check_budgets
from qgmem.samples import cache as C
from qgmem.samples import build as cache_build
from qgmem.samples.answer_filter import MatchRule
from qgmem.samples.build import build_cache, count_categories, plan_cases
from qgmem.samples.spec import DEFAULT_SENTENCE_ENCODER, CacheSpec
from qgmem.training.synthetic import synthetic_items

log = logging.getLogger(__name__)

#: what the data module answers from its cache spec (settings, keys, folders)
_SPEC_ATTRIBUTES = frozenset({f.name for f in fields(CacheSpec)} | {
    "samples_key", "answers_key", "cache_key", "samples_dir", "answers_dir", "dataset_dir",
    "sample_settings", "filter_settings", "answerer"})


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


class GraphTextDataModule(L.LightningDataModule):
    """Splits of contract items → batches through :class:`~qgmem.training.collate.GraphTextCollator`.

    Subclasses fill ``self._splits`` in ``setup``.
    """

    def __init__(self, *, lm: str, batch_size: int, eval_batch_size: int, num_workers: int,
                 max_prompt_tokens: int, max_answer_tokens: int, enable_thinking: bool = False, tokenizer=None,
                 memory_units: int | None = None, graph_mode: GraphMode | None = None):
        super().__init__()
        check_budgets(memory_units, None)
        self.memory_units = memory_units  # the prompt's text holds the top m units; the graph keeps all k
        self.graph_mode = graph_mode  # the answer contract's default mode (None: the module's training mode)
        self.lm = lm
        self.batch_size, self.eval_batch_size, self.num_workers = batch_size, eval_batch_size, num_workers
        self.max_prompt_tokens, self.max_answer_tokens = max_prompt_tokens, max_answer_tokens
        self.enable_thinking = enable_thinking
        self._tokenizer = tokenizer
        self._collator = None
        self._splits: dict[str, Dataset] = {}

    @property
    def prompt_settings(self) -> PromptSettings:
        """The run's one prompt contract: the collator, the answer filter, the model and the export use it."""
        return PromptSettings(max_prompt_tokens=self.max_prompt_tokens, max_answer_tokens=self.max_answer_tokens,
                              enable_thinking=self.enable_thinking, memory_units=self.memory_units)

    @property
    def answer_contract(self) -> AnswerContract:
        """What an answer of this run depends on (:class:`~qgmem.activation.answer_contract.AnswerContract`):
        the prompt with its text budget, the activation whose ``k`` units the graph is built over (the
        default's without one) and the default answer mode. The training module adopts it once per stage
        (``setup``) and writes it into every checkpoint; the export copies it from there."""
        return AnswerContract(self.prompt_settings, getattr(self, "activation", None) or ActivationConfig(),
                              self.graph_mode, names=("data.memory_units", "data.activation.k"))

    @property
    def order_seed(self) -> int:
        """Seed of the training order and of the alignment stage's order: the data ``seed`` (0 without one)."""
        return int(getattr(self, "seed", 0) or 0)

    def split(self, name: str) -> Dataset:
        if not self._splits:
            self.setup()
        return self._splits[name]

    def _set_splits(self, splits: dict[str, Any]) -> None:
        """Keep the loaded splits (a study's data module changes what a split reads here)."""
        self._splits = dict(splits)

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

            trainer = getattr(self, "trainer", None)  # this rank's share under DDP (Lightning keeps the sampler)
            replicas, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
            return ResumableDataLoader(self.split(name), batch_size=batch_size,
                                       sampler=EpochRandomSampler(self.split(name), self.order_seed,
                                                                  num_replicas=replicas, rank=rank),
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


class QGMemDataModule(GraphTextDataModule):
    """Training samples for the graph token: cached replay of construction + activation + answer filter.

    Defaults are the embedded setting (the real ConvoMem sample, parser extractor, MiniLM,
    SmolLM2-135M-Instruct, no answer filter, two distractor conversations per history); the ``default``
    preset adds only its CPU budget (a shorter prompt cap, two cache processes). The paper's setting
    (preset ``qwen3_8b``) raises ``num_cases`` to 1,200, swaps the models and filters with an LLM judge.
    ``answer_batch_size``, ``answer_max_new_tokens`` and ``answer_device`` control answer generation for the filter.
    ``data_fingerprint`` is ``content`` (hash file bytes) or ``stat`` (path, size, mtime; for huge
    local copies). ``rebuild=True`` discards this key's dataset folder (not its shards or answers).
    The cache settings, keys and folders are :attr:`cache_spec`'s, readable here by name too.

    Args:
        dataset: Data set the cases come from (``convomem``, ``locomo``, ``longmemeval``).
        data_path: Folder or file of that data set in its published form.
        num_cases: Cases sampled from it (``None`` = all).
        split_ratios: Train, validation and test fractions (summing to 1).
        group_key: What no two splits share: a ``person`` (falls back to ``dialogue`` when too few).
        seed: Seed of the case sampling and the split.
        distractor_conversations: Unrelated conversations of the same person added to each ConvoMem
            history (``None`` = the training caches' 2,
            :data:`qgmem.data.convomem_history.TRAINING_DISTRACTORS`; the loader's own default, 6, is
            what retrieval is measured on).
        construction: Offline memory construction settings (windows, extractor, traces).
        activation: Query-time activation settings (channels, pool, k, reranker).
        construction_llm: LLM backend of the ``llm`` extractor (``None`` = no LLM construction).
        construction_cases_in_flight: Cases whose LLM extraction runs at once during the cache build
            (``None`` = the server backend's ``max_concurrency``; ``1`` = one case after another). The
            backend's ``max_concurrency`` bounds their requests together; not part of the cache key.
        cache_processes: Worker processes that replay the cases of the cache build (each with its own
            models and ``cores / cache_processes`` threads; 1 = in this process, in plan order). Only
            without ``construction_llm``, and only in a one-process run (the ranks of a multi-process
            run each build their slice). Not part of the cache key: a new text's vector can differ in
            the last float32 bits with the batch it was first encoded in, nothing else.
        sentence_encoder: Frozen sentence encoder of node and edge features (id, folder or ``embedded:``).
        lm: Frozen LM whose tokenizer and answers the samples use (linked from ``model.lm``).
        answer_filter: Which training samples are kept: ``none`` (all with a reference answer; with
            SmolLM2-135M, ``match`` keeps only 3 of the 32 training questions of the embedded sample),
            ``match`` (the frozen LM answered correctly by the match rule) or ``llm`` (a judge says so).
        judge: LLM backend of the ``llm`` answer filter.
        match_min_tokens: Fewest tokens of a prediction contained in the reference that still matches.
        match_f1_threshold: Token F1 at or above which the match rule also accepts (``None`` = off).
        cache_dir: Folder of the replayed samples, answers and filtered splits.
        batch_size: Training batch size per process.
        eval_batch_size: Validation and test batch size per process.
        num_workers: DataLoader worker processes.
        max_prompt_tokens: Prompt length cap; the memory text is trimmed, never the question.
        max_answer_tokens: Answer length cap for the loss.
        enable_thinking: The chat template's thinking switch, set once for training and export.
        answer_batch_size: Batch size of the frozen LM answering training questions for the filter.
        answer_max_new_tokens: Length of those answers.
        answer_device: Device of that answering (``None`` = CUDA when available).
        strict: Stop at the first bad record or failed case; ``False`` skips and reports each.
        data_fingerprint: How the data files enter the cache key: ``content`` (hash the bytes) or
            ``stat`` (path, size, mtime; for huge local copies).
        rebuild: Discard this key's dataset folder and build it again (not its shards or answers).
        prepare_data_per_node: Build the cache once per node (``False``: once, on global rank 0, for a
            cache folder shared by every node).
        memory_units: The text budget ``m``: the prompt's text holds only the top ``m`` working-memory
            units (``None``: all ``k``) while the graph covers all ``k`` (``activation.k``, the graph
            budget); ``0 <= m <= k``. Part of the run's answer contract, which the model adopts and its
            checkpoints record, so the export records it and ``qgmem answer``, ``qgmem serve`` and
            ``qgmem eval-qa`` apply it; the cache is the same.
        graph_mode: The export's default answer mode, in the run's answer contract: ``token`` (the graph
            tokens) or ``none`` (the text prompt alone, the graph tokens one request field away);
            ``None`` = ``model.graph_mode``, the mode the model trains with. Not part of the cache key.
    """

    def __init__(
        self,
        dataset: str = "convomem",
        data_path: str = "data/convomem",
        num_cases: int | None = 60,
        split_ratios: tuple[float, float, float] = (0.7, 0.15, 0.15),
        group_key: Literal["person", "dialogue"] = "person",
        seed: int = 0,
        distractor_conversations: int | None = None,
        construction: ConstructionConfig | None = None,
        activation: ActivationConfig | None = None,
        construction_llm: LLMConfig | None = None,
        construction_cases_in_flight: int | None = None,
        cache_processes: int = 1,
        sentence_encoder: str = DEFAULT_SENTENCE_ENCODER,
        lm: str = EMBEDDED_LM,
        answer_filter: Literal["none", "match", "llm"] = "none",
        judge: LLMConfig | None = None,
        match_min_tokens: int = 2,
        match_f1_threshold: float | None = None,
        cache_dir: str = "data/cache",
        batch_size: int = 4,
        eval_batch_size: int = 8,
        num_workers: int = 0,
        max_prompt_tokens: int = PromptSettings.max_prompt_tokens,
        max_answer_tokens: int = PromptSettings.max_answer_tokens,
        enable_thinking: bool = False,
        answer_batch_size: int = 8,
        answer_max_new_tokens: int = 32,
        answer_device: str | None = None,
        strict: bool = True,
        data_fingerprint: Literal["content", "stat"] = "content",
        rebuild: bool = False,
        prepare_data_per_node: bool = True,
        memory_units: int | None = None,
        graph_mode: Literal["token", "none"] | None = None,
    ):
        activation = activation or ActivationConfig()
        self.cache_spec = CacheSpec(
            dataset=dataset, data_path=data_path, num_cases=num_cases, split_ratios=split_ratios,
            group_key=group_key, seed=seed, distractor_conversations=distractor_conversations,
            construction=construction or ConstructionConfig(), activation=activation,
            construction_llm=construction_llm, construction_cases_in_flight=construction_cases_in_flight,
            cache_processes=cache_processes,
            sentence_encoder=sentence_encoder, lm=lm,
            answer_filter=answer_filter, judge=judge,
            match_rule=MatchRule(min_tokens=match_min_tokens, f1_threshold=match_f1_threshold),
            cache_dir=cache_dir, prompt=PromptSettings(max_prompt_tokens=max_prompt_tokens,
                                                       max_answer_tokens=max_answer_tokens,
                                                       enable_thinking=enable_thinking),
            answer_batch_size=answer_batch_size,
            answer_max_new_tokens=answer_max_new_tokens, answer_device=answer_device, strict=strict,
            data_fingerprint=data_fingerprint)
        super().__init__(lm=lm, batch_size=batch_size, eval_batch_size=eval_batch_size, num_workers=num_workers,
                         max_prompt_tokens=max_prompt_tokens, max_answer_tokens=max_answer_tokens,
                         enable_thinking=enable_thinking, memory_units=memory_units, graph_mode=graph_mode)
        self.rebuild = rebuild
        self.prepare_data_per_node = prepare_data_per_node
        self._summary: dict[str, Any] | None = None
        _ = self.answer_contract  # made once here: a text budget above the graph's is refused before any build

    def __getattr__(self, name: str) -> Any:
        # only called for names not found normally: the cache settings, keys and folders
        if name in _SPEC_ATTRIBUTES and "cache_spec" in self.__dict__:
            return getattr(self.__dict__["cache_spec"], name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # ---- the cache ---------------------------------------------------------------------------------

    def prepare_data(self) -> None:
        """Build (or reuse, or resume) the cache for these settings. Writes files only; no state.

        In a run of several processes this does nothing: :meth:`setup` builds the cache with every
        rank taking its slice of the cases.
        """
        if self._cache_ranks() is not None:
            return
        final = C.DatasetCache(self.dataset_dir)
        if final.complete and not self.rebuild:
            try:
                final.verify()
                log.info("cache %s reused (%s)", self.cache_key, self.dataset_dir)
                return
            except IntegrityError as exc:  # its inputs (shards, answers) are at hand: rebuild it
                log.warning("cache dataset damaged, rebuilding it: %s", exc)
        cache_build.build_cache(self.cache_spec)

    def _cache_ranks(self) -> tuple[int, int] | None:
        """``(rank, world)`` of the processes sharing this cache folder, or None in a 1-process run.

        ``prepare_data_per_node`` keeps Lightning's meaning: True (node-local cache folders) shards
        the cases over the local ranks of each node, False (one shared folder) over all ranks.
        """
        trainer = self.trainer
        if trainer is None or trainer.world_size <= 1:
            return None
        if self.prepare_data_per_node:
            return trainer.local_rank, trainer.world_size // max(1, trainer.num_nodes)
        return trainer.global_rank, trainer.world_size

    def setup(self, stage: str | None = None) -> None:
        """Load the splits from the cache (every rank; after ``prepare_data`` and Lightning's barrier).

        In a run of several processes, the cache is built here first: each rank builds its slice,
        rank 0 (of the node, for node-local folders) merges and filters, and all ranks wait for it.
        """
        ranks = self._cache_ranks()
        if ranks is not None:
            strategy = self.trainer.strategy
            cache_build.build_on_ranks(self.cache_spec, *ranks, rebuild=self.rebuild,
                                       any_rank=lambda flag: strategy.reduce_boolean_decision(flag, all=False))
        final = C.DatasetCache(self.dataset_dir)
        if not final.complete:
            raise RuntimeError(f"no complete cache at {self.dataset_dir}: run prepare_data() first "
                               "(Lightning does, before setup)")
        splits = final.load()
        self._set_splits({name: QGMemDataset(splits[name]) for name in C.SPLITS})
        self._summary = final.summary()
        if stage == "fit" and len(self._splits["train"]) == 0:
            raise RuntimeError(f"the training split is empty after answer filtering ({self.answer_filter!r}); "
                               f"see {self.dataset_dir / 'summary.json'}")

    @property
    def summary(self) -> dict[str, Any]:
        """Counts per split and category, the filtering outcome, skips and left-out categories."""
        if self._summary is None:
            final = C.DatasetCache(self.dataset_dir)
            if not final.complete:
                raise RuntimeError("no summary yet: the cache is built by prepare_data()")
            self._summary = final.summary()
        return self._summary

    @classmethod
    def from_items(cls, train_items: Sequence[dict[str, Any]], val_items: Sequence[dict[str, Any]] = (),
                   test_items: Sequence[dict[str, Any]] = (), **kwargs: Any) -> InMemoryDataModule:
        """An :class:`InMemoryDataModule` over these items (same arguments)."""
        return InMemoryDataModule(train_items, val_items, test_items, **kwargs)


class InMemoryDataModule(GraphTextDataModule):
    """A data module over in-memory contract items: no data files, no memory building, no cache.

    ``feature_dim`` defaults to the first item's node-feature width. ``tokenizer`` defaults to
    ``lm``'s tokenizer (loaded on first use).
    """

    #: what an export records about the data side: nothing was built, nothing was filtered
    dataset = sentence_encoder = cache_key = None
    answer_filter = "none"

    def __init__(self, train_items: Sequence[dict[str, Any]], val_items: Sequence[dict[str, Any]] = (),
                 test_items: Sequence[dict[str, Any]] = (), *, tokenizer=None, lm: str = EMBEDDED_LM,
                 batch_size: int = 4, eval_batch_size: int | None = None,
                 max_prompt_tokens: int = PromptSettings.max_prompt_tokens,
                 max_answer_tokens: int = PromptSettings.max_answer_tokens, feature_dim: int | None = None,
                 memory_units: int | None = PromptSettings.memory_units,
                 graph_mode: Literal["token", "none"] | None = None):
        super().__init__(lm=lm, batch_size=batch_size, eval_batch_size=eval_batch_size or batch_size, num_workers=0,
                         max_prompt_tokens=max_prompt_tokens, max_answer_tokens=max_answer_tokens, tokenizer=tokenizer,
                         memory_units=memory_units, graph_mode=graph_mode)
        self.items = {"train": list(train_items), "val": list(val_items), "test": list(test_items)}
        first = next((it for split in self.items.values() for it in split), None)
        if feature_dim is None and first is None:
            raise ValueError("no items to read the feature width from: pass feature_dim")
        self.feature_dim = int(feature_dim if feature_dim is not None else first["graph"].x.shape[1])
        self._set_splits(self.items)

    def setup(self, stage: str | None = None) -> None:
        self._set_splits(self.items)

    @property
    def summary(self) -> dict[str, Any]:
        return {"cache_key": None, "source": "from_items",
                "samples": {k: count_categories(v) for k, v in self.items.items()}}


__all__ = ["GraphTextDataModule", "InMemoryDataModule", "QGMemDataModule", "QGMemDataset",
           # built and kept elsewhere, importable from here as before
           "build_cache", "plan_cases", "sentence_encoder_dim", "synthetic_items", "DEFAULT_SENTENCE_ENCODER"]
