"""Checkpoint → export → serving: same graph tokens as the checkpoint, the run's own metrics, no Lightning."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Trainer, seed_everything
from torch_geometric.data import Batch

from qgmem.cli import main as qgmem_main
from qgmem.export import CONFIG_FILE, WEIGHTS_FILE, answer_contract, export_checkpoint
from qgmem.lm import EMBEDDED_LM
from qgmem.model.alignment import node_word_ids
from qgmem.model.encoder import EncoderConfig
from qgmem.model.random_lm import save_random_lm
from qgmem.prompting.contract import PromptSettings
from qgmem.serving import GraphTokenEncoder, HiddenSizeMismatch
from qgmem.serving.pipeline import load_lm_for
from qgmem.training.datamodule import QGMemDataModule, synthetic_items
from qgmem.training.module import GenerationSettings, QGMemModule
from qgmem.training.stages import NodeWordAlignment

D = 8
PAPER = dict(features="text", readout="mean", num_graph_tokens=1, stages=[])  # not the defaults


@pytest.fixture(scope="module")
def lm_path(tmp_path_factory):
    return str(save_random_lm(tmp_path_factory.mktemp("lm") / "tiny", hidden_size=32, layers=2))


def fit_checkpoint(root: Path, lm: str, feature_dim: int = D, max_prompt_tokens: int = 96, max_steps: int = 2,
                   limit_val_batches: int | None = None, memory_units: int | None = None, **module_kwargs) -> str:
    seed_everything(0)
    module = QGMemModule(lm=lm, feature_dim=feature_dim, generation=GenerationSettings(max_new_tokens=3, val_generate_batches=1),
                         lr_scheduler={"class_path": "qgmem.training.schedule.WarmupCosine",
                                       "init_args": {"warmup_steps": 1}},
                         **{"encoder": EncoderConfig(hidden=16, heads=2, layers=2, dropout=0.0), **PAPER,
                            **module_kwargs})
    data = QGMemDataModule.from_items(synthetic_items(4, feature_dim, seed=1), synthetic_items(2, feature_dim, seed=2),
                                      lm=lm, batch_size=2, max_prompt_tokens=max_prompt_tokens, max_answer_tokens=8,
                                      memory_units=memory_units)
    trainer = Trainer(accelerator="cpu", devices=1, max_steps=max_steps, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=root, num_sanity_val_steps=0,
                      limit_val_batches=limit_val_batches)
    trainer.fit(module, datamodule=data)
    path = root / "checkpoints" / "model.ckpt"  # train.py's layout: <root>/checkpoints/*.ckpt + <root>/metrics.json
    trainer.save_checkpoint(path)
    return str(path)


NETS = {"mean": {}, "queries": {"readout": "queries", "num_graph_tokens": 2, "features": "edge_fact_sum"},
        "nodes": {"readout": "nodes", "num_graph_tokens": 3, "features": "node_words"},
        "summary_nodes": {"readout": "summary_nodes", "num_graph_tokens": 3, "features": "node_words"},
        "summary_units": {"readout": "summary_units", "num_graph_tokens": 4, "features": "text"}}
ALIGN = {"stages": [NodeWordAlignment(steps=3, weight=0.5)]}
TRAINING = {"nodes": ALIGN, "summary_nodes": ALIGN}  # module settings that are not the network's


@pytest.fixture(scope="module", params=sorted(NETS))
def exported(lm_path, tmp_path_factory, request):
    root = tmp_path_factory.mktemp("run")
    ckpt = fit_checkpoint(root, lm_path, **NETS[request.param], **TRAINING.get(request.param, {}))
    (root / "metrics.json").write_text(json.dumps({"val": {"val/nll": 9.5, "val/em": 0.25}, "test": {"test/f1": 0.5},
                                                   "best_checkpoint": ckpt}))
    return ckpt, export_checkpoint(ckpt, root / "export")


def test_export_reproduces_the_checkpoint_graph_tokens(exported):
    ckpt, out = exported
    assert (out / WEIGHTS_FILE).is_file() and (out / CONFIG_FILE).is_file()
    served = GraphTokenEncoder.from_pretrained(out)
    module = QGMemModule.load_from_checkpoint(ckpt).eval()
    graphs = []
    for item in synthetic_items(5, D, seed=7):
        graph = item["graph"]
        graph.node_word_ids = node_word_ids([item["node_text"]], [graph.num_nodes], module.tokenizer)
        graphs.append(graph)
    expected = module.graph_tokens(Batch.from_data_list(graphs))
    if served.config.features == "node_words":  # serving hands the encoder its LM's word embeddings
        with pytest.raises(RuntimeError, match="use_word_embedding"):
            served.encode(graphs)
        served.use_word_embedding(module.lm.get_input_embeddings())
    tokens = served.encode(graphs)
    assert tokens.shape == (5, served.config.num_graph_tokens, 32) and not tokens.requires_grad
    torch.testing.assert_close(tokens, expected.detach())


def test_export_config_and_model_card(exported):
    _, out = exported
    config = json.loads((out / CONFIG_FILE).read_text())
    net = {"features": "text", "readout": "mean", "num_graph_tokens": 1, **NETS[config["graph_token"]["readout"]]}
    assert config["graph_token"] == {"feature_dim": D, "edge_dim": D, "lm_hidden": 32, "projector_hidden": None,
                                     "encoder": {"hidden": 16, "heads": 2, "layers": 2, "dropout": 0.0,
                                                 "attention_dropout": 0.0},
                                     "injection": "input", "lm_layers": None, "lm_kv_width": None, **net}
    assert config["readout"] == {"kind": net["readout"], "num_graph_tokens": net["num_graph_tokens"]}
    answer = config["answer"]  # the answer contract, one block; none of its parts at the top level
    assert set(answer) == {"prompt", "activation", "graph_mode"} and not {"prompt", "activation", "graph_mode"} & set(config)
    assert config["features"] == net["features"] and answer["prompt"]["include_memory_text"] is True
    assert answer["prompt"]["num_graph_tokens"] == net["num_graph_tokens"]
    assert config["lm"]["hidden_size"] == 32 and config["lm"]["dtype"] == "float32"
    assert config["qgmem_version"] and answer["graph_mode"] == "token" and config["lora"] is None
    assert config["checkpoint"]["graph_mode"] == "token"  # the mode the weights trained with
    assert config["metrics"]["val"]["val/em"] == 0.25  # picked up from the run's metrics.json
    assert answer["prompt"]["max_prompt_tokens"] == 96  # the data side's prompt contract, adopted by the model
    card = (out / "README.md").read_text()
    assert "| val | nll | 9.5000 |" in card and "| test | f1 | 0.5000 |" in card


def test_an_older_checkpoint_s_prompt_contract_reaches_the_export():
    """Checkpoints written before the contract block kept its prompt in the hyperparameters and the data info,
    its activation in the data info and its mode in the hyperparameters."""
    from qgmem.model import checkpoint_keys as CK

    older = answer_contract({"hyper_parameters": {"enable_thinking": True, "graph": "none"},
                             CK.DATA_INFO: {"max_prompt_tokens": 300, "max_answer_tokens": 32, "activation": {"k": 4}}})
    assert older.prompt == PromptSettings(enable_thinking=True, max_prompt_tokens=300, max_answer_tokens=32)
    assert older.activation.k == 4 and older.graph_mode == "none"
    assert answer_contract({"hyper_parameters": {"prompt": {"graph_tokens": 2}}}).prompt == PromptSettings(num_graph_tokens=2)
    # a checkpoint with the block reads it, not the hyperparameters; --graph-mode replaces its mode
    block = {"hyper_parameters": {"prompt": {"memory_units": 9}},
             CK.ANSWER_CONTRACT: {"prompt": {"memory_units": 2}, "activation": {}, "graph_mode": "token"}}
    assert answer_contract(block).prompt.memory_units == 2
    assert answer_contract(block, "none").graph_mode == "none"


def test_metrics_of_another_run_never_reach_the_card(exported, tmp_path):
    """A metrics.json beside the run that names another checkpoint (or none) is not this export's."""
    import shutil

    ckpt, _ = exported
    run = tmp_path / "other-run"
    (run / "checkpoints").mkdir(parents=True)
    copy = run / "checkpoints" / "model.ckpt"
    shutil.copy(ckpt, copy)
    (run / "metrics.json").write_text(json.dumps({"test": {"test/f1": 0.99}, "best_checkpoint": "elsewhere.ckpt"}))
    out = export_checkpoint(copy, tmp_path / "export")
    assert json.loads((out / CONFIG_FILE).read_text())["metrics"] is None
    assert "0.99" not in (out / "README.md").read_text()


@pytest.mark.parametrize("expected", [64, 576])
def test_mismatched_hidden_size_is_refused(exported, expected):
    _, out = exported
    with pytest.raises(HiddenSizeMismatch, match=f"'graph_token.lm_hidden' is 32 .* hidden size {expected}"):
        GraphTokenEncoder.from_pretrained(out, expected_hidden_size=expected)
    assert GraphTokenEncoder.from_pretrained(out, expected_hidden_size=32).config.lm_hidden == 32


def test_serving_refuses_an_lm_of_another_width(exported, tmp_path):
    _, out = exported
    other = str(save_random_lm(tmp_path / "wide", hidden_size=48, layers=1))
    with pytest.raises(HiddenSizeMismatch, match="'graph_token.lm_hidden' is 32 .* has 48-d embeddings"):
        load_lm_for(GraphTokenEncoder.from_pretrained(out), other, None, "cpu")


def test_bad_export_folder_names_the_problem(exported, tmp_path):
    _, out = exported
    with pytest.raises(FileNotFoundError, match="config.json is missing: .* is not a QGMem export folder"):
        GraphTokenEncoder.from_pretrained(tmp_path)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / WEIGHTS_FILE).write_bytes((out / WEIGHTS_FILE).read_bytes())
    (broken / CONFIG_FILE).write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(ValueError, match="field 'format' is 'something-else'"):
        GraphTokenEncoder.from_pretrained(broken)


def test_export_subcommand(exported, tmp_path):
    ckpt, reference = exported
    assert qgmem_main(["export", "--ckpt", ckpt, "--out", str(tmp_path / "cli")]) == 0
    from safetensors.torch import load_file

    ours, theirs = load_file(str(tmp_path / "cli" / WEIGHTS_FILE)), load_file(str(reference / WEIGHTS_FILE))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        export_checkpoint(tmp_path / "missing.ckpt", tmp_path / "x")


def test_the_export_can_answer_with_the_text_prompt_by_default(exported, tmp_path, capsys):
    ckpt, reference = exported
    assert qgmem_main(["export", "--ckpt", ckpt, "--out", str(tmp_path / "text"), "--graph-mode", "none"]) == 0
    config = json.loads((tmp_path / "text" / CONFIG_FILE).read_text())
    assert config["answer"]["graph_mode"] == "none" and config["checkpoint"]["graph_mode"] == "token"
    card = (tmp_path / "text" / "README.md").read_text()
    assert "answers read the text prompt alone (trained with graph mode `token`" in card
    same = json.loads((reference / CONFIG_FILE).read_text())  # no --graph-mode: the checkpoint contract's
    assert same["answer"]["graph_mode"] == same["checkpoint"]["graph_mode"] == "token"
    assert "answers read the graph tokens" in (reference / "README.md").read_text()
    assert qgmem_main(["export", "--ckpt", ckpt, "--out", str(tmp_path / "bad"), "--graph-mode", "text"]) == 2
    assert "invalid choice: 'text'" in capsys.readouterr().err and not (tmp_path / "bad").exists()


def test_export_over_an_existing_one_replaces_it_whole(exported, tmp_path, monkeypatch):
    from qgmem.integrity import verify_sealed

    ckpt, _ = exported
    out = tmp_path / "export"
    export_checkpoint(ckpt, out)
    (out / "stale.txt").write_text("from an older export")
    export_checkpoint(ckpt, out)  # the old folder goes whole: nothing of it is left beside the new files
    assert not (out / "stale.txt").exists() and verify_sealed(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # no temp or .old- folder left

    def dies_half_way(self, folder):  # a write that fails after its first file
        (Path(folder) / WEIGHTS_FILE).write_bytes(b"half")
        raise OSError("disk full")

    (out / "marker.txt").write_text("the export being served")
    monkeypatch.setattr(GraphTokenEncoder, "_save_pretrained", dies_half_way)
    with pytest.raises(OSError, match="disk full"):
        export_checkpoint(ckpt, out)
    assert (out / "marker.txt").exists() and verify_sealed(out)  # the served export is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]


def test_an_export_whose_replace_was_killed_is_put_back_on_load(exported, tmp_path, monkeypatch):
    import os

    ckpt, _ = exported
    out = tmp_path / "export"
    export_checkpoint(ckpt, out)
    real_rename = Path.rename

    def killed_after_first_rename(self, target):  # the old export is aside; the process dies before the new one lands
        real_rename(self, target)
        if ".old-" in Path(target).name:
            real_rename(Path(target), Path(target).with_name(".export.old-999999999"))
            raise KeyboardInterrupt

    monkeypatch.setattr(Path, "rename", killed_after_first_rename)
    with pytest.raises(KeyboardInterrupt):
        export_checkpoint(ckpt, out)
    monkeypatch.undo()
    assert not out.exists() and (tmp_path / ".export.old-999999999").is_dir()
    loaded = GraphTokenEncoder.from_pretrained(out)  # the complete old export, renamed back
    assert isinstance(loaded, GraphTokenEncoder) and out.is_dir()
    assert not [p for p in os.listdir(tmp_path) if ".old-" in p]


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_export_refuses_nonfinite_weights(exported, tmp_path, value):
    ckpt = torch.load(exported[0], map_location="cpu", weights_only=True)
    name = sorted(ckpt["state_dict"])[1]
    ckpt["state_dict"][name].view(-1)[3] = value
    torch.save(ckpt, tmp_path / "bad.ckpt")
    with pytest.raises(ValueError, match=rf"bad.ckpt: 1 of \d+ weight tensors hold NaN or inf \({name[4:]}\); refusing"):
        export_checkpoint(tmp_path / "bad.ckpt", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_serving_loads_without_lightning_or_training_code(exported):
    _, out = exported
    code = ("import sys; from qgmem.serving import GraphTokenEncoder; "
            "import qgmem.serving.pipeline, qgmem.evaluation.eval_qa, qgmem.serving.answer_cli, qgmem.serving.text_graph_backbone; "
            f"m = GraphTokenEncoder.from_pretrained({str(out)!r}); "
            "bad = [k for k in sys.modules if k.split('.')[0] in ('lightning', 'pytorch_lightning') "
            "or k.startswith('qgmem.training')]; print(m.config.lm_hidden, bad)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "32 []"


def test_smollm2_end_to_end_generation_matches_serving(tmp_path):
    """The real SmolLM2 once: train one step, export, and serve; batched left-padded generation during
    training equals one-at-a-time generation through the export."""
    ckpt = fit_checkpoint(tmp_path, EMBEDDED_LM, feature_dim=384, max_prompt_tokens=128, max_steps=1,
                          limit_val_batches=0)
    out = export_checkpoint(ckpt, tmp_path / "export")
    module = QGMemModule.load_from_checkpoint(ckpt).eval()
    items = synthetic_items(2, 384, seed=5)
    items[1]["memory_text"] += " [M2] The user also likes long walks on the beach every Sunday morning."
    data = QGMemDataModule.from_items(items, items, lm=EMBEDDED_LM, batch_size=2, max_prompt_tokens=128)
    data.setup("fit")
    batch = next(iter(data.val_dataloader()))
    assert batch["gen_attention_mask"][0].sum() < batch["gen_attention_mask"][1].sum()  # row 0 is left-padded
    module.generation.max_new_tokens = 10
    batched = module.generate(batch)
    pipe = serving_pipeline(out, max_new_tokens=10)
    served = [a.answer for a in pipe.generate([retrieved_item(it) for it in items])]
    assert served == batched and all(isinstance(s, str) and s for s in served)


def retrieved_item(item):
    """A training item as the pipeline's activated question (same graph, memory text and question)."""
    from qgmem.activation.records import WorkingMemory
    from qgmem.serving import Retrieved

    return Retrieved(item["question"], WorkingMemory(question=item["question"], text=item["memory_text"]),
                     item["graph"], store_units=1)


def serving_pipeline(out, max_new_tokens):
    from qgmem.serving import QGMemPipeline

    encoder = GraphTokenEncoder.from_pretrained(out, expected_hidden_size=576)
    lm, tokenizer = load_lm_for(encoder, None, None, "cpu")

    class Dim:  # the graphs are given: only the feature width is checked
        dim = encoder.config.feature_dim

    return QGMemPipeline(encoder, lm, tokenizer, Dim(), max_new_tokens=max_new_tokens)


def test_the_export_records_the_text_and_the_graph_budget():
    """The data module's answer contract reaches config.json as the checkpoint's block: ``memory_units`` and
    ``activation.k`` and the default answer mode, copied from the block, not from the hyperparameters."""
    from qgmem.activation.config import ActivationConfig
    from qgmem.export import export_config
    from qgmem.model import checkpoint_keys as CK
    from qgmem.model.graph_token import GraphTokenConfig

    data = QGMemDataModule(memory_units=3, activation=ActivationConfig(k=5), graph_mode="none")
    net = GraphTokenConfig(feature_dim=D, edge_dim=D, lm_hidden=32, features="text", readout="mean", num_graph_tokens=1)
    ckpt = {"hyper_parameters": {"graph": "token"}, "state_dict": {}, CK.DATA_INFO: {},
            CK.ANSWER_CONTRACT: data.answer_contract.to_dict(), CK.GRAPH_TOKEN: net.to_dict()}
    config = export_config(Path("model.ckpt"), ckpt, None)
    assert config["answer"]["prompt"]["memory_units"] == 3 and config["answer"]["graph_mode"] == "none"
    assert config["answer"]["activation"]["k"] == config["activation_key_parameters"]["k"] == 5
    assert config["checkpoint"]["graph_mode"] == "token"


def test_the_text_budget_reaches_the_checkpoint_once_through_the_contract(lm_path, tmp_path):
    """A data module with ``memory_units=3`` gives a checkpoint whose contract block says 3 (its prompt with
    the network's slots, the mode the module trained with) and no ``prompt`` hyperparameter; a module
    loaded from it without a data module has that prompt."""
    from qgmem.model import checkpoint_keys as CK

    ckpt_path = fit_checkpoint(tmp_path, lm_path, max_steps=1, memory_units=3, limit_val_batches=1)
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    block = ckpt[CK.ANSWER_CONTRACT]
    assert block["prompt"]["memory_units"] == 3 and block["prompt"]["max_prompt_tokens"] == 96
    assert block["prompt"]["num_graph_tokens"] == 1 and block["graph_mode"] == "token"
    assert "prompt" not in ckpt["hyper_parameters"]
    loaded = QGMemModule.load_from_checkpoint(ckpt_path)
    assert loaded.contract.to_dict() == block and loaded.prompt_encoder.settings.memory_units == 3
    assert QGMemModule(lm=lm_path, feature_dim=D, **PAPER).prompt_encoder.settings.memory_units is None  # control

    # the same checkpoint as written before the block: its prompt in the hyperparameters
    older = {k: v for k, v in ckpt.items() if k != CK.ANSWER_CONTRACT}
    older["hyper_parameters"] = {**ckpt["hyper_parameters"], "prompt": {**block["prompt"], "memory_units": 2}}
    older_path = tmp_path / "older.ckpt"
    torch.save(older, older_path)
    assert QGMemModule.load_from_checkpoint(older_path).contract.prompt.memory_units == 2
    config = json.loads((export_checkpoint(older_path, tmp_path / "older_export") / CONFIG_FILE).read_text())
    assert config["answer"]["prompt"]["memory_units"] == 2 and config["answer"]["graph_mode"] == "token"
