"""``qgmem graph-stats``: what the cached local graphs look like, the figures the graph token depends on.

A graph token can add only what the graph holds. Three figures show whether the local graphs are
relations between entities or the dialogue's speech acts cut into pieces:

- ``speech_edge_share``: edges whose relation is a verb of communication ("answers", "mentions",
  "said", "recommends"; :data:`qgmem.memory.relations.SPEECH_VERBS`);
- ``long_node_share``: node texts longer than 40 characters (sentence fragments, not entities);
- ``busiest_node_share_median``: per graph, the share of its edges that touch its busiest node (a
  speaker hub), the median over graphs with at least one edge;

plus the most frequent predicates and nodes and the graph sizes.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from qgmem.memory.relations import MAX_NODE_CHARS, SPEECH_VERBS
from qgmem.memory.traces import lemma
from qgmem.settings_flags import add_settings_arguments, settings_from_args

_AUX_WORDS = {"is", "am", "are", "was", "were", "be", "been", "being", "has", "have", "had", "do", "does", "did",
              "will", "would", "should", "can", "could", "may", "might", "must", "shall", "not", "never", "just",
              "really", "also", "still", "always", "to"}


def relation_verb(label: str) -> str:
    """The lemma of a relation's first content word ("was telling" -> "tell", "answers" -> "answer")."""
    words = [w for w in re.findall(r"[a-z']+", label.lower()) if w]
    content = [w for w in words if w not in _AUX_WORDS] or words
    return lemma(content[0]) if content else ""


def is_speech_edge(label: str) -> bool:
    return relation_verb(label) in SPEECH_VERBS


def graph_stats(rows: Iterable[dict[str, Any]], top: int = 20) -> dict[str, Any]:
    """The figures over cached rows (each with ``node_text``, ``edge_text``, ``edge_index``, ``num_edges``)."""
    graphs = edges = speech = nodes = long_nodes = 0
    busiest: list[float] = []
    sizes_nodes: list[int] = []
    sizes_edges: list[int] = []
    predicates: Counter[str] = Counter()
    node_counts: Counter[str] = Counter()
    hubs: Counter[str] = Counter()
    for row in rows:
        graphs += 1
        node_text = list(row["node_text"])
        edge_text = [t for t in row["edge_text"]]
        e = int(row["num_edges"])
        flat = list(row["edge_index"])
        sources, targets = flat[:e], flat[e:2 * e]
        real_nodes = [t for t in node_text if t]
        nodes += len(real_nodes)
        long_nodes += sum(1 for t in real_nodes if len(t) > MAX_NODE_CHARS)
        node_counts.update(real_nodes)
        sizes_nodes.append(len(real_nodes))
        sizes_edges.append(e)
        forward = range(len(edge_text))
        edges += len(forward)
        for i in forward:
            predicates[edge_text[i]] += 1
            speech += is_speech_edge(edge_text[i])
        if forward:
            touching: Counter[int] = Counter()
            for i in forward:
                touching[int(sources[i])] += 1
                if int(targets[i]) != int(sources[i]):
                    touching[int(targets[i])] += 1
            node, count = touching.most_common(1)[0]
            busiest.append(count / len(forward))
            hubs[node_text[node] if node < len(node_text) else str(node)] += 1
    return {
        "graphs": graphs,
        "graphs_with_edges": len(busiest),
        "edges": edges,
        "nodes": nodes,
        "speech_edge_share": speech / edges if edges else 0.0,
        "long_node_share": long_nodes / nodes if nodes else 0.0,
        "long_node_chars": MAX_NODE_CHARS,
        "busiest_node_share_median": statistics.median(busiest) if busiest else 0.0,
        "busiest_node_share_mean": statistics.fmean(busiest) if busiest else 0.0,
        "nodes_per_graph_mean": statistics.fmean(sizes_nodes) if sizes_nodes else 0.0,
        "edges_per_graph_mean": statistics.fmean(sizes_edges) if sizes_edges else 0.0,
        "top_predicates": predicates.most_common(top),
        "top_nodes": node_counts.most_common(top),
        "top_busiest_nodes": hubs.most_common(10),
    }


def find_rows(cache: Path, key: str | None = None):
    """The rows under ``cache``: a ``dataset-<key>`` or ``samples-<key>`` folder, or a cache root.

    A root with several dataset folders needs ``key`` (or the most recently written one is taken and
    named in the output).
    """
    from qgmem.samples import cache as C

    from qgmem.errors import InputPathError

    cache = Path(cache)
    if not cache.is_dir():
        raise InputPathError(f"{cache}: no such cache folder")
    if (cache / "summary.json").exists() and (cache / "splits.json").exists():
        splits = C.DatasetCache(cache).load()
        return cache, [row for name in C.SPLITS for row in splits[name]]
    if (cache / "plan.json").exists():
        return cache, list(C.SampleCache(cache).load())
    candidates = sorted((p for p in cache.glob("dataset-*") if (p / "summary.json").exists()),
                        key=lambda p: p.stat().st_mtime)
    if key is not None:
        candidates = [p for p in candidates if p.name == f"dataset-{key}"]
    if not candidates:
        samples = sorted((p for p in cache.glob("samples-*") if (p / "COMPLETE").exists()),
                         key=lambda p: p.stat().st_mtime)
        if key is not None:
            samples = [p for p in samples if p.name == f"samples-{key}"]
        if not samples:
            raise InputPathError(f"{cache}: no complete dataset-<key> or samples-<key> folder"
                                 + (f" for key {key}" if key else ""), hint="build it with `python train.py`")
        return samples[-1], list(C.SampleCache(samples[-1]).load())
    chosen = candidates[-1]
    splits = C.DatasetCache(chosen).load()
    return chosen, [row for name in C.SPLITS for row in splits[name]]


@dataclass
class GraphStatsSettings:
    """What ``qgmem graph-stats`` runs with; one field per flag."""

    cache: str  #: training cache root, or one dataset-/samples-<key> folder
    key: str | None = None  #: cache key to read when the root holds several
    top: int = 20  #: how many predicates and nodes to list
    json: bool = False  #: print one JSON object as the last line




def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_settings_arguments(parser, GraphStatsSettings)


def run(args: argparse.Namespace) -> int:
    s = settings_from_args(GraphStatsSettings, args)
    folder, rows = find_rows(Path(s.cache), s.key)
    stats = {"folder": str(folder), **graph_stats(rows, s.top)}
    print(f"{folder}: {stats['graphs']} graphs, {stats['edges']} edges, {stats['nodes']} nodes "
          f"({stats['nodes_per_graph_mean']:.1f} nodes / {stats['edges_per_graph_mean']:.1f} edges per graph)")
    print(f"speech-verb edges            {stats['speech_edge_share']:.1%}")
    print(f"node texts over {MAX_NODE_CHARS} characters  {stats['long_node_share']:.1%}")
    print(f"busiest node's edge share    {stats['busiest_node_share_median']:.2f} (median), "
          f"{stats['busiest_node_share_mean']:.2f} (mean)")
    print("top predicates: " + ", ".join(f"{p} ({n})" for p, n in stats["top_predicates"][:10]))
    if s.json:
        print(json.dumps(stats, ensure_ascii=False))
    return 0
