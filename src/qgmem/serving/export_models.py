"""The export's models, loaded once per process: the one model-loading path of ``answer``, ``eval-qa``
and ``serve`` (:func:`load_models`), and the settings that name what to load: :class:`EngineSettings`
(the ``--lm-*`` flags) within :class:`LoadSettings` (the export, the device, the answer cap), which
``serve``, ``mcp``, ``answer`` and ``eval-qa`` nest, and :class:`ModelSettings` (the backbone besides),
shared by ``qgmem answer`` and ``qgmem eval-qa``. Each flag is declared here once;
:mod:`qgmem.settings_flags` turns the blocks into flags."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Literal

from qgmem.errors import UserError

#: what reads the graph: the export's frozen LM (graph tokens), or a hosted LLM (the graph as text)
BACKBONES = ("graph-token", "api")


@dataclass
class EngineSettings:
    """The frozen LM in a serving engine (``vllm serve --enable-prompt-embeds``) that this process sends
    prompt embeddings to (:mod:`qgmem.serving.remote_lm`); all ``None``: the LM runs in this process."""

    #: OpenAI-compatible base URL (…/v1) of a serving engine running the export's LM with prompt embeddings (vllm serve --enable-prompt-embeds); only the LM's input embedding table is loaded here
    lm_url: str | None = None
    #: model name the engine serves (default: the export's LM id; the embedded SmolLM2 is its hub id)
    lm_model: str | None = None
    #: NAME of the environment variable holding the engine's API key (default: none is sent)
    lm_api_key_env: str | None = None

    def check(self) -> None:
        """The flags' mistakes as one user error each (run once per start, before any model loads)."""
        import os

        if self.lm_url is None:
            for flag, value in (("--lm-model", self.lm_model), ("--lm-api-key-env", self.lm_api_key_env)):
                if value is not None:
                    raise UserError(f"{flag} needs --lm-url (the serving engine it describes)")
            return
        if not self.lm_url.startswith(("http://", "https://")):
            raise UserError(f"--lm-url must be an http(s) URL such as http://127.0.0.1:8100/v1, got {self.lm_url!r}")
        if self.lm_api_key_env and not os.environ.get(self.lm_api_key_env):
            raise UserError(f"--lm-api-key-env names {self.lm_api_key_env!r}, but that environment variable is "
                            "not set")

    def config(self) -> Any:
        """The engine's ``LLMConfig`` (``None`` without ``--lm-url``) of settings :meth:`check` passed."""
        if self.lm_url is None:
            return None
        from qgmem.serving.remote_lm import engine_config

        return engine_config(self.lm_url, self.lm_model, self.lm_api_key_env)


@dataclass
class LoadSettings:
    """Which export's models load, where, and where the LM runs: what every command serving an export reads."""

    export: str | None = None  #: export folder (``python train.py`` writes checkpoints/export) or hub id
    device: str | None = None  #: cpu | cuda (default: cuda when available)
    max_new_tokens: int | None = None  #: answer length cap (default: the export's)
    engine: EngineSettings = field(default_factory=EngineSettings)  # --lm-url, --lm-model, --lm-api-key-env

    def check(self) -> None:
        """The flags' mistakes as one user error each (once per start, before any model loads)."""
        if not self.export:
            raise UserError("--export is required (the export folder, e.g. checkpoints/export, or a hub id)")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise UserError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        self.engine.check()


@dataclass
class ModelSettings:
    """What ``qgmem answer`` and ``qgmem eval-qa`` answer with: the export's models, and what reads the graph."""

    load: LoadSettings = field(default_factory=LoadSettings)  # --export, --device, --max-new-tokens, --lm-*
    #: graph-token: the export's frozen LM reads the graph token (default); api: an OpenAI-compatible server reads the working memory + the graph as text
    backbone: Literal[BACKBONES] = "graph-token"
    api_base_url: str = "http://127.0.0.1:8000/v1"  #: server of --backbone api
    api_model: str = "gpt-4o-mini"  #: model name sent to the --backbone api server
    api_key_env: str = "OPENAI_API_KEY"  #: environment variable holding the API key (never stored or logged)

    def check(self) -> None:
        """The flags' mistakes as one user error each (once per start, before any model loads)."""
        self.load.check()
        if self.load.engine.lm_url is not None and self.backbone == "api":
            raise UserError("--lm-url serves the graph-token LM; --backbone api answers without it: give one of them")

    def api_config(self, model: str, base_url: str) -> Any:
        """An OpenAI-compatible server's ``LLMConfig`` (the api backbone's, or eval-qa's LLM judge), keyed by ``--api-key-env``."""
        from qgmem.llm.base import LLMConfig

        return LLMConfig(backend="openai", model=model, base_url=base_url, api_key_env=self.api_key_env,
                         max_retries=1, timeout_s=60.0)


#: pipelines loaded in this process, by (export, device, answer cap, backbone): each model loads once
_LOADED: dict[tuple, Any] = {}


def load_models(export: str, *, device: str | None = None, max_new_tokens: int | None = None, api: Any = None,
                lm_dtype: str | None = None, engine: Any = None):
    """A pipeline over the export's models, loaded once per process and shared by every caller.

    Each call returns a pipeline of its own (no memory yet) over the same loaded models: the graph
    encoder, the sentence encoder, the frozen LM and the construction builder (its spaCy parse memo).
    ``lm_dtype``: the LM's weights as ``float32`` / ``bfloat16`` / ``float16`` (default: the export's).
    ``engine``: the ``LLMConfig`` of a serving engine running the LM (``--lm-url``; see
    :meth:`EngineSettings.config`); then only the LM's input embedding table is loaded.
    """
    from transformers.utils import logging as hf_logging

    from qgmem.serving.pipeline import QGMemPipeline

    hf_logging.disable_progress_bar()  # weight-loading bars would bury the answer
    key = (str(export), device, max_new_tokens, repr(api), lm_dtype, repr(engine))
    loaded = _LOADED.get(key)
    if loaded is None:
        loaded = _LOADED[key] = QGMemPipeline.from_pretrained(export, device=device, max_new_tokens=max_new_tokens,
                                                              api=api, lm_dtype=lm_dtype, engine=engine)
    pipe = copy.copy(loaded)
    pipe.memory = None
    return pipe


def load_pipeline(settings: ModelSettings):
    """The pipeline of settings :meth:`ModelSettings.check` passed (a user error when the export cannot be read)."""
    api = settings.api_config(settings.api_model, settings.api_base_url) if settings.backbone == "api" else None
    return load_settings_models(settings.load, api=api)


def load_settings_models(load: LoadSettings, *, api: Any = None, lm_dtype: str | None = None):
    """:func:`load_models` for settings :meth:`LoadSettings.check` passed."""
    return load_models(load.export, device=load.device, max_new_tokens=load.max_new_tokens, api=api,
                       lm_dtype=lm_dtype, engine=load.engine.config())
