"""QGMemDataModule: cache keys, reuse, resume, answer filtering, grouped splits, items and batches.

Fast tests run the real loader, splitter, memory builder and activator on a tiny ConvoMem-form folder
written here, with a hashing stand-in for the sentence encoder and a stub for the frozen LM; the slow
ones use the real sample with MiniLM, once with a tiny random LM and once with SmolLM2.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from qgmem.activation.config import ActivationConfig
from qgmem.llm.backends import CallableBackend
from qgmem.llm.base import LLMConfig
from qgmem.memory.config import ConstructionConfig
from qgmem.samples import build as B
from qgmem.training import datamodule as D
from qgmem.samples.answer_filter import RUBRIC_CATEGORIES, LLMJudge, backend_completer
from qgmem.samples.cache import SampleCache
from qgmem.embed import sentence_encoder_dim
from qgmem.lm import EMBEDDED_LM
from qgmem.samples.build import build_cache
from qgmem.training.datamodule import QGMemDataModule
from qgmem.training.synthetic import synthetic_items

DIM = 384  # MiniLM's width: the module reads it from the model folder, the stand-in encoder matches it
PERSONS = ["p-ann", "p-bob", "p-cy", "p-dee"]
COLORS = ["green", "blue", "red", "amber", "violet", "teal"]


class HashEncoder:
    """Bag of words hashed into signed buckets, normalized: a deterministic, instant sentence encoder."""

    model_id = "test:hash"

    def __init__(self, dim: int = DIM, explode_on: str | None = None, interrupt_after: int | None = None):
        self.dim, self.calls, self.explode_on, self.interrupt_after = dim, 0, explode_on, interrupt_after

    def encode(self, texts):
        if self.interrupt_after is not None and self.calls >= self.interrupt_after:
            raise KeyboardInterrupt("stopped on purpose")  # like Ctrl-C or a killed job, mid-case
        self.calls += len(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            if self.explode_on and self.explode_on in text:
                raise RuntimeError(f"cannot encode {self.explode_on!r}")
            for word in re.findall(r"\w+", text.lower()):
                h = int(hashlib.md5(word.encode()).hexdigest(), 16)
                out[i, h % self.dim] += 1.0 if (h >> 8) % 2 else -1.0
            n = np.linalg.norm(out[i])
            out[i] /= n if n > 0 else 1.0
        return out


class StubAnswerer:
    """Stands in for the frozen LM: right (the color in the question's reference) for questions whose
    hash is even, wrong otherwise; counts calls; can stop on purpose like a killed process."""

    def __init__(self, fail_after: int | None = None):
        self.calls, self.fail_after = 0, fail_after

    def answer(self, pairs):
        out = []
        for memory, question in pairs:
            if self.fail_after is not None and self.calls >= self.fail_after:
                raise KeyboardInterrupt("stopped on purpose")
            self.calls += 1
            color = re.search(r"\((\w+) sheet\)", question)
            right = int(hashlib.md5(question.encode()).hexdigest(), 16) % 2 == 0
            out.append(f"It is {color.group(1) if color else 'fine'}." if right else "I think it is purple.")
        return out


def _conversation(person: str, i: int, color: str, topic: str) -> dict:
    lines = [
        ("User", f"I finally set up my new {topic} system at work this week."),
        ("Assistant", f"That sounds useful. How do you organize the {topic} entries?"),
        ("User", f"I mark every {topic} entry in {color} so it stands out on the sheet."),
        ("Assistant", f"Marking {topic} entries in {color} is a clear visual cue."),
        ("User", f"My manager Dana Lee liked the {color} {topic} entries a lot."),
        ("Assistant", "Great to hear that your manager appreciated it."),
    ]
    return {"id": f"{person}-conv-{i}", "messages": [{"speaker": s, "text": t} for s, t in lines]}


def write_convomem(root: Path, persons=PERSONS, items_per_person: int = 3, rubric_items: int = 1) -> Path:
    """A ConvoMem-form folder: per person, user_evidence items (real answers) and preference rubrics."""
    base = root / "core_benchmark" / "evidence_questions"
    topics = ["lead", "invoice", "meeting", "task"]
    for p_index, person in enumerate(persons):
        items = []
        for i in range(items_per_person):
            color, topic = COLORS[(p_index + i) % len(COLORS)], topics[i % len(topics)]
            conv = _conversation(person, i, color, topic)
            # the question carries its answer's color so the stub LM can be right on purpose
            items.append({"question": f"Which color do I use for the {topic} entries of {person} ({color} sheet)?",
                          "answer": color.capitalize(),
                          "message_evidences": [{"speaker": "User", "text": conv["messages"][2]["text"]}],
                          "conversations": [conv], "personId": person})
        (base / "user_evidence" / "1_evidence").mkdir(parents=True, exist_ok=True)
        (base / "user_evidence" / "1_evidence" / f"{person}_Tester.json").write_text(
            json.dumps({"evidence_items": items}), encoding="utf-8")
        rubric = []
        for i in range(rubric_items):
            conv = _conversation(person, 100 + i, COLORS[i], "note")
            rubric.append({"question": "How should I organize my notes?",
                           "answer": "A good response should suggest color coding the notes.",
                           "message_evidences": [{"speaker": "User", "text": conv["messages"][2]["text"]}],
                           "conversations": [conv], "personId": person})
        (base / "preference_evidence" / "1_evidence").mkdir(parents=True, exist_ok=True)
        (base / "preference_evidence" / "1_evidence" / f"{person}_Tester.json").write_text(
            json.dumps({"evidence_items": rubric}), encoding="utf-8")
    return root


@pytest.fixture()
def tiny_data(tmp_path) -> Path:
    return write_convomem(tmp_path / "convomem")


def _dm(data: Path, cache: Path, **kw) -> QGMemDataModule:
    settings = dict(data_path=str(data), cache_dir=str(cache), num_cases=None, distractor_conversations=1,
                    split_ratios=(0.5, 0.25, 0.25), answer_filter="match")
    settings.update(kw)
    return QGMemDataModule(**settings)


def _build(dm: QGMemDataModule, **kw):
    kw.setdefault("encoder", HashEncoder())
    kw.setdefault("answerer", StubAnswerer())
    return build_cache(dm, progress=False, **kw)


def _rows(dm: QGMemDataModule, split: str) -> list[dict]:
    ds = dm.split(split)
    return [ds.row(i) for i in range(len(ds))]


# ---- keys -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("change,part", [
    ({"num_cases": 5}, "samples"),
    ({"seed": 1}, "samples"),
    ({"split_ratios": (0.6, 0.2, 0.2)}, "samples"),
    ({"distractor_conversations": 2}, "samples"),
    ({"construction": ConstructionConfig(window_size=8)}, "samples"),
    ({"activation": ActivationConfig(k=5)}, "samples"),
    ({"group_key": "dialogue"}, "samples"),
    ({"lm": "some/other-lm"}, "answers"),
    ({"answer_max_new_tokens": 8}, "answers"),
    ({"max_prompt_tokens": 300}, "answers"),
    ({"answer_filter": "none"}, "filter"),
    ({"match_f1_threshold": 0.5}, "filter"),
])
def test_cache_key_changes_with_each_setting(tiny_data, tmp_path, change, part):
    base = _dm(tiny_data, tmp_path / "cache")
    other = _dm(tiny_data, tmp_path / "cache", **change)
    assert other.cache_key != base.cache_key
    assert (other.samples_key != base.samples_key) == (part == "samples")
    assert (other.answers_key != base.answers_key) == (part == "answers")


@pytest.mark.parametrize("change", [{"batch_size": 16}, {"eval_batch_size": 3}, {"num_workers": 2},
                                    {"max_answer_tokens": 17}, {"answer_batch_size": 1}, {"rebuild": True}])
def test_cache_key_ignores_loader_only_settings(tiny_data, tmp_path, change):
    assert _dm(tiny_data, tmp_path / "c", **change).cache_key == _dm(tiny_data, tmp_path / "c").cache_key


def test_cache_key_changes_with_the_data_files(tiny_data, tmp_path):
    before = _dm(tiny_data, tmp_path / "c").samples_key
    file = next(tiny_data.rglob("p-ann_Tester.json"))
    doc = json.loads(file.read_text())
    doc["evidence_items"][0]["answer"] = "Magenta"
    file.write_text(json.dumps(doc))
    assert _dm(tiny_data, tmp_path / "c").samples_key != before


def test_feature_dim_is_read_without_loading_the_encoder():
    assert sentence_encoder_dim(D.DEFAULT_SENTENCE_ENCODER) == 384
    assert QGMemDataModule(num_cases=2).feature_dim == 384


@pytest.mark.parametrize("kwargs,match", [
    ({"answer_filter": "exact"}, "answer_filter"),
    ({"answer_filter": "llm"}, "judge"),
    ({"split_ratios": (0.5, 0.5, 0.5)}, "split_ratios"),
    ({"num_cases": 0}, "num_cases"),
])
def test_bad_settings_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        QGMemDataModule(**kwargs)


# ---- build, reuse, resume -----------------------------------------------------------------------------


def test_build_then_reuse_without_rebuilding(tiny_data, tmp_path, monkeypatch):
    dm = _dm(tiny_data, tmp_path / "cache")
    summary = _build(dm)
    assert summary["cache_key"] == dm.cache_key
    assert summary["cases"] == {"loaded": 16, "sampled": 16, "train": 8, "val": 4, "test": 4}
    stamp = (dm.dataset_dir / "summary.json").stat().st_mtime_ns

    def no_rebuild(*a, **k):
        raise AssertionError("the cache was rebuilt although nothing changed")

    monkeypatch.setattr(B, "build_cache", no_rebuild)
    again = _dm(tiny_data, tmp_path / "cache")
    again.prepare_data()  # complete cache: returns without building
    again.setup("fit")
    assert (again.dataset_dir / "summary.json").stat().st_mtime_ns == stamp
    assert again.summary["cache_key"] == dm.cache_key
    assert len(again.split("val")) == 4 and len(again.split("test")) == 4


def test_changed_filter_reuses_samples_and_answers(tiny_data, tmp_path):
    first = _dm(tiny_data, tmp_path / "cache")
    _build(first)
    encoder, answerer = HashEncoder(), StubAnswerer()
    second = _dm(tiny_data, tmp_path / "cache", match_f1_threshold=0.9)
    summary = _build(second, encoder=encoder, answerer=answerer)
    assert second.cache_key != first.cache_key and second.samples_key == first.samples_key
    assert encoder.calls == 0 and answerer.calls == 0  # neither replay nor generation ran again
    assert summary["answers"]["reused"] == summary["answers"]["needed"] > 0


def test_interrupted_build_resumes_to_the_same_result(tiny_data, tmp_path):
    clean = _dm(tiny_data, tmp_path / "clean")
    _build(clean)
    dm = _dm(tiny_data, tmp_path / "resumed")
    with pytest.raises(KeyboardInterrupt):
        _build(dm, encoder=HashEncoder(interrupt_after=80))  # about half of the 157 texts encoded
    shards = SampleCache(dm.samples_dir)
    done = sum(shards.has_shard(i) for i in range(16))
    assert not shards.complete and 0 < done < 16
    assert not list(shards.shards.glob("shard-*/.*")) and not (shards.shards / "shard-00015").exists()
    assert not (dm.dataset_dir / "summary.json").exists()
    # the answer step is interrupted too: generation stops after 2 answers (a killed process)
    with pytest.raises(KeyboardInterrupt):
        _build(dm, answerer=StubAnswerer(fail_after=2))
    assert shards.complete
    answerer = StubAnswerer()
    summary = _build(dm, answerer=answerer)
    needed = summary["answers"]["needed"]
    assert answerer.calls == needed - summary["answers"]["reused"] and summary["answers"]["reused"] >= 0
    clean.setup()
    dm.setup()
    for split in ("train", "val", "test"):
        a, b = _rows(clean, split), _rows(dm, split)
        assert [r["qa_id"] for r in a] == [r["qa_id"] for r in b]
        for ra, rb in zip(a, b):
            assert ra["memory_text"] == rb["memory_text"] and ra["answer"] == rb["answer"]
            assert np.array_equal(np.asarray(ra["x"]), np.asarray(rb["x"]))
            assert ra["edge_index"] == rb["edge_index"]


def test_interrupted_answers_are_kept(tiny_data, tmp_path):
    dm = _dm(tiny_data, tmp_path / "cache", answer_batch_size=1)  # persisted every 4 answers
    with pytest.raises(KeyboardInterrupt):
        _build(dm, answerer=StubAnswerer(fail_after=5))
    answerer = StubAnswerer()
    summary = _build(dm, answerer=answerer)
    assert summary["answers"]["reused"] == 4  # one full chunk survived the interruption
    assert answerer.calls == summary["answers"]["needed"] - 4


def test_rebuild_discards_the_dataset_but_keeps_samples_and_answers(tiny_data, tmp_path):
    dm = _dm(tiny_data, tmp_path / "cache")
    _build(dm)
    stamp = (dm.dataset_dir / "summary.json").stat().st_mtime_ns
    again = _dm(tiny_data, tmp_path / "cache", rebuild=True)
    again.prepare_data()  # the real path: no encoder or LM is loaded, since shards and answers exist
    summary = again.summary
    assert (again.dataset_dir / "summary.json").stat().st_mtime_ns != stamp
    assert summary["answers"]["generated"] == 0 and summary["answers"]["reused"] == summary["answers"]["needed"]
    assert summary["seconds"]["cases_built_this_run"] == 16  # from the first build's completion record


# ---- filtering --------------------------------------------------------------------------------------


def test_match_filter_keeps_correct_training_answers_and_leaves_rubrics_out(tiny_data, tmp_path):
    dm = _dm(tiny_data, tmp_path / "cache")
    _build(dm)
    dm.setup()
    summary = dm.summary
    counts = summary["filter"]["counts"]["train"]
    train = _rows(dm, "train")
    assert all(r["correct"] and r["judged"] and r["category"] == "user_evidence" for r in train)
    assert all(r["answer"] == r["reference"] for r in train)  # the reference is the target
    assert all(r["lm_answer"].lower().startswith("it is") for r in train)
    assert counts["user_evidence"]["kept"] == len(train) == counts["user_evidence"]["correct"]
    assert 0 < len(train) < counts["user_evidence"]["samples"]  # the stub is wrong on some
    assert counts["preference_evidence"]["kept"] == 0 == counts["preference_evidence"]["judged"]
    assert set(summary["left_out_categories"]) == {"preference_evidence"}
    assert "no LLM judge" in summary["left_out_categories"]["preference_evidence"]
    # validation and test are never filtered, rubrics included, with the reference as the answer
    for split in ("val", "test"):
        rows = _rows(dm, split)
        assert len(rows) == summary["cases"][split] and all(r["answer"] == r["reference"] for r in rows)
    assert any(r["category"] in RUBRIC_CATEGORIES for r in _rows(dm, "val") + _rows(dm, "test"))


def test_no_filter_keeps_all_but_rubrics(tiny_data, tmp_path):
    dm = _dm(tiny_data, tmp_path / "cache", answer_filter="none")
    answerer = StubAnswerer()
    summary = _build(dm, answerer=answerer)
    assert answerer.calls == 0 and summary["answers"]["needed"] == 0
    train_counts = summary["filter"]["counts"]["train"]
    assert train_counts["user_evidence"]["samples"] > 0  # not vacuous: there are training samples to keep
    assert train_counts["user_evidence"]["kept"] == train_counts["user_evidence"]["samples"]
    assert train_counts["preference_evidence"]["samples"] > 0 and train_counts["preference_evidence"]["kept"] == 0
    dm.setup()
    train = _rows(dm, "train")
    assert len(train) == train_counts["user_evidence"]["samples"] and all(r["category"] == "user_evidence"
                                                                         for r in train)
    assert set(summary["left_out_categories"]) == {"preference_evidence"}


def test_llm_judge_keeps_rubric_answers_it_accepts(tiny_data, tmp_path):
    """With a judge, rubric categories train on the frozen LM's own accepted answer."""
    def verdict(messages):
        reply = messages[-1]["content"].split("Reply to grade:")[-1]
        return "VERDICT: CORRECT" if "purple" not in reply else "VERDICT: INCORRECT"

    backend = CallableBackend(verdict)
    dm = _dm(tiny_data, tmp_path / "cache", answer_filter="llm", judge=LLMConfig(backend="transformers", model="stub"))
    summary = _build(dm, judge=LLMJudge(backend_completer(backend)))
    dm.setup()
    train = _rows(dm, "train")
    assert summary["left_out_categories"] == {}
    rubric = [r for r in train if r["category"] == "preference_evidence"]
    assert rubric and all(r["answer"] == r["lm_answer"] != r["reference"] for r in rubric)
    assert all("purple" not in r["answer"] for r in train)
    counts = summary["filter"]["counts"]["train"]
    assert sum(c["judged"] for c in counts.values()) == backend.usage.requests == summary["answers"]["needed"]


def test_a_judge_outage_stops_the_build_instead_of_dropping_samples(tiny_data, tmp_path):
    """A judge request that gets no reply (server down) is not an "incorrect" verdict: no dataset is
    written, and the run after the outage keeps every sample the judge accepts."""
    from qgmem.errors import UserError

    down = {"on": True}

    def verdict(messages):
        if down["on"] and "Reply to grade:" in messages[-1]["content"]:
            raise RuntimeError("connection refused")
        return "VERDICT: CORRECT"

    backend = CallableBackend(verdict)
    dm = _dm(tiny_data, tmp_path / "cache", answer_filter="llm", judge=LLMConfig(backend="transformers", model="stub"))
    with pytest.raises(UserError, match=r"answer filter: \d+ of \d+ judge requests .* got no reply"):
        _build(dm, judge=LLMJudge(backend_completer(backend)))
    assert not D.C.DatasetCache(dm.dataset_dir).complete
    down["on"] = False
    summary = _build(dm, judge=LLMJudge(backend_completer(backend)))
    train = summary["filter"]["totals"]["train"]
    assert train["kept"] == train["samples"] == train["judged"] > 0


# ---- splits -----------------------------------------------------------------------------------------


def test_splits_have_no_shared_person(tiny_data, tmp_path):
    dm = _dm(tiny_data, tmp_path / "cache", answer_filter="none")
    summary = _build(dm)
    dm.setup()
    groups = {s: {r["group"] for r in _rows(dm, s)} for s in ("val", "test")}
    groups["train"] = {r["group"] for r in SampleCache(dm.samples_dir).load() if r["split"] == "train"}
    assert groups["train"] and groups["val"] and groups["test"]
    assert not (groups["train"] & groups["val"]) and not (groups["train"] & groups["test"])
    assert not (groups["val"] & groups["test"])
    assert summary["split"]["group_key_used"] == "person" and summary["split"]["groups_shared_across_splits"] == 0
    assert summary["split"]["warnings"] == []


def test_one_person_falls_back_to_dialogue_grouping_and_says_so(tmp_path):
    data = write_convomem(tmp_path / "one", persons=["p-solo"], items_per_person=6)
    dm = _dm(data, tmp_path / "cache", answer_filter="none")
    summary = _build(dm)
    split = summary["split"]
    assert split["group_key_used"] == "dialogue" and split["groups_shared_across_splits"] == 0
    assert any("dialogue" in w for w in split["warnings"])


def test_strict_build_names_the_failing_case_and_lenient_build_records_it(tiny_data, tmp_path):
    with pytest.raises(RuntimeError, match=r"case \d+ \('.*p-bob.*'"):
        _build(_dm(tiny_data, tmp_path / "strict", answer_filter="none"), encoder=HashEncoder(explode_on="p-bob"))
    marker = "Dana"  # every conversation mentions her: make just one person's cases fail instead
    data = write_convomem(tmp_path / "lenient-data")
    file = next(data.rglob("p-cy_Tester.json"))
    file.write_text(file.read_text().replace(marker, "Zorblax"))
    dm = _dm(data, tmp_path / "lenient", answer_filter="none", strict=False)
    summary = _build(dm, encoder=HashEncoder(explode_on="Zorblax"))
    skipped = summary["skipped_cases"]
    assert skipped and all("p-cy" in s["case_id"] and "Zorblax" in s["reason"] for s in skipped)


# ---- items and batches ------------------------------------------------------------------------------


def test_items_follow_the_contract(tiny_data, tmp_path):
    dm = _dm(tiny_data, tmp_path / "cache", answer_filter="none")
    _build(dm)
    dm.setup()
    item = dm.split("val")[0]
    assert set(item) == {
        "graph", "memory_text", "question", "answer", "category", "qa_id", "node_text"}
    g = item["graph"]
    assert g.x.dtype == torch.float32 and g.x.dim() == 2 and g.x.shape[1] == DIM and g.x.shape[0] >= 1
    assert g.edge_index.dtype == torch.long and g.edge_index.shape[0] == 2
    assert g.edge_attr.shape == (g.edge_index.shape[1], DIM)
    assert item["memory_text"].startswith("[M1]") and item["question"].endswith("?")
    row = dm.split("val").row(0)
    assert g.x.shape[0] == max(1, row["num_nodes"]) and len(row["node_text"]) == row["num_nodes"]
    assert item["node_text"] == list(row["node_text"])


def test_dataloaders_batch_with_the_collator(tiny_data, tmp_path, smollm2_tokenizer):
    dm = _dm(tiny_data, tmp_path / "cache", answer_filter="none", batch_size=3, eval_batch_size=2,
             max_prompt_tokens=200, max_answer_tokens=16)
    _build(dm)
    dm._tokenizer = smollm2_tokenizer  # the tokenizer the module would load for its lm
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape[0] == 3 and batch["labels"].shape == batch["input_ids"].shape
    assert batch["graph"].num_graphs == 3 and batch["graph"].x.shape[1] == DIM
    assert batch["input_ids"].shape[1] <= 200 + 16
    val = next(iter(dm.val_dataloader()))
    assert val["input_ids"].shape[0] == 2 and val["qa_id"] == [dm.split("val")[i]["qa_id"] for i in range(2)]


def test_fit_with_an_empty_training_split_says_why(tiny_data, tmp_path):
    class Wrong:
        def answer(self, pairs):
            return ["I think it is purple."] * len(pairs)

    dm = _dm(tiny_data, tmp_path / "cache")
    summary = _build(dm, answerer=Wrong())
    assert summary["filter"]["totals"]["train"]["kept"] == 0
    with pytest.raises(RuntimeError, match="training split is empty"):
        dm.setup("fit")
    dm.setup("validate")  # evaluation still works
    assert len(dm.split("val")) == summary["cases"]["val"]


def test_setup_without_a_cache_says_what_to_do(tiny_data, tmp_path):
    with pytest.raises(RuntimeError, match="prepare_data"):
        _dm(tiny_data, tmp_path / "empty").setup()


@pytest.mark.parametrize("feature_dim,batch_size", [(8, 2), (16, 3)])
def test_from_items_serves_tiny_batches(smollm2_tokenizer, feature_dim, batch_size):
    items = synthetic_items(7, feature_dim, seed=3)
    dm = QGMemDataModule.from_items(items[:5], items[5:6], items[6:], tokenizer=smollm2_tokenizer,
                                    batch_size=batch_size, max_prompt_tokens=128, max_answer_tokens=8)
    assert dm.feature_dim == feature_dim and dm.cache_key is None
    dm.prepare_data()
    dm.setup("fit")
    batches = list(dm.train_dataloader())
    assert [b["input_ids"].shape[0] for b in batches] == [batch_size] * (5 // batch_size) + (
        [5 % batch_size] if 5 % batch_size else [])
    assert batches[0]["graph"].x.shape[1] == feature_dim
    assert len(list(dm.val_dataloader())) == 1 and len(list(dm.test_dataloader())) == 1
    assert dm.summary["samples"]["train"] == {"changing_evidence": 2, "user_evidence": 3}


def test_synthetic_items_follow_the_contract():
    items = synthetic_items(6, 6, seed=1)
    assert [it["qa_id"] for it in items] == [f"synthetic#{i}" for i in range(6)]
    assert sum(it["graph"].edge_index.shape[1] for it in items) > 0
    for it in items:
        g = it["graph"]
        assert g.x.shape[1] == 6 and g.x.shape[0] >= 1 and g.edge_attr.shape == (g.edge_index.shape[1], 6)
        assert g.edge_index.shape[0] == 2 and int(g.edge_index.max()) < g.x.shape[0] if g.edge_index.numel() else \
            g.edge_index.shape == (2, 0)
    assert synthetic_items(6, 6, seed=1)[2]["graph"].x.equal(items[2]["graph"].x)  # seeded


# ---- the real sample ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_real_sample_end_to_end_with_minilm_and_a_tiny_lm(convomem_path, tmp_path):
    """prepare_data + setup on a handful of real ConvoMem cases: MiniLM features, tiny random answer LM."""
    from qgmem.model.random_lm import save_random_lm

    lm = save_random_lm(tmp_path / "tiny-lm", hidden_size=32, layers=1, heads=2, kv_heads=1)
    dm = QGMemDataModule(data_path=str(convomem_path), num_cases=5, distractor_conversations=1,
                         cache_dir=str(tmp_path / "cache"), lm=str(lm), answer_max_new_tokens=4,
                         max_prompt_tokens=256)
    dm.prepare_data()
    dm.setup()
    summary = dm.summary
    assert summary["cases"]["sampled"] == 5 and summary["cases"]["loaded"] == 525
    assert summary["split"]["group_key_used"] == "dialogue" and summary["split"]["warnings"]
    assert sum(summary["qas"].values()) == 5
    for split in ("val", "test"):
        ds = dm.split(split)
        assert len(ds) == summary["cases"][split]
        for i in range(len(ds)):
            item = ds[i]
            assert item["graph"].x.shape[1] == 384 and item["memory_text"].startswith("[M1]")
    needed = summary["answers"]["needed"]
    assert summary["answers"]["generated"] == needed
    again = QGMemDataModule(data_path=str(convomem_path), num_cases=5, distractor_conversations=1,
                            cache_dir=str(tmp_path / "cache"), lm=str(lm), answer_max_new_tokens=4,
                            max_prompt_tokens=256)
    assert again.cache_key == dm.cache_key
    again.prepare_data()
    again.setup()
    assert again.summary == summary


@pytest.mark.slow
def test_real_sample_with_smollm2_answer_filter(convomem_path, tmp_path):
    """One build with the real frozen LM judging its own answers (3 cases keep it short)."""
    dm = QGMemDataModule(data_path=str(convomem_path), num_cases=3, distractor_conversations=1,
                         cache_dir=str(tmp_path / "cache"), answer_max_new_tokens=16, max_prompt_tokens=384,
                         answer_filter="match")
    dm.prepare_data()
    dm.setup("validate")
    summary = dm.summary
    train = summary["filter"]["counts"].get("train", {})
    judged = sum(c["judged"] for c in train.values())
    assert judged == summary["answers"]["needed"] == summary["answers"]["generated"]
    rows = [dm.split("train").row(i) for i in range(len(dm.split("train")))]
    assert all(r["correct"] and r["lm_answer"] for r in rows)
    assert summary["settings"]["lm"] == EMBEDDED_LM


def test_the_training_order_follows_the_data_seed(smollm2_tokenizer):
    """The product's order (and the alignment stage's) comes from the data seed; 0 without one."""
    from qgmem.training.datamodule import InMemoryDataModule
    from qgmem.training.module import _order_seed

    dm = InMemoryDataModule(synthetic_items(4, 8, seed=0), tokenizer=smollm2_tokenizer)
    assert (dm.order_seed, _order_seed(dm), _order_seed(None)) == (0, 0, 0)
    assert _dm(Path("unused"), Path("unused"), seed=3).order_seed == 3


@pytest.mark.parametrize("units, k, message", [
    (11, None, "data.memory_units = 11 is more than data.activation.k = 10"),
    (3, 2, "data.memory_units = 3 is more than data.activation.k = 2"),
    (-1, None, "data.memory_units must be >= 0"),
])
def test_data_module_refuses_a_text_budget_outside_the_graphs_naming_it(units, k, message):
    from qgmem.activation.config import ActivationConfig
    from qgmem.errors import SettingError

    with pytest.raises(SettingError) as info:
        QGMemDataModule(memory_units=units, **({"activation": ActivationConfig(k=k)} if k else {}))
    assert message in str(info.value)
    dm = QGMemDataModule(memory_units=k or 10, **({"activation": ActivationConfig(k=k)} if k else {}))  # m = k holds
    # the run's answer contract: the data module's prompt and activation, as one object
    assert dm.answer_contract.prompt == dm.prompt_settings and dm.answer_contract.prompt.memory_units == (k or 10)
    assert dm.answer_contract.activation.k == (k or 10)


def test_in_memory_data_module_refuses_a_negative_text_budget():
    from qgmem.errors import SettingError
    from qgmem.training.datamodule import InMemoryDataModule

    with pytest.raises(SettingError, match="data.memory_units must be >= 0"):
        InMemoryDataModule([], feature_dim=4, tokenizer=object(), memory_units=-2)
