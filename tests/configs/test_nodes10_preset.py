"""The ``default`` preset is the compact prompt, and ``nodes10`` (the former default) is default.yaml's CPU
setting with the module's signature defaults where default.yaml sets the compact prompt, nothing else."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from qgmem.configs import preset_path

REPO = Path(__file__).resolve().parents[2]
#: what the default preset sets over the nodes10 preset (the compact prompt and its answer mode), and to what
#: (the stages as the file lists them: the settings it sets; resolved, every setting is printed)
STAGES = [{"class_path": "qgmem.training.stages.MemoryReconstruction", "init_args": {"steps": 40, "batch_size": 8}},
          {"class_path": "qgmem.training.stages.Distillation", "init_args": {"weight": 2.0}}]
COMPACT = {"data.memory_units": 3, "model.readout": "summary_units", "model.num_graph_tokens": 11,
           "model.stages": STAGES,
           "data.graph_mode": "none"}  # the answer-mode rule's outcome for the default (docs/graph_token.md)
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


def test_the_default_is_nodes10_plus_the_compact_prompt():
    """The CPU budget is written in both files: a change to default.yaml not made in nodes10.yaml fails."""
    assert _differ(_preset("nodes10"), _preset("default")) == COMPACT
    assert _preset("default")["data"]["max_prompt_tokens"] == _preset("nodes10")["data"]["max_prompt_tokens"] == 288


def test_the_diff_tells_a_drifted_budget():  # a negative control of the check above
    drifted = _preset("default")
    drifted["trainer"]["max_steps"] = 60
    assert _differ(_preset("nodes10"), drifted) == {**COMPACT, "trainer.max_steps": 60}


def test_both_load_by_name_and_their_budgets_hold_together():
    from qgmem.job import resolved_config

    default = resolved_config(["--config", "default"])
    nodes10 = resolved_config(["--config", "nodes10"])
    assert resolved_config([]) == default  # python train.py reads the default preset
    assert _differ(nodes10, default) == {**COMPACT, "model.stages": RESOLVED_STAGES}
    # the text budget is the top m of the graph's k units, and the readout holds one token per unit besides the pooled one
    k = default["data"]["activation"]["k"]
    assert default["data"]["memory_units"] == 3 <= k == 10
    assert default["model"]["num_graph_tokens"] == 1 + k
    # the former default: every unit as text, one token per node after the pooled one
    assert nodes10["data"]["memory_units"] is None and nodes10["model"]["readout"] == "summary_nodes"
    assert nodes10["model"]["num_graph_tokens"] == 17
    assert [st["class_path"] for st in nodes10["model"]["stages"]] == ["qgmem.training.stages.NodeWordAlignment"]
