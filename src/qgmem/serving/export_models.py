"""The export's models, loaded once per process: the one model-loading path of ``answer``, ``eval-qa``
and ``serve`` (:func:`load_models`), and the flags that name what to load (the export, the backbone,
the device), shared by ``qgmem answer`` and ``qgmem eval-qa``."""

from __future__ import annotations

import argparse
import copy
from typing import Any

from qgmem.errors import UserError


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--export", required=True, help="export folder (train.py writes checkpoints/export) or hub id")
    parser.add_argument("--backbone", choices=("graph-token", "api"), default="graph-token",
                        help="graph-token: the export's frozen LM reads the graph token (default); api: an "
                             "OpenAI-compatible server reads the working memory + the graph as text")
    parser.add_argument("--api-base-url", default="http://127.0.0.1:8000/v1", help="server of --backbone api")
    parser.add_argument("--api-model", default="gpt-4o-mini", help="model name sent to the --backbone api server")
    parser.add_argument("--api-key-env", default="OPENAI_API_KEY",
                        help="environment variable holding the API key (never stored or logged)")
    add_engine_arguments(parser)
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="answer length cap (default: the export's)")
    parser.add_argument("--device", default=None, help="cpu | cuda (default: cuda when available)")


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """``--lm-url`` and its companions: the frozen LM runs in a serving engine (``vllm serve
    --enable-prompt-embeds``), this process sends it prompt embeddings (:mod:`qgmem.serving.remote_lm`)."""
    parser.add_argument("--lm-url", default=None,
                        help="OpenAI-compatible base URL (…/v1) of a serving engine that runs the export's LM and "
                             "takes prompt embeddings (vllm serve --enable-prompt-embeds); only the LM's input "
                             "embedding table is loaded here")
    parser.add_argument("--lm-model", default=None,
                        help="model name the engine serves (default: the export's LM id; the embedded SmolLM2 is "
                             "its hub id)")
    parser.add_argument("--lm-api-key-env", default=None,
                        help="environment variable holding the engine's API key (default: none is sent)")


def engine_settings(lm_url: str | None, lm_model: str | None, lm_api_key_env: str | None) -> Any:
    """The engine's ``LLMConfig`` from the ``--lm-*`` flags (``None`` without ``--lm-url``), checked."""
    import os

    if lm_url is None:
        for flag, value in (("--lm-model", lm_model), ("--lm-api-key-env", lm_api_key_env)):
            if value is not None:
                raise UserError(f"{flag} needs --lm-url (the serving engine it describes)")
        return None
    if not lm_url.startswith(("http://", "https://")):
        raise UserError(f"--lm-url must be an http(s) URL such as http://127.0.0.1:8100/v1, got {lm_url!r}")
    if lm_api_key_env and not os.environ.get(lm_api_key_env):
        raise UserError(f"--lm-api-key-env names {lm_api_key_env!r}, but that environment variable is not set")
    from qgmem.serving.remote_lm import engine_config

    return engine_config(lm_url, lm_model, lm_api_key_env)


def api_config(args: argparse.Namespace, model: str, base_url: str) -> Any:
    from qgmem.llm.base import LLMConfig

    return LLMConfig(backend="openai", model=model, base_url=base_url, api_key_env=args.api_key_env,
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
    :func:`engine_settings`); then only the LM's input embedding table is loaded.
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


def load_pipeline(args: argparse.Namespace):
    """The pipeline the flags describe (a user error when the export cannot be read)."""
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise UserError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    engine = engine_settings(args.lm_url, args.lm_model, args.lm_api_key_env)
    if engine is not None and args.backbone == "api":
        raise UserError("--lm-url serves the graph-token LM; --backbone api answers without it: give one of them")
    api = api_config(args, args.api_model, args.api_base_url) if args.backbone == "api" else None
    return load_models(args.export, device=args.device, max_new_tokens=args.max_new_tokens, api=api, engine=engine)
