"""The node-token alignment stage: it fits node tokens to word embeddings, runs once per fresh fit."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch import Trainer, seed_everything

from qgmem.lm import load_tokenizer
from qgmem.model.alignment import alignment_loss
from qgmem.model.encoder import EncoderConfig
from qgmem.model.graph_token import GraphTokenConfig, GraphTokenNet
from qgmem.model.random_lm import save_random_lm
from qgmem.training.alignment import align_node_tokens
from qgmem.training.collate import GraphTextCollator
from qgmem.training.datamodule import QGMemDataModule
from qgmem.training.module import GenerationSettings, QGMemModule
from qgmem.training.stages import NodeWordAlignment
from qgmem.training.synthetic import synthetic_items

D = 8
ENC = EncoderConfig(hidden=16, heads=2, layers=1, dropout=0.0)


@pytest.fixture(scope="module")
def lm_path(tmp_path_factory):
    return str(save_random_lm(tmp_path_factory.mktemp("lm") / "tiny", hidden_size=32, layers=1))


def node_word_loss(net, collator, items, table) -> float:
    batch = collator(items)
    with torch.no_grad():
        return float(alignment_loss(net.node_tokens(batch["graph"]), batch["graph"].node_word_ids, table))


@pytest.mark.parametrize("features", ["text", "node_words"])
def test_alignment_lowers_the_loss_and_is_seeded(lm_path, features):
    collator = GraphTextCollator(load_tokenizer(lm_path), max_prompt_tokens=96, max_answer_tokens=8)
    table = torch.randn(load_tokenizer(lm_path).vocab_size, 32, generator=torch.Generator().manual_seed(0))
    items, held_out = synthetic_items(12, D, seed=1), synthetic_items(6, D, seed=5)
    nets = []
    for _ in range(2):
        torch.manual_seed(0)
        net = GraphTokenNet(GraphTokenConfig(D, D, 32, ENC, features=features, readout="nodes", num_graph_tokens=4))
        net.use_word_embedding(table)
        before, before_held_out = (node_word_loss(net, collator, x, table) for x in (items, held_out))
        result = align_node_tokens(net, items, collator, table, steps=60, batch_size=4, lr=1e-2, seed=3)
        nets.append(net)
    assert result["steps"] == 60 and result["last_loss"] < result["first_loss"]
    assert node_word_loss(nets[0], collator, items, table) < 0.5 * before
    # on graphs it never saw: the node words generalise; random synthetic text features can only be
    # memorised (the control that shows the held-out figure is not the training one)
    after_held_out = node_word_loss(nets[0], collator, held_out, table)
    assert (after_held_out < 0.5 * before_held_out) == (features == "node_words")
    for a, b in zip(nets[0].parameters(), nets[1].parameters()):  # same seed, same weights
        torch.testing.assert_close(a, b)


def test_alignment_needs_node_texts(lm_path):
    collator = GraphTextCollator(load_tokenizer(lm_path), max_prompt_tokens=96, max_answer_tokens=8)
    items = [{k: v for k, v in it.items() if k != "node_text"} for it in synthetic_items(4, D, seed=1)]
    net = GraphTokenNet(GraphTokenConfig(D, D, 32, ENC, features="text", readout="mean", num_graph_tokens=1))
    with pytest.raises(ValueError, match="node_text"):
        align_node_tokens(net, items, collator, torch.randn(10, 32), steps=2)
    assert align_node_tokens(net, items, collator, torch.randn(10, 32), steps=0) == {}


def fit(lm_path, root, **kwargs):
    seed_everything(0)
    module = QGMemModule(lm=lm_path, feature_dim=D, encoder=ENC, generation=GenerationSettings(max_new_tokens=3, val_generate_batches=0),
                         lr_scheduler={"class_path": "qgmem.training.schedule.WarmupCosine",
                                       "init_args": {"warmup_steps": 1}},
                         **{"features": "node_words", "readout": "nodes", "num_graph_tokens": 4,
                            "stages": [], **kwargs})
    data = QGMemDataModule.from_items(synthetic_items(6, D, seed=1), synthetic_items(2, D, seed=2), lm=lm_path,
                                      batch_size=2, max_prompt_tokens=96, max_answer_tokens=8)
    trainer = Trainer(accelerator="cpu", devices=1, max_steps=2, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, default_root_dir=root,
                      limit_val_batches=0, num_sanity_val_steps=0)
    start = {k: v.clone() for k, v in module.net.state_dict().items()}
    trainer.fit(module, datamodule=data)
    return module, trainer, start


def test_fit_runs_the_alignment_stage_first(lm_path, tmp_path):
    module, trainer, _ = fit(lm_path, tmp_path, stages=[NodeWordAlignment(steps=5, batch_size=32, weight=0.5)])
    assert module.alignment_result["steps"] == 5
    assert module.alignment_result["last_loss"] < module.alignment_result["first_loss"]
    assert "train/align" in trainer.callback_metrics  # the auxiliary loss of every answer step
    # the answer NLL plus 0.5 x the alignment loss, as logged (the last step's)
    total = trainer.callback_metrics["train/nll_step"] + 0.5 * trainer.callback_metrics["train/align_step"]
    assert torch.allclose(trainer.callback_metrics["train/loss_step"], total)
    plain, trainer, _ = fit(lm_path, tmp_path / "plain")
    assert not getattr(plain, "alignment_result", None) and "train/align" not in trainer.callback_metrics


def test_the_stage_shows_its_steps_out_of_the_total_only_when_asked(lm_path, capsys):
    collator = GraphTextCollator(load_tokenizer(lm_path), max_prompt_tokens=96, max_answer_tokens=8)
    items = synthetic_items(4, D, seed=1)
    table = torch.randn(load_tokenizer(lm_path).vocab_size, 32)
    net = GraphTokenNet(GraphTokenConfig(D, D, 32, ENC, features="node_words", readout="nodes", num_graph_tokens=4))
    net.use_word_embedding(table)
    align_node_tokens(net, items, collator, table, steps=3, batch_size=2, progress=True)
    err = capsys.readouterr().err
    assert "node-token alignment" in err and "3/3" in err and "loss=" in err
    align_node_tokens(net, items, collator, table, steps=3, batch_size=2)  # rank > 0, tests: quiet
    assert "node-token alignment" not in capsys.readouterr().err
