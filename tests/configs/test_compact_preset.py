"""The ``compact`` preset: default.yaml's CPU setting plus the compact prompt's named settings, nothing else."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from qgmem.configs import preset_path

REPO = Path(__file__).resolve().parents[2]
#: what the compact preset changes over the default preset, and to what
#: (the stages as the file lists them: the settings it sets; resolved, every setting is printed)
STAGES = [{"class_path": "qgmem.training.stages.MemoryReconstruction", "init_args": {"steps": 40, "batch_size": 8}},
          {"class_path": "qgmem.training.stages.Distillation", "init_args": {"weight": 2.0}}]
COMPACT = {"data.memory_units": 3, "model.readout": "summary_units", "model.num_graph_tokens": 11,
           "model.stages": STAGES}
RESOLVED_STAGES = [{"class_path": "qgmem.training.stages.MemoryReconstruction",
                    "init_args": {"steps": 40, "batch_size": 8, "lr": 3e-3}},
                   {"class_path": "qgmem.training.stages.Distillation",
                    "init_args": {"weight": 2.0, "topk": 16, "cache_dir": None}}]


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def _differ(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """``b``'s value of every dotted key where ``b`` differs from ``a``."""
    a, b = _flat(a), _flat(b)
    return {k: b.get(k) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def _preset(name: str) -> dict[str, Any]:
    return yaml.safe_load(preset_path(name).read_text(encoding="utf-8"))


def test_compact_is_the_default_preset_plus_the_named_settings():
    """The CPU budget is written in both files: a change to default.yaml not made here fails."""
    assert _differ(_preset("default"), _preset("compact")) == COMPACT
    assert _preset("compact")["data"]["max_prompt_tokens"] == 288


def test_the_diff_tells_a_drifted_budget():  # a negative control of the check above
    drifted = _preset("compact")
    drifted["trainer"]["max_steps"] = 60
    assert _differ(_preset("default"), drifted) == {**COMPACT, "trainer.max_steps": 60}


def test_compact_loads_by_name_and_its_budgets_hold_together():
    from qgmem.job import resolved_config

    compact = resolved_config(["--config", "compact"])
    default = resolved_config(["--config", "default"])
    assert _differ(default, compact) == {**COMPACT, "model.stages": RESOLVED_STAGES}
    # the text budget is the top m of the graph's k units, and the readout holds one token per unit besides the pooled one
    k = compact["data"]["activation"]["k"]
    assert compact["data"]["memory_units"] == 3 <= k == 10
    assert compact["model"]["num_graph_tokens"] == 1 + k
