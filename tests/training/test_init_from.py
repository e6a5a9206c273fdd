"""``--model.init_from``: start encoder + projector from an export or from the alignment stage's weights."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch import Trainer, seed_everything
from safetensors.torch import load_file

from qgmem.errors import UserError
from qgmem.export import WEIGHTS_FILE, export_checkpoint
from qgmem.model.encoder import EncoderConfig
from qgmem.model.pretrained import ExportFormatError
from qgmem.model.random_lm import save_random_lm
from qgmem.training.datamodule import QGMemDataModule
from qgmem.training.module import GenerationSettings, QGMemModule
from qgmem.training.stages import NodeWordAlignment
from qgmem.training.synthetic import synthetic_items

D = 8
NET = dict(feature_dim=D, encoder=EncoderConfig(hidden=16, heads=2, layers=1, dropout=0.0), features="node_words",
           readout="nodes", num_graph_tokens=3, generation=GenerationSettings(max_new_tokens=2, val_generate_batches=0), stages=[])


@pytest.fixture(scope="module")
def lm_path(tmp_path_factory):
    return str(save_random_lm(tmp_path_factory.mktemp("lm") / "tiny", hidden_size=32, layers=1))


def data(lm_path):
    return QGMemDataModule.from_items(synthetic_items(4, D, seed=1), synthetic_items(2, D, seed=2), lm=lm_path,
                                      batch_size=2, max_prompt_tokens=96, max_answer_tokens=8)


def fit(module, lm_path, root, max_steps):
    trainer = Trainer(accelerator="cpu", devices=1, max_steps=max_steps, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=root, num_sanity_val_steps=0, limit_val_batches=0)
    trainer.fit(module, datamodule=data(lm_path))
    return trainer


@pytest.fixture(scope="module")
def trained(lm_path, tmp_path_factory):
    """A run with the alignment stage (2 steps) and 2 answer steps, exported."""
    root = tmp_path_factory.mktemp("run")
    seed_everything(0)
    module = QGMemModule(lm=lm_path, **{**NET, "stages": [NodeWordAlignment(steps=2, weight=0.0)]})
    trainer = fit(module, lm_path, root, max_steps=2)
    ckpt = root / "model.ckpt"
    trainer.save_checkpoint(ckpt)
    return root, export_checkpoint(ckpt, root / "export", {}), module


def test_an_export_round_trips_through_zero_steps(lm_path, trained, tmp_path):
    _, export, _ = trained
    exported = load_file(str(export / WEIGHTS_FILE))
    seed_everything(1)  # another initialisation, which init_from replaces
    module = QGMemModule(lm=lm_path, init_from=str(export), **NET)
    fresh = QGMemModule(lm=lm_path, **NET)
    assert any(not torch.equal(v, exported[k]) for k, v in fresh.net.state_dict().items())  # a control
    fit(module, lm_path, tmp_path, max_steps=0)
    state = module.net.state_dict()
    assert set(state) == set(exported)
    assert all(torch.equal(state[k], exported[k]) for k in exported)


def test_the_alignment_stage_saves_what_a_later_run_starts_from(lm_path, trained):
    root, _, first = trained
    saved = root / "alignment" / WEIGHTS_FILE
    assert first.alignment_result["weights"] == str(saved) and saved.is_file()
    module = QGMemModule(lm=lm_path, init_from=str(saved), **NET)
    weights = load_file(str(saved))
    assert all(torch.equal(module.net.state_dict()[k], weights[k]) for k in weights)
    # the stage's output, not the end of the run: answer steps moved the weights after it
    assert any(not torch.equal(first.net.state_dict()[k], weights[k]) for k in weights)


def test_another_shape_names_the_tensor_and_the_field(lm_path, trained):
    _, export, _ = trained
    wider = {**NET, "encoder": EncoderConfig(hidden=24, heads=2, layers=1, dropout=0.0)}
    with pytest.raises(ExportFormatError, match=r"encoder\.hidden.*= 24.*'.*' has size 16"):
        QGMemModule(lm=lm_path, init_from=str(export), **wider)


def test_a_missing_file_is_a_user_error(lm_path, tmp_path):
    with pytest.raises(UserError, match="init_from"):
        QGMemModule(lm=lm_path, init_from=str(tmp_path / "nothing"), **NET)


def test_a_checkpoint_loads_after_its_starting_weights_are_gone(lm_path, trained, tmp_path):
    import shutil

    _, export, _ = trained
    start = tmp_path / "start"
    shutil.copytree(export, start)
    module = QGMemModule(lm=lm_path, init_from=str(start), **NET)
    trainer = fit(module, lm_path, tmp_path / "run", max_steps=1)
    ckpt = tmp_path / "run.ckpt"
    trainer.save_checkpoint(ckpt)
    assert torch.load(ckpt, weights_only=True)["hyper_parameters"]["init_from"] == str(start)  # kept as a record
    shutil.rmtree(start)
    loaded = QGMemModule.load_from_checkpoint(ckpt, weights_only=True)
    state = loaded.net.state_dict()
    assert all(torch.equal(state[k], v) for k, v in module.net.state_dict().items())
    with pytest.raises(UserError, match="init_from"):  # asked for explicitly, the missing file still counts
        QGMemModule.load_from_checkpoint(ckpt, weights_only=True, init_from=str(start))
