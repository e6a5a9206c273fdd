"""Training-cache integrity on disk: each fault injected into shards, answer chunks and splits, and its outcome."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from torch_geometric.data import Data

from qgmem.errors import IntegrityError
from qgmem.samples import cache as C

D = 4


def rows(case: str, n: int = 2, split: str = "train") -> list[dict]:
    out = []
    for i in range(n):
        gen = torch.Generator().manual_seed(hash((case, i)) % 1000)
        graph = Data(x=torch.rand(3, D, generator=gen), edge_index=torch.tensor([[0, 1], [1, 2]]),
                     edge_attr=torch.rand(2, D, generator=gen))
        out.append(C.sample_row(qa_id=f"{case}#q{i}", case_id=case, dialogue_id=case, group="g", split=split,
                                category="user_evidence", question=f"question {i}?", reference=f"answer {i}",
                                memory_text=f"[M1] fact {i}", graph=graph, feature_dim=D,
                                node_text=["a", "b", "c"], edge_text=["r", "s"], edge_unit=[0, 0]))
    return out


def arrow_file(folder: Path) -> Path:
    (path,) = sorted(folder.rglob("*.arrow"))
    return path


def flip_middle(path: Path, n: int = 32) -> None:
    """Flip ``n`` bytes in the middle of a file (the issue's "32 flipped bytes mid-Arrow file")."""
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    for i in range(mid - n // 2, mid + n // 2):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.fixture()
def samples(tmp_path) -> C.SampleCache:
    cache = C.SampleCache(tmp_path / "samples-k")
    cache.start({"k": 1}, [{"split": "train", "case_id": "c0"}, {"split": "train", "case_id": "c1"}])
    for index in range(2):
        cache.write_shard(index, rows(f"c{index}"), {"case_id": f"c{index}", "split": "train"})
    cache.mark_complete({})
    return cache


def test_every_published_shard_carries_its_checksums(samples):
    listing = C.read_json(samples.shard_dir(0) / C.CHECKSUMS)
    assert "meta.json" in listing and any(name.endswith(".arrow") for name in listing)
    assert all(set(record) == {"size", "sha256"} for record in listing.values())
    assert len(samples.load()) == 4 and samples.damaged_shards(2) == {}


@pytest.mark.parametrize("fault,message", [(flip_middle, "checksum mismatch"), (truncate, r"truncated \(\d+ bytes")])
def test_a_damaged_shard_is_refused_naming_its_file(samples, fault, message):
    path = arrow_file(samples.shard_dir(1))
    fault(path)
    with pytest.raises(IntegrityError, match=rf"{path}: {message}"):
        samples.load()
    assert list(samples.damaged_shards(2)) == [1]


def test_a_shard_deleted_after_complete_is_reported_missing(samples):
    samples.remove_shard(0)
    assert samples.complete
    damaged = samples.damaged_shards(2)
    assert list(damaged) == [0] and "missing (deleted" in damaged[0]
    with pytest.raises(IntegrityError, match="shard-00000: missing"):
        samples.load()


def test_a_truncated_arrow_file_without_checksums_still_names_the_folder(samples):
    folder = samples.shard_dir(0) / "data"
    truncate(arrow_file(folder))
    with pytest.raises(IntegrityError, match=rf"{folder}: unreadable Arrow data .*rerun the same training command"):
        C.load_arrow(folder)


def test_a_folder_without_checksums_cannot_be_verified(samples):
    (samples.shard_dir(0) / C.CHECKSUMS).unlink()
    with pytest.raises(IntegrityError, match="checksums.json: is missing, so .* cannot be verified"):
        samples.check_shard(0)


@pytest.mark.parametrize("field", ["x", "edge_attr"])
@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_nonfinite_features_are_refused_at_the_source_naming_the_case(field, value):
    graph = Data(x=torch.rand(3, D), edge_index=torch.tensor([[0, 1], [1, 2]]), edge_attr=torch.rand(2, D))
    getattr(graph, field)[1, 2] = value
    text = {"x": "the node b", "edge_attr": "predicate s"}[field]
    with pytest.raises(ValueError, match=rf"case 'case-7', qa q3: 1 (node|edge) feature row\(s\) hold NaN or inf .*{text}"):
        C.sample_row(qa_id="q3", case_id="case-7", dialogue_id="d", group="g", split="train", category="c",
                     question="?", reference="r", memory_text="m", graph=graph, feature_dim=D,
                     node_text=["a", "the node b", "c"], edge_text=["r", "predicate s"], edge_unit=[0, 0])


# ---- the filtered splits ---------------------------------------------------------------------------------


def final_rows(case: str, split: str) -> list[dict]:
    return [{**r, "answer": r["reference"], "lm_answer": "", "judged": False, "correct": False}
            for r in rows(case, 3, split)]


@pytest.fixture()
def dataset(tmp_path) -> C.DatasetCache:
    cache = C.DatasetCache(tmp_path / "dataset-k")
    cache.save({"train": final_rows("c0", "train"), "val": final_rows("c1", "val"), "test": []}, {"cache_key": "k"})
    return cache


def rewrite_split(cache: C.DatasetCache, split: str, edit) -> None:
    """Rewrite one split's Arrow data with ``edit(rows)`` applied, keeping the old checksums."""
    from datasets import Dataset

    folder = cache.root / split
    edited = edit(C.load_arrow(folder).to_list())
    Dataset.from_list(edited, features=C.final_features()).save_to_disk(str(cache.root / ".edited"))
    for name in os.listdir(cache.root / ".edited"):
        os.replace(cache.root / ".edited" / name, folder / name)
    (cache.root / ".edited").rmdir()


def test_an_edited_answer_text_is_refused(dataset):
    def edit(split_rows):
        split_rows[1]["answer"] = "an answer nobody gave"
        return split_rows

    assert dataset.load()["train"][1]["answer"] == "answer 1"
    rewrite_split(dataset, "train", edit)
    with pytest.raises(IntegrityError, match=r"dataset-k/train/.*: (checksum mismatch|truncated|longer than written)"):
        dataset.load()


def test_flipped_bytes_in_a_split_are_refused(dataset):
    path = arrow_file(dataset.root / "val")
    flip_middle(path)
    with pytest.raises(IntegrityError, match=rf"{path}: checksum mismatch"):
        dataset.load()


def test_a_nan_written_with_matching_checksums_is_still_refused(dataset):
    def edit(split_rows):
        split_rows[2]["x"][5] = float("nan")
        return split_rows

    rewrite_split(dataset, "train", edit)
    C.seal(dataset.root)  # as if the NaN had been written by the build itself
    with pytest.raises(IntegrityError, match=r"train: column 'x' holds NaN or inf \(first in row 2, qa c0#q2\)"):
        dataset.load()


# ---- answers and leftovers -------------------------------------------------------------------------------


def test_a_damaged_answer_chunk_is_dropped_so_its_answers_are_generated_again(tmp_path):
    answers = C.AnswerCache(tmp_path / "answers-k", {"lm": "x"})
    answers.add({"k1": "one", "k2": "two"})
    answers.add({"k3": "three"})
    flip_middle(arrow_file(tmp_path / "answers-k" / "chunk-00000"), n=8)
    again = C.AnswerCache(tmp_path / "answers-k")
    assert again.load() == {"k3": "three"}
    assert len(again.dropped) == 1 and "chunk-00000" in again.dropped[0] and "checksum mismatch" in again.dropped[0]
    assert not (tmp_path / "answers-k" / "chunk-00000").exists()


def test_stale_temp_folders_of_killed_builds_are_removed(samples, tmp_path):
    dead = 2 ** 22 + 12345  # above the default pid_max: no such process
    leftovers = [samples.shards / f".shard-00002.tmp-{dead}", tmp_path / f".dataset-k.tmp-{dead}",
                 samples.root / f".plan.json.tmp-{dead}"]
    for path in leftovers[:2]:
        path.mkdir()
        (path / "half-written").write_text("x")
    leftovers[2].write_text("{")
    live = samples.shards / f".shard-00003.tmp-{os.getpid()}"  # a build running now (this process)
    live.mkdir()
    removed = C.remove_stale_temp(tmp_path)
    assert sorted(removed) == sorted(leftovers) and not any(p.exists() for p in leftovers)
    assert live.exists() and samples.damaged_shards(2) == {}


# ---- the build: what it rebuilds, what it refuses ------------------------------------------------------

from training.test_datamodule import HashEncoder, StubAnswerer, _build, _dm, _rows, write_convomem  # noqa: E402


class NaNEncoder(HashEncoder):
    """The stand-in encoder, returning NaN for one text (a sentence encoder gone wrong)."""

    def __init__(self, bad_text: str):
        super().__init__()
        self.bad_text = bad_text

    def encode(self, texts):
        out = super().encode(texts)
        out[[t == self.bad_text for t in texts]] = np.nan
        return out


@pytest.fixture()
def built(tmp_path):
    dm = _dm(write_convomem(tmp_path / "convomem"), tmp_path / "cache")
    _build(dm)
    dm.setup()
    return dm


def split_rows(dm, split="train"):
    return [(r["qa_id"], r["answer"], r["memory_text"], list(r["x"])) for r in _rows(dm, split)]


@pytest.mark.parametrize("fault", [flip_middle, truncate, "delete"])
def test_a_damaged_or_deleted_shard_is_rebuilt_by_the_next_build(built, fault, caplog):
    expected = split_rows(built)
    samples = C.SampleCache(built.samples_dir)
    if fault == "delete":
        samples.remove_shard(3)  # after the COMPLETE marker
    else:
        fault(arrow_file(samples.shard_dir(3)))
    again = _dm(Path(built.data_path), built.cache_dir, rebuild=True)
    summary = _build(again)
    assert [r["shard"] for r in summary["rebuilt_shards"]] == [3] and "shard-00003" in caplog.text
    assert summary["seconds"]["cases_built_this_run"] == 1  # only that case was replayed
    assert samples.complete and samples.damaged_shards(16) == {}
    again.setup()
    assert split_rows(again) == expected


@pytest.mark.parametrize("fault", ["flip", "edited answer"])
def test_a_damaged_dataset_is_rebuilt_from_shards_and_answers_by_prepare_data(built, fault, caplog):
    expected = split_rows(built)
    if fault == "flip":
        flip_middle(arrow_file(built.dataset_dir / "train"))
    else:
        rewrite_split(C.DatasetCache(built.dataset_dir), "train",
                      lambda rs: [{**r, "answer": "an answer nobody gave"} for r in rs])
    again = _dm(Path(built.data_path), built.cache_dir)
    with pytest.raises(IntegrityError, match=r"dataset-.*/train/.*rerun the same training command"):
        again.setup()  # refused before any row is read
    again.prepare_data()  # no encoder or LM is loaded: the shards and answers are intact
    assert "cache dataset damaged, rebuilding it" in caplog.text
    again.setup()
    assert split_rows(again) == expected and again.summary["answers"]["generated"] == 0


def test_a_damaged_answer_chunk_is_generated_again_by_the_build(built):
    chunks = sorted(built.answers_dir.glob("chunk-*"))
    flip_middle(arrow_file(chunks[0]), n=8)
    expected = split_rows(built)
    answerer = StubAnswerer()
    again = _dm(Path(built.data_path), built.cache_dir, rebuild=True)
    summary = _build(again, answerer=answerer)
    assert summary["answers"]["damaged_chunks_dropped"] == 1 and answerer.calls == summary["answers"]["generated"] > 0
    again.setup()
    assert split_rows(again) == expected


def test_stale_temp_folders_are_removed_by_the_build(built):
    dead = 2 ** 22 + 4321
    stale = [built.cache_dir / f".{built.dataset_dir.name}.tmp-{dead}",
             built.samples_dir / "shards" / f".shard-00002.tmp-{dead}"]
    for path in stale:
        path.mkdir()
    _build(_dm(Path(built.data_path), built.cache_dir, rebuild=True))
    assert not any(p.exists() for p in stale)


def test_a_nan_embedding_is_caught_at_the_source_naming_the_case(tmp_path):
    data = write_convomem(tmp_path / "convomem")  # the node "amber" occurs in some cases only
    with pytest.raises(RuntimeError, match=r"case \d+ \('.*'.*ValueError: case '.*', qa .*node feature row\(s\) "
                                           r"hold NaN or inf .*amber"):
        _build(_dm(data, tmp_path / "strict"), encoder=NaNEncoder("amber"))
    lenient = _dm(data, tmp_path / "lenient", strict=False)
    summary = _build(lenient, encoder=NaNEncoder("amber"))
    skipped = summary["skipped_cases"]
    assert 0 < len(skipped) < 16 and all("NaN or inf" in s["reason"] for s in skipped)
    lenient.setup()
    kept = [r for split in C.SPLITS for r in _rows(lenient, split)]
    assert kept and all(np.isfinite(np.asarray(r["x"])).all() for r in kept)


def test_a_damaged_embedding_memo_chunk_is_dropped_and_its_texts_encoded_again(tmp_path):
    from qgmem.samples.embedding_memo import EmbeddingMemo

    memo = EmbeddingMemo(HashEncoder(), tmp_path / "memo", flush_every=2)
    first = memo.encode(["green lead", "blue invoice"])  # flushed: one chunk
    (chunk,) = sorted((tmp_path / "memo").glob("chunk-*"))
    assert (chunk / C.CHECKSUMS).is_file()
    flip_middle(arrow_file(chunk), n=8)
    encoder = HashEncoder()
    again = EmbeddingMemo(encoder, tmp_path / "memo")
    assert again.loaded == 0 and not chunk.exists()
    assert np.array_equal(again.encode(["green lead", "blue invoice"]), first) and encoder.calls == 2
