"""``qgmem graph-stats`` on a tiny hand-made cache: every figure checked against a hand count."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch_geometric.data import Data

from qgmem.cli import main
from qgmem.samples import cache as C
from qgmem.samples.graph_stats import find_rows, graph_stats, is_speech_edge, relation_verb

LONG = "No, genuinely, nothing that specific in terms of numerical targets"


def _row(qa_id: str, split: str, nodes: list[str], edges: list[tuple[int, int, str]]) -> dict:
    index = torch.tensor([[h for h, _, _ in edges], [t for _, t, _ in edges]])
    graph = Data(x=torch.zeros(len(nodes), 2), edge_index=index,
                 edge_attr=torch.zeros(len(edges), 2))
    row = C.sample_row(qa_id=qa_id, case_id="c", dialogue_id="d", group="g", split=split, category="user_evidence",
                       question="q?", reference="a", memory_text="[M1] fact.", graph=graph, feature_dim=2,
                       node_text=nodes, edge_text=[label for _, _, label in edges], edge_unit=list(range(len(edges))))
    return {**row, "answer": "a", "lm_answer": "", "judged": False, "correct": False}


@pytest.fixture()
def tiny_cache(tmp_path):
    rows = {
        "train": [_row("q1", "train", ["User", "Denver", "User's sister", LONG],
                       [(0, 1, "moved to"), (1, 2, "move with"), (0, 3, "answers")])],
        "val": [_row("q2", "val", ["Cooper", "squirrel", "park"],
                     [(0, 1, "found"), (1, 2, "in")])],
        "test": [],
    }
    root = tmp_path / "cache"
    C.DatasetCache(root / "dataset-abc").save(rows, {"cache_key": "abc"})
    return root


def test_figures_of_a_tiny_cache(tiny_cache):
    folder, rows = find_rows(tiny_cache)
    assert folder.name == "dataset-abc" and len(rows) == 2
    stats = graph_stats(rows)
    assert (stats["graphs"], stats["edges"], stats["nodes"]) == (2, 5, 7)
    assert stats["speech_edge_share"] == pytest.approx(1 / 5)  # "answers"
    assert stats["long_node_share"] == pytest.approx(1 / 7)
    # busiest node: "User" or "Denver" touch 2 of 3 edges; "squirrel" both of 2
    assert stats["busiest_node_share_median"] == pytest.approx(np.median([2 / 3, 1.0]))
    assert stats["top_predicates"][0] == ("moved to", 1) and len(stats["top_predicates"]) == 5


def test_command_prints_json_and_names_a_missing_cache(tiny_cache, tmp_path, capsys):
    assert main(["graph-stats", "--cache", str(tiny_cache), "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["edges"] == 5 and out["speech_edge_share"] == pytest.approx(0.2)
    assert main(["graph-stats", "--cache", str(tmp_path / "nowhere")]) == 2
    assert "nowhere: no such cache folder" in capsys.readouterr().err


@pytest.mark.parametrize("label,verb,speech", [
    ("answers", "answer", True), ("was telling", "tell", True), ("would recommend", "recommend", True),
    ("mentions", "mention", True), ("moved to", "move", False), ("should look into", "look", False),
    ("is", "be", False), ("of", "of", False),
])
def test_speech_verbs(label, verb, speech):
    assert relation_verb(label) == verb and is_speech_edge(label) is speech
