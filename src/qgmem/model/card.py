"""The export's model card: YAML metadata the Hub reads (licence, base model, data sets, metrics) + prose.

Metrics come only from the run that produced the exported checkpoint (``config["metrics"]``); a card
of an export without recorded metrics says so instead of borrowing another run's.
"""

from __future__ import annotations

import json
from typing import Any

from huggingface_hub import ModelCard, ModelCardData
from huggingface_hub.repocard_data import EvalResult

from qgmem.lm import EMBEDDED_LM, EMBEDDED_LM_HUB_ID

#: data set name in the config -> (Hub id, licence of the data the model was trained on)
DATASETS = {
    "convomem": ("Salesforce/ConvoMem", "cc-by-nc-4.0"),
    "locomo": ("snap-research/locomo", "cc-by-nc-4.0"),
    "longmemeval": ("xiaowu0162/longmemeval", "mit"),
}
#: the embedded LM alias -> the Hub model it was converted from
BASE_MODELS = {EMBEDDED_LM: EMBEDDED_LM_HUB_ID}


def _metric_rows(metrics: dict[str, Any] | None) -> list[tuple[str, str, float]]:
    rows = []
    for split in ("val", "test"):
        values = (metrics or {}).get(split) or {}
        for name in ("nll", "em", "f1"):
            for key in (f"{split}/{name}", name):
                if key in values and values[key] is not None:
                    rows.append((split, name, float(values[key])))
                    break
    return rows


def card_data(config: dict[str, Any]) -> ModelCardData:
    """The YAML block: licence of the training data, base model, data sets, this run's test metrics."""
    dataset = str(config.get("dataset") or "")
    hub_dataset, licence = DATASETS.get(dataset, (None, None))
    lm_id = str((config.get("lm") or {}).get("id") or "")
    base_model = BASE_MODELS.get(lm_id, lm_id if lm_id.count("/") == 1 else None)
    results = [EvalResult(task_type="question-answering", dataset_type=hub_dataset or dataset or "unknown",
                          dataset_name=f"{dataset} ({split} split of the training run)", dataset_split=split,
                          metric_type=name, metric_name=name.upper() if name != "nll" else "answer NLL",
                          metric_value=round(value, 4))
               for split, name, value in _metric_rows(config.get("metrics")) if split == "test"]
    return ModelCardData(
        license=licence, base_model=base_model, datasets=[hub_dataset] if hub_dataset else None,
        library_name="qgmem", tags=["graph-token", "conversational-memory", "qgmem"],
        metrics=sorted({name for split, name, _ in _metric_rows(config.get("metrics"))}) or None,
        model_name="qgmem-graph-token" if results else None, eval_results=results or None,
    )


def _modes(config: dict[str, Any]) -> tuple[Any, Any]:
    """The default answer mode (``answer.graph_mode``) and the mode the weights trained with
    (``checkpoint.graph_mode``)."""
    return (config.get("answer") or {}).get("graph_mode"), (config.get("checkpoint") or {}).get("graph_mode")


def _answer_mode(config: dict[str, Any]) -> str:
    """What an answer reads by default (field ``answer.graph_mode``), and how the weights trained when that
    differs."""
    mode, trained = _modes(config)
    said = {"token": "the graph tokens", "none": "the text prompt alone"}.get(mode, f"graph mode `{mode}`")
    if trained and trained != mode:
        said += f" (trained with graph mode `{trained}`; a request's `graph` field picks another)"
    return said


def _budgets(config: dict[str, Any]) -> str:
    """What the LM reads of the working memory, and why the embedded default reads it that way."""
    answer = config.get("answer") or {}
    prompt, k = answer.get("prompt") or {}, (answer.get("activation") or {}).get("k")
    m, tokens = prompt.get("memory_units"), prompt.get("num_graph_tokens")
    graph = f"{tokens} graph tokens over {k if k is not None else 'all'} units"
    if m is None:
        return f"the whole working memory as text and {graph}"
    return (f"the top {m} working-memory units as text and {graph} (the compact prompt; the embedded default "
            "since its 3 units of text are within noise of 10 on validation at half the prompt tokens, and its "
            "graph tokens break greedy answers less often than the former default's)")


def _answer_rule(config: dict[str, Any]) -> str:
    """Why the export answers with or without its graph tokens by default."""
    mode, trained = _modes(config)
    if mode == "none" and trained not in (None, "none"):
        return ("The text prompt is the default answer: by the answer-mode rule the graph tokens ship only if "
                "held-out greedy F1 with them is not lower than without, in both ConvoMem forms, and their "
                "replies are not more often degenerate (empty, a lead-in line, an echoed memory entry).")
    return ("Answers are read by the answer cut: the first line that holds an answer, lead-in lines "
            "(\"The answer is:\") skipped and an echoed memory entry reduced to its fact.")


def model_card(config: dict[str, Any]) -> str:
    """The whole ``README.md`` of an export folder."""
    g, lm = config.get("graph_token") or {}, config.get("lm") or {}
    enc = g.get("encoder") or {}
    sentence = config.get("sentence_encoder") or {}
    rows = [f"| {s} | {n} | {v:.4f} |" for s, n, v in _metric_rows(config.get("metrics"))]
    licence = card_data(config).license
    body = "\n".join([
        "# QGMem graph-token encoder",
        "",
        "A relation-aware graph encoder (TransformerConv with predicate edge features) and a two-layer",
        "projector that turn a question's local memory graph into graph tokens for a frozen causal LM",
        "(QGMem, arXiv 2610.11920, §III-C). Only these weights were trained; the LM and the sentence encoder",
        "are frozen." + (" LoRA adapters of the LM are in `lora_adapter/` (PEFT format)." if config.get("lora") else ""),
        "",
        f"- LM: `{lm.get('id')}` (hidden size {lm.get('hidden_size')}, dtype {lm.get('dtype')})",
        f"- sentence encoder: `{sentence.get('id')}` ({sentence.get('dim')}-d node/edge features)",
        f"- encoder: {enc.get('layers')} layers, {enc.get('heads')} heads, width {enc.get('hidden')}; "
        f"answers read {_answer_mode(config)}",
        f"- reads: {_budgets(config)}",
        *([f"- the graph enters the LM as keys and values at every one of its {g.get('lm_layers')} layers "
           "(`injection: kv_prefix`); `--lm-url` cannot serve it"] if g.get("injection") == "kv_prefix" else []),
        f"- prompt: {json.dumps({k: v for k, v in ((config.get('answer') or {}).get('prompt') or {}).items() if k != 'system_prompt'})}",
        f"- activation: {json.dumps(config.get('activation_key_parameters') or {})}",
        f"- trained on: `{config.get('dataset')}`" + (f" (data licence {licence})" if licence else "")
        + f"; data cache key `{config.get('cache_key')}`; qgmem {config.get('qgmem_version')}",
        "",
        *(["| split | metric | value |", "| --- | --- | --- |", *rows] if rows else
          ["No metrics were recorded for the run that produced this checkpoint."]),
        "",
        _answer_rule(config),
        "",
        "NLL is the mean answer-token negative log-likelihood; EM and F1 are exact match and token F1 of",
        "greedy answers against the references, with the SQuAD normalization of `qgmem.text`.",
        "",
        "```python",
        "from qgmem.serving import QGMemPipeline",
        "pipe = QGMemPipeline.from_pretrained(\"<this folder or hub id>\")",
        "pipe.remember(history)            # a list of sessions, or a data set file",
        "print(pipe.answer([\"What did I say about ...?\"])[0].answer)",
        "```",
        "",
    ])
    return ModelCard(f"---\n{card_data(config).to_yaml()}\n---\n\n{body}").content
