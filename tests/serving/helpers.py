"""Exports built without training (a randomly initialized network)."""

from __future__ import annotations

from pathlib import Path

import torch

from qgmem.activation.config import ActivationConfig
from qgmem.memory.config import ConstructionConfig
from qgmem.model.encoder import EncoderConfig
from qgmem.model.graph_token import GraphTokenConfig
from qgmem.model.pretrained import GraphTokenEncoder
from qgmem.prompting import PromptSettings

from activation.helpers import HashEncoder  # noqa: F401  tests/activation/helpers.py, re-exported for the serving tests

HIDDEN = 32


def export_config(lm_path: str, feature_dim: int, **extra) -> dict:
    """An export's ``config.json`` of today's format; ``prompt``, ``activation`` and ``graph_mode`` given
    here go into its ``answer`` block."""
    answer = {"prompt": PromptSettings(max_prompt_tokens=256).to_dict(), "activation": ActivationConfig().to_dict(),
              "graph_mode": "token", **{k: extra.pop(k) for k in ("prompt", "activation", "graph_mode") if k in extra}}
    return {"lm": {"id": lm_path, "hidden_size": HIDDEN, "load_dtype": "auto"}, "answer": answer,
            "sentence_encoder": {"id": "embedded:all-MiniLM-L6-v2", "dim": feature_dim},
            "construction": ConstructionConfig().to_dict(),
            "dataset": "convomem", "generation": {"max_new_tokens": 4},
            "metrics": {"val": {"val/nll": 2.5}, "test": {"test/em": 0.25, "test/f1": 0.5}}, **extra}


def make_encoder(lm_path: str, feature_dim: int = 8, layers: int = 2, seed: int = 0, **extra) -> GraphTokenEncoder:
    torch.manual_seed(seed)
    config = GraphTokenConfig(feature_dim=feature_dim, edge_dim=feature_dim, lm_hidden=HIDDEN,
                              features="text", readout="mean", num_graph_tokens=1,
                              encoder=EncoderConfig(hidden=16, heads=2, layers=layers, dropout=0.0))
    return GraphTokenEncoder(config, export_config(lm_path, feature_dim, **extra)).eval()


def make_export(folder: Path, lm_path: str, feature_dim: int = 8, **kwargs) -> Path:
    make_encoder(lm_path, feature_dim, **kwargs).save_pretrained(folder)
    return folder
