"""One home per default: the signatures hold the defaults, a preset only what differs from them."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any

import pytest
import yaml

from qgmem.job import resolved_config

REPO = Path(__file__).resolve().parents[2]
PRESETS = sorted((REPO / "configs").glob("*.yaml"))
#: keys only the stage subcommands have (Lightning's own ``weights_only`` of validate/test/fit)
SUBCOMMAND_ONLY = {"weights_only"}


@pytest.fixture(scope="module")
def signature_defaults() -> dict[str, Any]:
    return resolved_config(default_config=None)


def restated(preset: dict[str, Any], defaults: dict[str, Any], prefix: str = "") -> list[str]:
    """Keys of ``preset`` (nested, dotted) whose value is the default's own."""
    found = []
    for key, value in preset.items():
        name = f"{prefix}{key}"
        if key not in defaults or key == "class_path":  # which class the init_args are for, not a value
            continue
        default = defaults[key]
        if isinstance(value, dict) and isinstance(default, dict):
            found += restated(value, default, name + ".")
        elif _same(value, default):
            found.append(name)
    return found


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return float(a) == float(b)
    return a == b


def test_restated_finds_a_default_written_twice(signature_defaults):
    """Positive and negative control of the check below."""
    preset = {"model": {"graph_mode": "token", "generation": {"max_new_tokens": 7}, "encoder": {"hidden": 256, "layers": 3}},
              "trainer": {"max_steps": 30}, "data": {"split_ratios": [0.7, 0.15, 0.15]},
              "optimizer": {"class_path": "torch.optim.AdamW", "init_args": {"lr": 1e-3}}}
    assert restated(preset, signature_defaults) == ["model.graph_mode", "model.encoder.hidden", "data.split_ratios",
                                                    "optimizer.init_args.lr"]
    assert restated({"optimizer": {"class_path": "torch.optim.AdamW", "init_args": {"lr": 2e-4}}},
                    signature_defaults) == []


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.name)
def test_no_preset_restates_a_signature_default(preset, signature_defaults):
    assert restated(yaml.safe_load(preset.read_text()), signature_defaults) == []


def test_fit_without_config_is_train_py():
    """``qgmem fit`` without ``--config`` trains the model ``python train.py`` trains."""
    job = resolved_config()
    fit = resolved_config(subcommand="fit")
    assert {k: v for k, v in fit.items() if k not in SUBCOMMAND_ONLY} == job
    assert job["model"]["features"] == "node_words" and job["trainer"]["max_steps"] == 30  # a real config


def _signature_defaults(obj) -> dict[str, Any]:
    if dataclasses.is_dataclass(obj):
        out = {}
        for f in dataclasses.fields(obj):
            if f.default is not dataclasses.MISSING:
                out[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                out[f.name] = f.default_factory()
        return out
    return {p.name: p.default for p in inspect.signature(obj).parameters.values()
            if p.default is not inspect.Parameter.empty}


def conflicting_defaults(objects) -> dict[str, dict[str, Any]]:
    """Settings two signatures name alike but default differently (``None`` = "resolved elsewhere")."""
    by_name: dict[str, dict[str, Any]] = {}
    for obj in objects:
        for name, value in _signature_defaults(obj).items():
            if value is not None:
                by_name.setdefault(name, {})[obj.__qualname__] = str(value) if isinstance(value, Path) else value
    return {name: where for name, where in by_name.items() if len({repr(v) for v in where.values()}) > 1}


def test_one_default_per_setting():
    from qgmem.data.convomem import load_convomem
    from qgmem.model.encoder import EncoderConfig
    from qgmem.model.graph_token import GraphTokenConfig
    from qgmem.prompting import PromptSettings
    from qgmem.samples.spec import CacheSpec
    from qgmem.training.datamodule import InMemoryDataModule, QGMemDataModule
    from qgmem.training.module import QGMemModule

    objects = [QGMemModule, QGMemDataModule, InMemoryDataModule, CacheSpec, PromptSettings, GraphTokenConfig,
               EncoderConfig, load_convomem]
    assert conflicting_defaults(objects) == {}

    def other(max_prompt_tokens: int = 320, lm: str = QGMemModule.__init__.__defaults__[0]):
        pass  # a negative control: a second default of max_prompt_tokens is found, a shared one is not

    assert set(conflicting_defaults([*objects, other])) == {"max_prompt_tokens"}
