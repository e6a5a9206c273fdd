"""Node-token alignment targets: word-piece ids per node, their mean word embedding, the relative loss."""

from __future__ import annotations

import pytest
import torch

from qgmem.model.alignment import PAD_PIECE, alignment_loss, node_word_ids, word_targets

VOCAB = {"user": 1, "green": 2, "hot": 3, "leads": 4, "the": 5, "spreadsheet": 6}


def tokenizer(text, add_special_tokens=False):
    """A word-level stand-in with the call signature of a Hugging Face tokenizer."""
    assert not add_special_tokens and text.startswith(" ")  # node texts are encoded mid-sentence
    return {"input_ids": [VOCAB[w] for w in text.split()]}


def test_node_word_ids_follow_pyg_node_order_and_pad():
    ids = node_word_ids([["user", "hot leads"], ["green"]], [2, 1], tokenizer)
    assert ids.shape == (3, 8) and ids.dtype == torch.long
    assert ids[:, :2].tolist() == [[1, PAD_PIECE], [3, 4], [2, PAD_PIECE]]
    assert (ids[:, 2:] == PAD_PIECE).all()


def test_node_word_ids_cut_long_texts_and_leave_textless_nodes_empty():
    ids = node_word_ids([["the hot leads spreadsheet"], ["", "  "], []], [1, 2, 1], tokenizer, max_pieces=2)
    assert ids.tolist() == [[5, 3], [PAD_PIECE] * 2, [PAD_PIECE] * 2, [PAD_PIECE] * 2]


def test_node_word_ids_refuse_more_texts_than_nodes():
    with pytest.raises(ValueError, match="2 nodes but 3 node texts"):
        node_word_ids([["user", "green", "hot"]], [2], tokenizer)


def test_word_targets_are_mean_embeddings():
    table = torch.arange(14, dtype=torch.float32).view(7, 2)
    ids = torch.tensor([[3, 4, PAD_PIECE], [PAD_PIECE] * 3, [1, PAD_PIECE, PAD_PIECE]])
    target, valid = word_targets(ids, table)
    assert target.shape == (3, 2) and valid.tolist() == [True, False, True]
    torch.testing.assert_close(target[0], (table[3] + table[4]) / 2)
    torch.testing.assert_close(target[1], torch.zeros(2))
    torch.testing.assert_close(target[2], table[1])


def test_alignment_loss_is_relative_and_skips_nodes_without_text():
    table = torch.randn(7, 4)
    ids = torch.tensor([[1, 2], [3, PAD_PIECE], [PAD_PIECE, PAD_PIECE]])
    target, _ = word_targets(ids, table)
    exact = torch.cat([target[:2], torch.randn(1, 4) * 100])  # the textless node's token does not count
    assert alignment_loss(exact, ids, table).item() == pytest.approx(0.0, abs=1e-6)
    assert alignment_loss(torch.zeros(3, 4), ids, table).item() == pytest.approx(1.0)
    none = torch.full((2, 2), PAD_PIECE)
    pred = torch.randn(2, 4, requires_grad=True)
    loss = alignment_loss(pred, none, table)
    assert loss.item() == 0.0 and loss.requires_grad
    with pytest.raises(ValueError, match="3 node tokens but word ids for 2 nodes"):
        alignment_loss(torch.zeros(3, 4), none, table)
