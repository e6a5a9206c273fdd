"""The config hub: presets by name, one copy each (the repository's configs/), shipped in a wheel."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from qgmem.configs import preset_names, preset_path, resolve_config

REPO = Path(__file__).resolve().parents[2]
ROOT_CONFIGS = sorted((REPO / "configs").glob("*.yaml"))


def test_every_repository_config_is_a_preset():
    assert preset_names() == sorted(p.stem for p in ROOT_CONFIGS)
    assert {"default", "qwen3_8b"} <= set(preset_names())


@pytest.mark.parametrize("config", ROOT_CONFIGS, ids=lambda p: p.name)
def test_preset_is_the_repository_file_itself(config):
    assert preset_path(config.stem).samefile(config)  # one source of truth, no diverging copy
    assert preset_path(config.name) == preset_path(config.stem)


def test_resolve_keeps_paths_and_maps_names(tmp_path):
    own = tmp_path / "mine.yaml"
    own.write_text("trainer: {}\n")
    assert resolve_config(str(own)) == str(own)
    assert resolve_config("missing/dir/x.yaml") == "missing/dir/x.yaml"  # a path: the parser reports it
    assert Path(resolve_config("qwen3_8b")).samefile(REPO / "configs" / "qwen3_8b.yaml")


def test_unknown_preset_names_the_value_and_the_presets():
    with pytest.raises(FileNotFoundError, match=r"'qwen9'.*default, nodes10, qwen3_8b"):
        resolve_config("qwen9")


def test_a_retired_preset_is_refused_saying_what_replaced_it():
    with pytest.raises(FileNotFoundError, match=r"preset 'compact' was retired: .*--config default.*--config nodes10"):
        resolve_config("compact")


@pytest.mark.slow
def test_wheel_ships_presets_as_files(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path)], check=True, cwd=tmp_path)
    wheel = zipfile.ZipFile(next(tmp_path.glob("qgmem-*.whl")))
    for config in ROOT_CONFIGS:
        assert wheel.read(f"qgmem/configs/{config.name}") == config.read_bytes()
