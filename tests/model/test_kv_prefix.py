"""The deep reader: a key/value prefix at every layer of a tiny random Llama of the real architecture (GQA)."""

from __future__ import annotations

import pytest
import torch

from qgmem.lm import load_causal_lm, load_tokenizer
from qgmem.model.fusion import answer_nll, base_model, insert_token
from qgmem.model.kv_prefix import KVPrefix, KVProjector, kv_scale, lm_kv_shape, reading
from qgmem.model.random_lm import save_random_lm
from qgmem.prompting import generate

LAYERS, HIDDEN, HEADS, KV_HEADS = 3, 32, 4, 2  # head_dim 8, keys 16 wide: grouped-query attention
WIDTH = KV_HEADS * HIDDEN // HEADS


@pytest.fixture(scope="module")
def lm_path(tmp_path_factory):
    return str(save_random_lm(tmp_path_factory.mktemp("lm") / "tiny", hidden_size=HIDDEN, layers=LAYERS,
                              heads=HEADS, kv_heads=KV_HEADS))


@pytest.fixture(scope="module")
def lm(lm_path):
    return load_causal_lm(lm_path).eval()


def prefix(B: int, K: int, seed: int = 0, scale: float = 1.0) -> KVPrefix:
    g = torch.Generator().manual_seed(seed)
    return KVPrefix(scale * torch.randn(B, K, LAYERS, 2, WIDTH, generator=g))


def text(B: int, T: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(10, 1000, (B, T), generator=torch.Generator().manual_seed(seed))


def logits_with(lm, ids, mask, pos, kv, labels=None):
    embeds = lm.get_input_embeddings()(ids)
    e, m, p, _ = insert_token(embeds, mask, pos, kv, labels)
    with reading(lm, kv, pos):
        out = lm(inputs_embeds=e, attention_mask=m, position_ids=p, output_hidden_states=True)
    return out


def test_the_lm_s_key_value_shape_and_the_projector_s_output(lm):
    assert lm_kv_shape(lm) == (LAYERS, WIDTH)
    projector = KVProjector(12, HIDDEN, LAYERS, WIDTH)
    assert projector(torch.randn(2, 5, 12)).shape == (2, 5, LAYERS, 2, WIDTH)
    target = kv_scale(lm)
    assert target.shape == (LAYERS, 2) and bool((target > 0).all())
    sample = torch.randn(64, 12)
    projector.match_scale(target, sample)
    rms = projector(sample).pow(2).mean(dim=(0, -1)).sqrt()
    assert torch.allclose(rms, target, rtol=1e-4)


def test_a_changed_prefix_changes_the_logits_through_every_layer(lm):
    ids, mask, pos = text(2, 9), torch.ones(2, 9, dtype=torch.long), torch.tensor([3, 5])
    kv = prefix(2, 4)
    base = logits_with(lm, ids, mask, pos, kv)
    after = slice(int(pos.max()) + 4, None)  # text columns after every row's slot block
    for layer in range(LAYERS):
        for which in range(2):  # the key, then the value, of this layer only
            changed = kv.values.clone()
            changed[:, :, layer, which] += 1.0
            out = logits_with(lm, ids, mask, pos, KVPrefix(changed))
            assert not torch.allclose(out.logits[:, after], base.logits[:, after], atol=1e-5), (layer, which)
            # the layers below it read the same keys and values: their outputs do not move
            for depth in range(1, layer + 1):
                assert torch.allclose(out.hidden_states[depth], base.hidden_states[depth], atol=1e-6), (layer, depth)
            assert not torch.allclose(out.hidden_states[layer + 1][:, after], base.hidden_states[layer + 1][:, after])


def test_a_zero_length_prefix_is_exactly_the_text_only_prompt(lm):
    ids, mask, pos = text(2, 7), torch.ones(2, 7, dtype=torch.long), torch.tensor([2, 4])
    none = logits_with(lm, ids, mask, pos, None).logits
    empty = logits_with(lm, ids, mask, pos, KVPrefix(torch.zeros(2, 0, LAYERS, 2, WIDTH))).logits
    assert empty.shape == none.shape and torch.equal(empty, none)


def test_the_prefix_equals_keys_and_values_placed_in_a_cache_by_hand(lm):
    """An independent construction of the same thing: the head's cache, then the prefix's keys rotated at
    positions ``pos .. pos + K - 1`` appended at every layer, then the rest of the text after them."""
    from transformers import DynamicCache
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    P, K, T = 3, 4, 8
    ids, kv = text(1, T), prefix(1, K, scale=3.0)
    ours = logits_with(lm, ids, torch.ones(1, T, dtype=torch.long), torch.tensor([P]), kv).logits[:, P + K:]

    decoder = base_model(lm)
    embeds = lm.get_input_embeddings()(ids)
    cache = DynamicCache(config=lm.config)
    decoder(inputs_embeds=embeds[:, :P], cache=cache, use_cache=True)
    slots = torch.arange(P, P + K).view(1, -1)
    cos, sin = decoder.rotary_emb(embeds, slots)
    head_dim = HIDDEN // HEADS
    for layer in range(LAYERS):
        k = kv.values[:, :, layer, 0].view(1, K, KV_HEADS, head_dim).transpose(1, 2)
        v = kv.values[:, :, layer, 1].view(1, K, KV_HEADS, head_dim).transpose(1, 2)
        _, k = apply_rotary_pos_emb(k, k, cos, sin)
        cache.update(k, v, layer)
    rest = decoder(inputs_embeds=embeds[:, P:], cache=cache, use_cache=True,
                   position_ids=torch.arange(P + K, T + K).view(1, -1)).last_hidden_state
    theirs = lm.get_output_embeddings()(rest)
    assert torch.allclose(ours, theirs, atol=1e-5)


def test_left_padded_rows_read_their_prefix_as_when_alone(lm):
    ids, kv = text(2, 8), prefix(2, 3)
    pad = 3  # row 1 is 5 tokens long, left-padded by 3
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, :pad] = 0
    pos = torch.tensor([2, pad + 2])
    batch = logits_with(lm, ids, mask, pos, kv).logits
    alone = logits_with(lm, ids[1:, pad:], mask[1:, pad:], torch.tensor([2]), KVPrefix(kv.values[1:])).logits
    assert torch.allclose(batch[1, pad:], alone[0], atol=1e-5)


def test_greedy_generation_with_a_prefix_is_the_full_forward_s_argmax(lm, lm_path):
    tok = load_tokenizer(lm_path)
    B, T, K, N = 2, 6, 3, 6
    ids, kv = text(B, T, seed=4), prefix(B, K, seed=5, scale=2.0)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[0, :2] = 0  # left padding, as generation uses
    pos = torch.tensor([3, 2])
    embeds = lm.get_input_embeddings()(ids)
    e, m, _, _ = insert_token(embeds, mask, pos, kv)
    with reading(lm, kv, pos):
        out = generate(lm, tok, m, inputs_embeds=e, max_new_tokens=N, stop_ids=[-1], pad_id=0)
    new = torch.tensor(out.ids)
    assert new.shape == (B, N)
    full = torch.cat([ids, new], 1)
    logits = logits_with(lm, full, torch.cat([mask, torch.ones(B, N, dtype=torch.long)], 1), pos, kv).logits
    assert torch.equal(logits[:, T + K - 1: -1].argmax(-1), new)
    with reading(lm, None, pos):  # and the prefix made a difference to what was generated
        plain = generate(lm, tok, m, inputs_embeds=e, max_new_tokens=N, stop_ids=[-1], pad_id=0)
    assert plain.ids != out.ids


def test_the_loss_through_the_prefix_falls_and_only_the_projector_learns(lm):
    torch.manual_seed(0)
    B, T, K = 3, 10, 2
    ids, mask, pos = text(B, T, seed=7), torch.ones(B, T, dtype=torch.long), torch.full((B,), 2)
    labels = torch.full((B, T), -100)
    labels[:, 6:] = ids[:, 6:]
    projector = KVProjector(8, HIDDEN, LAYERS, WIDTH)
    projector.match_scale(kv_scale(lm), torch.randn(64, 8))
    readout = torch.randn(B, K, 8)
    optimizer = torch.optim.Adam(projector.parameters(), lr=3e-2)
    lm_before = {k: v.clone() for k, v in lm.state_dict().items()}
    losses = []
    for _ in range(25):
        kv = KVPrefix(projector(readout))
        e, m, p, lab = insert_token(lm.get_input_embeddings()(ids), mask, pos, kv, labels)
        with reading(lm, kv, pos):
            loss = answer_nll(lm, e, m, p, lab, shared_prefix=2)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.3, losses
    assert all(torch.equal(v, lm_before[k]) for k, v in lm.state_dict().items())


def test_the_shared_head_cache_gives_the_same_loss(lm):
    B, T, K = 2, 9, 3
    ids, mask, pos = text(B, T, seed=8), torch.ones(B, T, dtype=torch.long), torch.full((B,), 3)
    ids[1, :3] = ids[0, :3]  # a template head shared by every row
    labels = torch.full((B, T), -100)
    labels[:, 6:] = ids[:, 6:]
    kv = prefix(B, K)
    e, m, p, lab = insert_token(lm.get_input_embeddings()(ids), mask, pos, kv, labels)
    with reading(lm, kv, pos):
        full = answer_nll(lm, e, m, p, lab, reduction="none")
        cached = answer_nll(lm, e, m, p, lab, reduction="none", shared_prefix=3)
    assert torch.allclose(full, cached, atol=1e-5)
