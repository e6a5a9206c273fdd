"""The rehearsal of ``configs/qwen3_8b.yaml``: its overrides are exactly the named ones, and it runs end to end."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from qgmem.job import resolved_config

REPO = Path(__file__).resolve().parents[2]
#: the keys the miniature changes in the preset; anything else differing is a leak of the rehearsal
NAMED_OVERRIDES = sorted([
    "trainer.accelerator", "trainer.devices", "trainer.max_epochs", "trainer.default_root_dir",
    "model.lm", "model.max_new_tokens",
    "data.data_path", "data.num_cases", "data.cache_dir", "data.sentence_encoder", "data.num_workers",
    "data.construction_llm.base_url", "data.construction_llm.cache_path",
    "data.judge.base_url", "data.judge.cache_path", "data.activation.reranker_path",
])


def _rehearsal():
    spec = importlib.util.spec_from_file_location("paper_preset_rehearsal", REPO / "bench" / "paper_preset_rehearsal.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def test_print_config_differs_from_the_preset_only_in_the_named_overrides(tmp_path):
    R = _rehearsal()
    assert sorted(R.override_keys()) == NAMED_OVERRIDES
    overrides = R.write_overrides(tmp_path, 8123, 12, 2)
    preset = _flat(resolved_config(["--config", "qwen3_8b"], default_config=None))
    rehearsal = _flat(resolved_config(R.config_args(overrides), default_config=None))
    differ = sorted(k for k in set(preset) | set(rehearsal) if preset.get(k) != rehearsal.get(k))
    assert differ == NAMED_OVERRIDES
    # the preset's own values stay: bf16, DDP, gradient checkpointing, LLM construction and judge, LLM reranker
    for key, value in {"trainer.strategy": "ddp", "trainer.precision": "bf16-mixed", "model.lm_dtype": "bfloat16",
                       "model.gradient_checkpointing": True, "data.construction.extractor": "llm",
                       "data.answer_filter": "llm", "data.activation.reranker": "llm",
                       "data.construction_llm.backend": "openai", "data.enable_thinking": False}.items():
        assert rehearsal[key] == value, key
    assert rehearsal["data.construction_llm.base_url"] == "http://127.0.0.1:8123/v1"
    assert rehearsal["data.num_cases"] == 12


def test_fill_keeps_the_type_of_a_whole_placeholder():
    R = _rehearsal()
    assert R.fill({"a": "{n}", "b": "{d}/x.sqlite", "c": 3}, {"n": 5, "d": "cache"}) == {"a": 5, "b": "cache/x.sqlite", "c": 3}
