"""``injection: kv_prefix`` in training: its settings, the answer loss, the reconstruction stage and distillation
in a fit, and the export's round trip, over a tiny random Llama with grouped-query attention."""

from __future__ import annotations

import json

import pytest
import torch
from lightning.pytorch import Trainer, seed_everything
from torch_geometric.data import Batch

from qgmem.errors import SettingError
from qgmem.export import CONFIG_FILE, export_checkpoint
from qgmem.model.encoder import EncoderConfig
from qgmem.model.kv_prefix import KVPrefix
from qgmem.model.random_lm import save_random_lm
from qgmem.serving import GraphTokenEncoder
from qgmem.training.datamodule import QGMemDataModule
from qgmem.training.module import GenerationSettings, QGMemModule
from qgmem.training.stages import Distillation, MemoryReconstruction
from qgmem.training.synthetic import synthetic_items

D, LAYERS = 8, 2
ENC = EncoderConfig(hidden=16, heads=2, layers=1, dropout=0.0)
KV = dict(injection="kv_prefix", features="text", readout="summary_units", num_graph_tokens=4, stages=[])
MEMORY = "[M1] The user keeps bees.\n[M2] Ana is the user's sister.\n[M3] The hives stand by the {color} barn."


@pytest.fixture(scope="module")
def lm_path(tmp_path_factory):
    return str(save_random_lm(tmp_path_factory.mktemp("lm") / "tiny", hidden_size=32, layers=LAYERS, heads=4,
                              kv_heads=2))


def items(n: int, seed: int = 1) -> list[dict]:
    out = synthetic_items(n, D, seed=seed)
    for i, item in enumerate(out):
        item["memory_text"] = MEMORY.format(color=["red", "green", "blue", "white"][i % 4])
    return out


def make_module(lm_path, **kwargs) -> QGMemModule:
    seed_everything(0)
    return QGMemModule(**{**dict(lm=lm_path, feature_dim=D, encoder=ENC, generation=GenerationSettings(max_new_tokens=3, val_generate_batches=1),
                                 **KV), **kwargs})


def data(lm_path, n_train=4, **kwargs) -> QGMemDataModule:
    return QGMemDataModule.from_items(items(n_train), items(2, seed=2), items(2, seed=3), lm=lm_path, batch_size=2,
                                      max_prompt_tokens=96, max_answer_tokens=8, **kwargs)


@pytest.mark.parametrize("kwargs,match", [
    ({}, "NodeWordAlignment"),  # the default stages pre-train with the word alignment and keep its weight
    ({"stages": [], "gradient_checkpointing": True}, "gradient_checkpointing"),
    ({"injection": "cross_attention"}, "model.injection must be"),
])
def test_settings_a_key_value_prefix_cannot_train_with_are_refused_by_name(kwargs, match):
    settings = {"injection": "kv_prefix", **kwargs}
    with pytest.raises(SettingError, match=match):
        QGMemModule(**settings)  # refused before any LM is loaded


def test_the_network_writes_keys_and_values_for_every_layer_and_only_it_learns(lm_path):
    module = make_module(lm_path)
    cfg = module.net.config
    assert (cfg.injection, cfg.lm_layers, cfg.lm_kv_width) == ("kv_prefix", LAYERS, 16)  # 2 key/value heads of 8
    d = data(lm_path)
    d.setup("fit")
    batch = next(iter(d.train_dataloader()))
    prefix = module.graph_tokens(batch["graph"])
    assert isinstance(prefix, KVPrefix) and prefix.values.shape == (2, 4, LAYERS, 2, 16)
    embeds, mask, _, labels, _ = module.fused_inputs(batch)
    assert embeds.shape[1] == batch["input_ids"].shape[1] + 4 and labels.shape == mask.shape
    optimizer = torch.optim.Adam([p for p in module.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(12):  # a tiny fixed batch: the answer loss through the prefix falls
        loss = module(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0], losses
    trained = {n for n, p in module.named_parameters() if p.grad is not None}
    assert trained and all(n.startswith("net.") for n in trained)
    none = make_module(lm_path, graph_mode="none")
    assert none.fused_inputs(batch)[0].shape[1] == batch["input_ids"].shape[1]  # no prefix, no columns


def test_fit_with_reconstruction_and_distillation_then_export_and_load_round_trip(lm_path, tmp_path):
    module = make_module(lm_path, stages=[MemoryReconstruction(steps=3), Distillation(weight=0.5, topk=4)])
    trainer = Trainer(accelerator="cpu", devices=1, max_steps=2, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=tmp_path, num_sanity_val_steps=0)
    trainer.fit(module, datamodule=data(lm_path, memory_units=2))
    assert module.alignment_result["steps"] == 3 and module.alignment_result["first_loss"] > 0
    assert {"train/kl", "train/nll"} <= set(trainer.callback_metrics)
    assert torch.isfinite(trainer.callback_metrics["val/nll"])
    ckpt = tmp_path / "checkpoints" / "model.ckpt"
    trainer.save_checkpoint(ckpt)

    out = export_checkpoint(str(ckpt), tmp_path / "export")
    config = json.loads((out / CONFIG_FILE).read_text())
    assert config["graph_token"]["injection"] == "kv_prefix" and config["graph_token"]["lm_layers"] == LAYERS
    assert "every layer" in config["graph_token_position"]
    served = GraphTokenEncoder.from_pretrained(out)
    graphs = [item["graph"] for item in items(3, seed=7)]
    expected = QGMemModule.load_from_checkpoint(str(ckpt)).eval().graph_tokens(Batch.from_data_list(graphs))
    got = served.encode(graphs)
    assert isinstance(got, KVPrefix) and got.values.shape == (3, 4, LAYERS, 2, 16)
    torch.testing.assert_close(got.values, expected.values.detach())


def test_the_reconstruction_loss_falls_through_a_key_value_prefix_and_the_lm_stays_as_it_was(lm_path):
    from qgmem.lm import load_causal_lm, load_tokenizer
    from qgmem.model.graph_token import GraphTokenConfig, GraphTokenNet
    from qgmem.model.kv_prefix import kv_scale
    from qgmem.training.collate import GraphTextCollator
    from qgmem.training.reconstruction import reconstruct_memory

    tokenizer, lm = load_tokenizer(lm_path), load_causal_lm(lm_path)
    with torch.no_grad():  # a random LM's logits are all but uniform; a sharper final norm lets them move
        lm.model.norm.weight.mul_(30.0)
    lm_before = {k: v.clone() for k, v in lm.state_dict().items()}
    torch.manual_seed(0)
    net = GraphTokenNet(GraphTokenConfig(D, D, 32, ENC, features="text", readout="summary_units", num_graph_tokens=4,
                                         injection="kv_prefix", lm_layers=LAYERS, lm_kv_width=16))
    net.projector.match_scale(kv_scale(lm), torch.randn(64, ENC.hidden))
    result = reconstruct_memory(net, lm, tokenizer, items(4), GraphTextCollator(tokenizer).graphs, memory_units=2,
                                steps=15, batch_size=4, lr=5e-2, seed=3)
    assert result["steps"] == 15 and result["last_loss"] < result["first_loss"] - 1.0, result
    assert all(torch.equal(v, lm_before[k]) for k, v in lm.state_dict().items())
    assert all(p.grad is None for p in lm.parameters())
