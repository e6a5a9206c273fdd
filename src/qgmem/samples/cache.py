"""The on-disk cache of training samples: keys, Arrow shards, frozen-LM answers, PyG round trip.

Why a cache: replaying construction and activation (and answering with the frozen LM) costs minutes on
a CPU and hours for the paper's 1,200 cases on an 8B LM, while training reads the same samples every
epoch and every rerun. Everything is ``datasets`` Arrow on disk (memory-mapped, no pickle); graph
tensors are stored flat with their shapes and turned back into ``torch_geometric.data.Data`` on read.

Layout under ``cache_dir`` (each part is keyed, so a changed setting gets a new folder and an unchanged
one is reused)::

    samples-<key>/    settings.json, plan.json, shards/shard-00000/{data/, meta.json}, COMPLETE
    answers-<key>/    settings.json, chunk-00000/ ...   frozen-LM answers, keyed per prompt
    dataset-<key>/    train/ val/ test/, splits.json, summary.json   the filtered splits

Every shard or chunk is written to a temporary folder and renamed into place, so an interrupted build
leaves only whole shards behind and a rerun continues from the first missing one.

Integrity: every published folder (shard, answer chunk, dataset) carries ``CHECKSUMS``, the size and
SHA-256 of each of its files (:mod:`qgmem.integrity`), written last before the rename, and is verified
before it is read. A damaged part raises :class:`~qgmem.errors.IntegrityError` naming the file; the
build (:func:`damaged_parts`) rebuilds what it can from its inputs. Graph features are checked for
NaN/inf when a row is made (so a bad sentence embedding is caught at the source, naming the case) and
again when a split is loaded (a NaN written with matching checksums).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import shutil
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from qgmem.errors import IntegrityError
from qgmem.integrity import CHECKSUMS as INTEGRITY_CHECKSUMS
from qgmem.integrity import fresh_temp_dir, publish_dir, write_text_atomic

log = logging.getLogger(__name__)

#: the file in each published folder listing its other files' size and SHA-256
CHECKSUMS = INTEGRITY_CHECKSUMS  # one name for every sealed folder (qgmem.integrity)
#: how to rebuild the cache when a part cannot be rebuilt in place
REBUILD_HINT = "rerun the same training command: damaged parts are rebuilt from their inputs"

#: bump when the row schema or the meaning of a stored field changes (part of every cache key)
CACHE_FORMAT_VERSION = 9  # 4: main's last row change; 5: edge_fact (the unit's fact embedding per edge); 6: object "it" resolved to a named referent; 7: the evidence-ablated graph per sample; 8: the sham-ablated graph beside it; 9: both leave the row for the study's own table (qgmem.evaluation.counterfactuals)

SPLITS = ("train", "val", "test")


# --------------------------------------------------------------------------------------------------
# keys


def _canonical(obj: Any) -> Any:
    """JSON-ready form of settings: dataclasses as dicts, tuples as lists, paths as strings."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _canonical(dataclasses.asdict(obj))
    if isinstance(obj, dict):
        return {str(k): _canonical(v) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))}
    if isinstance(obj, (list, tuple)):
        return [_canonical(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


def stable_hash(obj: Any, length: int = 16) -> str:
    """A short hex digest of ``obj``'s canonical JSON (sorted keys), stable across processes."""
    text = json.dumps(_canonical(obj), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:length]


def fingerprint_data(path: str | Path, mode: str = "content") -> dict[str, Any]:
    """What the data contributes to the cache key.

    ``content`` (default) hashes every file's bytes: robust to copies and fresh clones, which reset
    modification times, and cheap for the sample (≈6 MB). ``stat`` uses relative path, size and
    modification time instead, for multi-GB local copies of the full data set. A path that does not
    exist is taken as a hub id and keyed by its name.
    """
    if mode not in ("content", "stat"):
        raise ValueError(f"fingerprint mode must be 'content' or 'stat', got {mode!r}")
    root = Path(path)
    if not root.exists():
        return {"hub_id": str(path)}
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    entries = []
    for file in files:
        rel = file.name if root.is_file() else file.relative_to(root).as_posix()
        if mode == "stat":
            st = file.stat()
            entries.append([rel, st.st_size, st.st_mtime_ns])
        else:
            digest = hashlib.sha256()
            with open(file, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(block)
            entries.append([rel, digest.hexdigest()])
    return {"mode": mode, "files": len(entries), "digest": stable_hash(entries, 32)}


# --------------------------------------------------------------------------------------------------
# rows <-> PyG


def sample_features():
    """The Arrow schema of one cached sample (graph tensors flat, with their shapes)."""
    from datasets import Features, List, Value

    return Features({
        "qa_id": Value("string"), "case_id": Value("string"), "dialogue_id": Value("string"),
        "group": Value("string"), "split": Value("string"), "category": Value("string"),
        "question": Value("string"), "question_time": Value("string"),
        "reference": Value("string"),  # the data set's answer (a rubric for rubric categories)
        "memory_text": Value("string"), **graph_features(),
        "node_text": List(Value("string")), "edge_text": List(Value("string")),
        "edge_unit": List(Value("int32")),
    })


def final_features():
    """The schema of the filtered splits: a sample plus the supervision outcome."""
    from datasets import Features, Value

    features = dict(sample_features())
    features.update({
        "answer": Value("string"),  # supervision target (train) or reference (val/test)
        "lm_answer": Value("string"),  # the frozen LM's answer, "" when none was generated
        "judged": Value("bool"), "correct": Value("bool"),
    })
    return Features(features)


def sample_row(*, qa_id: str, case_id: str, dialogue_id: str, group: str, split: str, category: str,
               question: str, reference: str, memory_text: str, graph: Any, feature_dim: int,
               question_time: str | None = None, node_text: Iterable[str] = (), edge_text: Iterable[str] = (),
               edge_unit: Iterable[int] = ()) -> dict[str, Any]:
    """One cache row from a working memory's PyG graph (``x [N, D]``, ``edge_index [2, E]``, ``edge_attr [E, D]``)."""
    node_text, edge_text = list(node_text), list(edge_text)
    columns = graph_columns(graph, feature_dim, node_text=node_text, edge_text=edge_text,
                            where=f"case {case_id!r}, qa {qa_id}")
    return {
        "qa_id": qa_id, "case_id": case_id, "dialogue_id": dialogue_id, "group": group, "split": split,
        "category": category, "question": question, "question_time": question_time, "reference": reference,
        "memory_text": memory_text, **columns, "node_text": node_text, "edge_text": edge_text,
        "edge_unit": [int(u) for u in edge_unit],
    }


def graph_features() -> dict[str, Any]:
    """The Arrow columns of one graph (tensors flat, with their shapes): the row's, or a study's second graph."""
    from datasets import List, Value

    return {"num_nodes": Value("int32"), "num_edges": Value("int32"), "feature_dim": Value("int32"),
            "x": List(Value("float32")),  # [num_nodes * feature_dim], row-major
            "edge_index": List(Value("int64")),  # [2 * num_edges], row-major (sources then targets)
            "edge_attr": List(Value("float32")),  # [num_edges * feature_dim]
            "edge_fact": List(Value("float32"))}  # [num_edges * feature_dim]: the edge's unit fact embedding


def graph_columns(graph: Any, feature_dim: int, *, node_text: Sequence[str] = (), edge_text: Sequence[str] = (),
                  where: str = "") -> dict[str, Any]:
    """:func:`graph_features`' columns of a PyG graph, checked: shapes agree, indices in range, features finite."""
    x = _as_array(getattr(graph, "x", None), np.float32, (0, feature_dim))
    edge_index = _as_array(getattr(graph, "edge_index", None), np.int64, (2, 0))
    num_edges = edge_index.shape[1] if edge_index.ndim == 2 else 0
    edge_attr = _as_array(getattr(graph, "edge_attr", None), np.float32, (num_edges, feature_dim))
    edge_fact = _as_array(getattr(graph, "edge_fact", None), np.float32, (num_edges, feature_dim))
    if x.ndim != 2 or (x.shape[0] and x.shape[1] != feature_dim):
        raise ValueError(f"{where}: node features have shape {tuple(x.shape)}, expected [N, {feature_dim}]")
    if edge_index.shape != (2, num_edges) or edge_attr.shape != (num_edges, feature_dim) \
            or edge_fact.shape != (num_edges, feature_dim):
        raise ValueError(f"{where}: edge_index {tuple(edge_index.shape)} / edge_attr {tuple(edge_attr.shape)} / "
                         f"edge_fact {tuple(edge_fact.shape)} do not agree (expected [2, E] and [E, {feature_dim}])")
    if num_edges and (edge_index.min() < 0 or edge_index.max() >= x.shape[0]):
        raise ValueError(f"{where}: edge_index points outside the {x.shape[0]} nodes")
    for name, values, texts in (("node", x, node_text), ("edge", edge_attr, edge_text)):
        bad = np.flatnonzero(~np.isfinite(values).all(axis=1)) if values.size else []
        if len(bad):
            shown = [texts[i] if i < len(texts) else f"#{i}" for i in bad[:3]]
            raise ValueError(f"{where}: {len(bad)} {name} feature row(s) hold NaN or inf "
                             f"(the sentence encoder's embedding of {shown}); nothing of this case was cached")
    return {"num_nodes": int(x.shape[0]), "num_edges": int(num_edges), "feature_dim": int(feature_dim),
            "x": x.reshape(-1), "edge_index": edge_index.reshape(-1), "edge_attr": edge_attr.reshape(-1),
            "edge_fact": edge_fact.reshape(-1)}


def _as_array(value: Any, dtype: Any, empty_shape: tuple[int, int]) -> np.ndarray:
    if value is None:
        return np.zeros(empty_shape, dtype=dtype)
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    arr = np.asarray(value, dtype=dtype)
    return arr.reshape(empty_shape) if arr.size == 0 else arr


def row_to_data(row: dict[str, Any]):
    """A cached row back to ``Data(x [N, D], edge_index [2, E], edge_attr [E, D], edge_fact [E, D], edge_unit [E])``.

    An empty working memory (no nodes) becomes one all-zero node with no edges, so every sample has a
    graph token to pool. A row without ``edge_unit`` (a graph table that does not record it) gets
    :data:`~qgmem.model.graph_modes.UNKNOWN_UNIT` on every edge, so all graphs still batch together.
    """
    import torch
    from torch_geometric.data import Data

    from qgmem.model.graph_modes import UNKNOWN_UNIT, empty_graph

    n, e, d = int(row["num_nodes"]), int(row["num_edges"]), int(row["feature_dim"])
    x = torch.as_tensor(np.asarray(row["x"], dtype=np.float32)).reshape(n, d)
    edge_index = torch.as_tensor(np.asarray(row["edge_index"], dtype=np.int64)).reshape(2, e)
    edge_attr = torch.as_tensor(np.asarray(row["edge_attr"], dtype=np.float32)).reshape(e, d)
    edge_fact = torch.as_tensor(np.asarray(row["edge_fact"], dtype=np.float32)).reshape(e, d)
    units = row.get("edge_unit")
    edge_unit = torch.as_tensor(np.asarray(units, dtype=np.int64)).reshape(e) if units is not None \
        else torch.full((e,), UNKNOWN_UNIT, dtype=torch.long)
    if n == 0:
        return empty_graph(d, facts=True)
    return Data(x=x, edge_index=edge_index, edge_attr=edge_attr, edge_fact=edge_fact, edge_unit=edge_unit)


def row_to_item(row: dict[str, Any]) -> dict[str, Any]:
    """A filtered row to the dataset item the collator consumes (the data↔model contract)."""
    return {"graph": row_to_data(row), "memory_text": row["memory_text"], "question": row["question"],
            "answer": row["answer"], "category": row["category"], "qa_id": row["qa_id"],
            "node_text": list(row.get("node_text") or [])}


# --------------------------------------------------------------------------------------------------
# writing folders atomically


@contextlib.contextmanager
def quiet_datasets() -> Iterator[None]:
    """No per-shard "Saving the dataset" bars (the build shows one bar over cases instead)."""
    import datasets

    was_disabled = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if not was_disabled:
            datasets.enable_progress_bars()


def seal(folder: Path) -> None:
    """Write ``folder/CHECKSUMS``: size + SHA-256 of every other file under ``folder`` (written last)."""
    from qgmem.integrity import seal as seal_files

    seal_files(folder, [p.relative_to(folder).as_posix() for p in folder.rglob("*")
                        if p.is_file() and p.name != CHECKSUMS], listing=CHECKSUMS)


def verify_folder(folder: Path, hint: str = REBUILD_HINT) -> None:
    """Raise :class:`IntegrityError` unless every file of ``folder``'s ``CHECKSUMS`` is intact.

    A folder without ``CHECKSUMS`` (written before they were recorded, or damaged) cannot be trusted
    either; a file present but not listed is ignored (``datasets`` may add cache files beside its own).
    """
    from qgmem.integrity import verify_sealed

    verify_sealed(folder, hint=hint, listing=CHECKSUMS)


def load_arrow(folder: Path, hint: str = REBUILD_HINT):
    """``datasets.load_from_disk`` that names the folder when the Arrow data cannot be read."""
    from datasets import load_from_disk

    try:
        return load_from_disk(str(folder))
    except Exception as exc:  # noqa: BLE001 - pyarrow/datasets raise many types, none naming the path
        raise IntegrityError(f"{folder}: unreadable Arrow data ({type(exc).__name__}: {exc})", hint=hint) from exc


def check_finite_features(ds, where: Path, hint: str = REBUILD_HINT) -> None:
    """Refuse a split whose ``x`` or ``edge_attr`` holds NaN/inf (scanned in Arrow, no Python rows)."""
    import pyarrow.compute as pc

    table = ds.data.table if hasattr(ds.data, "table") else ds.data
    for column in ("x", "edge_attr"):
        if column not in table.column_names or table.num_rows == 0:
            continue
        values = table.column(column)
        finite = pc.is_finite(pc.list_flatten(values))
        if len(finite) and not pc.all(finite).as_py():
            first = int(np.flatnonzero(~np.asarray(finite.to_numpy(), dtype=bool))[0])
            row = _row_of_flat_index(np.asarray(pc.list_value_length(values).to_numpy()), first)
            qa = table.column("qa_id")[row].as_py() if "qa_id" in table.column_names else "?"
            raise IntegrityError(f"{where}: column {column!r} holds NaN or inf (first in row {row}, qa {qa}); "
                                 "the cache was written with non-finite features or edited", hint=hint)


def _row_of_flat_index(lengths: np.ndarray, index: int) -> int:
    return int(np.searchsorted(np.cumsum(lengths), index, side="right"))


def publish(tmp: Path, final: Path) -> None:
    """Seal a finished temporary folder and move it into place; a folder already there (another writer) wins."""
    seal(tmp)
    publish_dir(tmp, final, if_exists="keep")  # content-keyed: concurrent ranks build it alike


def _save_rows(rows: list[dict[str, Any]], features: Any, path: Path) -> None:
    from datasets import Dataset

    with quiet_datasets():
        Dataset.from_list(rows, features=features).save_to_disk(str(path))


def _empty(features: Any):
    """An empty in-memory dataset with the schema (never saved: ``datasets`` cannot reload one)."""
    from datasets import Dataset

    return Dataset.from_dict({name: [] for name in features}, features=features)


def write_json(path: Path, obj: Any) -> None:
    """Write JSON atomically (:func:`qgmem.integrity.write_text_atomic`), keys sorted."""
    write_text_atomic(path, json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=True) + "\n")


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))


# --------------------------------------------------------------------------------------------------
# sample shards (one per case)


class SampleCache:
    """Per-case Arrow shards of samples, a plan that fixes their order, and a completion marker.

    ``features`` is the rows' schema (:func:`sample_features`); a study's table keyed by the same plan
    (:mod:`qgmem.evaluation.counterfactuals`) passes its own.
    """

    def __init__(self, root: str | Path, features: Any = None):
        self.root = Path(root)
        self.shards = self.root / "shards"
        self.features = features

    @property
    def complete(self) -> bool:
        return (self.root / "COMPLETE").exists()

    def start(self, settings: dict[str, Any], plan: list[dict[str, str]]) -> None:
        """Record settings and the ordered case plan; a plan that differs from a stored one is an error.

        The plan is derived from the key's settings, so a mismatch means the sampling or splitting code
        changed without a format-version bump: continuing would mix two plans in one cache.
        """
        self.shards.mkdir(parents=True, exist_ok=True)
        plan_path = self.root / "plan.json"
        if plan_path.exists():
            stored = read_json(plan_path)
            if stored != plan:
                raise RuntimeError(
                    f"{plan_path}: the stored case plan differs from the one these settings give now "
                    "(sampling/splitting code changed?); delete this folder or bump CACHE_FORMAT_VERSION")
        else:
            write_json(self.root / "settings.json", settings)
            write_json(plan_path, plan)

    def plan(self) -> list[dict[str, str]]:
        return read_json(self.root / "plan.json")

    def shard_dir(self, index: int) -> Path:
        return self.shards / f"shard-{index:05d}"

    def has_shard(self, index: int) -> bool:
        return (self.shard_dir(index) / "meta.json").exists()

    def write_shard(self, index: int, rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
        """Write one case's rows (possibly none, e.g. a skipped case) with its metadata, atomically."""
        final = self.shard_dir(index)
        tmp = fresh_temp_dir(final)
        if rows:  # ``datasets`` cannot reload an empty saved dataset: an empty shard is its meta.json only
            _save_rows(rows, self.features or sample_features(), tmp / "data")
        write_json(tmp / "meta.json", {**meta, "rows": len(rows)})
        publish(tmp, final)

    def shard_meta(self, index: int) -> dict[str, Any]:
        return read_json(self.shard_dir(index) / "meta.json")

    def mark_complete(self, info: dict[str, Any]) -> None:
        write_json(self.root / "COMPLETE", info)

    def completion_info(self) -> dict[str, Any]:
        return read_json(self.root / "COMPLETE")

    def unmark_complete(self) -> None:
        (self.root / "COMPLETE").unlink(missing_ok=True)

    def check_shard(self, index: int) -> None:
        """Raise :class:`IntegrityError` unless shard ``index`` exists and matches its checksums."""
        folder = self.shard_dir(index)
        if not self.has_shard(index):
            raise IntegrityError(f"{folder}: missing (deleted, or its build was interrupted)", hint=REBUILD_HINT)
        verify_folder(folder)

    def damaged_shards(self, count: int) -> dict[int, str]:
        """``{index: why}`` for the shards of ``range(count)`` that are missing or fail their checksums."""
        damaged = {}
        for index in range(count):
            try:
                self.check_shard(index)
            except IntegrityError as exc:
                damaged[index] = str(exc)
        return damaged

    def remove_shard(self, index: int) -> None:
        shutil.rmtree(self.shard_dir(index), ignore_errors=True)

    def load(self):
        """All shards concatenated in plan order, as one memory-mapped ``datasets.Dataset`` (each verified)."""
        from datasets import concatenate_datasets

        parts = []
        for index in range(len(self.plan())):
            self.check_shard(index)
            if self.shard_meta(index)["rows"]:
                parts.append(load_arrow(self.shard_dir(index) / "data"))
        return concatenate_datasets(parts) if parts else _empty(self.features or sample_features())


# --------------------------------------------------------------------------------------------------
# frozen-LM answers


def answer_key(memory_text: str, question: str) -> str:
    """Key of one prompt's answer within an :class:`AnswerCache` (the folder already fixes the LM)."""
    return hashlib.sha256(f"{memory_text}\x00{question}".encode("utf-8")).hexdigest()[:32]


class AnswerCache:
    """The frozen LM's answers, appended in Arrow chunks; a rerun with the same LM never regenerates.

    The folder is keyed by the LM id and generation settings (and the prompt wording), each entry by
    its memory text and question, so a construction change reuses the answers of unchanged prompts.
    """

    def __init__(self, root: str | Path, settings: dict[str, Any] | None = None):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        if settings is not None and not (self.root / "settings.json").exists():
            write_json(self.root / "settings.json", settings)
        self._answers: dict[str, str] | None = None
        self.dropped: list[str] = []  # damaged chunks removed by load (their answers are generated again)

    def _chunks(self) -> list[Path]:
        return sorted(p for p in self.root.glob("chunk-*") if p.is_dir())

    def load(self) -> dict[str, str]:
        """Every intact chunk's answers. A damaged chunk is logged, removed and counted in ``dropped``:
        its inputs (the prompts) are at hand, so its answers are simply generated again."""
        if self._answers is None:
            answers: dict[str, str] = {}
            for chunk in self._chunks():
                try:
                    verify_folder(chunk)
                    ds = load_arrow(chunk)
                except IntegrityError as exc:
                    log.warning("frozen-LM answers dropped, to be generated again: %s", exc)
                    self.dropped.append(str(exc))
                    shutil.rmtree(chunk, ignore_errors=True)
                    continue
                answers.update(zip(ds["key"], ds["answer"]))
            self._answers = answers
        return self._answers

    def __len__(self) -> int:
        return len(self.load())

    def get(self, key: str) -> str | None:
        return self.load().get(key)

    def add(self, answers: dict[str, str]) -> None:
        """Persist new answers as one more chunk (atomic)."""
        from datasets import Dataset, Features, Value

        if not answers:
            return
        existing = self.load()
        index = len(self._chunks())
        final = self.root / f"chunk-{index:05d}"
        while final.exists():
            index += 1
            final = self.root / f"chunk-{index:05d}"
        tmp = fresh_temp_dir(final)
        features = Features({"key": Value("string"), "answer": Value("string")})
        with quiet_datasets():
            Dataset.from_dict({"key": list(answers), "answer": list(answers.values())},
                              features=features).save_to_disk(str(tmp))
        publish(tmp, final)
        existing.update(answers)


# --------------------------------------------------------------------------------------------------
# the filtered splits


class DatasetCache:
    """The final ``DatasetDict`` (train/val/test) with its run summary; complete once summary.json exists."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    @property
    def complete(self) -> bool:
        return (self.root / "summary.json").exists()

    def save(self, splits: dict[str, list[dict[str, Any]]], summary: dict[str, Any]) -> None:
        """Write each non-empty split as its own Arrow folder, the sizes, then the summary (atomically)."""
        tmp = fresh_temp_dir(self.root)
        sizes = {name: len(splits.get(name, [])) for name in SPLITS}
        for name in SPLITS:
            if sizes[name]:
                _save_rows(splits[name], final_features(), tmp / name)
        write_json(tmp / "splits.json", sizes)
        write_json(tmp / "summary.json", summary)
        self.root.parent.mkdir(parents=True, exist_ok=True)
        if self.root.exists():  # an incomplete leftover, or a rebuild
            shutil.rmtree(self.root)
        publish(tmp, self.root)

    def verify(self, hint: str = REBUILD_HINT) -> None:
        """Raise :class:`IntegrityError` unless every file matches the checksums written with it."""
        verify_folder(self.root, hint=hint)

    def load(self, verify: bool = True, hint: str = REBUILD_HINT):
        """The ``DatasetDict`` of the three splits (memory-mapped; an empty split is empty in memory).

        Checksums first (``verify``), then the Arrow data, then a scan for NaN/inf features, so no
        damaged split is ever trained on; each failure is an :class:`IntegrityError` naming the file.
        """
        from datasets import DatasetDict

        if verify:
            self.verify(hint)
        sizes = read_json(self.root / "splits.json")
        splits = {}
        for name in SPLITS:
            splits[name] = load_arrow(self.root / name, hint) if sizes[name] else _empty(final_features())
            check_finite_features(splits[name], self.root / name, hint)
        return DatasetDict(splits)

    def summary(self) -> dict[str, Any]:
        return read_json(self.root / "summary.json")


# --------------------------------------------------------------------------------------------------
# leftovers of killed builds


def remove_stale_temp(cache_dir: str | Path) -> list[Path]:
    """Delete the ``.<name>.tmp-<pid>`` folders and files that killed builds left under ``cache_dir``.

    Looks where the cache publishes (the cache folder, each part's folder and the shard folders);
    a temp folder of a process still running (another rank's build) is kept.
    """
    from qgmem.integrity import remove_stale_temp as remove

    root = Path(cache_dir)
    if not root.is_dir():
        return []
    parents = [root, *(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))]
    parents += [p / "shards" for p in parents[1:] if (p / "shards").is_dir()]
    removed = [path for parent in parents for path in remove(parent)]
    for path in removed:
        log.warning("removed %s, left by a build that was killed", path)
    return removed
