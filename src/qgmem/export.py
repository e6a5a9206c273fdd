"""``qgmem export``: a trained checkpoint's graph encoder + projector as a Hub-style export folder.

The folder layout, the format checks and save/load/push live in
:class:`qgmem.model.pretrained.GraphTokenEncoder`; this module turns a Lightning checkpoint into one:
weights (``graph_encoder.safetensors``), ``config.json`` with everything a server needs (network shape,
LM, the answer contract as the checkpoint recorded it, sentence encoder and feature spec, construction
settings, cache key, package version, the run's metrics), LoRA adapters in PEFT's format and the model card.
:mod:`qgmem.serving` loads it without Lightning or the training code.
"""

from __future__ import annotations

import argparse
import json
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from qgmem import __version__
from qgmem.provenance import git_commit
from qgmem.integrity import fresh_temp_dir, publish_dir
from qgmem.older_records import checkpoint_contract, checkpoint_graph_mode, checkpoint_hparams
from qgmem.settings_flags import add_settings_arguments, settings_from_args

if TYPE_CHECKING:
    from qgmem.activation.answer_contract import AnswerContract

__all__ = ["CONFIG_FILE", "FORMAT", "FORMAT_VERSION", "WEIGHTS_FILE", "answer_contract", "export_checkpoint",
           "find_metrics", "load_checkpoint"]
#: the export format's names, read from their home on first use (so ``qgmem export --help`` loads no torch)
_FORMAT_NAMES = ("CONFIG_FILE", "FORMAT", "FORMAT_VERSION", "WEIGHTS_FILE")


def __getattr__(name: str) -> Any:
    if name not in _FORMAT_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from qgmem.model import pretrained

    return getattr(pretrained, name)

EDGE_FEATURE_SPEC = {
    "node_features": "frozen sentence-encoder embedding (L2-normalized) of the node text: a subject or object "
                     "of an activated unit's triple, de-duplicated by normalized text",
    "edge_features": "frozen sentence-encoder embedding (L2-normalized) of the edge text: the predicate",
    "edge_fact": "frozen sentence-encoder embedding of the fact of the memory unit each edge comes from "
                 "(read when graph_token.features is not 'text')",
    "empty_graph": "one all-zero node and no edges",
    "builder": "qgmem.activation.graph.graph_to_data",
}


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """A Lightning checkpoint of ``QGMemModule`` as plain tensors and dicts (``weights_only`` load)."""
    import torch

    from qgmem.model import checkpoint_keys as CK

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    for key in ("state_dict", "hyper_parameters"):
        if key not in ckpt:
            raise ValueError(f"{path}: not a QGMem training checkpoint (no {key!r})")
    if not any(k.startswith(CK.NET_PREFIX) for k in ckpt["state_dict"]):
        raise ValueError(f"{path}: the checkpoint holds no graph-token weights ('{CK.NET_PREFIX}*')")
    return ckpt


def find_metrics(ckpt_path: Path) -> dict[str, Any] | None:
    """The ``metrics.json`` of the run that wrote ``ckpt_path``, or ``None``.

    ``train.py`` writes ``<root>/checkpoints/*.ckpt`` and ``<root>/metrics.json`` naming its best
    checkpoint; only a metrics file of that run root that names this very checkpoint is taken, never
    one of a parent folder's run.
    """
    ckpt_path = Path(ckpt_path).resolve()
    candidate = ckpt_path.parent.parent / "metrics.json"
    if not candidate.is_file():
        return None
    metrics = json.loads(candidate.read_text())
    best = metrics.get("best_checkpoint") if isinstance(metrics, dict) else None
    return metrics if best and Path(best).resolve() == ckpt_path else None


def answer_contract(ckpt: dict[str, Any], graph_mode: str | None = None) -> AnswerContract:
    """The run's answer contract from a checkpoint's block (one written before it had the block: its parts
    gathered by :func:`qgmem.older_records.checkpoint_contract`); ``graph_mode`` replaces its mode."""
    from qgmem.activation.answer_contract import AnswerContract
    from qgmem.model import checkpoint_keys as CK

    block = ckpt.get(CK.ANSWER_CONTRACT) or checkpoint_contract(ckpt["hyper_parameters"],
                                                                 dict(ckpt.get(CK.DATA_INFO) or {}))
    contract = AnswerContract.from_dict(block)
    return replace(contract, graph_mode=graph_mode) if graph_mode is not None else contract


#: where the graph enters the LM, by ``graph_token.injection`` (the export's ``graph_token_position``)
GRAPH_POSITION = {
    "input": "before the first token of the user content",
    "kv_prefix": "keys and values at every layer, at the positions before the first token of the user content "
                 "(rotated there like input tokens)",
}


def export_config(ckpt_path: Path, ckpt: dict[str, Any], metrics: dict[str, Any] | None,
                  graph_mode: str | None = None) -> dict[str, Any]:
    """``config.json`` of the export of ``ckpt`` (without the weights); ``graph_mode``: see
    :func:`export_checkpoint`."""
    from qgmem.model import checkpoint_keys as CK
    from qgmem.model.graph_token import GraphTokenConfig
    from qgmem.model.pretrained import FORMAT, FORMAT_VERSION

    hp = ckpt["hyper_parameters"]
    info = dict(ckpt.get(CK.DATA_INFO) or {})
    lm_info = dict(ckpt.get(CK.LM) or {})
    graph_token = dict(ckpt.get(CK.GRAPH_TOKEN) or {})
    if not graph_token:
        raise ValueError(f"{ckpt_path}: the checkpoint has no graph-token config ({CK.GRAPH_TOKEN!r})")
    graph_token = GraphTokenConfig.from_dict(graph_token).to_dict()  # older checkpoints' field names read too
    has_adapter = any(k.startswith(CK.LM_PREFIX) for k in ckpt["state_dict"])
    answer = answer_contract(ckpt, graph_mode).to_dict()
    activation = answer["activation"]
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION, "qgmem_version": __version__,
        # the code that trained the weights (the checkpoint's), else the code exporting them
        "git_commit": (ckpt.get(CK.PROVENANCE) or {}).get("git_commit", git_commit()),
        "graph_token": graph_token,
        # what an answer depends on: the prompt, the activation, the mode it reads when its caller names none
        "answer": answer,
        "readout": {"kind": graph_token["readout"], "num_graph_tokens": graph_token["num_graph_tokens"]},
        "features": graph_token.get("features", "text"),
        "lm": {"id": hp.get("lm"), "hidden_size": graph_token.get("lm_hidden"), "dtype": lm_info.get("dtype"),
               "load_dtype": hp.get("lm_dtype"), "end_of_turn_id": lm_info.get("end_of_turn_id")},
        "graph_token_position": GRAPH_POSITION[graph_token["injection"]],
        "generation": {"max_new_tokens": checkpoint_hparams(hp)["generation"].get("max_new_tokens")},
        "sentence_encoder": {"id": info.get("sentence_encoder"),
                             "dim": info.get("feature_dim", graph_token.get("feature_dim"))},
        "edge_features": {**EDGE_FEATURE_SPEC, "dim": graph_token.get("edge_dim")},
        "activation_key_parameters": {k: activation.get(k) for k in ("k", "pool_size", "rrf_k", "attribute_threshold",
                                                                     "reranker", "reranker_path") if k in activation},
        "construction": info.get("construction"),
        "construction_llm": construction_llm(info.get("construction_llm")),
        "dataset": info.get("dataset"), "answer_filter": info.get("answer_filter"),
        "cache_key": info.get("cache_key"),
        "data_split": _data_split(info),
        "lora": hp.get("lora") if has_adapter else None,
        # the mode the weights trained with (the answer block's may differ: qgmem export --graph-mode)
        "checkpoint": {"file": ckpt_path.name, "epoch": ckpt.get("epoch"), "global_step": ckpt.get("global_step"),
                       "graph_mode": checkpoint_graph_mode(hp)},
        "metrics": metrics,
    }


def construction_llm(config: dict[str, Any] | None) -> dict[str, Any] | None:
    """Where construction's LLM was reached (backend, model, server, the key's variable name), so a server
    of the export builds memories as training did; the response cache's path is the training machine's, left out."""
    if not config:
        return None
    return {k: v for k, v in dict(config).items() if k != "cache_path"}


def _data_split(info: dict[str, Any]) -> dict[str, Any] | None:
    """How the run sampled and split its cases, so ``qgmem eval-qa --split test`` evaluates the held-out ones."""
    settings = ((info.get("summary") or {}).get("settings") or {})
    keys = ("dataset", "num_cases", "split_ratios", "group_key", "seed", "distractor_conversations")
    return {k: settings.get(k) for k in keys} if settings else None


def export_checkpoint(ckpt_path: str | Path, out_dir: str | Path, metrics: dict[str, Any] | None = None, *,
                      graph_mode: str | None = None) -> Path:
    """Write the export folder for ``ckpt_path``; returns ``out_dir`` (an existing one is replaced whole).

    ``metrics`` default to the checkpoint's own run's (:func:`find_metrics`); none found, the card says so.
    ``graph_mode``: the export's default answer mode (field ``answer.graph_mode``: ``token``, or ``none``, the
    text prompt alone, with the graph tokens one request field away); default: the checkpoint's contract's
    (the run's ``data.graph_mode``, else the mode the weights trained with).
    """
    from qgmem.finite import nonfinite_names
    from qgmem.model import checkpoint_keys as CK
    from qgmem.model.graph_modes import check_mode
    from qgmem.model.graph_token import GraphTokenConfig
    from qgmem.model.pretrained import GraphTokenEncoder, peft_adapter_state

    ckpt_path, out = Path(ckpt_path), Path(out_dir)
    if graph_mode is not None:
        check_mode(graph_mode)
    ckpt = load_checkpoint(ckpt_path)
    state = ckpt["state_dict"]
    weights = {k[len(CK.NET_PREFIX):]: v.contiguous() for k, v in state.items() if k.startswith(CK.NET_PREFIX)}
    adapter = {k: v.contiguous() for k, v in state.items() if k.startswith(CK.LM_PREFIX)}
    bad = nonfinite_names({**weights, **adapter})
    if bad:  # a NaN model must never ship: refuse before anything is written
        raise ValueError(f"{ckpt_path}: {len(bad)} of {len(weights) + len(adapter)} weight tensors hold NaN or inf "
                         f"({', '.join(bad[:5])}{', ...' if len(bad) > 5 else ''}); refusing to export them")
    config = export_config(ckpt_path, ckpt, metrics if metrics is not None else find_metrics(ckpt_path), graph_mode)
    encoder = GraphTokenEncoder(GraphTokenConfig.from_dict(config["graph_token"]), config,
                                adapter=peft_adapter_state(adapter) if adapter else None)
    encoder.load_state_dict(weights, strict=True)
    # built beside and renamed into place: an export killed half-way, or written over one that is
    # being served, never leaves a half-written folder under ``out``
    tmp = fresh_temp_dir(out)
    try:
        encoder.save_pretrained(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return publish_dir(tmp, out, if_exists="replace")


@dataclass
class ExportSettings:
    """What ``qgmem export`` runs with; one field per flag."""

    ckpt: str  #: Lightning checkpoint written by train.py
    out: str  #: export folder to create
    #: metrics.json to put on the model card (default: the one train.py wrote next to the checkpoint's run)
    metrics: str | None = None
    #: what answers read when a request names no mode: the graph tokens, or none (the text prompt alone); default: the checkpoint's answer contract's
    graph_mode: Literal["token", "none"] | None = None




def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_settings_arguments(parser, ExportSettings)


def run(args: argparse.Namespace) -> int:
    from qgmem.errors import as_user_error

    s = settings_from_args(ExportSettings, args)
    with as_user_error(ValueError):  # not a checkpoint, no graph-token weights, unreadable metrics JSON
        metrics = json.loads(Path(s.metrics).read_text()) if s.metrics else None
        out = export_checkpoint(s.ckpt, s.out, metrics, graph_mode=s.graph_mode)
    print(f"exported {s.ckpt} -> {out}")
    return 0
