"""Distillation from the full-text teacher: the KL term, its alignment with the batch, and training with it."""

from __future__ import annotations

import math

import pytest
import torch
from lightning.pytorch import Trainer, seed_everything

from qgmem.model.encoder import EncoderConfig
from qgmem.model.random_lm import save_random_lm
from qgmem.training.datamodule import QGMemDataModule
from qgmem.training.distill import teacher_targets, topk_kl
from qgmem.training.module import GenerationSettings, QGMemModule
from qgmem.training.stages import Distillation
from qgmem.training.synthetic import synthetic_items
from qgmem.training.teacher import TeacherEntry, build_teacher

D = 8
INF = float("inf")


@pytest.fixture(scope="module")
def lm_path(tmp_path_factory):
    return str(save_random_lm(tmp_path_factory.mktemp("lm") / "tiny", hidden_size=32, layers=2))


def test_kl_is_zero_when_the_student_is_the_teacher_and_positive_otherwise():
    ids, teacher = torch.tensor([[0, 1]]), torch.tensor([[2.0, 0.0]])
    same = topk_kl(torch.tensor([[2.0, 0.0, -INF, -INF]]), ids, teacher)  # all its mass on the teacher's k ids
    assert same.item() == pytest.approx(0.0, abs=1e-7)
    # the same logits on the k ids, mass elsewhere too: KL = -log(the student's mass on the k ids)
    spread = topk_kl(torch.tensor([[2.0, 0.0, 0.0, 0.0]]), ids, teacher)
    assert spread.item() == pytest.approx(-math.log((math.e ** 2 + 1) / (math.e ** 2 + 3)), rel=1e-6)
    # the teacher's probabilities swapped: Σ p (log p − log q) = 2 p0 − 2 p1 = 2 tanh(1)
    swapped = topk_kl(torch.tensor([[0.0, 2.0, -INF, -INF]]), ids, teacher)
    assert swapped.item() == pytest.approx(2 * math.tanh(1.0), rel=1e-6)
    # the mean over answer tokens
    both = topk_kl(torch.tensor([[2.0, 0.0, -INF, -INF], [0.0, 2.0, -INF, -INF]]), ids.repeat(2, 1),
                   teacher.repeat(2, 1))
    assert both.item() == pytest.approx(math.tanh(1.0), rel=1e-6)


def test_teacher_targets_follow_the_batch_answer_tokens():
    a = TeacherEntry(torch.tensor([[1, 2], [3, 4]]), torch.tensor([[1.0, 0.0], [2.0, 0.0]]), torch.tensor([7, 9]))
    b = TeacherEntry(torch.tensor([[5, 6]]), torch.tensor([[3.0, 0.0]]), torch.tensor([8]))
    table = {"a": a, "b": b}
    # the batch holds b then a: row 0 has one answer token, row 1 two
    ids, logits = teacher_targets(table, ["b", "a"], torch.tensor([8, 7, 9]), torch.tensor([0, 1, 1]))
    assert ids.tolist() == [[5, 6], [1, 2], [3, 4]] and logits[:, 0].tolist() == [3.0, 1.0, 2.0]
    with pytest.raises(ValueError, match="'a' holds other answer tokens"):
        teacher_targets(table, ["b", "a"], torch.tensor([8, 7, 6]), torch.tensor([0, 1, 1]))
    with pytest.raises(KeyError, match="'c'"):
        teacher_targets(table, ["c"], torch.tensor([8]), torch.tensor([0]))


def make_module(lm_path, **kwargs) -> QGMemModule:
    seed_everything(0)
    return QGMemModule(lm=lm_path, feature_dim=D, encoder=EncoderConfig(hidden=16, heads=2, layers=2, dropout=0.0),
                       generation=GenerationSettings(max_new_tokens=3, val_generate_batches=1), features="text", readout="mean",
                       num_graph_tokens=1, lr_scheduler={"class_path": "qgmem.training.schedule.WarmupCosine",
                                                         "init_args": {"warmup_steps": 1}}, **{"stages": [], **kwargs})


def make_data(lm_path, n_train=4, batch_size=4) -> QGMemDataModule:
    # the student's text holds no unit (memory_units 0); the teacher reads them all
    return QGMemDataModule.from_items(synthetic_items(n_train, D, seed=1), synthetic_items(2, D, seed=2),
                                      synthetic_items(2, D, seed=3), lm=lm_path, batch_size=batch_size,
                                      max_prompt_tokens=96, max_answer_tokens=8, memory_units=0)


def test_the_distilled_loss_falls_on_a_fixed_batch(lm_path, tmp_path):
    stage = Distillation(weight=2.0, topk=8)
    module = make_module(lm_path, stages=[stage])
    with torch.no_grad():  # a random LM's outputs are near uniform whatever it reads; larger weights make
        for name, weight in module.lm.named_parameters():  # them peaked and sensitive to the input, as trained
            if "norm" not in name:
                weight.mul_(20.0)
    data = make_data(lm_path, n_train=2, batch_size=2)
    data.setup("fit")
    module.adopt_contract(data.answer_contract)
    stage.teacher, _ = build_teacher(module.lm, lm_path, module.tokenizer, module.prompt_encoder.settings,
                                     data.split("train"), topk=8, folder=tmp_path, progress=False)
    batch = next(iter(data.train_dataloader()))
    module.train()

    def losses():
        ce, answer = module.answer_logits(batch)
        return ce, stage.term(module, batch, answer)

    ce, kl = losses()
    torch.testing.assert_close(ce, module(batch))  # the answer loss of the same student forward
    optimizer = torch.optim.Adam(module.net.parameters(), lr=0.05)
    totals, kls = [], []
    for _ in range(12):
        ce, kl = losses()
        total = ce + stage.weight * kl
        optimizer.zero_grad()
        total.backward()
        optimizer.step()
        totals.append(total.item())
        kls.append(kl.item())
    assert totals[-1] < 0.9 * totals[0] and kls[-1] < kls[0] and min(kls) > 0, (totals, kls)


def test_fit_builds_the_teacher_under_the_run_root_and_logs_each_term(lm_path, tmp_path):
    def fit(root):
        trainer = Trainer(accelerator="cpu", devices=1, max_steps=1, limit_val_batches=0, num_sanity_val_steps=0,
                          enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                          logger=False, default_root_dir=root)
        module = make_module(lm_path, stages=[Distillation(weight=0.5, topk=4)])
        trainer.fit(module, datamodule=make_data(lm_path, batch_size=2))
        return trainer, module

    trainer, module = fit(tmp_path)
    assert {"train/nll", "train/kl", "train/loss"} <= set(trainer.callback_metrics)
    assert sorted(module.stages[0].teacher) == [f"synthetic#{i}" for i in range(4)]
    assert len(list((tmp_path / "teacher").glob("*.safetensors"))) == 4
    metrics = trainer.callback_metrics  # the last step's: train/loss = answer NLL + λ · KL
    torch.testing.assert_close(metrics["train/loss"], metrics["train/nll"] + 0.5 * metrics["train/kl"])


@pytest.mark.parametrize("rank", [0, 1])
def test_a_teacher_build_that_fails_on_rank_0_stops_every_rank(lm_path, tmp_path, monkeypatch, rank):
    """Rank 0 builds the cache while the others wait: its failure reaches them through the collective
    they wait in (they raise OtherRankFailed instead of waiting at a barrier until the timeout)."""
    from types import SimpleNamespace

    import qgmem.training.module as M
    import qgmem.training.teacher as T
    from qgmem.ranks import OtherRankFailed

    def broken(*a, **k):
        raise OSError("teacher folder not writable")

    flags: list[bool] = []

    def any_rank(flag, all=True):  # the other rank's word: rank 0 failed
        flags.append(flag)
        return True

    stage = Distillation(weight=0.5, topk=4)
    module = make_module(lm_path, stages=[stage])
    data = make_data(lm_path, batch_size=2)
    data.setup("fit")
    monkeypatch.setattr(T, "build_teacher", broken)
    fake = SimpleNamespace(world_size=2, is_global_zero=rank == 0, default_root_dir=str(tmp_path),
                           strategy=SimpleNamespace(reduce_boolean_decision=any_rank))
    monkeypatch.setattr(M.QGMemModule, "trainer", property(lambda self: fake))
    with pytest.raises(OSError if rank == 0 else OtherRankFailed, match="not writable" if rank == 0 else "rank 0"):
        stage.fit_start(module, data)
    assert flags == [rank == 0]  # rank 0 reported its failure; rank 1 had nothing to report and did not build
    # negative control: nobody failed, every rank reads the cache rank 0 filled
    monkeypatch.setattr(T, "build_teacher", build_teacher)
    fake.is_global_zero, fake.strategy = True, SimpleNamespace(reduce_boolean_decision=lambda flag, all=True: flag)
    stage.fit_start(module, data)
    assert len(stage.teacher) == len(data.split("train"))
