"""``train.py`` flow (LightningCLI): config + overrides → fit → best checkpoint → test → metrics.json → export."""

from __future__ import annotations

import json
import re
from pathlib import Path

import lightning as L
import pytest
import torch

from qgmem.lm import EMBEDDED_LM
from qgmem.model.random_lm import save_random_lm
from qgmem.training.cli import main
from qgmem.training.datamodule import QGMemDataModule, synthetic_items

REPO = Path(__file__).resolve().parents[2]


class TinyData(QGMemDataModule):
    """Synthetic items behind the real data module's loaders (no memory building, no cache)."""

    def __init__(self, lm: str = EMBEDDED_LM, n_train: int = 6, n_eval: int = 4, feature_dim: int = 8,
                 batch_size: int = 2):
        L.LightningDataModule.__init__(self)
        built = QGMemDataModule.from_items(synthetic_items(n_train, feature_dim, seed=1),
                                           synthetic_items(n_eval, feature_dim, seed=2),
                                           synthetic_items(n_eval, feature_dim, seed=3), lm=lm,
                                           batch_size=batch_size, max_prompt_tokens=96, max_answer_tokens=8)
        self.__dict__.update({k: v for k, v in built.__dict__.items() if k != "_hparams"})


@pytest.fixture(scope="module")
def lm_path(tmp_path_factory):
    return str(save_random_lm(tmp_path_factory.mktemp("lm") / "tiny", hidden_size=32, layers=2))


def tiny_args(root: Path, lm_path: str, *extra: str) -> list[str]:
    config = root.parent / "tiny.yaml"
    config.write_text(
        "trainer:\n  accelerator: cpu\n  devices: 1\n  max_steps: 3\n  val_check_interval: 2\n"
        "  check_val_every_n_epoch: null\n  num_sanity_val_steps: 0\n  enable_progress_bar: false\n"
        "  enable_model_summary: false\n  log_every_n_steps: 1\n"
        "model:\n  encoder: {hidden: 16, heads: 2, layers: 2, dropout: 0.0}\n  max_new_tokens: 3\n  warmup_steps: 1\n")
    return ["--config", str(config), "--trainer.default_root_dir", str(root), "--model.lm", lm_path, *extra]


def test_train_runs_fit_test_export_and_resumes(lm_path, tmp_path, capsys):
    root = tmp_path / "run"
    metrics = main(tiny_args(root, lm_path, "--model.encoder.layers", "3"), datamodule_class=TinyData)
    out = capsys.readouterr().out
    assert "best checkpoint:" in out and str(root / "export") in out
    saved = json.loads((root / "metrics.json").read_text())
    assert saved["val"] == metrics["val"] and {"val/nll", "val/em", "val/f1"} <= set(saved["val"])
    assert {"test/nll", "test/em", "test/f1"} <= set(saved["test"])
    assert saved["val"]["val/nll"] == pytest.approx(saved["best_score"])  # the best checkpoint's validation
    assert saved["best_checkpoint"].startswith(str(root / "checkpoints"))
    assert (root / "checkpoints" / "last.ckpt").is_file() and any((root / "lightning_logs").rglob("events.*"))
    config = json.loads((root / "export" / "config.json").read_text())
    assert config["graph_token"]["encoder"]["layers"] == 3 and config["graph_token"]["feature_dim"] == 8
    assert config["metrics"]["test"] == saved["test"] and config["lm"]["id"] == lm_path
    # the prompt contract is set on the data side and reaches the export through the model
    assert config["prompt"]["max_prompt_tokens"] == 96 and config["prompt"]["max_answer_tokens"] == 8

    again = main(tiny_args(root, lm_path, "--model.encoder.layers", "3", "--trainer.max_steps", "5",
                           "--ckpt_path", "last"), datamodule_class=TinyData)
    last = torch.load(root / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert last["global_step"] == 5 and again["test"]


@pytest.mark.parametrize("config,expected", [("default.yaml", "embedded:SmolLM2-135M-Instruct"),
                                             ("qwen3_8b.yaml", "Qwen/Qwen3-8B")])
def test_shipped_configs_parse(config, expected, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", str(REPO / "configs" / config), "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = capsys.readouterr().out
    assert printed.count(f"lm: {expected}") == 1  # model.lm; data.lm is linked to it, so not printed
    assert "feature_dim" not in printed  # linked from the data module when it is built


def test_command_line_overrides_reach_the_classes(capsys):
    with pytest.raises(SystemExit):
        main(["--config", str(REPO / "configs" / "default.yaml"), "--trainer.devices", "8",
              "--model.encoder.layers", "3", "--model.lm", "some/other-lm", "--print_config"])
    printed = capsys.readouterr().out
    assert re.search(r"devices: '?8'?\n", printed) and "layers: 3" in printed
    assert printed.count("lm: some/other-lm") == 1 and "construction_llm" in printed


def test_data_summary_lines_report_kept_samples_fallback_and_left_out_categories():
    from qgmem.training.cli import data_summary_lines

    summary = {
        "cache_key": "abc",
        "filter": {"rule": "none", "totals": {"train": {"kept": 32, "samples": 42}, "val": {"kept": 9, "samples": 9}},
                   "left_out_categories": {"preference_evidence": "reference is a grading rubric"}},
        "split": {"group_key": "person", "group_key_used": "dialogue"},
    }
    lines = data_summary_lines(summary)
    assert lines[0] == "data:  samples kept (of built) train 32/42, val 9/9; answer filter 'none'; cache abc"
    assert "grouped by 'dialogue' instead of 'person'" in lines[1]
    assert lines[2] == "data:  preference_evidence: reference is a grading rubric"
    assert data_summary_lines({}) == []
