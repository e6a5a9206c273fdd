"""The training stages (``model.stages``): records, refusals, and a new recipe without a new module parameter."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from lightning.pytorch import seed_everything

from qgmem.errors import SettingError
from qgmem.model.encoder import EncoderConfig
from qgmem.model.random_lm import save_random_lm
from qgmem.training.datamodule import QGMemDataModule
from qgmem.training.module import QGMemModule
from qgmem.training.stages import (Distillation, MemoryReconstruction, NodeWordAlignment, Stage, as_stage,
                                   check_stages, stage_record)
from qgmem.training.synthetic import synthetic_items

D = 8


@pytest.fixture(scope="module")
def lm_path(tmp_path_factory):
    return str(save_random_lm(tmp_path_factory.mktemp("lm") / "tiny", hidden_size=32, layers=1))


def test_the_module_takes_stages_not_a_parameter_per_recipe():
    params = set(inspect.signature(QGMemModule.__init__).parameters) - {"self"}
    assert len(params) <= 20 and "stages" in params
    assert not {p for p in params if p.startswith(("align_", "distill_", "teacher_"))}


@pytest.mark.parametrize("stage", [NodeWordAlignment(steps=3, weight=0.5), MemoryReconstruction(steps=4, lr=0.01),
                                   Distillation(weight=0.5, topk=8, cache_dir="t")], ids=lambda s: type(s).__name__)
def test_a_stage_s_record_is_plain_data_that_builds_it_again(stage):
    record = stage_record(stage)
    assert record["class_path"] == f"qgmem.training.stages.{type(stage).__name__}"
    assert all(isinstance(v, (int, float, str, type(None))) for v in record["init_args"].values())
    assert as_stage(record) == stage and as_stage(stage) is stage
    assert stage.trains  # says what it trains


def test_when_each_stage_runs():
    assert (NodeWordAlignment().pretrains, NodeWordAlignment().adds_term) == (True, True)
    assert (NodeWordAlignment(steps=0).pretrains, NodeWordAlignment(weight=0.0).adds_term) == (False, False)
    assert (MemoryReconstruction().pretrains, MemoryReconstruction().adds_term) == (True, False)
    assert (Distillation().pretrains, Distillation().adds_term, Distillation.reads_logits) == (False, True, True)


@pytest.mark.parametrize("stages,message", [
    ([NodeWordAlignment(steps=-1)], r"NodeWordAlignment: steps \(-1\) and weight \(5.0\) must be >= 0"),
    ([NodeWordAlignment(steps=0, weight=0.0)], "NodeWordAlignment: steps and weight are both 0"),
    ([NodeWordAlignment(lr=0.0)], "NodeWordAlignment: batch_size must be >= 1 and lr > 0"),
    ([MemoryReconstruction(batch_size=0)], "MemoryReconstruction: steps and batch_size must be >= 1"),
    ([Distillation(weight=0.0)], "Distillation: weight must be > 0"),
    ([Distillation(topk=0)], "Distillation: topk must be >= 1"),
    ([Distillation(), NodeWordAlignment(), Distillation(weight=0.5)], "lists Distillation twice"),
    ([{"class_path": "qgmem.training.module.LoraSettings"}], "'qgmem.training.module.LoraSettings' is not a training stage"),
    ([{"init_args": {"steps": 3}}], r"each stage is \{class_path"),
])
def test_a_bad_stage_is_refused_by_name_before_the_lm_loads(stages, message):
    with pytest.raises(SettingError, match=message):
        QGMemModule(lm="no/such/lm", stages=stages)  # refused before the (missing) LM is looked up
    with pytest.raises(SettingError, match=message):
        check_stages([as_stage(s) for s in stages])


@dataclass
class Constant(Stage):
    """A term of a fixed value: a recipe the module has never heard of."""

    trains: ClassVar[str] = "nothing (a test's)"
    term_name: ClassVar[str] = "constant"
    weight: float = 0.5
    value: float = 2.0

    @property
    def adds_term(self) -> bool:
        return True

    def term(self, module, batch, answer):
        return torch.tensor(self.value)


def test_a_new_stage_plugs_in_without_a_module_parameter(lm_path):
    seed_everything(0)
    module = QGMemModule(lm=lm_path, feature_dim=D, encoder=EncoderConfig(hidden=16, heads=2, layers=1, dropout=0.0),
                         features="text", readout="mean", num_graph_tokens=1, stages=[Constant()])
    assert module.hparams.stages == [{"class_path": f"{__name__}.Constant", "init_args": {"weight": 0.5, "value": 2.0}}]
    data = QGMemDataModule.from_items(synthetic_items(2, D, seed=1), lm=lm_path, batch_size=2, max_prompt_tokens=96,
                                      max_answer_tokens=8)
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    module.train()
    torch.testing.assert_close(module.training_step(batch, 0), module(batch) + 0.5 * 2.0)
    plain = QGMemModule(lm=lm_path, feature_dim=D, encoder=EncoderConfig(hidden=16, heads=2, layers=1, dropout=0.0),
                        features="text", readout="mean", num_graph_tokens=1, stages=[])
    plain.net.load_state_dict(module.net.state_dict())
    plain.train()
    torch.testing.assert_close(plain.training_step(batch, 0), module(batch))  # no stage: the answer loss alone
