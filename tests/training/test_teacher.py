"""The teacher cache: computed once per sample, reused, rebuilt when its key changes or a file is damaged."""

from __future__ import annotations

import pytest
import torch

from qgmem.errors import SettingError
from qgmem.lm import load_causal_lm, load_tokenizer
from qgmem.model.random_lm import save_random_lm
from qgmem.prompting import PromptSettings
from qgmem.training import teacher as T
from qgmem.training.synthetic import synthetic_items

SETTINGS = PromptSettings(max_prompt_tokens=96, max_answer_tokens=8, memory_units=0)


@pytest.fixture(scope="module")
def lm_path(tmp_path_factory):
    return str(save_random_lm(tmp_path_factory.mktemp("lm") / "tiny", hidden_size=32, layers=2))


@pytest.fixture(scope="module")
def lm(lm_path):
    return load_causal_lm(lm_path), load_tokenizer(lm_path)


@pytest.fixture
def forwards(monkeypatch):
    """Counts the teacher's LM forward passes (samples per call)."""
    calls: list[int] = []
    real = T.teacher_forward

    def counted(lm, samples, *args, **kwargs):
        calls.append(len(samples))
        return real(lm, samples, *args, **kwargs)

    monkeypatch.setattr(T, "teacher_forward", counted)
    return calls


def build(lm, items, folder, topk=4, **kwargs):
    model, tokenizer = lm
    return T.build_teacher(model, "tiny", tokenizer, SETTINGS, items, topk=topk, folder=folder, progress=False,
                           **kwargs)


def test_entries_are_the_top_k_answer_logits_of_the_full_text_prompt(lm, tmp_path):
    model, tokenizer = lm
    items = synthetic_items(3, seed=1)
    table, stats = build(lm, items, tmp_path, topk=4, batch_size=2)
    assert stats["samples"] == 3 and stats["misses"] == 3 and stats["hits"] == 0 and stats["truncated"] == 0
    assert sorted(table) == ["synthetic#0", "synthetic#1", "synthetic#2"]
    # one sample alone, through the LM's own full-logits path: the teacher reads every unit and no graph
    encoder = T.PromptEncoder(tokenizer, T.teacher_prompt(SETTINGS))
    assert encoder.settings.memory_units is None and encoder.settings.max_prompt_tokens == T.TEACHER_PROMPT_TOKENS
    prompt, answer = encoder.prompt(items[1]["memory_text"], items[1]["question"]), encoder.answer(items[1]["answer"])
    assert "[M1]" in tokenizer.decode(prompt.ids)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt.ids + answer])).logits[0].float()
    expected = logits[len(prompt.ids) - 1: len(prompt.ids) + len(answer) - 1].topk(4, dim=-1)
    entry = table["synthetic#1"]
    assert torch.equal(entry.answer, torch.tensor(answer)) and entry.ids.shape == (len(answer), 4)
    assert torch.equal(entry.ids, expected.indices)
    torch.testing.assert_close(entry.logits, expected.values, atol=1e-4, rtol=1e-4)


def test_the_cache_is_reused_and_rebuilt_when_its_key_changes(lm, tmp_path, forwards):
    items = synthetic_items(4, seed=1)
    first, stats = build(lm, items, tmp_path)
    assert stats["misses"] == 4 and sum(forwards) == 4 and len(list(tmp_path.glob("*.safetensors"))) == 4
    forwards.clear()
    again, stats = build(lm, items, tmp_path)
    assert (stats["hits"], stats["misses"], forwards) == (4, 0, [])  # no teacher forward at all
    assert all(torch.equal(again[q].logits, first[q].logits) and torch.equal(again[q].ids, first[q].ids)
               for q in first)
    _, stats = build(lm, items, tmp_path, topk=3)  # another k
    assert stats["misses"] == 4 and sum(forwards) == 4
    forwards.clear()
    _, stats = build(lm, items, tmp_path, max_prompt_tokens=512)  # another teacher prompt cap
    assert stats["misses"] == 4 and sum(forwards) == 4
    forwards.clear()
    other = load_causal_lm(lm[0].name_or_path)  # the same id and config, other weights
    with torch.no_grad():
        other.get_input_embeddings().weight.mul_(2.0)
    _, stats = build((other, lm[1]), items, tmp_path)
    assert stats["misses"] == 4 and sum(forwards) == 4
    forwards.clear()
    changed = [dict(item) for item in items]
    changed[2]["answer"] = "Purple"  # another answer: that sample alone
    table, stats = build(lm, changed, tmp_path)
    assert (stats["hits"], stats["misses"], forwards) == (3, 1, [1])
    assert not torch.equal(table["synthetic#2"].answer, first["synthetic#2"].answer)


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_corrupt_entry_is_detected_and_rebuilt(lm, tmp_path, forwards, damage, caplog):
    items = synthetic_items(2, seed=1)
    first, _ = build(lm, items, tmp_path)
    path = sorted(tmp_path.glob("*.safetensors"), key=lambda p: p.stat().st_mtime)[0]
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncate"
                     else data[:-3] + bytes([data[-3] ^ 0xFF]) + data[-2:])  # a bit of the logits
    forwards.clear()
    table, stats = build(lm, items, tmp_path)
    assert (stats["corrupt"], stats["misses"], stats["hits"], forwards) == (1, 1, 1, [1])
    assert str(path) in caplog.text
    # recomputed, not read (the counts above say so); the rebuilt row ran in a batch of its own, so its float32
    # logits match the batched first build to rounding, not bit for bit
    assert all(torch.allclose(table[q].logits, first[q].logits, rtol=1e-4, atol=1e-4) for q in first)
    _, stats = build(lm, items, tmp_path)
    assert (stats["corrupt"], stats["hits"]) == (0, 2)  # and rewritten


def test_a_sample_without_memory_text_cannot_be_taught(lm, tmp_path):
    items = synthetic_items(2, seed=1)
    del items[1]["memory_text"]
    with pytest.raises(SettingError, match=r"model\.stages: Distillation.*synthetic#1.*'memory_text'"):
        build(lm, items, tmp_path)
