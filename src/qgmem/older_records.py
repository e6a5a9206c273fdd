"""How a record written by an older version reads today: exports, checkpoints, stores, caches, configs.

One home for every such rule, so an old record reads the same wherever it is opened.

Export ``config.json`` (older format versions, the answer contract's parts at the top level before
the ``answer`` block), the graph-token network and prompt blocks of exports and checkpoints (renamed
fields, fields added since), a checkpoint's answer contract (its prompt kept in two places, its activation
in the data info and its graph mode in the hyperparameters before it had one block), its training stages (flat ``align_*``/``distill_*`` settings before
``model.stages`` listed them) and its generation settings (flat before ``model.generation``) read as
the version of today would have written them.

Settings that tuning rounds added and later retired: exports, stores and caches written before a setting
was retired record it (and cache and store keys hash it). Today's code always behaves as one value of
each, so a record holding that value reads as it always did, and a record holding another value is
refused by name: this version cannot reproduce it (the git history holds the code that can). Caches and
stores also keep their keys: a retired setting that every key held keeps its place there with the value
today's code uses. Nothing here is a user's setting; ``ActivationConfig`` and ``ConstructionConfig``
strip these fields from what they read and add the keyed ones to their keys. Retired command flags are
refused by name, saying what happens instead, whether given on the command line or in a ``--config`` file;
so are retired preset names.

Renamed settings: a checkpoint's hyperparameters and a request body read by the names of before (the graph
mode's ``graph``, now ``graph_mode``); a flag or training key of before is refused naming today's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qgmem.errors import ExportFormatError

#: graph-token network: how a config written before these fields existed reads (the paper's network); the
#: product's defaults are ``QGMemModule``'s signature, so the network config has none
GRAPH_TOKEN_LEGACY_FIELDS = {"features": "text", "readout": "mean", "num_graph_tokens": 1}
#: graph-token network: fields renamed since, old name -> name (K was ``num_queries`` before it had one
#: name everywhere)
GRAPH_TOKEN_RENAMED = {"num_queries": "num_graph_tokens"}
#: prompt settings renamed since: old name -> name (saved with older checkpoints and exports)
PROMPT_RENAMED = {"graph_tokens": "num_graph_tokens"}


def read_export_config(config: dict[str, Any], version: int, path: Path) -> dict[str, Any]:
    """An export's ``config.json`` of format ``version`` (already checked readable) as today's version
    reads it: version 1 kept ``graph_token_position`` in the prompt block and its LoRA adapter outside
    PEFT's format (refused: serving cannot apply it); version 3 named K ``graph_tokens`` in the readout
    block (the network and prompt blocks are renamed by :func:`read_graph_token` and :func:`read_prompt`;
    that block is only a record); version 4 and older kept the answer contract's parts at the top level
    (:func:`export_answer_block`)."""
    if version == 1:
        prompt = dict(config.get("prompt") or {})
        config["graph_token_position"] = prompt.pop("graph_token_position", None)
        config["prompt"] = {k: v for k, v in prompt.items() if v is not None}
        if config.get("lora"):
            raise ExportFormatError(f"{path}: field 'lora' is set, but a version-1 export keeps its LoRA adapter "
                                    "outside PEFT's format and serving cannot apply it; re-export the checkpoint")
    readout = config.get("readout")
    if version < 4 and isinstance(readout, dict) and "graph_tokens" in readout:
        readout["num_graph_tokens"] = readout.pop("graph_tokens")
    if version < 5:
        config = export_answer_block(config)
    return config


def export_answer_block(config: dict[str, Any]) -> dict[str, Any]:
    """A ``config.json`` of format 4 or older with the answer contract as version 5 writes it: the top-level
    ``prompt``, ``activation`` and ``graph_mode`` fields as one ``answer`` block (an absent one is left to
    the contract's default), and ``trained_graph_mode``, the mode the weights trained with, as
    ``checkpoint.graph_mode``."""
    config = dict(config)
    answer = {}
    for name in ("prompt", "activation", "graph_mode"):
        value = config.pop(name, None)
        if value:
            answer[name] = value
    trained = config.pop("trained_graph_mode", None)
    config["answer"] = answer
    if trained:
        config["checkpoint"] = {**(config.get("checkpoint") or {}), "graph_mode": trained}
    return config


def read_graph_token(values: dict[str, Any]) -> dict[str, Any]:
    """A graph-token network config with today's field names, the fields it predates at the paper's values."""
    return {**GRAPH_TOKEN_LEGACY_FIELDS, **{GRAPH_TOKEN_RENAMED.get(k, k): v for k, v in values.items()}}


def read_prompt(values: dict[str, Any] | None) -> dict[str, Any]:
    """A saved prompt-settings block with today's field names."""
    return {PROMPT_RENAMED.get(k, k): v for k, v in (values or {}).items()}


def checkpoint_prompt(hp: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's prompt-settings block: its hyperparameters' ``prompt``, or, in a checkpoint written
    before that existed, the parts it kept in the hyperparameters and the data info (unset ones omitted)."""
    if hp.get("prompt"):
        return hp["prompt"]
    legacy = {"enable_thinking": hp.get("enable_thinking"), "max_prompt_tokens": info.get("max_prompt_tokens"),
              "max_answer_tokens": info.get("max_answer_tokens")}
    return {k: v for k, v in legacy.items() if v is not None}

def checkpoint_contract(hp: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
    """The answer-contract block of a checkpoint written before it had one: its prompt
    (:func:`checkpoint_prompt`), the activation its data info records and the mode its module trained with
    (:func:`checkpoint_graph_mode`)."""
    return {"prompt": read_prompt(checkpoint_prompt(hp, info)), "activation": info.get("activation") or {},
            "graph_mode": checkpoint_graph_mode(hp)}


def checkpoint_graph_mode(hp: dict[str, Any]) -> str:
    """The graph mode a checkpoint's module trained with: its hyperparameter ``graph_mode``, formerly ``graph``
    (:func:`read_module_hparams`)."""
    return read_module_hparams(hp).get("graph_mode") or "token"


#: module hyperparameters whose values moved to the checkpoint's answer-contract block
#: (:func:`checkpoint_contract` reads them from an older checkpoint)
CONTRACT_MODULE_HPARAMS = ("prompt",)

#: a checkpoint's training-stage hyperparameters before ``model.stages`` listed the stages
#: (``align_objective``: ``words`` or ``reconstruct``; a checkpoint without one predates ``reconstruct``)
STAGE_HPARAMS = ("align_steps", "align_objective", "align_batch_size", "align_lr", "align_weight",
                 "distill_weight", "distill_topk", "teacher_cache_dir")
#: module hyperparameters retired without a trace in the trained weights (the checkpoint's replace them)
RETIRED_MODULE_HPARAMS = ("match_embedding_scale",)
#: where the stages of such a checkpoint live today
STAGES_PACKAGE = "qgmem.training.stages"


def checkpoint_stages(hp: dict[str, Any]) -> list[dict[str, Any]]:
    """The stages an older checkpoint's flat hyperparameters describe, as ``{class_path, init_args}`` records
    (a setting the checkpoint lacks is left to the stage's default; none recorded: no stages)."""
    def args(**names: str) -> dict[str, Any]:
        return {new: hp[old] for new, old in names.items() if hp.get(old) is not None}

    stages = []
    steps, weight = int(hp.get("align_steps") or 0), float(hp.get("align_weight") or 0.0)
    pre = args(steps="align_steps", batch_size="align_batch_size", lr="align_lr")
    if hp.get("align_objective", "words") == "reconstruct":
        if steps > 0:
            stages.append({"class_path": f"{STAGES_PACKAGE}.MemoryReconstruction", "init_args": pre})
    elif steps > 0 or weight > 0:
        stages.append({"class_path": f"{STAGES_PACKAGE}.NodeWordAlignment",
                       "init_args": {**pre, **args(weight="align_weight")}})
    if float(hp.get("distill_weight") or 0.0) > 0:
        stages.append({"class_path": f"{STAGES_PACKAGE}.Distillation",
                       "init_args": args(weight="distill_weight", topk="distill_topk", cache_dir="teacher_cache_dir")})
    return stages


#: a checkpoint's generation hyperparameters before ``model.generation`` held them (absent ones: the defaults)
GENERATION_HPARAMS = ("max_new_tokens", "val_generate_batches", "test_generate_batches", "num_examples")


def checkpoint_hparams(hp: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's module hyperparameters as today's module takes them: the flat stage settings of an
    older one as its ``stages`` list, its flat generation settings as its ``generation`` block, renamed
    settings by their names of today (:func:`read_module_hparams`), retired settings and those the
    answer-contract block holds now left out."""
    hp = {k: v for k, v in read_module_hparams(hp).items() if k not in RETIRED_MODULE_HPARAMS + CONTRACT_MODULE_HPARAMS}
    if "generation" not in hp:
        flat = {k: hp.pop(k) for k in GENERATION_HPARAMS if k in hp}
        hp["generation"] = flat
    if "stages" not in hp:
        stages = checkpoint_stages(hp)
        hp = {**{k: v for k, v in hp.items() if k not in STAGE_HPARAMS}, "stages": stages}
    return hp


#: module hyperparameters renamed since: old name -> name (the graph mode was ``graph`` before it had one
#: name everywhere, ``graph_mode``)
MODULE_RENAMED = {"graph": "graph_mode"}
#: flags of ``qgmem answer`` renamed since -> what to write instead
ANSWER_FLAGS: dict[str, str] = {"graph": "the graph mode's one name is --graph-mode (token, none or shuffled)"}
#: flags of ``qgmem eval-qa`` renamed since -> what to write instead
EVAL_QA_FLAGS: dict[str, str] = {
    "graph": "the graph modes' one name is --graph-modes (comma-separated: token, none, shuffled, ablated)",
}
#: fields of the memory service's request bodies renamed since: old name -> name (still read, so clients
#: written before keep working; the reply's field was already ``graph_mode``)
REQUEST_RENAMED: dict[str, str] = {"graph": "graph_mode"}
#: a training run's ``metrics.json`` fields renamed since: old name -> name
RUN_METRICS_RENAMED: dict[str, str] = {"graph": "graph_mode"}


def read_run_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """A run's ``metrics.json`` with today's field names (:data:`RUN_METRICS_RENAMED`)."""
    return {RUN_METRICS_RENAMED.get(k, k): v for k, v in metrics.items()}


def read_module_hparams(hp: dict[str, Any]) -> dict[str, Any]:
    """Module hyperparameters with today's names (:data:`MODULE_RENAMED`)."""
    return {MODULE_RENAMED.get(k, k): v for k, v in hp.items()}


#: activation: retired field -> the value today's activation always uses
ACTIVATION_RETIRED: dict[str, object] = {
    "expansion_seeds": 0, "expansion_max_entity_units": 20, "feedback_seeds": 0, "hop_extra_units": 0,
    "fusion_weights": {}, "lexical_speaker_once": False, "superseded": "attach", "extra": {},
    # no default, preset or documented choice set them (reverse edges in the local graph; source text
    # in each working-memory entry)
    "reverse_edges": False, "source_chars": 0,
}
#: activation: retired fields that every cache key held (they were in the first keyed settings)
ACTIVATION_KEYED = ("superseded", "extra", "reverse_edges", "source_chars")
#: activation: a retired value of a field that stays
ACTIVATION_RETIRED_VALUES: dict[str, tuple[object, ...]] = {"dense_speaker_names": ("blend",)}

#: construction: retired field -> the value today's construction always uses
CONSTRUCTION_RETIRED: dict[str, object] = {"unread_turn_fallback": True, "source_turn_label": True}
#: construction: retired fields that store and cache keys held while they had today's value
CONSTRUCTION_KEYED = ("unread_turn_fallback",)


#: presets retired by name -> what trains their setting today (``--config NAME`` is refused saying so)
RETIRED_PRESETS: dict[str, str] = {
    "compact": "the compact prompt is the default since issue 63 (python train.py, or --config default); "
               "the former default is --config nodes10",
}

#: keys of the training configuration (``python train.py``, ``qgmem fit|validate|test``) that were renamed or retired
#: -> what sets their value now
TRAINING_FLAGS: dict[str, str] = {
    "model.graph": "the graph mode's one name is model.graph_mode (--model.graph_mode token|none|shuffled)",
    "answer_graph": "the export's default answer mode is the data module's data.graph_mode "
                    "(--data.graph_mode token|none, or graph_mode under data: in the YAML)",
}

#: flags of ``qgmem eval-retrieval`` that no default or documented choice needed -> what happens instead
RETRIEVAL_EVAL_FLAGS: dict[str, str] = {
    "pool_size": "the fused pool is ActivationConfig's pool_size (100), or k when k is larger",
    "limit_per_category": "--limit N evaluates the first N cases",
    "device": "model rerankers run on cuda when it is available, else on the CPU",
}


def _read(values: dict[str, Any], retired: dict[str, object], what: str) -> dict[str, Any]:
    """``values`` without the ``retired`` fields. A field the record lacks reads as today's value: records
    written since the retirement lack it too. (A construction record written before
    ``unread_turn_fallback`` existed, which behaved as ``False``, therefore reads as ``True``.)"""
    values = dict(values)
    for name, today in retired.items():
        recorded = values.pop(name, today)
        if name == "fusion_weights":
            recorded = dict(recorded or {})
        if recorded != today:
            raise ValueError(f"{what} setting {name}={recorded!r} was retired; this version always uses "
                             f"{today!r} and cannot reproduce it")
    return values


def read_activation(values: dict[str, Any]) -> dict[str, Any]:
    """An activation record without its retired fields; a retired value it cannot reproduce is an error."""
    values = _read(values, ACTIVATION_RETIRED, "activation")
    for name, gone in ACTIVATION_RETIRED_VALUES.items():
        if values.get(name) in gone:
            raise ValueError(f"activation setting {name}={values[name]!r} was retired and cannot be reproduced")
    return values


def read_construction(values: dict[str, Any]) -> dict[str, Any]:
    """A construction record without its retired fields; a retired value this version cannot reproduce is
    an error."""
    return _read(values, CONSTRUCTION_RETIRED, "construction")


def activation_key(key: dict[str, Any]) -> dict[str, Any]:
    """``key`` with the retired fields every activation cache key held, at today's values."""
    return {**key, **{name: ACTIVATION_RETIRED[name] for name in ACTIVATION_KEYED}}


def construction_key(key: dict[str, Any]) -> dict[str, Any]:
    """``key`` with the retired construction fields that keys held, at today's values."""
    return {**key, **{name: CONSTRUCTION_RETIRED[name] for name in CONSTRUCTION_KEYED}}


def stored_source_label(meta: dict[str, Any]) -> bool:
    """Whether a store's source turns were embedded as ``speaker: text`` (its construction settings say
    so; a store recording none was built with the label). Only a store without source-turn vectors of
    its own needs this, to embed its turns as it would have."""
    return bool(meta.get("params", {}).get("source_turn_label", True))

#: flags of ``qgmem serve`` that were retired -> what replaced them
SERVE_FLAGS: dict[str, str] = {
    "store_root": "the memories live in a database: --store sqlite:///DIR/memories.db (the default is "
                  "sqlite:///memories/memories.db) or --store postgresql://…; a folder of the earlier format "
                  "moves there with qgmem migrate-store --from DIR --to URL",
}
