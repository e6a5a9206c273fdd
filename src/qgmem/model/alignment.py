"""Node tokens that read as words: the LM's own embedding of each node's text as a regression target.

A frozen LM reads its input embeddings, and a small one (SmolLM2-135M) reads an inserted vector that
lies near the embedding of a word much as it reads that word: inserting the LM's word embeddings of a
graph's node texts as soft tokens already lowers the answer NLL of the graph's own question against
another graph's (docs/BENCHMARKS.md, learning check). A randomly initialised encoder + projector
produces vectors the LM has never seen, and a few hundred question-answer pairs cannot teach it a
mapping into the word-embedding space. So the projector's per-node output
(:meth:`qgmem.model.graph_token.GraphTokenNet.node_tokens`) is fitted to the mean input embedding of
the node text's word pieces, an objective that needs no LM forward pass and has one target per node
rather than one per question.
"""

from __future__ import annotations

from typing import Sequence

import torch

MAX_WORD_PIECES = 8  # word pieces of a node text that enter its target; node texts are short spans
PAD_PIECE = -1


def node_word_ids(node_texts: Sequence[Sequence[str]], num_nodes: Sequence[int], tokenizer,
                  max_pieces: int = MAX_WORD_PIECES) -> torch.Tensor:
    """Word-piece ids of every node of a batch of graphs, in PyG's node order: ``[sum(num_nodes), max_pieces]``.

    A node text is encoded as it would appear mid-sentence (a leading space); pieces past
    ``max_pieces`` are cut, short rows are padded with ``PAD_PIECE``. A graph's nodes without a text
    (the all-zero node of an empty working memory) are all padding, so they get no target.
    """
    rows: list[list[int]] = []
    for texts, n in zip(node_texts, num_nodes):
        texts = list(texts)
        if len(texts) > n:
            raise ValueError(f"a graph has {n} nodes but {len(texts)} node texts")
        for i in range(n):
            text = texts[i].strip() if i < len(texts) else ""
            ids = tokenizer(" " + text, add_special_tokens=False)["input_ids"] if text else []
            rows.append(list(ids)[:max_pieces])
    out = torch.full((len(rows), max_pieces), PAD_PIECE, dtype=torch.long)
    for r, ids in enumerate(rows):
        if ids:
            out[r, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    return out


def word_targets(ids: torch.Tensor, embedding: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean word embedding per node ``[N, H]`` and which nodes have one ``[N]`` (``embedding``: ``[V, H]``)."""
    present = ids != PAD_PIECE
    vectors = embedding[ids.clamp(min=0)] * present.unsqueeze(-1).to(embedding.dtype)
    counts = present.sum(1, keepdim=True).clamp(min=1).to(embedding.dtype)
    return vectors.sum(1) / counts, present.any(1)


def alignment_loss(node_tokens: torch.Tensor, ids: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
    """Mean squared error of node tokens ``[N, H]`` against their word targets, relative to the targets'
    mean square (1.0 = predicting zeros; 0 = exact). Zero when no node has a text."""
    if node_tokens.size(0) != ids.size(0):
        raise ValueError(f"{node_tokens.size(0)} node tokens but word ids for {ids.size(0)} nodes")
    target, valid = word_targets(ids.to(node_tokens.device), embedding.detach().to(node_tokens.dtype))
    if not bool(valid.any()):
        return node_tokens.sum() * 0.0
    target, pred = target[valid], node_tokens[valid]
    return (pred - target).pow(2).mean() / target.pow(2).mean().clamp(min=1e-12)
