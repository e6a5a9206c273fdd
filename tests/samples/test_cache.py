"""The cache's building blocks: keys, data fingerprints, row <-> PyG round trip, atomic shards, answers."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from torch_geometric.data import Batch, Data

from qgmem.samples import cache as C
from qgmem.model.graph_modes import UNKNOWN_UNIT


@dataclass
class _Settings:
    k: int = 10
    channels: tuple[str, ...] = ("lexical", "semantic")


def test_stable_hash_is_order_independent_and_setting_sensitive():
    a = C.stable_hash({"x": 1, "cfg": _Settings()})
    assert a == C.stable_hash({"cfg": _Settings(), "x": 1})
    assert a == C.stable_hash({"x": 1, "cfg": {"channels": ["lexical", "semantic"], "k": 10}})
    assert a != C.stable_hash({"x": 1, "cfg": _Settings(k=11)})
    assert len(a) == 16 and int(a, 16) >= 0


@pytest.mark.parametrize("mode", ["content", "stat"])
def test_fingerprint_changes_with_the_data(tmp_path, mode):
    (tmp_path / "a").mkdir()
    f = tmp_path / "a" / "x.json"
    f.write_text('{"q": 1}')
    first = C.fingerprint_data(tmp_path, mode)
    assert first == C.fingerprint_data(tmp_path, mode) and first["files"] == 1
    f.write_text('{"q": 22}')
    if mode == "stat":
        os.utime(f, ns=(10**18, 10**18))
    assert C.fingerprint_data(tmp_path, mode) != first


def test_content_fingerprint_ignores_modification_time(tmp_path):
    f = tmp_path / "x.json"
    f.write_text("[]")
    first = C.fingerprint_data(tmp_path)
    os.utime(f, ns=(10**18, 10**18))  # a fresh clone or a copy resets mtimes
    assert C.fingerprint_data(tmp_path) == first


def test_fingerprint_of_a_hub_id_and_bad_mode(tmp_path):
    assert C.fingerprint_data("Salesforce/ConvoMem-not-a-local-path") == {"hub_id": "Salesforce/ConvoMem-not-a-local-path"}
    with pytest.raises(ValueError, match="content"):
        C.fingerprint_data(tmp_path, "mtime")


def _graph(n: int, e: int, d: int, seed: int = 0) -> Data:
    g = torch.Generator().manual_seed(seed)
    return Data(x=torch.randn(n, d, generator=g), edge_index=torch.randint(0, max(n, 1), (2, e), generator=g),
                edge_attr=torch.randn(e, d, generator=g), edge_fact=torch.randn(e, d, generator=g))


def _row(qa_id: str, graph: Data, d: int, split: str = "train", category: str = "user_evidence", **kw):
    return C.sample_row(qa_id=qa_id, case_id=f"c-{qa_id}", dialogue_id=f"d-{qa_id}", group="p0", split=split,
                        category=category, question="Which color?", reference="Green",
                        memory_text="[M1] green", graph=graph, feature_dim=d,
                        node_text=[f"n{i}" for i in range(graph.x.shape[0])],
                        edge_text=[f"e{j}" for j in range(graph.edge_index.shape[1])],
                        edge_unit=list(range(graph.edge_index.shape[1])), **kw)


@pytest.mark.parametrize("n,e,d", [(3, 4, 8), (1, 0, 5), (6, 1, 384)])
def test_row_round_trips_to_pyg_with_exact_shapes(tmp_path, n, e, d):
    graph = _graph(n, e, d)
    from datasets import Dataset, load_from_disk

    Dataset.from_list([_row("q", graph, d)], features=C.sample_features()).save_to_disk(str(tmp_path / "ds"))
    row = load_from_disk(str(tmp_path / "ds"))[0]
    back = C.row_to_data(row)
    assert back.x.shape == (n, d) and back.x.dtype == torch.float32
    assert back.edge_index.shape == (2, e) and back.edge_index.dtype == torch.long
    assert back.edge_attr.shape == (e, d) and back.edge_attr.dtype == torch.float32
    assert torch.equal(back.x, graph.x) and torch.equal(back.edge_index, graph.edge_index)
    assert torch.equal(back.edge_attr, graph.edge_attr)
    assert back.edge_fact.shape == (e, d) and torch.equal(back.edge_fact, graph.edge_fact)
    assert back.edge_unit.dtype == torch.long and back.edge_unit.tolist() == list(range(e))  # the units' positions
    assert row["node_text"] == [f"n{i}" for i in range(n)] and row["num_edges"] == e
    del row["edge_unit"]  # a graph table that does not record the units: every edge's unit is unknown
    assert C.row_to_data(row).edge_unit.tolist() == [UNKNOWN_UNIT] * e


def test_empty_graph_becomes_one_zero_node():
    row = _row("q", Data(x=torch.zeros(0, 4), edge_index=torch.zeros(2, 0, dtype=torch.long),
                         edge_attr=torch.zeros(0, 4)), 4)
    data = C.row_to_data(row)
    assert data.x.shape == (1, 4) and float(data.x.abs().sum()) == 0.0
    assert data.edge_index.shape == (2, 0) and data.edge_attr.shape == (0, 4)


def test_items_batch_with_pyg():
    rows = [_row(f"q{i}", _graph(n, e, 6, seed=i), 6) for i, (n, e) in enumerate([(2, 1), (4, 3), (1, 0)])]
    for r in rows:
        r.update(answer=r["reference"])
    items = [C.row_to_item(r) for r in rows]
    assert set(items[0]) == {"graph", "memory_text", "question", "answer", "category", "qa_id", "node_text"}
    assert all(len(it["node_text"]) == it["graph"].num_nodes for it in items)  # one text per node
    batch = Batch.from_data_list([it["graph"] for it in items])
    assert batch.x.shape == (7, 6) and batch.edge_index.shape == (2, 4) and batch.num_graphs == 3
    assert batch.edge_index.max() < 7
    assert batch.edge_unit.tolist() == [0, 0, 1, 2]  # each graph's own positions, not offset


@pytest.mark.parametrize("bad", ["x_width", "edge_out_of_range", "attr_rows", "fact_rows"])
def test_sample_row_rejects_inconsistent_graphs(bad):
    graph = _graph(3, 2, 4)
    if bad == "x_width":
        graph.x = torch.randn(3, 5)
    elif bad == "edge_out_of_range":
        graph.edge_index = torch.tensor([[0, 1], [2, 3]])
    elif bad == "attr_rows":
        graph.edge_attr = torch.randn(3, 4)
    else:
        graph.edge_fact = torch.randn(1, 4)
    with pytest.raises(ValueError, match="qa q"):
        _row("q", graph, 4)


def test_sample_cache_shards_plan_and_completion(tmp_path):
    cache = C.SampleCache(tmp_path / "samples")
    plan = [{"split": "train", "case_id": "a"}, {"split": "val", "case_id": "b"}, {"split": "test", "case_id": "c"}]
    cache.start({"k": 1}, plan)
    cache.write_shard(0, [_row("q0", _graph(2, 1, 4), 4)], {"case_id": "a", "split": "train"})
    cache.write_shard(1, [], {"case_id": "b", "split": "val", "skipped": "boom"})
    assert cache.has_shard(0) and cache.has_shard(1) and not cache.has_shard(2) and not cache.complete
    assert cache.shard_meta(1) == {"case_id": "b", "split": "val", "skipped": "boom", "rows": 0}
    assert not list(cache.shards.glob(".*"))  # no temporary folders left behind
    cache.write_shard(2, [_row("q2", _graph(3, 2, 4), 4, split="test")], {"case_id": "c", "split": "test"})
    cache.mark_complete({"done": True})
    assert cache.complete and cache.completion_info() == {"done": True}
    rows = cache.load()
    assert rows["qa_id"] == ["q0", "q2"]
    with pytest.raises(RuntimeError, match="plan"):
        C.SampleCache(tmp_path / "samples").start({"k": 1}, plan[::-1])


def test_answer_cache_appends_chunks_and_reloads(tmp_path):
    settings = {"lm": "tiny", "max_new_tokens": 4}
    store = C.AnswerCache(tmp_path / "answers", settings)
    k1, k2 = C.answer_key("[M1] a", "q1"), C.answer_key("[M1] a", "q2")
    assert k1 != k2 and C.answer_key("[M1] a", "q1") == k1
    store.add({k1: "Green"})
    store.add({k2: "Blue"})
    store.add({})
    again = C.AnswerCache(tmp_path / "answers")
    assert again.load() == {k1: "Green", k2: "Blue"} and len(again) == 2
    assert sorted(p.name for p in (tmp_path / "answers").iterdir()) == ["chunk-00000", "chunk-00001", "settings.json"]
    assert C.read_json(tmp_path / "answers" / "settings.json") == settings


def test_dataset_cache_saves_three_splits_and_summary(tmp_path):
    def final(qa_id, split):
        r = _row(qa_id, _graph(2, 1, 4), 4, split=split)
        r.update(answer="Green", lm_answer="green", judged=split == "train", correct=split == "train")
        return r

    cache = C.DatasetCache(tmp_path / "dataset")
    assert not cache.complete
    cache.save({"train": [final("a", "train"), final("b", "train")], "val": [final("c", "val")]}, {"n": 3})
    assert cache.complete and cache.summary() == {"n": 3}
    splits = cache.load()
    assert {k: len(v) for k, v in splits.items()} == {"train": 2, "val": 1, "test": 0}
    item = C.row_to_item(splits["train"][0])
    assert item["answer"] == "Green" and item["graph"].x.shape == (2, 4)
    assert np.isclose(float(item["graph"].x.sum()), float(_graph(2, 1, 4).x.sum()), atol=1e-5)
