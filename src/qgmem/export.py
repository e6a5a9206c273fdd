"""``qgmem export``: a trained checkpoint's graph encoder + projector as a self-contained folder.

``DIR/graph_encoder.safetensors`` holds the weights (no pickle), ``DIR/config.json`` everything a
server needs to feed it and check it (encoder shape, LM id/hidden size/dtype, sentence encoder and
feature spec, activation parameters, cache key, package version) and ``DIR/README.md`` is a short model
card with the validation and test metrics. :mod:`qgmem.serving` loads it without Lightning.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from qgmem import __version__
from qgmem.finite import nonfinite_names
from qgmem.prompting import PromptSettings

WEIGHTS_FILE = "graph_encoder.safetensors"
ADAPTER_FILE = "lm_lora_adapter.safetensors"
CONFIG_FILE = "config.json"
FORMAT = "qgmem-graph-token"
FORMAT_VERSION = 1
NET_PREFIX = "net."

EDGE_FEATURE_SPEC = {
    "node_features": "frozen sentence-encoder embedding (L2-normalized) of the node text: a subject or object "
                     "of an activated unit's triple, de-duplicated by normalized text",
    "edge_features": "frozen sentence-encoder embedding (L2-normalized) of the edge text: the predicate, or "
                     "'inverse: <predicate>' for an optional reverse edge",
    "edge_fact": "frozen sentence-encoder embedding of the fact of the memory unit each edge comes from "
                 "(read when graph_token.features is not 'text')",
    "empty_graph": "one all-zero node and no edges",
    "builder": "qgmem.activation.graph.graph_to_data",
}


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """A Lightning checkpoint of ``QGMemModule`` as plain tensors and dicts (``weights_only`` load)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    for key in ("state_dict", "hyper_parameters"):
        if key not in ckpt:
            raise ValueError(f"{path}: not a QGMem training checkpoint (no {key!r})")
    if not any(k.startswith(NET_PREFIX) for k in ckpt["state_dict"]):
        raise ValueError(f"{path}: the checkpoint holds no graph-token weights ('{NET_PREFIX}*')")
    return ckpt


def find_metrics(ckpt_path: Path, levels: int = 4) -> dict[str, Any] | None:
    """``metrics.json`` written by ``train.py`` in the checkpoint's run folder (searched upwards)."""
    for parent in list(ckpt_path.resolve().parents)[:levels]:
        candidate = parent / "metrics.json"
        if candidate.is_file():
            return json.loads(candidate.read_text())
    return None


def prompt_settings(hp: dict[str, Any], info: dict[str, Any]) -> PromptSettings:
    """The run's prompt contract from a checkpoint (older checkpoints kept its parts in two places)."""
    if hp.get("prompt"):
        return PromptSettings.from_dict(hp["prompt"])
    legacy = {"enable_thinking": hp.get("enable_thinking"), "max_prompt_tokens": info.get("max_prompt_tokens"),
              "max_answer_tokens": info.get("max_answer_tokens")}
    return PromptSettings(**{k: v for k, v in legacy.items() if v is not None})


def export_checkpoint(ckpt_path: str | Path, out_dir: str | Path, metrics: dict[str, Any] | None = None) -> Path:
    """Write the export folder for ``ckpt_path``; returns ``out_dir``."""
    ckpt_path, out = Path(ckpt_path), Path(out_dir)
    ckpt = load_checkpoint(ckpt_path)
    hp, state = ckpt["hyper_parameters"], ckpt["state_dict"]
    info = dict(ckpt.get("qgmem_data_info") or {})
    lm_info = dict(ckpt.get("qgmem_lm") or {})
    weights = {k[len(NET_PREFIX):]: v.contiguous() for k, v in state.items() if k.startswith(NET_PREFIX)}
    adapter = {k: v.contiguous() for k, v in state.items() if k.startswith("lm.")}
    bad = nonfinite_names({**weights, **adapter})
    if bad:  # a NaN model must never ship: refuse before anything is written
        raise ValueError(f"{ckpt_path}: {len(bad)} of {len(weights) + len(adapter)} weight tensors hold NaN or inf "
                         f"({', '.join(bad[:5])}{', ...' if len(bad) > 5 else ''}); refusing to export them")
    graph_token = dict(ckpt.get("qgmem_graph_token") or {})
    if not graph_token:
        raise ValueError(f"{ckpt_path}: the checkpoint has no graph-token config ('qgmem_graph_token')")
    metrics = metrics if metrics is not None else find_metrics(ckpt_path)
    activation = info.get("activation") or {}
    config = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "qgmem_version": __version__,
        "graph_token": graph_token,
        "graph_mode": hp.get("graph", "token"),
        "readout": {"kind": graph_token.get("readout", "mean"), "graph_tokens": graph_token.get("num_queries", 1)},
        "features": graph_token.get("features", "text"),
        "lm": {"id": hp.get("lm"), "hidden_size": graph_token.get("lm_hidden"), "dtype": lm_info.get("dtype"),
               "load_dtype": hp.get("lm_dtype"), "end_of_turn_id": lm_info.get("end_of_turn_id")},
        "prompt": prompt_settings(hp, info).to_dict(),
        "graph_token_position": "before the first token of the user content",
        "sentence_encoder": {"id": info.get("sentence_encoder"), "dim": info.get("feature_dim", graph_token.get("feature_dim"))},
        "edge_features": {**EDGE_FEATURE_SPEC, "dim": graph_token.get("edge_dim")},
        "activation": activation,
        "activation_key_parameters": {k: activation.get(k) for k in ("k", "pool_size", "rrf_k", "attribute_threshold",
                                                                     "reranker", "reverse_edges") if k in activation},
        "construction": info.get("construction"),
        "dataset": info.get("dataset"), "answer_filter": info.get("answer_filter"),
        "cache_key": info.get("cache_key"),
        "lora": hp.get("lora") if adapter else None,
        "checkpoint": {"file": ckpt_path.name, "epoch": ckpt.get("epoch"), "global_step": ckpt.get("global_step")},
        "metrics": metrics,
    }
    out.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(out / WEIGHTS_FILE), metadata={"format": FORMAT, "qgmem_version": __version__})
    if adapter:
        save_file(adapter, str(out / ADAPTER_FILE), metadata={"format": FORMAT})
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=False, default=str) + "\n")
    (out / "README.md").write_text(model_card(config))
    return out


def _metric_rows(metrics: dict[str, Any] | None) -> list[str]:
    rows = []
    for split in ("val", "test"):
        values = (metrics or {}).get(split) or {}
        for name in ("nll", "em", "f1"):
            for key in (f"{split}/{name}", name):
                if key in values:
                    rows.append(f"| {split} | {name} | {float(values[key]):.4f} |")
                    break
    return rows


def model_card(config: dict[str, Any]) -> str:
    g, lm, enc = config["graph_token"], config["lm"], config["graph_token"].get("encoder", {})
    rows = _metric_rows(config.get("metrics")) or ["| – | – | not recorded |"]
    return "\n".join([
        "# QGMem graph-token encoder",
        "",
        "A relation-aware graph encoder (TransformerConv with predicate edge features), a readout (mean pooling or",
        "learned queries) and a two-layer projector that turn a query's local memory graph into graph tokens for a",
        "frozen causal LM",
        "(QGMem, arXiv 2610.11920, §III-C). Only these weights were trained; the LM and sentence encoder are frozen.",
        "",
        f"- LM: `{lm['id']}` (hidden size {lm['hidden_size']}, dtype {lm['dtype']})",
        f"- sentence encoder: `{config['sentence_encoder']['id']}` ({config['sentence_encoder']['dim']}-d node/edge features)",
        f"- encoder: {enc.get('layers')} layers, {enc.get('heads')} heads, width {enc.get('hidden')}; "
        f"graph mode `{config['graph_mode']}`",
        f"- features `{g.get('features', 'text')}`; readout `{g.get('readout', 'mean')}` giving "
        f"{g.get('num_queries', 1)} graph token(s)",
        f"- activation: {json.dumps(config.get('activation_key_parameters') or {})}",
        f"- data cache key: `{config.get('cache_key')}`; qgmem {config['qgmem_version']}",
        f"- feature widths: node {g.get('feature_dim')}, edge {g.get('edge_dim')}",
        "",
        "| split | metric | value |",
        "| --- | --- | --- |",
        *rows,
        "",
        "NLL is the mean answer-token negative log-likelihood; EM and F1 are SQuAD-normalized exact match and",
        "token F1 of greedy generations against the reference answers.",
        "",
        "Load with `qgmem.serving.GraphTokenEncoder.from_pretrained(<this folder>)`.",
        "",
    ])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ckpt", required=True, help="Lightning checkpoint written by train.py")
    parser.add_argument("--out", required=True, help="export folder to create")
    parser.add_argument("--metrics", default=None, help="metrics.json to put on the model card "
                        "(default: the one train.py wrote next to the checkpoint's run)")


def run(args: argparse.Namespace) -> int:
    from qgmem.errors import as_user_error

    with as_user_error(ValueError):  # not a checkpoint, no graph-token weights, unreadable metrics JSON
        metrics = json.loads(Path(args.metrics).read_text()) if args.metrics else None
        out = export_checkpoint(args.ckpt, args.out, metrics)
    print(f"exported {args.ckpt} -> {out}")
    return 0
