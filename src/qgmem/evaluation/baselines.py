"""The comparison retriever: plain BM25 over a dialogue's raw turns, one turn per entry."""

from __future__ import annotations

from qgmem.activation.channels import LexicalChannel
from qgmem.data.records import Dialogue


class BM25TurnBaseline:
    """BM25 (same tokenizer, stop words and stems as the lexical channel) over raw turn texts."""

    def __init__(self, dialogue: Dialogue, k1: float = 1.5, b: float = 0.75):
        self.turns = dialogue.turns()
        self.channel = LexicalChannel([f"{t.speaker}: {t.text}" for t in self.turns], k1=k1, b=b)

    def retrieve(self, question: str, k: int) -> list[list[str]]:
        """The top-``k`` turns as single-turn entries (turn id lists), best first."""
        return [[self.turns[i].id] for i, _ in self.channel.search(question, k)]

    def context(self, entries: list[list[str]]) -> str:
        """The retrieved turns as ``[Mi] speaker: text`` lines, to count the context they would cost."""
        by_id = {t.id: t for t in self.turns}
        return "\n".join(f"[M{i + 1}] {by_id[e[0]].speaker}: {by_id[e[0]].text}" for i, e in enumerate(entries))


class DenseTurnBaseline:
    """The sentence encoder over raw turns (``speaker: text``), exact inner product: dense retrieval
    without construction, to tell what the memory units add over embedding the dialogue as it is."""

    def __init__(self, dialogue: Dialogue, encoder):
        import numpy as np

        self.turns = dialogue.turns()
        self.encoder = encoder
        texts = [f"{t.speaker}: {t.text}" for t in self.turns]
        self.vectors = (np.asarray(encoder.encode(texts), dtype=np.float32) if texts
                        else np.zeros((0, encoder.dim), np.float32))

    def retrieve(self, question: str, k: int, query_vec=None) -> list[list[str]]:
        """The top-``k`` turns by cosine with the question (ties: dialogue order), best first."""
        import numpy as np

        if not self.turns:
            return []
        q = self.encoder.encode([question])[0] if query_vec is None else query_vec
        scores = self.vectors @ np.asarray(q, dtype=np.float32).reshape(-1)
        order = np.lexsort((np.arange(len(scores)), -scores))[:k]
        return [[self.turns[i].id] for i in order]
