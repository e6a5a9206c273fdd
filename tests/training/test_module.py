"""QGMemModule over a tiny random LM: frozen LM, graph modes, checkpoints without the LM, resume, DDP."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from qgmem.model.encoder import EncoderConfig
from qgmem.model.random_lm import save_random_lm
from qgmem.training.datamodule import QGMemDataModule
from qgmem.training.synthetic import synthetic_items
from qgmem.training.module import GenerationSettings, QGMemModule
from qgmem.training.stages import NodeWordAlignment

D = 8
ENC = EncoderConfig(hidden=16, heads=2, layers=2, dropout=0.0)
def warmup(steps: int, **init_args) -> dict:
    return {"class_path": "qgmem.training.schedule.WarmupCosine", "init_args": {"warmup_steps": steps, **init_args}}


#: the paper's network, not the defaults
PAPER = dict(features="text", readout="mean", num_graph_tokens=1, stages=[])


@pytest.fixture(scope="module")
def lm_path(tmp_path_factory):
    return str(save_random_lm(tmp_path_factory.mktemp("lm") / "tiny", hidden_size=32, layers=2))


def make_module(lm_path, **kwargs) -> QGMemModule:
    seed_everything(0)
    defaults = dict(lm=lm_path, feature_dim=D, encoder=ENC, generation=GenerationSettings(max_new_tokens=3, val_generate_batches=1),
                    lr_scheduler=warmup(1), **PAPER)
    return QGMemModule(**{**defaults, **kwargs})


def make_data(lm_path, n_train=8, n_eval=4, batch_size=2) -> QGMemDataModule:
    return QGMemDataModule.from_items(synthetic_items(n_train, D, seed=1), synthetic_items(n_eval, D, seed=2),
                                      synthetic_items(n_eval, D, seed=3), lm=lm_path, batch_size=batch_size,
                                      max_prompt_tokens=96, max_answer_tokens=8)


def a_batch(lm_path, module, n=3):
    data = make_data(lm_path, n_train=n, batch_size=n)
    data.setup("fit")
    return next(iter(data.train_dataloader()))


def trainer(root, **kwargs) -> Trainer:
    ckpt = ModelCheckpoint(dirpath=root / "checkpoints", monitor="val/nll", mode="min", save_last=True,
                           filename="best-{step}")
    defaults = dict(accelerator="cpu", devices=1, max_steps=4, val_check_interval=2, check_val_every_n_epoch=None,
                    num_sanity_val_steps=0, enable_progress_bar=False, enable_model_summary=False,
                    default_root_dir=root, callbacks=[ckpt], log_every_n_steps=1)
    return Trainer(**{**defaults, **kwargs})


@pytest.mark.parametrize("graph_mode", ["token", "shuffled"])
def test_only_encoder_and_projector_get_gradients(lm_path, graph_mode):
    module = make_module(lm_path, graph_mode=graph_mode)
    module.train()
    assert module.net.training and not module.lm.training
    loss = module(a_batch(lm_path, module))
    loss.backward()
    assert loss.ndim == 0 and torch.isfinite(loss)
    assert all(p.grad is None for p in module.lm.parameters())
    assert all(not p.requires_grad for p in module.lm.parameters())
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in module.net.parameters())


def test_text_only_ablation_inserts_nothing(lm_path):
    module = make_module(lm_path, graph_mode="none")
    batch = a_batch(lm_path, module)
    embeds, mask, _, labels, _ = module.fused_inputs(batch)
    assert embeds.shape[1] == batch["input_ids"].shape[1] and torch.equal(labels, batch["labels"])
    with_token = make_module(lm_path, graph_mode="token").fused_inputs(batch)[0]
    assert with_token.shape[1] == batch["input_ids"].shape[1] + 1
    assert not module(batch).requires_grad  # nothing upstream of the loss trains
    assert module.training_step(batch, 0) is None  # so the optimizer step is skipped


def test_text_only_fit_runs_its_steps(lm_path, tmp_path):
    t = trainer(tmp_path, max_steps=3, max_epochs=5)
    t.fit(make_module(lm_path, graph_mode="none"), datamodule=make_data(lm_path))
    assert t.global_step == 3 and "val/nll" in t.callback_metrics



def test_sample_nll_weighted_by_answer_tokens_is_the_batch_nll(lm_path):
    module = make_module(lm_path).eval()
    batch = a_batch(lm_path, module, n=3)
    per_row, counts = module.sample_nll(batch)
    assert per_row.shape == (3,) and counts.shape == (3,) and bool((counts > 0).all())
    torch.testing.assert_close((per_row * counts).sum() / counts.sum(), module(batch))


@pytest.mark.parametrize("path,expected", [("torch.optim.AdamW", torch.optim.AdamW), ("SGD", torch.optim.SGD),
                                           ("torch.optim.Adam", torch.optim.Adam)])
def test_optimizer_is_a_class_path_with_init_args(lm_path, path, expected):
    init = {"lr": 0.02, "weight_decay": 0.5, **({"momentum": 0.9} if expected is torch.optim.SGD else {})}
    module = make_module(lm_path, optimizer={"class_path": path, "init_args": init})
    optimizer = module.configure_optimizers()["optimizer"]
    assert type(optimizer) is expected
    group = optimizer.param_groups[0]
    assert group["weight_decay"] == 0.5 and group["initial_lr"] == 0.02
    assert sum(p.numel() for p in group["params"]) == sum(p.numel() for p in module.net.parameters())
    if expected is torch.optim.SGD:
        assert group["momentum"] == 0.9


def test_default_schedule_is_transformers_cosine_warmup_to_a_tenth(lm_path):
    """The default run's schedule, as a class: the same rates as transformers' ``cosine_with_min_lr``."""
    from transformers import get_scheduler

    module = make_module(lm_path, optimizer={"class_path": "torch.optim.AdamW", "init_args": {"lr": 1.0}},
                         lr_scheduler=warmup(2))
    module._trainer = type("T", (), {"estimated_stepping_batches": 10})()  # a run of 10 optimizer steps
    config = module.configure_optimizers()
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    assert config["lr_scheduler"]["interval"] == "step" and scheduler.total_steps == 10
    reference = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    expected = get_scheduler("cosine_with_min_lr", reference, num_warmup_steps=2, num_training_steps=10,
                             scheduler_specific_kwargs={"min_lr_rate": 0.1})
    lrs, want = [], []
    for _ in range(11):
        lrs.append(optimizer.param_groups[0]["lr"])
        want.append(reference.param_groups[0]["lr"])
        optimizer.step(), reference.step()
        scheduler.step(), expected.step()
    assert lrs == pytest.approx(want, abs=1e-12)
    assert lrs[:3] == pytest.approx([0.0, 0.5, 1.0])  # linear warm-up over 2 steps
    assert lrs[10] == pytest.approx(0.1) and all(a >= b for a, b in zip(lrs[2:], lrs[3:]))


@pytest.mark.parametrize("kwargs,match", [({"optimizer": {"class_path": "AdamWW"}}, "AdamWW"),
                                          ({"optimizer": {"class_path": "torch.nn.Linear"}}, "Linear"),
                                          ({"optimizer": "AdamW"}, "class_path"),
                                          ({"lr_scheduler": {"class_path": "cosine_typo"}}, "cosine_typo")])
def test_unknown_optimizer_or_schedule_fails_at_construction(lm_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_module(lm_path, **kwargs)


def test_shuffled_pairs_each_sample_with_another_graph(lm_path):
    module = make_module(lm_path, graph_mode="shuffled").eval()
    batch = a_batch(lm_path, module)
    graphs = batch["graph"].to_data_list()
    shuffled = module.graph_tokens(batch["graph"])
    own = torch.cat([module.net(g) for g in graphs])
    torch.testing.assert_close(shuffled, own.roll(-1, 0), atol=1e-5, rtol=1e-5)  # sample i gets graph i + 1
    assert not torch.allclose(shuffled, own, atol=1e-3)
    # a batch of one gets the empty graph, as in serving
    from torch_geometric.data import Batch

    from qgmem.model.graph_modes import empty_graph

    alone = module.graph_tokens(Batch.from_data_list(graphs[:1]))
    torch.testing.assert_close(alone, module.net(empty_graph(D, facts=True)), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(alone, own[:1], atol=1e-3)


def test_gradient_checkpointing_keeps_loss_and_gradients(lm_path):
    batch = a_batch(lm_path, None)
    results, mlp_calls, prefix_runs = [], [], []
    for flag in (False, True):
        module = make_module(lm_path, gradient_checkpointing=flag)
        module.train()
        assert not any(m.training for m in module.lm.modules() if not getattr(m, "gradient_checkpointing", False))
        calls = []
        module.lm.model.layers[0].mlp.register_forward_pre_hook(lambda *_: calls.append(1))
        loss = module(batch)
        loss.backward()
        mlp_calls.append(len(calls))
        prefix_runs.append(int(module.shared_prefix(batch) > 0))  # the shared head runs once, on its own
        results.append((loss.detach(), [p.grad.clone() for p in module.net.parameters()]))
    assert prefix_runs == [1, 0]  # no head cache under checkpointing
    assert mlp_calls == [1 + 1, 2]  # head + rest without checkpointing; forward + recompute with it
    torch.testing.assert_close(results[0][0], results[1][0], atol=1e-5, rtol=1e-5)
    for g0, g1 in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(g0, g1, atol=1e-6, rtol=1e-4)


def test_lora_trains_adapters_and_keeps_base_frozen(lm_path):
    module = make_module(lm_path, lora={"r": 2, "alpha": 4, "target_modules": ["q_proj"]})
    trainable = {n for n, p in module.named_parameters() if p.requires_grad}
    assert any("lora_" in n for n in trainable)
    assert all(n.startswith("net.") or "lora_" in n for n in trainable)
    module.train()
    module(a_batch(lm_path, module)).backward()
    assert any(p.grad is not None for n, p in module.lm.named_parameters() if "lora_B" in n)


def test_fit_selects_checkpoint_without_the_lm_and_resumes(lm_path, tmp_path):
    module, data = make_module(lm_path), make_data(lm_path)
    t = trainer(tmp_path)
    t.fit(module, datamodule=data)
    best = t.checkpoint_callback.best_model_path
    assert best and t.checkpoint_callback.best_model_score is not None
    assert {"train/nll_step", "val/nll", "val/em", "val/f1"} <= set(t.callback_metrics)
    ckpt = torch.load(best, map_location="cpu", weights_only=True)
    assert ckpt["state_dict"] and all(k.startswith("net.") for k in ckpt["state_dict"])
    assert set(ckpt["state_dict"]) == {n for n, _ in module.net.named_parameters(prefix="net")}
    lm_bytes = sum(p.numel() * p.element_size() for p in module.lm.parameters())
    net_bytes = sum(p.numel() * p.element_size() for p in module.net.parameters())
    size = (tmp_path / "checkpoints" / "last.ckpt").stat().st_size
    assert size < 4 * net_bytes + 200_000 < lm_bytes  # weights + Adam moments + small metadata, no LM
    assert ckpt["qgmem_graph_token"]["lm_hidden"] == 32 and ckpt["hyper_parameters"]["encoder"]["layers"] == 2

    # the LM is rebuilt from its id; the graph tokens are the checkpoint's
    restored = QGMemModule.load_from_checkpoint(best).eval()
    batch = a_batch(lm_path, module)
    reference = make_module(lm_path).eval()
    reference.net.load_state_dict({k[4:]: v for k, v in ckpt["state_dict"].items()})
    torch.testing.assert_close(restored.graph_tokens(batch["graph"]), reference.graph_tokens(batch["graph"]))

    # resume from last.ckpt: continues the step count and the optimizer state
    again = trainer(tmp_path, max_steps=6)
    again.fit(make_module(lm_path), datamodule=make_data(lm_path), ckpt_path="last")
    assert again.global_step == 6
    state = again.optimizers[0].state_dict()["state"]
    assert int(next(iter(state.values()))["step"]) == 6


def test_load_refuses_a_checkpoint_of_another_shape(lm_path, tmp_path):
    module = make_module(lm_path)
    t = trainer(tmp_path, max_steps=2)
    t.fit(module, datamodule=make_data(lm_path))
    deeper = make_module(lm_path, encoder=EncoderConfig(hidden=16, heads=2, layers=3, dropout=0.0))
    ckpt = torch.load(t.checkpoint_callback.best_model_path, map_location="cpu", weights_only=True)
    with pytest.raises(KeyError, match="trainable weights"):
        deeper.on_load_checkpoint(ckpt)


class RankWeights(Callback):
    """At the first answer step (after the alignment stage), every rank writes a checksum of its
    graph-token weights and the all-gathered ones, so the test can compare the ranks."""

    def __init__(self, out_dir):
        self.out_dir = str(out_dir)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step != 0 or batch_idx != 0:
            return
        local = torch.stack([p.detach().double().sum() for p in pl_module.net.parameters()]).cpu()
        every = trainer.strategy.all_gather(local.to(pl_module.device)).cpu()
        import json
        import os

        sampler = trainer.train_dataloader.sampler  # the data module's, kept by Lightning under DDP
        with open(os.path.join(self.out_dir, f"rank{trainer.global_rank}.json"), "w") as f:
            json.dump({"local": local.tolist(), "all": every.tolist(), "sampler": type(sampler).__name__,
                       "share": list(sampler)}, f)


@pytest.mark.slow
@pytest.mark.parametrize("settings", [{}, {"features": "node_words", "readout": "nodes", "num_graph_tokens": 3,
                                          "stages": [NodeWordAlignment(steps=2, weight=0.5)]}], ids=["paper", "aligned"])
def test_two_process_ddp_spawn_selects_a_checkpoint(lm_path, tmp_path, settings, capfd):
    """Also with the alignment stage, whose result rank 0 broadcasts before the first answer step.

    Every epoch-level value is logged as a mean over the ranks: Lightning's advice to use ``sync_dist``
    (printed by the spawned ranks, 21 times for these two runs before the logging was fixed) never shows.
    """
    module, data = make_module(lm_path, **settings), make_data(lm_path, n_train=8, n_eval=4)
    t = trainer(tmp_path, strategy="ddp_spawn", devices=2, max_steps=2, val_check_interval=1)
    t.callbacks.append(RankWeights(tmp_path))
    t.fit(module, datamodule=data)
    best = t.checkpoint_callback.best_model_path
    assert best and torch.load(best, map_location="cpu", weights_only=True)["global_step"] in (1, 2)
    assert t.world_size == 2
    import json

    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["all"] == ranks[1]["all"] and len(ranks[0]["all"]) == 2  # both ranks saw both
    assert ranks[0]["local"] == ranks[1]["local"]  # the same weights on every rank before the first step
    assert ranks[0]["sampler"] == ranks[1]["sampler"] == "EpochRandomSampler"
    assert len(ranks[0]["share"]) == 4 and sorted(ranks[0]["share"] + ranks[1]["share"]) == list(range(8))
    if settings:  # the alignment stage ran (and moved the weights) before the comparison
        assert module.hparams.stages[0]["init_args"]["steps"] == 2
    out, err = capfd.readouterr()
    assert "Trainer.fit" in out + err  # the ranks' own output is captured here (the check can see them)
    assert "sync_dist=True" not in out + err
