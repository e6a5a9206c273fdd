"""``bench/serving/compact_answer.py``: the two exports it serves have their presets' budgets and shapes.

The latency itself is measured by the bench (docs/BENCHMARKS.md); here, that the exports it compares
are what the presets train: the default's (the compact prompt) text budget of 3 units and 11 graph
tokens, the former default's (nodes10) full text and 17 tokens, each loadable by the serving pipeline's config reader.
"""

from __future__ import annotations

import json

import yaml

from bench_script import REPO, load_bench_script


def test_each_untrained_export_has_its_presets_budgets_and_readout(tmp_path):
    script = load_bench_script("bench.serving.serve_load")
    assert script_presets() == ("nodes10", "default")
    for preset, (units, tokens, readout) in {"nodes10": (None, 17, "summary_nodes"),
                                              "default": (3, 11, "summary_units")}.items():
        folder = script.untrained_export(tmp_path / preset, preset)
        config = json.loads((folder / "config.json").read_text())
        answer = config["answer"]
        assert answer["prompt"]["memory_units"] == units and answer["prompt"]["num_graph_tokens"] == tokens
        assert config["graph_token"]["num_graph_tokens"] == tokens and config["graph_token"]["readout"] == readout
        assert answer["activation"]["k"] == 10  # the graph budget: both read the top 10 units
    cfg = yaml.safe_load((REPO / "configs" / "default.yaml").read_text())
    assert (cfg["data"]["memory_units"], cfg["model"]["num_graph_tokens"]) == (3, 11)
    # written once: a second call keeps the folder as it is
    before = (tmp_path / "default" / "config.json").stat().st_mtime_ns
    script.untrained_export(tmp_path / "default", "default")
    assert (tmp_path / "default" / "config.json").stat().st_mtime_ns == before


def script_presets() -> tuple[str, ...]:
    return load_bench_script("bench.serving.compact_answer").PRESETS
