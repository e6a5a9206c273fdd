"""Query-aware reranking of the fused pool into working memory.

Every backend scores the same structured candidate document (fact summary, source dialogue span,
attributes, trace trajectory), so swapping the embedded default for the paper's LLM scorer changes only
the scores. Backends:

- ``EmbeddingReranker``: cosine of question and fact embeddings blended with the fused channel score
  and the normalized BM25 score; no model call beyond the question embedding (the embedded default).
- ``CrossEncoderReranker``: a sentence-transformers cross-encoder from a local folder (``cross-encoder``),
  or the one ``qgmem train-reranker`` trains on ConvoMem (``trained``; same scorer, its own card).
- ``LLMReranker``: the Qwen3-Reranker protocol on any causal LM: the prompt asks whether the document
  answers the query with "yes" or "no", and the score is p("yes") from the next-token logits restricted
  to the two answer tokens, computed in batches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from qgmem.activation.serialize import turn_label
from qgmem.errors import InputPathError, UserError
from qgmem.memory.records import MemoryTrace, MemoryUnit


@dataclass
class Candidate:
    """A pooled unit as the reranker sees it."""

    index: int  # position in the store
    unit: MemoryUnit
    fused: float  # reciprocal-rank-fusion score
    document: str = ""
    lexical: float = 0.0  # BM25 score over the best BM25 score of the query (0 when the lexical channel missed it)
    ranks: dict[str, int] = field(default_factory=dict)
    # pooled units it stands for (itself, and the superseded trace members that brought it in)
    via: list[int] = field(default_factory=list)


def trajectory_lines(trace: MemoryTrace, lookup) -> list[str]:
    """``origin/update/supplement: fact`` per trace member in memory-time order, the latest marked current."""
    lines = []
    for uid, transition in zip(trace.unit_ids, trace.transitions):
        mark = " (current)" if uid == trace.latest_unit_id else ""
        lines.append(f"{transition}: {lookup(uid).fact}{mark}")
    return lines


def candidate_document(unit: MemoryUnit, trace: MemoryTrace | None = None, lookup=None,
                       source_chars: int = 400) -> str:
    """The structured text a reranker judges: fact, source span, attributes, trajectory."""
    source = unit.source_text.strip().replace("\n", " ")
    if len(source) > source_chars:
        source = source[:source_chars].rstrip() + " ..."
    attrs = []
    if unit.entities:
        attrs.append("entities: " + ", ".join(unit.entities))
    if unit.location:
        attrs.append(f"location: {unit.location}")
    if unit.fact_time:
        attrs.append(f"fact time: {unit.fact_time}")
    if unit.utterance_time:
        attrs.append(f"said: {unit.utterance_time}")
    parts = [f"Fact: {unit.fact}", f"Source ({turn_label(unit)}, {unit.speaker or 'unknown speaker'}): {source}"]
    if attrs:
        parts.append("Attributes: " + "; ".join(attrs))
    if trace is not None and lookup is not None and len(trace.unit_ids) > 1:
        parts.append("Trajectory: " + " | ".join(trajectory_lines(trace, lookup)))
    return "\n".join(parts)


class Reranker(Protocol):
    def score(self, question: str, candidates: list[Candidate], query_vec: np.ndarray | None = None) -> np.ndarray:
        """One relevance score per candidate (higher is better)."""
        ...


class EmbeddingReranker:
    """``weight · cos(question, fact) + (1 − weight) · fused / max(fused) + lexical_weight · lexical
    + source_weight · cos(question, source turn)``.

    No extra model call. ``lexical`` is the candidate's BM25 score over the best one for the question:
    rank fusion alone forgets how strong the lexical evidence was (a rare name matched vs one common
    word), and BM25 over the source turn is what plain turn retrieval relies on. A latest trace state
    that stands in for superseded members takes the best cosine over the states it represents, because
    the question may name an earlier value ("still a nurse?"). The source-turn term gives back what the
    rewrite into a fact dropped (``source_embeddings``: one row per unit, as the store keeps them).
    """

    def __init__(self, embeddings: np.ndarray, encoder=None, weight: float = 0.7, lexical_weight: float = 0.0,
                 source_embeddings: np.ndarray | None = None, source_weight: float = 0.0):
        if source_weight > 0 and source_embeddings is None:
            raise ValueError("EmbeddingReranker: source_weight > 0 needs the units' source-turn embeddings")
        self.embeddings = embeddings
        self.encoder = encoder
        self.weight = weight
        self.lexical_weight = lexical_weight
        self.source_embeddings = source_embeddings
        self.source_weight = source_weight

    def score(self, question: str, candidates: list[Candidate], query_vec: np.ndarray | None = None) -> np.ndarray:
        if not candidates:
            return np.zeros(0, dtype=np.float32)
        if query_vec is None:
            if self.encoder is None:
                raise ValueError("EmbeddingReranker needs the question embedding or an encoder")
            query_vec = self.encoder.encode([question])[0]
        q = np.asarray(query_vec, dtype=np.float32).reshape(-1)
        idx = np.asarray([c.index for c in candidates], dtype=np.int64)
        cosine = self.embeddings[idx] @ q
        for row, c in enumerate(candidates):
            others = [i for i in c.via if i != c.index]
            if others:
                cosine[row] = max(cosine[row], float((self.embeddings[others] @ q).max()))
        fused = np.asarray([c.fused for c in candidates], dtype=np.float32)
        fused = fused / fused.max() if fused.max() > 0 else fused
        lexical = np.asarray([c.lexical for c in candidates], dtype=np.float32)
        score = self.weight * cosine + (1.0 - self.weight) * fused + self.lexical_weight * lexical
        if self.source_weight > 0:
            score = score + self.source_weight * (self.source_embeddings[idx] @ q)
        return score.astype(np.float32)


class CrossEncoderReranker:
    """A sentence-transformers cross-encoder (local folder or hub id) scoring (question, document) pairs."""

    def __init__(self, path: str, batch_size: int = 32, max_length: int | None = 512, device: str | None = None):
        from sentence_transformers import CrossEncoder

        local = Path(path).exists()
        self.model = CrossEncoder(path, max_length=max_length, device=device, local_files_only=local)
        self.batch_size = batch_size

    def score(self, question: str, candidates: list[Candidate], query_vec: np.ndarray | None = None) -> np.ndarray:
        if not candidates:
            return np.zeros(0, dtype=np.float32)
        pairs = [(question, c.document) for c in candidates]
        scores = self.model.predict(pairs, batch_size=self.batch_size, show_progress_bar=False, convert_to_numpy=True)
        scores = np.asarray(scores, dtype=np.float32)
        return scores[:, -1] if scores.ndim == 2 else scores


#: files whose bytes are a model reranker's weights (what a cache key must cover)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


def weight_files(path: Path) -> list[Path]:
    """A reranker's weight files, sorted: those under a folder, or the file itself."""
    return sorted(p for p in (path.rglob("*") if path.is_dir() else [path])
                  if p.is_file() and p.suffix in WEIGHT_SUFFIXES)


def check_trained_folder(path: str | Path) -> None:
    """A ``trained`` reranker is a local folder that holds weights; say which setting is wrong before
    sentence-transformers fails deeper with a message that names neither."""
    folder = Path(path)
    if not folder.is_dir():
        raise InputPathError(f"reranker_path {str(path)!r}: no such folder (reranker='trained' reads a local "
                             "folder)", hint="`qgmem train-reranker --out DIR` writes one")
    if not weight_files(folder):
        raise UserError(f"reranker_path {str(path)!r}: the folder holds no weight file "
                        f"({', '.join(WEIGHT_SUFFIXES)})", hint="`qgmem train-reranker --out DIR` writes one")


def weights_digest(path: str | Path) -> str:
    """SHA-256 over a reranker folder's weight files (names and bytes, sorted by relative path).

    A changed or retrained reranker changes which units become working memory, so whatever is cached
    from activation (the training samples) must be keyed by this, not by the folder's name.
    """
    import hashlib

    root = Path(path)
    files = weight_files(root)
    if not files:
        raise FileNotFoundError(f"{root}: no weight files ({', '.join(WEIGHT_SUFFIXES)}) to fingerprint")
    digest = hashlib.sha256()
    for file in files:
        digest.update(str(file.relative_to(root) if root.is_dir() else file.name).encode())
        with open(file, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def reranker_fingerprint(kind: str, path: str | None) -> str | None:
    """What a cache key must hold about a model reranker: its weights' digest (``None``: no model).

    ``embedding`` has no weights of its own. A cross-encoder or trained reranker is a local folder; the
    LLM reranker is the embedded SmolLM2 unless ``path`` names another model. A hub id that is not a
    local folder is kept as its name (its weights cannot be read here).
    """
    if kind == "embedding":
        return None
    if kind == "llm":
        from qgmem.lm import EMBEDDED_LM, resolve_lm_path

        path = resolve_lm_path(path or EMBEDDED_LM)
    if path is None:
        raise ValueError(f"reranker={kind!r} needs reranker_path")
    return f"sha256:{weights_digest(path)}" if Path(path).exists() else f"id:{path}"


RERANK_SYSTEM = ('Judge whether the Document meets the requirements based on the Query and the Instruct '
                 'provided. Note that the answer can only be "yes" or "no".')
RERANK_INSTRUCTION = ("Given a question about a long conversation history, judge whether this memory entry "
                      "contains evidence needed to answer it")


class LLMReranker:
    """Yes/no relevance from a causal LM's next-token logits (the Qwen3-Reranker protocol), batched.

    The prompt is the model's chat template with the judging instruction as system message and
    ``<Instruct>/<Query>/<Document>`` as user message; the assistant turn is opened and, for models that
    think (Qwen3), an empty think block is appended. ``score = softmax(logit_yes, logit_no)[yes]``.
    Only the last position's logits are computed. Documents are cut to ``max_doc_tokens``.
    """

    def __init__(self, model, tokenizer, batch_size: int = 16, max_doc_tokens: int = 256,
                 instruction: str = RERANK_INSTRUCTION, empty_think: bool | None = None):
        import torch

        self.torch = torch
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.max_doc_tokens = max_doc_tokens
        self.instruction = instruction
        self.empty_think = ("<think>" in tokenizer.get_vocab()) if empty_think is None else empty_think
        self.yes_id = self._single_token("yes")
        self.no_id = self._single_token("no")
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token

    @classmethod
    def from_pretrained(cls, name_or_path: str, device: str | None = None, dtype: str = "auto", **kwargs) -> LLMReranker:
        from qgmem.lm import load_causal_lm, load_tokenizer

        return cls(load_causal_lm(name_or_path, dtype=dtype, device=device), load_tokenizer(name_or_path), **kwargs)

    def _single_token(self, word: str) -> int:
        ids = self.tokenizer.encode(word, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"the tokenizer splits {word!r} into {len(ids)} tokens; the yes/no scorer needs one")
        return ids[0]

    def _truncate(self, document: str) -> str:
        ids = self.tokenizer.encode(document, add_special_tokens=False)
        if len(ids) <= self.max_doc_tokens:
            return document
        return self.tokenizer.decode(ids[: self.max_doc_tokens])

    def prompt(self, question: str, document: str) -> str:
        user = f"<Instruct>: {self.instruction}\n<Query>: {question}\n<Document>: {self._truncate(document)}"
        messages = [{"role": "system", "content": RERANK_SYSTEM}, {"role": "user", "content": user}]
        if getattr(self.tokenizer, "chat_template", None):
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:
            text = f"{RERANK_SYSTEM}\n\n{user}\n\nAnswer: "
        return text + ("<think>\n\n</think>\n\n" if self.empty_think else "")

    def score(self, question: str, candidates: list[Candidate], query_vec: np.ndarray | None = None) -> np.ndarray:
        torch = self.torch
        if not candidates:
            return np.zeros(0, dtype=np.float32)
        prompts = [self.prompt(question, c.document) for c in candidates]
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths share a batch
        out = np.zeros(len(prompts), dtype=np.float32)
        device = next(self.model.parameters()).device
        side = self.tokenizer.padding_side
        self.tokenizer.padding_side = "left"  # the last position is the next-token position for every row
        try:
            for start in range(0, len(order), self.batch_size):
                rows = order[start:start + self.batch_size]
                batch = self.tokenizer([prompts[i] for i in rows], return_tensors="pt", padding=True,
                                       add_special_tokens=False).to(device)
                with torch.inference_mode():
                    try:
                        logits = self.model(**batch, logits_to_keep=1).logits[:, -1, :]
                    except TypeError:  # architectures without logits_to_keep: full logits, last position
                        logits = self.model(**batch).logits[:, -1, :]
                pair = torch.stack([logits[:, self.no_id], logits[:, self.yes_id]], dim=-1).float()
                p_yes = torch.softmax(pair, dim=-1)[:, 1].cpu().numpy()
                out[rows] = p_yes
        finally:
            self.tokenizer.padding_side = side
        return out


def shared_reranker(config, device: str | None = None) -> Reranker | None:
    """The model reranker ``config`` (an :class:`~qgmem.activation.config.ActivationConfig`) names, loaded
    once and handed to every activator of a run; ``None`` for ``embedding``, which each activator builds
    over its own store's vectors."""
    if config.reranker == "embedding":
        return None
    return make_reranker(config.reranker, embeddings=np.zeros((0, 0), np.float32), path=config.reranker_path,
                         batch_size=config.reranker_batch_size, max_doc_tokens=config.reranker_max_doc_tokens,
                         device=device)


def make_reranker(kind: str, *, embeddings: np.ndarray, encoder=None, path: str | None = None,
                  batch_size: int = 16, max_doc_tokens: int = 256, weight: float = 0.7, lexical_weight: float = 0.0,
                  source_embeddings: np.ndarray | None = None, source_weight: float = 0.0,
                  device: str | None = None):
    """Build a backend from settings; ``path`` is the cross-encoder folder or the causal LM (default SmolLM2)."""
    if kind == "embedding":
        return EmbeddingReranker(embeddings, encoder, weight, lexical_weight, source_embeddings, source_weight)
    if kind in ("cross-encoder", "trained"):
        if not path:
            raise ValueError(f"reranker={kind!r} needs reranker_path (a sentence-transformers cross-encoder folder"
                             + ("; `qgmem train-reranker --out DIR` writes one)" if kind == "trained" else ")"))
        if kind == "trained":
            check_trained_folder(path)
        return CrossEncoderReranker(path, batch_size=batch_size, device=device)
    if kind == "llm":
        from qgmem.lm import EMBEDDED_LM

        return LLMReranker.from_pretrained(path or EMBEDDED_LM, device=device, batch_size=batch_size,
                                           max_doc_tokens=max_doc_tokens)
    raise ValueError(f"unknown reranker {kind!r}")
