"""The ``reconstruct`` pre-training objective: hidden entries as targets, a falling loss, a frozen LM."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch import Trainer, seed_everything

from qgmem.lm import load_causal_lm, load_tokenizer
from qgmem.model.encoder import EncoderConfig
from qgmem.model.fusion import IGNORE_INDEX
from qgmem.model.graph_token import GraphTokenConfig, GraphTokenNet
from qgmem.model.random_lm import save_random_lm
from qgmem.training.collate import GraphTextCollator
from qgmem.training.datamodule import QGMemDataModule
from qgmem.training.module import GenerationSettings, QGMemModule
from qgmem.training.reconstruction import (CUE, MAX_TARGET_TOKENS, ReconstructionCollator, hidden_entries,
                                           pick_targets, reconstruct_memory)
from qgmem.training.stages import MemoryReconstruction
from qgmem.training.synthetic import synthetic_items

D = 8
ENC = EncoderConfig(hidden=16, heads=2, layers=1, dropout=0.0)
MEMORY = "[M1] The user keeps bees.\n[M2] Ana is the user's sister.\n[M3] The hives stand by the {color} barn."


@pytest.fixture(scope="module")
def lm_path(tmp_path_factory):
    return str(save_random_lm(tmp_path_factory.mktemp("lm") / "tiny", hidden_size=32, layers=1))


def items(n: int, seed: int = 1) -> list[dict]:
    """Synthetic items whose working memory has three entries (their graphs' edges come from units 0-2)."""
    out = synthetic_items(n, D, seed=seed)
    for i, item in enumerate(out):
        item["memory_text"] = MEMORY.format(color=["red", "green", "blue", "white"][i % 4])
    return out


def test_only_entries_past_the_text_budget_are_targets():
    assert [label for label, _ in hidden_entries(MEMORY, 1)] == [2, 3]
    assert [label for label, _ in hidden_entries(MEMORY, None)] == [1, 2, 3]  # no budget: every entry
    assert hidden_entries(MEMORY, 3) == [] and hidden_entries("[M1] fact\n[M2] ", 1) == []  # none, or empty
    draws = [pick_targets([MEMORY, "[M1] only", MEMORY], 1, torch.Generator().manual_seed(s)) for s in range(20)]
    assert all(d[1] is None for d in draws)
    assert {d[0][0] for d in draws} == {2, 3} == {d[2][0] for d in draws}
    again = [pick_targets([MEMORY, "[M1] only", MEMORY], 1, torch.Generator().manual_seed(s)) for s in range(20)]
    assert again == draws  # seeded
    assert draws[0][0] == (draws[0][0][0], dict(hidden_entries(MEMORY, 1))[draws[0][0][0]])


def test_the_batch_supervises_the_entry_tokens_only(smollm2_tokenizer):
    graphs = GraphTextCollator(smollm2_tokenizer).graphs
    batch_items = items(3)
    batch_items[1]["memory_text"] = "[M1] shown in the prompt"
    batch_items[2]["memory_text"] = "[M1] a\n[M2] " + "word " * 80  # longer than the cap
    batch = ReconstructionCollator(graphs, smollm2_tokenizer, memory_units=1, seed=0)(batch_items)
    assert batch["graph"].num_graphs == 2 and len(batch["targets"]) == 2  # the item without a hidden entry is left out
    for row, (label, text) in enumerate(batch["targets"]):
        cue = smollm2_tokenizer(CUE.format(label=label), add_special_tokens=False)["input_ids"]
        entry = smollm2_tokenizer(" " + text, add_special_tokens=False)["input_ids"][:MAX_TARGET_TOKENS]
        n = len(cue) + len(entry)
        assert batch["input_ids"][row, :n].tolist() == cue + entry and batch["attention_mask"][row].sum() == n
        assert batch["labels"][row, len(cue):n].tolist() == entry
        assert (batch["labels"][row, :len(cue)] == IGNORE_INDEX).all() and (batch["labels"][row, n:] == IGNORE_INDEX).all()
    assert batch["targets"][1] == (2, ("word " * 80).strip()) and batch["labels"][1].ne(IGNORE_INDEX).sum() == 48
    assert ReconstructionCollator(graphs, smollm2_tokenizer, memory_units=3)(items(2)) is None


def test_reconstruction_loss_falls_and_the_lm_stays_as_it_was(lm_path):
    tokenizer, lm = load_tokenizer(lm_path), load_causal_lm(lm_path)
    with torch.no_grad():  # a random LM's logits are all but uniform; a sharper final norm lets them move
        lm.model.norm.weight.mul_(30.0)
    lm_before = {k: v.clone() for k, v in lm.state_dict().items()}
    torch.manual_seed(0)
    net = GraphTokenNet(GraphTokenConfig(D, D, 32, ENC, features="text", readout="summary_units", num_graph_tokens=4))
    train = items(4)  # memory_units = 2: each graph's one target is entry [M3], a fixed batch
    graphs = GraphTextCollator(tokenizer).graphs
    result = reconstruct_memory(net, lm, tokenizer, train, graphs, memory_units=2, steps=15, batch_size=4, lr=5e-2,
                                seed=3)
    assert result["steps"] == 15 and result["last_loss"] < result["first_loss"] - 1.0
    assert all(torch.equal(v, lm_before[k]) for k, v in lm.state_dict().items())
    assert all(p.grad is None for p in lm.parameters())
    with pytest.raises(ValueError, match="memory_units = 3"):  # nothing past the budget anywhere
        reconstruct_memory(net, lm, tokenizer, train, graphs, memory_units=3, steps=1)
    assert reconstruct_memory(net, lm, tokenizer, train, graphs, memory_units=3, steps=0) == {}


def test_fit_runs_the_reconstruction_stage_with_the_data_s_text_budget(lm_path, tmp_path):
    seed_everything(0)
    module = QGMemModule(lm=lm_path, feature_dim=D, encoder=ENC, generation=GenerationSettings(max_new_tokens=3, val_generate_batches=0),
                         features="text", readout="summary_units", num_graph_tokens=4,
                         stages=[MemoryReconstruction(steps=3, batch_size=32)])
    data = QGMemDataModule.from_items(items(4), items(2, seed=2), lm=lm_path, batch_size=2, max_prompt_tokens=96,
                                      max_answer_tokens=8, memory_units=2)
    trainer = Trainer(accelerator="cpu", devices=1, max_steps=1, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path,
                      limit_val_batches=0, num_sanity_val_steps=0)
    trainer.fit(module, datamodule=data)
    assert module.alignment_result["steps"] == 3 and module.prompt_encoder.settings.memory_units == 2
    assert {"align/first_loss", "align/last_loss"} <= set(trainer.callback_metrics)
    assert "train/align" not in trainer.callback_metrics
