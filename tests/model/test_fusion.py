"""Graph-text fusion: token insertion with padding, answer-only LM head, generation from embeddings."""

from __future__ import annotations

import pytest
import torch

from qgmem.lm import load_causal_lm
from qgmem.model.fusion import IGNORE_INDEX, answer_nll, base_model, insert_token
from qgmem.model.random_lm import save_random_lm


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    return load_causal_lm(str(save_random_lm(tmp_path_factory.mktemp("lm") / "tiny", hidden_size=32, layers=2)))


@pytest.mark.parametrize("pos", [[0, 2], [3, 1], [4, 4]])
def test_insert_token_places_the_token_and_shifts_the_rest(pos):
    B, T, H = 2, 5, 3
    embeds = torch.arange(B * T * H, dtype=torch.float32).view(B, T, H)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])  # row 1 right-padded
    labels = torch.arange(B * T).view(B, T)
    token = torch.full((B, H), -1.0)
    e, m, p, lab = insert_token(embeds, mask, torch.tensor(pos), token, labels)
    assert e.shape == (B, T + 1, H) and m.shape == lab.shape == p.shape == (B, T + 1)
    for b in range(B):
        k = pos[b]
        assert torch.equal(e[b, k], token[b])
        assert torch.equal(e[b, :k], embeds[b, :k]) and torch.equal(e[b, k + 1:], embeds[b, k:])
        assert m[b, k] == 1 and torch.equal(m[b, k + 1:], mask[b, k:])
        assert lab[b, k] == IGNORE_INDEX and torch.equal(lab[b, k + 1:], labels[b, k:])
    assert p[0].tolist() == list(range(T + 1))


@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize("pos", [[0, 2], [3, 1], [4, 4]])
def test_insert_k_tokens_places_the_block_and_shifts_the_rest(pos, K):
    B, T, H = 2, 5, 3
    embeds = torch.arange(B * T * H, dtype=torch.float32).view(B, T, H)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    labels = torch.arange(B * T).view(B, T)
    token = -torch.arange(1, B * K * H + 1, dtype=torch.float32).view(B, K, H)
    e, m, p, lab = insert_token(embeds, mask, torch.tensor(pos), token, labels)
    assert e.shape == (B, T + K, H) and m.shape == lab.shape == p.shape == (B, T + K)
    for b in range(B):
        k = pos[b]
        assert torch.equal(e[b, k:k + K], token[b])
        assert torch.equal(e[b, :k], embeds[b, :k]) and torch.equal(e[b, k + K:], embeds[b, k:])
        assert m[b, k:k + K].tolist() == [1] * K and torch.equal(m[b, k + K:], mask[b, k:])
        assert (lab[b, k:k + K] == IGNORE_INDEX).all() and torch.equal(lab[b, k + K:], labels[b, k:])
    assert p[0].tolist() == list(range(T + K))


def test_one_token_per_row_equals_k_of_one():
    embeds, mask = torch.randn(2, 4, 3), torch.ones(2, 4, dtype=torch.long)
    token, pos = torch.randn(2, 3), torch.tensor([1, 3])
    flat = insert_token(embeds, mask, pos, token)
    block = insert_token(embeds, mask, pos, token.unsqueeze(1))
    for a, b in zip(flat[:3], block[:3]):
        assert torch.equal(a, b)


def test_insert_rejects_tokens_of_the_wrong_width():
    with pytest.raises(ValueError, match="graph tokens must be"):
        insert_token(torch.randn(2, 4, 3), torch.ones(2, 4, dtype=torch.long), torch.tensor([0, 0]), torch.randn(2, 1, 5))


def test_insert_none_keeps_text_only():
    embeds, mask = torch.randn(2, 4, 3), torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    e, m, p, lab = insert_token(embeds, mask, torch.tensor([1, 0]), None, None)
    assert e is embeds and m is mask and lab is None
    assert p.tolist() == [[0, 0, 1, 2], [0, 1, 2, 3]]  # left padding does not shift positions


def test_left_padding_positions_skip_pads():
    embeds, mask = torch.randn(1, 4, 3), torch.tensor([[0, 0, 1, 1]])
    _, m, p, _ = insert_token(embeds, mask, torch.tensor([2]), torch.zeros(1, 3))
    assert m.tolist() == [[0, 0, 1, 1, 1]] and p.tolist() == [[0, 0, 0, 1, 2]]


def _inputs(lm, B=3, T=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 200, (B, T), generator=g)
    lengths = torch.tensor([T, T - 2, T - 4])[:B]
    mask = (torch.arange(T) < lengths[:, None]).long()
    labels = torch.full((B, T), IGNORE_INDEX)
    for b, n in enumerate(lengths.tolist()):
        labels[b, n - 3:n] = ids[b, n - 3:n]
    token = torch.randn(B, lm.config.hidden_size, generator=g)
    embeds = lm.get_input_embeddings()(ids)
    return insert_token(embeds, mask, torch.tensor([1, 2, 0])[:B], token, labels)


@pytest.mark.parametrize("seed", [0, 1])
def test_answer_only_head_equals_full_logits_loss(tiny_lm, seed):
    embeds, mask, positions, labels = _inputs(tiny_lm, seed=seed)
    with torch.no_grad():
        ours = answer_nll(tiny_lm, embeds, mask, positions, labels)
        full = tiny_lm(inputs_embeds=embeds, attention_mask=mask, position_ids=positions, labels=labels).loss
    torch.testing.assert_close(ours, full, atol=1e-5, rtol=1e-5)


def test_answer_nll_per_row(tiny_lm):
    embeds, mask, positions, labels = _inputs(tiny_lm)
    with torch.no_grad():
        rows = answer_nll(tiny_lm, embeds, mask, positions, labels, reduction="none")
        singles = torch.stack([answer_nll(tiny_lm, embeds[b:b + 1], mask[b:b + 1], positions[b:b + 1],
                                          labels[b:b + 1]) for b in range(3)])
    assert rows.shape == (3,)
    torch.testing.assert_close(rows, singles, atol=1e-5, rtol=1e-5)


def test_padding_does_not_change_hidden_states(tiny_lm):
    """A left-padded row sees the same hidden state at its last position as the unpadded row."""
    ids = torch.randint(5, 200, (1, 6))
    embeds = tiny_lm.get_input_embeddings()(ids)
    token = torch.randn(1, tiny_lm.config.hidden_size)
    pad = tiny_lm.get_input_embeddings()(torch.zeros(1, 3, dtype=torch.long))
    e1, m1, p1, _ = insert_token(embeds, torch.ones(1, 6, dtype=torch.long), torch.tensor([2]), token)
    e2, m2, p2, _ = insert_token(torch.cat([pad, embeds], 1), torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1]]),
                                 torch.tensor([5]), token)
    with torch.no_grad():
        h1 = base_model(tiny_lm)(inputs_embeds=e1, attention_mask=m1, position_ids=p1).last_hidden_state
        h2 = base_model(tiny_lm)(inputs_embeds=e2, attention_mask=m2, position_ids=p2).last_hidden_state
    torch.testing.assert_close(h1[:, -1], h2[:, -1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("K", [1, 2])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_shared_prefix_gives_the_same_loss_and_gradients(tiny_lm, K, reduction):
    """The shared head run once as a cache equals running it in every row (loss and token gradient)."""
    from qgmem.model.fusion import shared_prefix_length

    g = torch.Generator().manual_seed(3)
    B, T, P = 3, 12, 4
    ids = torch.randint(5, 200, (B, T), generator=g)
    ids[:, :P] = ids[0, :P]  # the template head
    lengths = torch.tensor([T, T - 2, T - 3])
    mask = (torch.arange(T) < lengths[:, None]).long()
    labels = torch.full((B, T), IGNORE_INDEX)
    for b, n in enumerate(lengths.tolist()):
        labels[b, n - 3:n] = ids[b, n - 3:n]
    pos = torch.full((B,), P)
    assert shared_prefix_length(ids, mask, pos) == P
    results = []
    for shared in (0, P):
        token = torch.randn(B, K, tiny_lm.config.hidden_size, generator=torch.Generator().manual_seed(4),
                            requires_grad=True)
        fused = insert_token(tiny_lm.get_input_embeddings()(ids).detach(), mask, pos, token, labels)
        loss = answer_nll(tiny_lm, *fused, reduction=reduction, shared_prefix=shared)
        loss.sum().backward()
        results.append((loss.detach(), token.grad))
    torch.testing.assert_close(results[0][0], results[1][0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(results[0][1], results[1][1], atol=1e-5, rtol=1e-4)


def test_shared_prefix_length_stops_at_the_first_difference():
    from qgmem.model.fusion import shared_prefix_length

    ids = torch.tensor([[1, 2, 3, 4, 5], [1, 2, 9, 4, 5]])
    mask = torch.ones_like(ids)
    assert shared_prefix_length(ids, mask, torch.tensor([4, 4])) == 2
    assert shared_prefix_length(ids, mask, torch.tensor([1, 4])) == 1
    assert shared_prefix_length(ids, torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]]), torch.tensor([4, 4])) == 0
