"""Non-finite guard: a NaN sample stops the run (or skips its steps), a NaN val/nll is never best, no NaN export."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch import Trainer

from qgmem.lm import EMBEDDED_LM
from qgmem.model.encoder import EncoderConfig
from qgmem.model.random_lm import save_random_lm
from qgmem.job import main
from qgmem.training.datamodule import InMemoryDataModule, QGMemDataModule, synthetic_items
from qgmem.training.guard import FiniteModelCheckpoint, NonFiniteError, NonFiniteGuard
from qgmem.training.module import GenerationSettings, QGMemModule

D = 8
POISONED = "synthetic#3"  # the training sample that gets one NaN node feature


def poisoned(items: list[dict], qa_id: str, value: float = float("nan")) -> list[dict]:
    """``items`` with one node feature of sample ``qa_id`` set to ``value`` (the issue's fault)."""
    for item in items:
        if item["qa_id"] == qa_id:
            item["graph"].x[0, 0] = value
    return items


class PoisonedData(InMemoryDataModule):
    """Six synthetic training samples, one of them with a NaN (``where``: ``train`` or ``val``)."""

    def __init__(self, lm: str = EMBEDDED_LM, where: str = "train", value: str = "nan"):
        train, val, test = (synthetic_items(n, D, seed=s) for n, s in ((6, 1), (4, 2), (4, 3)))
        poisoned(train if where == "train" else val, POISONED, float(value))
        super().__init__(train, val, test, lm=lm, batch_size=2, max_prompt_tokens=96, max_answer_tokens=8)


@pytest.fixture(scope="module")
def lm_path(tmp_path_factory):
    return str(save_random_lm(tmp_path_factory.mktemp("lm") / "tiny", hidden_size=32, layers=2))


def args(root: Path, lm_path: str, *extra: str) -> list[str]:
    config = root.parent / "tiny.yaml"
    config.write_text(
        "trainer:\n  accelerator: cpu\n  devices: 1\n  max_steps: 4\n  val_check_interval: 2\n"
        "  check_val_every_n_epoch: null\n  num_sanity_val_steps: 0\n  enable_progress_bar: false\n"
        "  enable_model_summary: false\n  log_every_n_steps: 1\n"
        "model:\n  encoder: {hidden: 16, heads: 2, layers: 2, dropout: 0.0}\n  generation: {max_new_tokens: 3}\n"
        "  features: text\n  readout: mean\n  num_graph_tokens: 1\n  stages: []\n"
        "lr_scheduler: {class_path: qgmem.training.schedule.WarmupCosine, init_args: {warmup_steps: 1}}\n")
    return ["--config", str(config), "--trainer.default_root_dir", str(root), "--model.lm", lm_path, *extra]


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_nan_feature_stops_the_run_naming_the_sample_and_exports_nothing(lm_path, tmp_path, value, caplog):
    root = tmp_path / "run"
    with pytest.raises(NonFiniteError, match=rf"non-finite training loss .*at step \d+.*{POISONED}") as info:
        main(args(root, lm_path, "--data.value", value), datamodule_class=PoisonedData)
    assert "nonfinite.action=skip" in str(info.value)
    assert POISONED in caplog.text  # also logged, with the batch's ids
    assert not (root / "export").exists() and not (root / "metrics.json").exists()
    for ckpt in (root / "checkpoints").glob("*.ckpt"):  # whatever was saved before the bad step is finite
        state = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
        assert all(torch.isfinite(v).all() for v in state.values())


def test_skip_counts_the_bad_steps_and_keeps_the_weights_finite(lm_path, tmp_path):
    root = tmp_path / "run"
    metrics = main(args(root, lm_path, "--nonfinite.action", "skip", "--nonfinite.max_skipped", "4"),
                   datamodule_class=PoisonedData)
    skipped = metrics["nonfinite"]["skipped_steps"]
    # 6 samples in batches of 2 over 4 steps: the poisoned one is in 1 or 2 of them (epoch 0, maybe epoch 1)
    assert 1 <= len(skipped) <= 2 and all(POISONED in s["qa_ids"] and "loss nan" in s["what"] for s in skipped)
    assert metrics["nonfinite"]["action"] == "skip"
    assert json.loads((root / "metrics.json").read_text())["nonfinite"]["skipped_steps"] == skipped
    from safetensors.torch import load_file

    weights = load_file(root / "export" / "graph_encoder.safetensors")
    assert weights and all(torch.isfinite(t).all() for t in weights.values())


def test_skip_stops_once_more_than_max_skipped(lm_path, tmp_path):
    with pytest.raises(NonFiniteError, match=r"1 training steps had a non-finite .* more than nonfinite.max_skipped=0"):
        main(args(tmp_path / "run", lm_path, "--nonfinite.action", "skip", "--nonfinite.max_skipped", "0"),
             datamodule_class=PoisonedData)


def test_a_nan_val_nll_is_never_the_best_checkpoint(lm_path, tmp_path):
    root = tmp_path / "run"
    with pytest.raises(NonFiniteError, match=r"every validation gave a non-finite val/nll \(steps \[2, 4\]\)"):
        main(args(root, lm_path, "--data.where", "val"), datamodule_class=PoisonedData)
    saved = sorted(p.name for p in (root / "checkpoints").glob("*.ckpt"))
    assert saved == ["last.ckpt"] and not (root / "export").exists()


def test_checkpoint_top_k_takes_finite_scores_only():
    callback = FiniteModelCheckpoint(monitor="val/nll", mode="min", save_top_k=1)
    trainer = SimpleNamespace(global_step=7)
    assert not callback.check_monitor_top_k(trainer, torch.tensor(float("nan")))
    assert not callback.check_monitor_top_k(trainer, torch.tensor(float("-inf")))
    assert callback.check_monitor_top_k(trainer, torch.tensor(3.5))  # nothing in the top-k yet
    assert [r["step"] for r in callback.rejected] == [7, 7] and callback.rejected[1]["value"] == float("-inf")


def test_a_nonfinite_gradient_with_a_finite_loss_is_caught(lm_path, tmp_path):
    module = QGMemModule(lm=lm_path, feature_dim=D, encoder=EncoderConfig(hidden=16, heads=2, layers=2, dropout=0.0),
                         generation=GenerationSettings(max_new_tokens=3), features="text", readout="mean", num_graph_tokens=1, stages=[],
                         lr_scheduler={"class_path": "qgmem.training.schedule.WarmupCosine",
                                                         "init_args": {"warmup_steps": 1}})
    name, param = next(iter(module.net.named_parameters()))
    param.register_hook(lambda grad: torch.full_like(grad, float("inf")))
    data = QGMemDataModule.from_items(synthetic_items(4, D, seed=1), lm=lm_path, batch_size=2, max_prompt_tokens=96,
                                      max_answer_tokens=8)
    trainer = Trainer(accelerator="cpu", devices=1, max_steps=2, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, limit_val_batches=0,
                      default_root_dir=tmp_path, callbacks=[NonFiniteGuard()])
    with pytest.raises(NonFiniteError, match=rf"gradient of net\.{name} at step 0.*synthetic#"):
        trainer.fit(module, datamodule=data)


def test_skip_leaves_weights_and_optimizer_state_untouched(lm_path, tmp_path):
    module = QGMemModule(lm=lm_path, feature_dim=D, encoder=EncoderConfig(hidden=16, heads=2, layers=2, dropout=0.0),
                         generation=GenerationSettings(max_new_tokens=3), features="text", readout="mean", num_graph_tokens=1, stages=[],
                         lr_scheduler={"class_path": "qgmem.training.schedule.WarmupCosine",
                                                         "init_args": {"warmup_steps": 1}})
    before = {k: v.clone() for k, v in module.net.state_dict().items()}
    train = poisoned(synthetic_items(2, D, seed=1), "synthetic#0")  # every batch holds the NaN sample
    data = QGMemDataModule.from_items(train, lm=lm_path, batch_size=2, max_prompt_tokens=96, max_answer_tokens=8)
    guard = NonFiniteGuard(action="skip", max_skipped=5)
    trainer = Trainer(accelerator="cpu", devices=1, max_steps=3, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, limit_val_batches=0,
                      default_root_dir=tmp_path, callbacks=[guard])
    trainer.fit(module, datamodule=data)
    assert [s["step"] for s in guard.skipped] == [0, 1, 2] and trainer.global_step == 3
    after = module.net.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not trainer.optimizers[0].state  # AdamW never stepped a parameter


@pytest.mark.parametrize("kwargs,message", [({"action": "retry"}, "must be 'stop' or 'skip'"),
                                            ({"max_skipped": -1}, "max_skipped must be >= 0")])
def test_guard_settings_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        NonFiniteGuard(**kwargs)
