"""Records of older versions: older exports, checkpoints and prompt blocks read as today's; retired settings
keep the keys of before, old records read, lost values are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qgmem.activation.config import ActivationConfig
from qgmem.errors import ExportFormatError
from qgmem.memory.config import ConstructionConfig
from qgmem.older_records import checkpoint_prompt, read_export_config, read_graph_token, read_prompt

#: ``ActivationConfig().key_dict()`` and ``.to_dict()`` as written before the retired fields left (the
#: default's activation key of every cache built then, and what an export of then records)
OLD_ACTIVATION_KEY = {
    "ann_min_units": 50000, "attribute_threshold": 0.6, "bm25_b": 0.75, "bm25_k1": 1.5, "channel_depth": 100,
    "channels": ["lexical", "semantic", "attribute", "source"], "dense_speaker_names": "drop",
    "embedding_weight": 0.3, "extra": {}, "hnsw_ef_search": 128, "hnsw_m": 32, "k": 10, "lexical_weight": 0.2,
    "max_units_per_turn": 1, "parser": "heuristic", "pool_size": 100, "reranker": "embedding",
    "reranker_batch_size": 16, "reranker_max_doc_tokens": 256, "reranker_path": None, "reverse_edges": False,
    "rrf_k": 60.0, "source_chars": 0, "source_weight": 1.0, "superseded": "attach",
}
OLD_ACTIVATION_RECORD = {
    **OLD_ACTIVATION_KEY, "expansion_max_entity_units": 20, "expansion_seeds": 0, "feedback_seeds": 0,
    "fusion_weights": {}, "hop_extra_units": 0, "lexical_speaker_once": False, "model_weight": 1.0, "rerank_depth": 0,
}
#: ``ConstructionConfig().key_dict()`` and ``.to_dict()`` as written then (every default store's params)
OLD_CONSTRUCTION_KEY = {
    "consolidation": "auto", "extractor": "parser", "llm_retries": 1, "max_new_tokens": 768,
    "min_fact_similarity": 0.35, "min_trace_size": 2, "min_words": 4, "neighbours": 20, "temperature": 0.0,
    "trace_threshold": 0.8, "unread_turn_fallback": True, "window_overlap": 2, "window_size": 6,
}
OLD_CONSTRUCTION_RECORD = {**OLD_CONSTRUCTION_KEY, "source_turn_label": True}


def _json(value: dict) -> dict:
    return json.loads(json.dumps(value))


def test_default_keys_are_the_keys_of_before():
    assert _json(ActivationConfig().key_dict()) == OLD_ACTIVATION_KEY
    assert _json(ConstructionConfig().key_dict()) == OLD_CONSTRUCTION_KEY
    # negative control: a changed setting is another key
    assert _json(ActivationConfig(k=5).key_dict()) != OLD_ACTIVATION_KEY


def test_old_records_read_as_today_s_defaults():
    assert ActivationConfig.from_dict(OLD_ACTIVATION_RECORD) == ActivationConfig()
    assert ConstructionConfig.from_dict(OLD_CONSTRUCTION_RECORD) == ConstructionConfig()
    # today's records, which lack the retired fields, read back too
    assert ActivationConfig.from_dict(ActivationConfig(k=4).to_dict()) == ActivationConfig(k=4)
    eight = ConstructionConfig(window_size=8)
    assert ConstructionConfig.from_dict(eight.to_dict()) == eight


@pytest.mark.parametrize(("field", "value"), [
    ("expansion_seeds", 3), ("feedback_seeds", 1), ("hop_extra_units", 20), ("expansion_max_entity_units", 5),
    ("fusion_weights", {"source": 2.0}), ("lexical_speaker_once", True), ("superseded", "fold"),
    ("dense_speaker_names", "blend"), ("reverse_edges", True), ("source_chars", 200),
])
def test_a_retired_activation_value_is_refused_by_name(field, value):
    with pytest.raises(ValueError, match=field):
        ActivationConfig.from_dict({**OLD_ACTIVATION_RECORD, field: value})


def test_a_retired_construction_value_is_refused_by_name():
    with pytest.raises(ValueError, match="source_turn_label"):
        ConstructionConfig.from_dict({**OLD_CONSTRUCTION_RECORD, "source_turn_label": False})
    with pytest.raises(ValueError, match="unread_turn_fallback"):
        ConstructionConfig.from_dict({**OLD_CONSTRUCTION_RECORD, "unread_turn_fallback": False})
    with pytest.raises(ValueError, match="unknown construction settings"):
        ConstructionConfig.from_dict({**OLD_CONSTRUCTION_RECORD, "no_such": 1})


@pytest.mark.parametrize("where", ["flag", "config"])
@pytest.mark.parametrize(("name", "value"), [("pool_size", "200"), ("limit_per_category", "2"), ("device", "cuda")])
def test_a_retired_eval_retrieval_flag_is_refused_by_name(name, value, where, tmp_path, capsys):
    """An old command line or ``--config`` file of eval-retrieval naming a retired flag: exit 2, the flag named
    and what happens instead (not argparse's "unrecognized arguments")."""
    from qgmem.cli import main
    from qgmem.older_records import RETRIEVAL_EVAL_FLAGS

    flag = "--" + name.replace("_", "-")
    if where == "flag":
        extra = [flag, value]
    else:
        (tmp_path / "old.yaml").write_text(f"{name}: {value}\nk: 5\n")
        extra = ["--config", str(tmp_path / "old.yaml")]
    assert main(["eval-retrieval", "--dataset", "locomo", "--path", str(tmp_path / "x.json"), *extra]) == 2
    assert f"{flag} was retired: {RETRIEVAL_EVAL_FLAGS[name]}" in capsys.readouterr().err


def test_an_older_run_s_metrics_read_with_the_graph_mode_s_name():
    from qgmem.older_records import read_run_metrics

    assert read_run_metrics({"graph": "none", "best_score": 1.5}) == {"graph_mode": "none", "best_score": 1.5}
    assert read_run_metrics({"graph_mode": "token"}) == {"graph_mode": "token"}  # today's, as it is


@pytest.mark.parametrize("where", ["flag", "config"])
@pytest.mark.parametrize(("command", "args", "retired"), [
    ("answer", ["--question", "Where?", "--history", "h.json"], "ANSWER_FLAGS"),
    ("eval-qa", ["--dataset", "locomo", "--path", "x.json"], "EVAL_QA_FLAGS"),
])
def test_the_graph_mode_s_older_flag_is_refused_by_name(command, args, retired, where, tmp_path, capsys):
    """``--graph`` (and a ``graph:`` key of a ``--config`` file) of ``answer`` and ``eval-qa``: exit 2 naming
    the flag and its name of today, before any export is read."""
    import qgmem.older_records as older
    from qgmem.cli import main

    extra = ["--graph", "none"]
    if where == "config":
        (tmp_path / "old.yaml").write_text("graph: none\n")
        extra = ["--config", str(tmp_path / "old.yaml")]
    assert main([command, "--export", str(tmp_path / "no-export"), *args, *extra]) == 2
    err = capsys.readouterr().err
    assert f"--graph was retired: {getattr(older, retired)['graph']}" in err and "Traceback" not in err
    assert "--graph-mode" in err


@pytest.mark.parametrize("where", ["flag", "config"])
def test_the_training_s_model_graph_is_refused_by_name(where, tmp_path, capsys):
    """``model.graph`` (a flag, or a key of a training YAML written before) is refused saying
    ``model.graph_mode``; the control: ``model.graph_mode`` parses."""
    from qgmem.cli import main
    from qgmem.older_records import TRAINING_FLAGS

    extra = ["--model.graph", "none"]
    if where == "config":
        (tmp_path / "old.yaml").write_text("model:\n  graph: none\n")
        extra = ["--config", str(tmp_path / "old.yaml")]
    with pytest.raises(SystemExit) as refused:
        main(["fit", *extra, "--print_config"])
    err = capsys.readouterr().err
    assert refused.value.code == 2 and "Traceback" not in err
    assert f"--model.graph was retired: {TRAINING_FLAGS['model.graph']}" in err.splitlines()[-1]
    with pytest.raises(SystemExit) as printed:
        main(["fit", "--model.graph_mode", "none", "--print_config"])
    assert printed.value.code in (0, None) and "  graph_mode: none\n" in capsys.readouterr().out


def test_a_version_1_export_config_reads_as_today_s():
    config = {"prompt": {"max_prompt_tokens": 512, "note": None, "graph_token_position": "before the question"},
              "readout": {"kind": "mean"}}
    assert read_export_config(config, 1, Path("config.json")) == {
        "answer": {"prompt": {"max_prompt_tokens": 512}}, "graph_token_position": "before the question",
        "readout": {"kind": "mean"}}


def test_a_version_1_export_with_lora_is_refused_by_field():
    with pytest.raises(ExportFormatError, match=r"^x/config.json: field 'lora' is set, but a version-1 export"):
        read_export_config({"prompt": {}, "lora": {"r": 8}}, 1, Path("x/config.json"))


def test_k_s_older_readout_name_reads_as_today_s_until_version_4():
    assert read_export_config({"readout": {"kind": "nodes", "graph_tokens": 3}}, 3, Path("c"))["readout"] == {
        "kind": "nodes", "num_graph_tokens": 3}
    # a version-4 record is today's: nothing is renamed
    assert read_export_config({"readout": {"graph_tokens": 3}}, 4, Path("c"))["readout"] == {"graph_tokens": 3}


def test_an_older_network_config_reads_with_today_s_names_and_the_paper_s_fields():
    assert read_graph_token({"feature_dim": 8, "num_queries": 4, "readout": "queries"}) == {
        "feature_dim": 8, "num_graph_tokens": 4, "readout": "queries", "features": "text"}
    assert read_graph_token({"feature_dim": 8}) == {"feature_dim": 8, "features": "text", "readout": "mean",
                                                    "num_graph_tokens": 1}


def test_an_older_prompt_block_reads_with_today_s_names():
    assert read_prompt({"graph_tokens": 2, "enable_thinking": True}) == {"num_graph_tokens": 2, "enable_thinking": True}
    assert read_prompt(None) == {}


def test_an_older_checkpoint_s_prompt_contract_is_gathered_from_its_two_places():
    assert checkpoint_prompt({"prompt": {"max_prompt_tokens": 99}, "enable_thinking": True}, {}) == {
        "max_prompt_tokens": 99}
    assert checkpoint_prompt({"enable_thinking": True}, {"max_prompt_tokens": 300, "max_answer_tokens": None}) == {
        "enable_thinking": True, "max_prompt_tokens": 300}


def test_an_older_checkpoint_s_flat_stage_settings_read_as_its_stages():
    from qgmem.older_records import checkpoint_hparams, checkpoint_stages

    words = {"align_steps": 300, "align_objective": "words", "align_batch_size": 32, "align_lr": 0.003,
             "align_weight": 5.0, "distill_weight": 0.0, "distill_topk": 16, "teacher_cache_dir": None}
    assert checkpoint_stages(words) == [{"class_path": "qgmem.training.stages.NodeWordAlignment",
                                         "init_args": {"steps": 300, "batch_size": 32, "lr": 0.003, "weight": 5.0}}]
    compact = {**words, "align_objective": "reconstruct", "align_steps": 40, "align_batch_size": 8, "align_weight": 0.0,
               "distill_weight": 2.0, "teacher_cache_dir": "/t"}
    assert checkpoint_stages(compact) == [
        {"class_path": "qgmem.training.stages.MemoryReconstruction", "init_args": {"steps": 40, "batch_size": 8,
                                                                                   "lr": 0.003}},
        {"class_path": "qgmem.training.stages.Distillation", "init_args": {"weight": 2.0, "topk": 16, "cache_dir": "/t"}}]
    # the paper's (no stage at all), a checkpoint older than the stages, and one older than align_objective
    assert checkpoint_stages({**words, "align_steps": 0, "align_weight": 0.0}) == []
    assert checkpoint_stages({"graph": "token"}) == []
    assert checkpoint_stages({"align_steps": 5, "align_weight": 0.5}) == [
        {"class_path": "qgmem.training.stages.NodeWordAlignment", "init_args": {"steps": 5, "weight": 0.5}}]
    # the whole hyperparameter block: the flat and retired keys go, the rest stays; today's block is kept
    read = checkpoint_hparams({**compact, "graph": "none", "match_embedding_scale": True})
    assert read == {"graph_mode": "none", "stages": checkpoint_stages(compact), "generation": {}}
    today = {"graph_mode": "token", "stages": [], "generation": {"max_new_tokens": 5}}
    assert checkpoint_hparams(today) == today


def test_an_older_checkpoint_s_graph_reads_as_its_graph_mode():
    """The graph mode was the hyperparameter ``graph`` before it had one name everywhere."""
    from qgmem.older_records import checkpoint_hparams, read_module_hparams

    assert read_module_hparams({"graph": "shuffled", "lm": "x"}) == {"graph_mode": "shuffled", "lm": "x"}
    assert checkpoint_hparams({"graph": "none", "stages": [], "generation": {}}) == {
        "graph_mode": "none", "stages": [], "generation": {}}
    # negative control: today's name and the graph objects' keys elsewhere are left alone
    assert read_module_hparams({"graph_mode": "none"}) == {"graph_mode": "none"}


def test_an_older_checkpoint_s_flat_generation_settings_read_as_its_generation_block():
    from qgmem.older_records import checkpoint_hparams
    from qgmem.training.module import GenerationSettings

    flat = {"max_new_tokens": 24, "val_generate_batches": 1, "test_generate_batches": None, "num_examples": 8,
            "stages": []}
    read = checkpoint_hparams(flat)
    assert read == {"stages": [], "generation": {"max_new_tokens": 24, "val_generate_batches": 1,
                                                 "test_generate_batches": None, "num_examples": 8}}
    assert GenerationSettings(**read["generation"]) == GenerationSettings(24, 1, None, 8)


def test_the_stage_records_an_older_checkpoint_gets_build_the_stages():
    """Each record names a stage class and its settings as they are today (a drift fails here)."""
    from qgmem.older_records import checkpoint_stages
    from qgmem.training.stages import Distillation, MemoryReconstruction, NodeWordAlignment, as_stage

    stages = [as_stage(r) for r in checkpoint_stages({"align_objective": "reconstruct", "align_steps": 4,
                                                      "align_batch_size": 2, "align_lr": 0.01, "distill_weight": 0.5,
                                                      "distill_topk": 8, "teacher_cache_dir": "t"})]
    assert stages == [MemoryReconstruction(steps=4, batch_size=2, lr=0.01), Distillation(weight=0.5, topk=8, cache_dir="t")]
    assert [as_stage(r) for r in checkpoint_stages({"align_steps": 3, "align_weight": 0.5, "align_lr": 0.1})] == [
        NodeWordAlignment(steps=3, lr=0.1, weight=0.5)]


FIXTURES = Path(__file__).resolve().parent / "fixtures"


def test_a_version_4_export_config_reads_as_today_s_answer_block():
    """Version 4 kept the answer contract's parts at the top level and named the weights' mode
    ``trained_graph_mode``; it reads as version 5 writes it, and as one contract."""
    from qgmem.activation.answer_contract import AnswerContract
    from qgmem.prompting import PromptSettings

    old = json.loads((FIXTURES / "export_v4" / "config.json").read_text())
    read = read_export_config(dict(old), 4, Path("config.json"))
    assert not {"prompt", "activation", "graph_mode", "trained_graph_mode"} & set(read)
    assert read["answer"] == {"prompt": old["prompt"], "activation": old["activation"], "graph_mode": "none"}
    assert read["checkpoint"] == {**old["checkpoint"], "graph_mode": "token"}
    contract = AnswerContract.from_export_config(read)
    assert contract.prompt == PromptSettings.from_dict(old["prompt"]) and contract.prompt.memory_units == 3
    assert contract.activation == ActivationConfig.from_dict(old["activation"]) and contract.graph_mode == "none"
    # an export older than the mode fields answers with the tokens, as it did; today's record is left as it is
    assert AnswerContract.from_export_config(read_export_config({"prompt": {}}, 3, Path("c"))).graph_mode == "token"
    assert read_export_config({"answer": {"graph_mode": "none"}}, 5, Path("c")) == {"answer": {"graph_mode": "none"}}


def test_an_older_checkpoint_s_answer_contract_is_gathered_from_where_it_was_kept():
    from qgmem.activation.answer_contract import AnswerContract
    from qgmem.older_records import checkpoint_contract

    info = {"activation": ActivationConfig(k=7).to_dict(), "max_prompt_tokens": 300}
    # the prompt hyperparameter of before this block, the module's mode under its old name and its new one
    for hp in ({"prompt": {"memory_units": 2, "num_graph_tokens": 5}, "graph": "none"},
               {"prompt": {"memory_units": 2, "num_graph_tokens": 5}, "graph_mode": "none"}):
        contract = AnswerContract.from_dict(checkpoint_contract(hp, info))
        assert contract.prompt.memory_units == 2 and contract.prompt.num_graph_tokens == 5
        assert contract.activation.k == 7 and contract.graph_mode == "none"
    # older still: the prompt's parts in the hyperparameters and the data info, no activation recorded
    block = checkpoint_contract({"enable_thinking": True}, {"max_prompt_tokens": 300})
    assert block == {"prompt": {"enable_thinking": True, "max_prompt_tokens": 300}, "activation": {},
                     "graph_mode": "token"}


def test_an_older_checkpoint_s_prompt_hyperparameter_is_left_out_of_the_module_s():
    from qgmem.older_records import checkpoint_hparams

    read = checkpoint_hparams({"prompt": {"memory_units": 3}, "graph": "token", "stages": [], "generation": {}})
    assert read == {"graph_mode": "token", "stages": [], "generation": {}}  # and its older graph name read as today's


@pytest.mark.parametrize("where", ["flag", "config"])
def test_the_retired_answer_graph_is_refused_naming_data_graph_mode(where, tmp_path, capsys):
    """``answer_graph`` (the export's answer mode, now ``data.graph_mode``): refused naming the setting
    that replaced it, exit 2, on the command line or in a YAML (not LightningCLI's "unrecognized")."""
    from qgmem import job
    from qgmem.older_records import TRAINING_FLAGS

    if where == "flag":
        args = ["--answer_graph", "none"]
    else:
        (tmp_path / "old.yaml").write_text("answer_graph: none\n")
        args = ["--config", "default", "--config", str(tmp_path / "old.yaml")]
    with pytest.raises(SystemExit) as refused:  # LightningCLI's parser exits as it does for any bad key
        job.script_main(args)
    err = capsys.readouterr().err
    assert refused.value.code == 2
    assert f"--answer_graph was retired: {TRAINING_FLAGS['answer_graph']}" in err and "data.graph_mode" in err
    assert "Traceback" not in err
