"""The deep reader: the graph as ``K`` positions of keys and values at every layer of the frozen LM.

With ``injection: input`` the projector writes ``K`` vectors among the LM's input embeddings, and only
the first layer reads them as they are. With ``injection: kv_prefix`` the projector writes, for each
of the ``K`` readout vectors, a key and a value for every attention layer (a per-layer prefix as in
prefix tuning and P-Tuning v2, here computed per example from the graph); the frozen LM reads them
through its own attention, at every depth.

Where the prefix sits. The ``K`` slots take the columns the input tokens take today (the prompt's
graph slot, after the chat-template head): :func:`qgmem.model.fusion.insert_token` inserts ``K``
placeholder columns there, so masks, position ids and labels follow the padding exactly as for
``input``, and the head's key/value cache (computed once per batch in training, once per LM in
serving) stays valid, since nothing before the slot changes. While :func:`reading` is active, a
forward hook on each layer's ``k_proj`` and ``v_proj`` replaces their output at the slot columns with
the prefix's key and value for that layer. Only the keys and values of a slot column are read by the
other positions, so the placeholder's own hidden state never matters: the slots are exactly a
key/value prefix of ``K`` positions at every layer.

RoPE. The prefix's keys are written before the rotary embedding (they replace ``k_proj``'s output),
so the LM rotates them at the slot positions ``graph_pos .. graph_pos + K - 1``, as it would the keys
of ``K`` input tokens there; the text after the slot continues at ``graph_pos + K``. A key written
for a position is then read at the right relative distance by every later query, in training, in a
forward pass and in cached greedy decoding alike (the cache stores the rotated keys once, at prefill).
An architecture with a key norm after ``k_proj`` (Qwen3) normalises the prefix keys too.

Which columns a call covers: a forward pre-hook on the decoder reads the length of the key/value cache
it is given, so a call that continues a cache (the shared template head, ``generate``'s decoding
steps) knows its columns' absolute index.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Literal, get_args

import torch
from torch import nn

from qgmem.model.fusion import base_model

Injection = Literal["input", "kv_prefix"]
INJECTIONS: tuple[str, ...] = get_args(Injection)


def check_injection(kind: str) -> None:
    """The known places the graph enters the LM; a ``ValueError`` naming the setting otherwise."""
    if kind not in INJECTIONS:
        raise ValueError(f"injection must be one of {INJECTIONS}, got {kind!r}")


def lm_kv_shape(lm) -> tuple[int, int]:
    """``(layers, width)``: the LM's attention layers and the width of one layer's keys (and values),
    ``num_key_value_heads * head_dim`` (grouped-query attention keeps fewer key/value heads than query heads)."""
    config = base_model(lm).config
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    return int(config.num_hidden_layers), kv_heads * head_dim


class KVPrefix:
    """The per-layer keys and values of ``K`` graph slots: ``values`` ``[B, K, layers, 2, width]`` (index
    0 of the fourth axis is the key, before RoPE, 1 the value)."""

    def __init__(self, values: torch.Tensor):
        if values.dim() != 5 or values.size(3) != 2:
            raise ValueError(f"a key/value prefix is [B, K, layers, 2, width], got {tuple(values.shape)}")
        self.values = values

    @property
    def num_slots(self) -> int:
        return int(self.values.size(1))

    def slot_embeddings(self, embeds: torch.Tensor) -> torch.Tensor:
        """The ``K`` placeholder columns :func:`~qgmem.model.fusion.insert_token` inserts (zeros: their
        hidden states are never read, only the keys and values written over them)."""
        return embeds.new_zeros(embeds.size(0), self.num_slots, embeds.size(-1))


class KVProjector(nn.Module):
    """``Linear → GELU → Linear`` to ``layers · 2 · width``: each readout vector becomes a key and a value at
    every layer (the reparametrised prefix of prefix tuning, here a function of the graph)."""

    def __init__(self, in_dim: int, lm_hidden: int, layers: int, width: int, hidden: int | None = None):
        super().__init__()
        hidden = hidden or max(in_dim, lm_hidden)
        self.layers, self.width = int(layers), int(width)
        self.net = nn.Sequential(nn.Linear(in_dim, hidden), nn.GELU(), nn.Linear(hidden, self.layers * 2 * self.width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., C]`` → ``[..., layers, 2, width]``."""
        return self.net(x).unflatten(-1, (self.layers, 2, self.width))

    @torch.no_grad()
    def match_scale(self, target_rms: torch.Tensor, sample: torch.Tensor) -> None:
        """Rescale the last layer so a fresh prefix has, per layer, the RMS of the LM's own keys and values
        (``target_rms`` ``[layers, 2]``, :func:`kv_scale`): a prefix far louder than the text's keys would
        take all the attention at the start of training, a far quieter one none."""
        current = self(sample).float().pow(2).mean(dim=tuple(range(sample.dim() - 1)) + (-1,)).sqrt()
        factor = torch.where(current > 0, target_rms.to(current) / current.clamp(min=1e-12), torch.ones_like(current))
        last = self.net[-1]
        last.weight.view(self.layers, 2, self.width, -1).mul_(factor[:, :, None, None].to(last.weight.dtype))
        last.bias.view(self.layers, 2, self.width).mul_(factor[:, :, None].to(last.bias.dtype))


def _projections(lm) -> list[tuple[nn.Module, nn.Module]]:
    """Each attention layer's ``(k_proj, v_proj)`` (LoRA-wrapped ones included)."""
    layers = base_model(lm).layers
    return [(layer.self_attn.k_proj, layer.self_attn.v_proj) for layer in layers]


@torch.no_grad()
def kv_scale(lm, tokens: int = 64, seed: int = 0) -> torch.Tensor:
    """``[layers, 2]``: the RMS of the LM's keys (``k_proj``'s output) and values at each layer, over one
    forward of ``tokens`` token ids drawn with ``seed`` (a fixed sample: the scale, not the text, matters)."""
    projections = _projections(lm)
    rms = torch.zeros(len(projections), 2)
    handles = []
    for i, pair in enumerate(projections):
        for j, module in enumerate(pair):
            def record(_module, _args, out, i=i, j=j):
                rms[i, j] = out.detach().float().pow(2).mean().sqrt().cpu()
            handles.append(module.register_forward_hook(record))
    try:
        decoder = base_model(lm)
        vocab = decoder.get_input_embeddings().num_embeddings
        ids = torch.randint(vocab, (1, tokens), generator=torch.Generator().manual_seed(seed))
        decoder(input_ids=ids.to(decoder.get_input_embeddings().weight.device), use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return rms


@contextmanager
def reading(lm, prefix, pos: torch.Tensor) -> Iterator[None]:
    """While active, ``lm`` reads ``prefix`` (a :class:`KVPrefix`) at the ``K`` slot columns starting at
    column ``pos[b]`` of row ``b``, the columns :func:`~qgmem.model.fusion.insert_token` inserted for it.

    Anything else (an input-embedding token, ``None``) needs nothing here: the context does nothing, so
    every caller wraps its LM calls alike, whatever the injection.
    """
    if not isinstance(prefix, KVPrefix) or prefix.num_slots == 0:
        yield
        return
    values, K = prefix.values, prefix.num_slots
    pos = pos.to(values.device).view(-1, 1)
    state = {"offset": 0}

    def before(_module, _args, kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        state["offset"] = int(cache.get_seq_length()) if cache is not None else 0

    def writer(layer: int, which: int):
        def write(_module, _args, out):
            cols = torch.arange(out.size(1), device=out.device) + state["offset"]
            slot = cols.view(1, -1) - pos.to(out.device)  # [B, S]: 0..K-1 inside the slot block
            at = (slot >= 0) & (slot < K)
            if not bool(at.any()):
                return None
            if out.size(0) != slot.size(0):
                raise ValueError(f"a key/value prefix for {slot.size(0)} rows cannot be written into a batch of "
                                 f"{out.size(0)}")
            src = values[:, :, layer, which].to(out.device)  # [B, K, width]
            picked = src.gather(1, slot.clamp(0, K - 1).unsqueeze(-1).expand(-1, -1, src.size(-1)))
            return torch.where(at.unsqueeze(-1), picked.to(out.dtype), out)
        return write

    projections = _projections(lm)
    if values.size(2) != len(projections):
        raise ValueError(f"the prefix has keys and values for {values.size(2)} layers, the LM has {len(projections)}")
    handles = [base_model(lm).register_forward_pre_hook(before, with_kwargs=True)]
    try:
        for i, pair in enumerate(projections):
            for j, module in enumerate(pair):
                handles.append(module.register_forward_hook(writer(i, j)))
        yield
    finally:
        for handle in handles:
            handle.remove()
