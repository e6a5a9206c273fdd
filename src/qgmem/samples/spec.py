"""What a training cache is built from: typed settings, the keys they hash to, and the folders they name.

The data module, the standalone ``qgmem build-cache`` command and every rank of a sharded build make the
same :class:`CacheSpec` from the same settings, so they all agree on the keys (and so on the folders)
without talking to each other. Keys are computed once, on construction: hashing the sample's files
takes milliseconds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from qgmem.activation.config import ActivationConfig
from qgmem.embed import DEFAULT_ENCODER, sentence_encoder_dim
from qgmem.lm import EMBEDDED_LM
from qgmem.llm.backends import SERVER_BACKENDS
from qgmem.llm.base import LLMConfig
from qgmem.memory.config import ConstructionConfig
from qgmem.prompting import PromptSettings
from qgmem.samples import cache as C
from qgmem.samples.answer_filter import RULES, LMAnswerer, MatchRule

DEFAULT_SENTENCE_ENCODER = DEFAULT_ENCODER

#: LLM settings that change what a backend answers (not where it runs or how fast)
_LLM_KEY_FIELDS = ("backend", "model", "dtype", "extra_body")


@dataclass
class CacheSpec:
    """Settings of one cache: data, sampling, splits, construction, activation, encoder, answers, filter."""

    dataset: str = "convomem"
    data_path: str = "data/convomem"
    num_cases: int | None = 60
    split_ratios: tuple[float, float, float] = (0.7, 0.15, 0.15)
    group_key: Literal["person", "dialogue"] = "person"
    seed: int = 0
    #: ConvoMem distractor conversations per history (``None``: the training caches' number,
    #: :data:`qgmem.data.convomem_history.TRAINING_DISTRACTORS`); resolved before it enters the key
    distractor_conversations: int | None = None
    construction: ConstructionConfig = field(default_factory=ConstructionConfig)
    activation: ActivationConfig = field(default_factory=ActivationConfig)
    construction_llm: LLMConfig | None = None
    #: cases whose LLM extraction runs at once (``None``: the server backend's ``max_concurrency``; 1 =
    #: one case after another); how the build runs, not what it builds, so it is in no key
    construction_cases_in_flight: int | None = None
    #: worker processes that replay the cases of a heuristic build (1 = in this process, in plan
    #: order); how the build runs, not what it builds, so it is in no key
    cache_processes: int = 1
    sentence_encoder: str = DEFAULT_SENTENCE_ENCODER
    lm: str = EMBEDDED_LM
    answer_filter: Literal["none", "match", "llm"] = "none"
    judge: LLMConfig | None = None
    match_rule: MatchRule = field(default_factory=MatchRule)
    cache_dir: Path = Path("data/cache")
    #: the run's prompt contract: the filter answers on exactly the prompt the model trains on
    prompt: PromptSettings = field(default_factory=PromptSettings)
    answer_batch_size: int = 8
    answer_max_new_tokens: int = 32
    answer_device: str | None = None
    strict: bool = True
    data_fingerprint: Literal["content", "stat"] = "content"
    #: the sentence encoder's width, read from its folder (no model load) unless given
    feature_dim: int | None = None

    def __post_init__(self) -> None:
        if self.answer_filter not in RULES:
            raise ValueError(f"answer_filter must be one of {RULES}, got {self.answer_filter!r}")
        if self.answer_filter == "llm" and self.judge is None:
            raise ValueError("answer_filter='llm' needs judge: LLMConfig(...) (the shared LLM backend settings)")
        ratios = tuple(self.split_ratios)
        if len(ratios) != 3 or any(r < 0 for r in ratios) or abs(sum(ratios) - 1.0) > 1e-6:
            raise ValueError(f"split_ratios must be three non-negative numbers summing to 1, got {self.split_ratios}")
        if self.construction_cases_in_flight is not None:
            if self.construction_cases_in_flight < 1:
                raise ValueError(f"construction_cases_in_flight must be >= 1 or None (the backend's "
                                 f"max_concurrency), got {self.construction_cases_in_flight}")
            backend = self.construction_llm.backend.lower() if self.construction_llm is not None else None
            if self.construction_cases_in_flight > 1 and backend not in SERVER_BACKENDS:
                raise ValueError(f"construction_cases_in_flight={self.construction_cases_in_flight} needs an "
                                 f"OpenAI-compatible server as construction_llm (backend: openai), got "
                                 f"{backend!r}: a local model answers one case's windows as one batch")
        if self.cache_processes < 1:
            raise ValueError(f"cache_processes must be >= 1, got {self.cache_processes}")
        if self.cache_processes > 1 and self.construction_llm is not None:
            raise ValueError(f"cache_processes={self.cache_processes} would load construction_llm once per "
                             "process: with an LLM extractor keep cache_processes=1 and set "
                             "construction_cases_in_flight (cases extracted at once against a server)")
        if self.num_cases is not None and self.num_cases < 1:
            raise ValueError(f"num_cases must be >= 1 or None (all cases), got {self.num_cases}")
        self.split_ratios = tuple(float(r) for r in ratios)
        self.cache_dir = Path(self.cache_dir)
        self.distractor_conversations = _resolve_distractors(self.dataset, self.distractor_conversations)
        if self.feature_dim is None:
            self.feature_dim = sentence_encoder_dim(self.sentence_encoder)
        self.samples_key = C.stable_hash(self.sample_settings())
        self.answers_key = C.stable_hash(self.answerer().settings)
        self.cache_key = C.stable_hash({"samples": self.samples_key, **self.filter_settings()})

    # ---- settings that make up the keys -----------------------------------------------------------

    def sample_settings(self) -> dict[str, Any]:
        """Everything the cached samples depend on (data, sampling, splits, construction, activation, encoder)."""
        return {
            "format": C.CACHE_FORMAT_VERSION, "dataset": self.dataset,
            "data": C.fingerprint_data(self.data_path, self.data_fingerprint),
            "num_cases": self.num_cases, "split_ratios": self.split_ratios, "group_key": self.group_key,
            "seed": self.seed, "distractor_conversations": self.distractor_conversations, "strict": self.strict,
            "construction": self.construction.key_dict(), "activation": self.activation.key_dict(),
            "construction_llm": _llm_key(self.construction_llm), "sentence_encoder": self.sentence_encoder,
            "store_format": _store_format_version(),
        }

    def filter_settings(self) -> dict[str, Any]:
        """What the filtered splits add on top of the samples (the rule, the answers' LM, the judge)."""
        return {"format": C.CACHE_FORMAT_VERSION, "answer_filter": self.answer_filter,
                "answers": self.answers_key if self.answer_filter != "none" else None,
                "judge": _llm_key(self.judge) if self.answer_filter == "llm" else None,
                "match": asdict(self.match_rule) if self.answer_filter == "match" else None}

    def answerer(self) -> LMAnswerer:
        """The frozen LM that answers the training questions for the filter (loads lazily)."""
        return LMAnswerer(self.lm, prompt=self.prompt, batch_size=self.answer_batch_size,
                          max_new_tokens=self.answer_max_new_tokens, device=self.answer_device)

    # ---- folders ----------------------------------------------------------------------------------

    @property
    def samples_dir(self) -> Path:
        return self.cache_dir / f"samples-{self.samples_key}"

    @property
    def answers_dir(self) -> Path:
        return self.cache_dir / f"answers-{self.answers_key}"

    @property
    def dataset_dir(self) -> Path:
        return self.cache_dir / f"dataset-{self.cache_key}"


def _llm_key(config: LLMConfig | None) -> dict[str, Any] | None:
    return None if config is None else {k: v for k, v in asdict(config).items() if k in _LLM_KEY_FIELDS}


def _store_format_version() -> Any:
    """The memory store's code version: a change in construction output invalidates cached samples."""
    from qgmem.memory import store

    return getattr(store, "STORE_FORMAT_VERSION", None)


def _resolve_distractors(dataset: str, value: int | None) -> int | None:
    if value is None and dataset == "convomem":
        from qgmem.data.convomem_history import TRAINING_DISTRACTORS

        return int(TRAINING_DISTRACTORS)
    return value


__all__ = ["DEFAULT_SENTENCE_ENCODER", "CacheSpec"]
