"""``train.py`` flow (LightningCLI): config + overrides → fit → best checkpoint → test → metrics.json → export."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

from qgmem.lm import EMBEDDED_LM
from qgmem.model.random_lm import save_random_lm
from qgmem.job import main
from qgmem.training.cli import run_subcommand
from qgmem.training.datamodule import InMemoryDataModule
from qgmem.training.synthetic import synthetic_items

REPO = Path(__file__).resolve().parents[2]


class TinyData(InMemoryDataModule):
    """Synthetic items behind the real data module's loaders (no memory building, no cache)."""

    def __init__(self, lm: str = EMBEDDED_LM, n_train: int = 6, n_eval: int = 4, feature_dim: int = 8,
                 batch_size: int = 2, memory_units: int | None = None, graph_mode: str | None = None):
        super().__init__(synthetic_items(n_train, feature_dim, seed=1), synthetic_items(n_eval, feature_dim, seed=2),
                         synthetic_items(n_eval, feature_dim, seed=3), lm=lm, batch_size=batch_size,
                         max_prompt_tokens=96, max_answer_tokens=8, memory_units=memory_units, graph_mode=graph_mode)


@pytest.fixture(scope="module")
def lm_path(tmp_path_factory):
    return str(save_random_lm(tmp_path_factory.mktemp("lm") / "tiny", hidden_size=32, layers=2))


def tiny_args(root: Path, lm_path: str, *extra: str) -> list[str]:
    config = root.parent / "tiny.yaml"
    config.write_text(
        "trainer:\n  accelerator: cpu\n  devices: 1\n  max_steps: 3\n  val_check_interval: 2\n"
        "  check_val_every_n_epoch: null\n  num_sanity_val_steps: 0\n  enable_progress_bar: false\n"
        "  enable_model_summary: false\n  log_every_n_steps: 1\n"
        "model:\n  encoder: {hidden: 16, heads: 2, layers: 2, dropout: 0.0}\n  generation: {max_new_tokens: 3}\n"
        "  features: text\n  readout: mean\n  num_graph_tokens: 1\n  stages: []\n"
        "lr_scheduler: {class_path: qgmem.training.schedule.WarmupCosine, init_args: {warmup_steps: 1}}\n")
    return ["--config", str(config), "--trainer.default_root_dir", str(root), "--model.lm", lm_path, *extra]


def test_train_runs_fit_test_export_and_resumes(lm_path, tmp_path, capsys):
    root = tmp_path / "run"
    metrics = main(tiny_args(root, lm_path, "--model.encoder.layers", "3"), datamodule_class=TinyData)
    out = capsys.readouterr().out
    assert "best checkpoint:" in out and str(root / "export") in out
    saved = json.loads((root / "metrics.json").read_text())
    assert saved["val"] == metrics["val"] and {"val/nll", "val/em", "val/f1"} <= set(saved["val"])
    assert {"test/nll", "test/em", "test/f1"} <= set(saved["test"])
    assert saved["val"]["val/nll"] == pytest.approx(saved["best_score"])  # the best checkpoint's validation
    assert saved["best_checkpoint"].startswith(str(root / "checkpoints"))
    assert set(saved["seconds"]) == {"cache", "alignment", "fit", "test", "export"}  # per-stage times
    assert all(v >= 0 for v in saved["seconds"].values()) and "time:  cache" in out
    assert (root / "checkpoints" / "last.ckpt").is_file() and any((root / "lightning_logs").rglob("events.*"))
    config = json.loads((root / "export" / "config.json").read_text())
    assert config["graph_token"]["encoder"]["layers"] == 3 and config["graph_token"]["feature_dim"] == 8
    from qgmem import __version__
    from qgmem.provenance import git_commit

    # the code that made them: the package version and the checkout's commit (None outside a checkout)
    assert saved["qgmem_version"] == config["qgmem_version"] == __version__
    assert saved["git_commit"] == config["git_commit"] == git_commit()
    assert config["metrics"]["test"] == saved["test"] and config["lm"]["id"] == lm_path
    # the prompt contract is set on the data side and reaches the export through the model
    prompt = config["answer"]["prompt"]
    assert prompt["max_prompt_tokens"] == 96 and prompt["max_answer_tokens"] == 8
    # per-category scalars, test predictions next to metrics.json, hp_metric = the best checkpoint's score
    categories = {"user_evidence", "changing_evidence"}
    assert {f"test/{c}/{m}" for c in categories for m in ("nll", "em", "f1")} <= set(saved["test"])
    rows = [json.loads(line) for line in (root / "test_predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and {r["category"] for r in rows} == categories and f"predictions:        {root}" in out
    assert {"qa_id", "question", "answer", "prediction", "em", "f1", "nll"} <= set(rows[0])
    assert sum(r["em"] for r in rows) / 4 == pytest.approx(saved["test"]["test/em"])
    scalars = read_scalars(root)
    assert scalars["hp_metric"][-1] == pytest.approx(saved["best_score"])
    assert "lr-AdamW" in scalars and {f"val/{c}/nll" for c in categories} <= set(scalars)

    # answers read the tokens by default (data.graph_mode unset: the mode the model trains with)
    assert config["answer"]["graph_mode"] == config["checkpoint"]["graph_mode"] == "token"

    again = main(tiny_args(root, lm_path, "--model.encoder.layers", "3", "--trainer.max_steps", "5",
                           "--ckpt_path", "last", "--data.graph_mode", "none"), datamodule_class=TinyData)
    last = torch.load(root / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert last["global_step"] == 5 and again["test"]
    # the export's default answer mode is the text prompt; the weights still trained with their graph tokens
    config = json.loads((root / "export" / "config.json").read_text())
    assert config["answer"]["graph_mode"] == "none" and config["checkpoint"]["graph_mode"] == "token"


def read_scalars(root: Path) -> dict[str, list[float]]:
    """Every scalar of the run's TensorBoard event files, in step order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars: dict[str, list[float]] = {}
    for folder in sorted({p.parent for p in (root / "lightning_logs").rglob("events.*")}):
        events = EventAccumulator(str(folder))
        events.Reload()
        for tag in events.Tags()["scalars"]:
            scalars.setdefault(tag, []).extend(e.value for e in events.Scalars(tag))
    return scalars


def test_subcommands_fit_then_test_and_validate_a_checkpoint_without_retraining(lm_path, tmp_path, capsys):
    root = tmp_path / "run"
    run_subcommand(["fit", *tiny_args(root, lm_path, "--model.encoder.layers", "3",
                                      "--trainer.enable_progress_bar", "true")], datamodule_class=TinyData)
    out = capsys.readouterr().out
    assert "step (epoch 0): 100%" in out and "3/3" in out and "Epoch" not in out  # the bar counts steps
    best = next(p for p in (root / "checkpoints").glob("*.ckpt") if p.name != "last.ckpt")
    assert torch.load(root / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 3
    assert not (root / "metrics.json").exists() and not (root / "export").exists()  # fit only fits

    # the YAML says 2 encoder layers; the checkpoint's hyperparameters (3) build the model
    run_subcommand(["test", *tiny_args(root, lm_path), "--ckpt_path", str(best)], datamodule_class=TinyData)
    rows = [json.loads(line) for line in (root / "test_predictions.jsonl").read_text().splitlines()]
    assert sorted(r["qa_id"] for r in rows) == [f"synthetic#{i}" for i in range(4)]
    # a checkpoint of a run that started from weights which are gone (another machine, a cleaned folder):
    # its hyperparameters name the file, and it still validates
    ckpt = torch.load(best, weights_only=True)
    ckpt["hyper_parameters"]["init_from"] = str(tmp_path / "gone" / "graph_encoder.safetensors")
    torch.save(ckpt, best)
    capsys.readouterr()
    run_subcommand(["validate", *tiny_args(root, lm_path), "--ckpt_path", str(best)], datamodule_class=TinyData)
    assert "the weights come from the checkpoint, not from model.init_from" in capsys.readouterr().err
    scalars = read_scalars(root)
    assert len(scalars["val/nll"]) == 2 and len(scalars["test/nll"]) == 1  # fit's validation + validate's
    assert scalars["val/nll"][-1] == pytest.approx(float(best.stem.split("val_nll")[1]), abs=1e-4)


def test_a_checkpoint_with_the_older_flat_stage_settings_loads_and_validates(lm_path, tmp_path, capsys):
    """Before ``model.stages`` and ``model.generation``, a checkpoint kept its stages as ``align_*``/``distill_*``
    hyperparameters and its generation settings flat, and before ``graph_mode`` its graph mode as ``graph``: it
    loads with those (``qgmem.older_records``), as a module and through ``--ckpt_path``."""
    from qgmem.training.cli import _cli
    from qgmem.training.module import GenerationSettings, QGMemModule
    from qgmem.training.stages import NodeWordAlignment

    root = tmp_path / "run"
    run_subcommand(["fit", *tiny_args(root, lm_path, "--trainer.max_steps", "1", "--trainer.val_check_interval", "1",
                                      "--model.stages+=NodeWordAlignment", "--model.stages.steps", "1",
                                      "--model.stages.batch_size", "2")], datamodule_class=TinyData)
    ckpt = torch.load(root / "checkpoints" / "last.ckpt", weights_only=True)
    hp = ckpt["hyper_parameters"]
    assert hp["stages"] == [{"class_path": "qgmem.training.stages.NodeWordAlignment",
                             "init_args": {"steps": 1, "batch_size": 2, "lr": 3e-3, "weight": 5.0}}]
    del hp["stages"], hp["generation"], hp["graph_mode"]
    hp["graph"] = "shuffled"
    hp.update(max_new_tokens=5, val_generate_batches=0, test_generate_batches=1, num_examples=2)
    hp.update(align_steps=1, align_objective="words", align_batch_size=2, align_lr=3e-3, align_weight=0.5,
              distill_weight=0.0, distill_topk=16, teacher_cache_dir=None, match_embedding_scale=True)
    old = tmp_path / "old.ckpt"
    torch.save(ckpt, old)
    module = QGMemModule.load_from_checkpoint(old, weights_only=True)
    assert module.stages == [NodeWordAlignment(steps=1, batch_size=2, weight=0.5)]
    assert module.generation == GenerationSettings(max_new_tokens=5, val_generate_batches=0, test_generate_batches=1,
                                                   num_examples=2)
    assert module.hparams.graph_mode == "shuffled" and "graph" not in module.hparams
    capsys.readouterr()
    cli = _cli(["test", *tiny_args(root, lm_path), "--ckpt_path", str(old)], run=True, datamodule_class=TinyData)
    assert cli.model.hparams.graph_mode == "shuffled" and "test/nll" in capsys.readouterr().out


@pytest.mark.parametrize("config,expected", [("default", EMBEDDED_LM),
                                             ("qwen3_8b.yaml", "Qwen/Qwen3-8B"),
                                             (str(REPO / "configs" / "qwen3_8b.yaml"), "Qwen/Qwen3-8B")])
def test_shipped_configs_parse_by_name_or_path(config, expected, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", config, "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = capsys.readouterr().out
    assert printed.count(f"lm: {expected}") == 1  # model.lm; data.lm is linked to it, so not printed
    assert "feature_dim" not in printed  # linked from the data module when it is built
    # construction and activation print resolved (the preset's values over the dataclass defaults)
    assert "construction: null" not in printed and "activation: null" not in printed
    assert "  construction:\n    window_size: 6\n" in printed and "    pool_size: 100\n" in printed
    assert ("extractor: llm" in printed) == ("qwen3" in config)


def test_optimizer_and_lr_scheduler_follow_lightning_cli(capsys):
    """``--optimizer`` / ``--lr_scheduler`` are LightningCLI's (class_path + init_args), linked into the model."""
    with pytest.raises(SystemExit):
        run_subcommand(["fit", "--help"])
    usage = capsys.readouterr().out
    assert "--optimizer" in usage and "--lr_scheduler" in usage
    from qgmem.job import resolved_config

    cfg = resolved_config(["--optimizer", "SGD", "--optimizer.lr", "0.05", "--lr_scheduler.warmup_steps", "3"])
    assert cfg["optimizer"]["class_path"] == "torch.optim.SGD" and cfg["optimizer"]["init_args"]["lr"] == 0.05
    assert cfg["lr_scheduler"]["class_path"] == "qgmem.training.schedule.WarmupCosine"
    assert cfg["lr_scheduler"]["init_args"]["warmup_steps"] == 3
    assert "optimizer" not in cfg["model"] and "lr_scheduler" not in cfg["model"]  # linked, so not printed


def test_the_linked_optimizer_reaches_the_model(lm_path, tmp_path):
    from qgmem.training.cli import _cli

    args = tiny_args(tmp_path / "run", lm_path, "--optimizer", "SGD", "--optimizer.lr", "0.05",
                     "--optimizer.momentum", "0.9", "--lr_scheduler.warmup_steps", "0")
    cli = _cli(args, run=False, datamodule_class=TinyData)  # builds the model and data, runs nothing
    model = cli.model
    model._trainer = type("T", (), {"estimated_stepping_batches": 4})()
    optimizer = model.configure_optimizers()["optimizer"]
    assert type(optimizer) is torch.optim.SGD and optimizer.param_groups[0]["momentum"] == 0.9
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.05)  # no warm-up: the peak rate at once


@pytest.mark.parametrize("subcommand", ["fit", "validate", "test"])
def test_subcommand_print_config_reads_presets(subcommand, capsys):
    with pytest.raises(SystemExit):
        run_subcommand([subcommand, "--config", "default", "--print_config"])
    printed = capsys.readouterr().out
    assert f"lm: {EMBEDDED_LM}" in printed and "ckpt_path: null" in printed


@pytest.mark.parametrize("key,target", [("model", "qgmem.training.module.QGMemModule"),
                                        ("data", "qgmem.training.datamodule.QGMemDataModule")])
def test_each_argument_has_its_own_help(key, target):
    """Every constructor argument's help comes from its own docstring line, not a neighbour's."""
    import importlib
    import inspect

    from lightning.pytorch.cli import LightningArgumentParser

    module, _, name = target.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    parser = LightningArgumentParser()
    parser.add_lightning_class_args(cls, key)
    names = [n for n in inspect.signature(cls.__init__).parameters if n != "self"]
    prefix = key + "."
    helps = {a.dest[len(prefix):]: a.help or "" for a in parser._actions if a.dest.startswith(prefix)}
    helps.update({g.dest[len(prefix):]: g.title or "" for g in parser._action_groups  # dataclass arguments
                  if (getattr(g, "dest", None) or "").startswith(prefix)})
    for arg in names:
        text = helps.get(arg, "")
        assert text.strip() and text != "Path to a configuration file.", f"--{key}.{arg} has no help"
        others = [o for o in names if o != arg and re.search(rf"\b{o}:", text)]
        assert not others, f"--{key}.{arg}'s help holds the text of {others}: {text!r}"


@pytest.mark.parametrize("debug", [False, True])
def test_train_script_user_error_is_one_message_and_exit_2(monkeypatch, capsys, debug):
    from qgmem.errors import UserError
    from qgmem import job as training_cli

    def failing_main(args, default_config=None):
        assert "--debug" not in args
        raise UserError("non-finite training loss nan at step 0")

    monkeypatch.setattr(training_cli, "main", failing_main)
    argv = ["--trainer.max_steps", "1"] + (["--debug"] if debug else [])
    assert training_cli.script_main(argv) == 2
    err = capsys.readouterr().err
    assert "non-finite training loss nan at step 0" in err
    assert ("Traceback" in err) is debug


class DrawingData(TinyData):
    """TinyData whose ``prepare_data`` draws from every global generator, as an in-process cache build does."""

    def __init__(self, draws: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.draws = draws

    def prepare_data(self) -> None:
        import random

        import numpy as np

        for _ in range(self.draws):  # the first call builds; fit's own call finds the cache and draws nothing
            random.random(), np.random.rand(), torch.rand(1)
        self.draws = 0


def test_a_cache_stage_that_draws_does_not_change_the_run(lm_path, tmp_path):
    """Built (draws) or loaded (no draws), the same command gives the same figures.

    Dropout is on, so fit reads torch's generator; were the draws not undone, the runs would differ."""
    runs = [main(tiny_args(tmp_path / f"run{draws}", lm_path, "--model.encoder.dropout", "0.5",
                           "--data.draws", str(draws), "--export", "false"),
                 datamodule_class=DrawingData)
            for draws in (0, 7)]
    assert runs[0]["val"] == runs[1]["val"] and runs[0]["test"] == runs[1]["test"]


STUDY_SETTINGS = ("graph_only", "order_seed", "text_dropout", "text_dropout_units")


def test_the_studies_settings_are_not_the_products(capsys):
    """``python train.py`` neither prints nor takes the settings only a study sets (qgmem.evaluation.study_data)."""
    from qgmem import job as training_cli

    with pytest.raises(SystemExit):
        main(["--print_config"])
    printed = capsys.readouterr().out
    assert "memory_units" in printed and not [s for s in STUDY_SETTINGS if f"{s}:" in printed]
    with pytest.raises(SystemExit):
        main(["--help"])
    usage = capsys.readouterr().out
    assert "--data.memory_units" in usage and not [s for s in STUDY_SETTINGS if f"--data.{s}" in usage]
    with pytest.raises(SystemExit) as refused:
        training_cli.script_main(["--data.text_dropout", "0.5"])
    err = capsys.readouterr().err
    assert refused.value.code == 2 and "text_dropout" in err and "Traceback" not in err


def test_train_script_reports_a_setting_its_objects_refuse_as_a_user_error(capsys):
    """A ``ValueError`` while the run's objects are built from the settings is one message and exit 2."""
    from qgmem import job as training_cli

    assert training_cli.script_main(["--data.split_ratios", "[0.5, 0.5, 0.5]"]) == 2
    err = capsys.readouterr().err
    assert "bad setting: split_ratios must be three non-negative numbers summing to 1" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("args,message", [
    (["--model.stages+=Distillation", "--model.stages.weight", "-0.5"],
     "model.stages: Distillation: weight must be > 0 (leave the stage out for none), got -0.5"),
    (["--model.stages+=Distillation", "--model.stages.topk", "0"], "model.stages: Distillation: topk must be >= 1, got 0"),
    (["--config", "nodes10", "--model.stages.steps", "0", "--model.stages.weight", "0"],
     "model.stages: NodeWordAlignment: steps and weight are both 0, so the stage does nothing"),
    (["--config", "nodes10", "--model.stages+=NodeWordAlignment"], "model.stages lists NodeWordAlignment twice"),
    (["--model.stages", '[{"class_path": "MemoryReconstruction", "init_args": {"steps": 0}}]'],
     "model.stages: MemoryReconstruction: steps and batch_size must be >= 1")])
def test_train_script_refuses_a_bad_stage_setting(args, message, capsys):
    """A stage setting out of range, or a stage listed twice, is one message naming the stage and exit 2,
    before the LM loads."""
    from qgmem import job as training_cli

    assert training_cli.script_main(args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_preset_s_stages_are_changed_from_the_command_line():
    """The last stage's settings by name, a stage appended with ``+=``, the whole list as JSON."""
    from qgmem.job import resolved_config

    def stages(*args: str) -> list[tuple[str, dict]]:
        return [(s["class_path"].rsplit(".", 1)[1], s["init_args"]) for s in resolved_config(list(args))["model"]["stages"]]

    nodes10 = ("--config", "nodes10")
    assert stages(*nodes10) == [("NodeWordAlignment", {"steps": 300, "batch_size": 32, "lr": 3e-3, "weight": 5.0})]
    assert stages(*nodes10, "--model.stages.steps", "3")[0][1]["steps"] == 3
    assert [name for name, _ in stages(*nodes10, "--model.stages+=Distillation")] == ["NodeWordAlignment", "Distillation"]
    assert stages("--model.stages", "[]") == []
    default = stages()
    assert default == [("MemoryReconstruction", {"steps": 40, "batch_size": 8, "lr": 3e-3}),
                       ("Distillation", {"weight": 2.0, "topk": 16, "cache_dir": None})]
    assert stages("--model.stages.topk", "8")[1][1]["topk"] == 8  # the last one


class NoMemoryTextData(TinyData):
    """TinyData whose training samples lack the text the distillation teacher reads."""

    def setup(self, stage=None):
        super().setup(stage)
        self._splits["train"] = [{k: v for k, v in item.items() if k != "memory_text"} for item in self.items["train"]]


def test_distillation_without_the_teachers_text_is_a_setting_error(lm_path, tmp_path):
    from qgmem.errors import SettingError

    with pytest.raises(SettingError, match=r"model\.stages: Distillation.*synthetic#0.*no field 'memory_text'"):
        main(tiny_args(tmp_path / "run", lm_path, "--model.stages+=Distillation", "--export", "false"),
             datamodule_class=NoMemoryTextData)


def test_train_script_refuses_a_text_budget_above_the_graphs_naming_both(capsys):
    """A real run of the default preset: m > k_graph is refused before any cache is built."""
    from qgmem import job as training_cli

    assert training_cli.script_main(["--data.memory_units", "11"]) == 2
    err = capsys.readouterr().err
    assert "data.memory_units = 11 is more than data.activation.k = 10" in err and "Traceback" not in err


def test_the_compact_recipe_trains_and_exports_with_both_stages(lm_path, tmp_path, capsys):
    """The compact preset's recipe at tiny scale: per-unit tokens, stage 1 (reconstruction) and stage 2
    (distillation) in one run, an export that records the text budget, and checkpoints that record the stages."""
    root = tmp_path / "run"
    stages = [{"class_path": "qgmem.training.stages.MemoryReconstruction", "init_args": {"steps": 2, "batch_size": 2}},
              {"class_path": "qgmem.training.stages.Distillation", "init_args": {"weight": 2.0}}]
    metrics = main(tiny_args(root, lm_path, "--model.readout", "summary_units", "--model.num_graph_tokens", "4",
                             "--model.stages", json.dumps(stages), "--data.memory_units", "0"), datamodule_class=TinyData)
    assert any((root / "teacher").iterdir())  # the teacher cache was built under the run
    recorded = torch.load(root / "checkpoints" / "last.ckpt", weights_only=True)["hyper_parameters"]["stages"]
    assert recorded == [{"class_path": "qgmem.training.stages.MemoryReconstruction",
                         "init_args": {"steps": 2, "batch_size": 2, "lr": 3e-3}},
                        {"class_path": "qgmem.training.stages.Distillation",
                         "init_args": {"weight": 2.0, "topk": 16, "cache_dir": None}}]
    assert math.isfinite(metrics["val"]["val/nll"])
    config = json.loads((root / "export" / "config.json").read_text())
    assert config["answer"]["prompt"]["memory_units"] == 0 and config["graph_token"]["readout"] == "summary_units"
