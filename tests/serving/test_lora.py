"""A LoRA run round-trips through serving: PEFT's own adapter format, applied when the export is served."""

from __future__ import annotations

import json

import pytest
import torch
from lightning.pytorch import Trainer, seed_everything

from qgmem.errors import IntegrityError
from qgmem.export import export_checkpoint
from qgmem.lm import load_causal_lm
from qgmem.model.encoder import EncoderConfig
from qgmem.model.pretrained import ADAPTER_DIR, CONFIG_FILE, ExportFormatError, GraphTokenEncoder
from qgmem.serving.pipeline import load_lm_for
from qgmem.training.datamodule import QGMemDataModule, synthetic_items
from qgmem.training.module import GenerationSettings, LoraSettings, QGMemModule


@pytest.fixture(scope="module")
def lora_run(tiny_lm_path, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    seed_everything(0)
    module = QGMemModule(lm=tiny_lm_path, feature_dim=8, generation=GenerationSettings(max_new_tokens=2, val_generate_batches=0),
                         optimizer={"class_path": "torch.optim.AdamW", "init_args": {"lr": 0.05}},
                         lr_scheduler={"class_path": "qgmem.training.schedule.WarmupCosine",
                                       "init_args": {"warmup_steps": 0}},
                         encoder=EncoderConfig(hidden=16, heads=2, layers=1, dropout=0.0),
                         features="text", readout="mean", num_graph_tokens=1, stages=[],
                         lora=LoraSettings(r=2, alpha=4, target_modules=["q_proj", "v_proj"]))
    data = QGMemDataModule.from_items(synthetic_items(4, 8, seed=1), synthetic_items(2, 8, seed=2), lm=tiny_lm_path,
                                      batch_size=2, max_prompt_tokens=96, max_answer_tokens=8)
    Trainer(accelerator="cpu", devices=1, max_steps=3, logger=False, enable_progress_bar=False,
            enable_model_summary=False, default_root_dir=root, num_sanity_val_steps=0, limit_val_batches=0,
            enable_checkpointing=False).fit(module, datamodule=data)
    ckpt = root / "lora.ckpt"
    module.trainer.save_checkpoint(ckpt)
    return module.eval(), export_checkpoint(ckpt, root / "export")


def test_adapter_is_saved_in_peft_format(lora_run):
    _, out = lora_run
    adapter = out / ADAPTER_DIR
    assert sorted(p.name for p in adapter.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    peft_config = json.loads((adapter / "adapter_config.json").read_text())
    assert peft_config["peft_type"] == "LORA" and peft_config["r"] == 2 and peft_config["lora_alpha"] == 4
    assert sorted(peft_config["target_modules"]) == ["q_proj", "v_proj"]
    assert json.loads((out / CONFIG_FILE).read_text())["lora"]["r"] == 2


def test_served_lm_is_the_trained_lora_lm(lora_run, tiny_lm_path):
    module, out = lora_run
    encoder = GraphTokenEncoder.from_pretrained(out)
    served, _ = load_lm_for(encoder, None, None, "cpu")
    ids = torch.tensor([[1, 5, 9, 20, 7]])
    trained = module.lm(input_ids=ids).logits
    torch.testing.assert_close(served(input_ids=ids).logits, trained)
    base = load_causal_lm(tiny_lm_path)(input_ids=ids).logits
    assert (base - trained).abs().max() > 1e-4  # the adapters changed the LM, so serving without them differs


def test_lora_export_without_its_adapter_is_refused(lora_run, tmp_path):
    import shutil

    _, out = lora_run
    copy = tmp_path / "export"
    shutil.copytree(out, copy)
    shutil.rmtree(copy / ADAPTER_DIR)
    with pytest.raises(IntegrityError, match="lora_adapter/adapter_config.json: missing .*qgmem export"):
        GraphTokenEncoder.from_pretrained(copy)
    (copy / "checksums.json").unlink()  # an export without checksums (version 2) is caught when the LM is loaded
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "format_version": 2}))
    with pytest.raises(ExportFormatError, match="field 'lora' is set but the export has no lora_adapter/ folder"):
        load_lm_for(GraphTokenEncoder.from_pretrained(copy), None, None, "cpu")
