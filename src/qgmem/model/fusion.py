"""Graph-text fusion: put the graph token(s) into a frozen causal LM's input embeddings.

Two jobs, kept free of Lightning so serving reuses them (decoding is :func:`qgmem.prompting.generate`):

- :func:`insert_token` places ``K`` vectors per row at ``pos`` (right- or left-padded rows alike) and keeps
  the attention mask, labels and position ids consistent with the padding (for ``injection: kv_prefix``
  the ``K`` columns are placeholders whose keys and values :mod:`qgmem.model.kv_prefix` writes);
- :func:`answer_logits` runs the LM's base model and applies the output head **only** at positions whose
  next token is a label, so no full-vocabulary logits are computed over the prompt; :func:`answer_nll`
  (the answer loss) and the distillation term read them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def insert_token(embeds: torch.Tensor, attention_mask: torch.Tensor, pos: torch.Tensor,
                 token: torch.Tensor | None, labels: torch.Tensor | None = None):
    """Insert the ``K`` graph tokens ``token[b]`` before column ``pos[b]`` of row ``b``.

    ``embeds`` ``[B, T, H]``, ``attention_mask`` ``[B, T]``, ``pos`` ``[B]``, ``token`` ``[B, K, H]``
    (``[B, H]`` is one token per row, ``K = 1``; ``None`` or ``K = 0``: no insertion, the text-only prompt;
    a key/value prefix, :class:`qgmem.model.kv_prefix.KVPrefix`: its ``K`` placeholder columns, which
    :func:`qgmem.model.kv_prefix.reading` fills at every layer). Returns ``(embeds, attention_mask, position_ids, labels)`` with length ``T + K`` (``T`` without a
    token); the new columns are attended to and never labels. Position ids count attended columns only,
    so left padding does not shift positions.
    """
    if hasattr(token, "slot_embeddings"):  # a per-layer key/value prefix: K placeholder columns
        token = token.slot_embeddings(embeds)
    if token is not None and token.dim() == 3 and token.size(1) == 0:
        token = None  # an empty graph block: exactly the text-only prompt
    if token is not None:
        if token.dim() == 2:
            token = token.unsqueeze(1)
        B, T, H = embeds.shape
        if token.dim() != 3 or token.size(0) != B or token.size(-1) != H:
            raise ValueError(f"graph tokens must be [B={B}, K, H={H}] (or [B, H]), got {tuple(token.shape)}")
        K = token.size(1)
        cols = torch.arange(T + K, device=embeds.device).unsqueeze(0).expand(B, -1)
        pos = pos.to(embeds.device).view(B, 1)
        slot = cols - pos  # 0..K-1 inside the inserted block
        at = (slot >= 0) & (slot < K)
        src = torch.where(cols >= pos + K, cols - K, cols).clamp(max=T - 1)  # column of the original row
        inserted = token.to(embeds.dtype).gather(1, slot.clamp(0, K - 1).unsqueeze(-1).expand(-1, -1, H))
        embeds = torch.where(at.unsqueeze(-1), inserted,
                             embeds.gather(1, src.unsqueeze(-1).expand(-1, -1, H)))
        attention_mask = torch.where(at, torch.ones_like(attention_mask[:, :1]), attention_mask.gather(1, src))
        if labels is not None:
            labels = torch.where(at, torch.full_like(labels[:, :1], IGNORE_INDEX), labels.gather(1, src))
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    return embeds, attention_mask, position_ids, labels


def base_model(lm):
    """The LM without its output head (``LlamaModel`` inside ``LlamaForCausalLM``; works through LoRA)."""
    if hasattr(lm, "get_base_model"):  # a peft wrapper: LoRA layers live inside the base model
        lm = lm.get_base_model()
    return lm.get_decoder()


def shared_prefix_length(input_ids: torch.Tensor, attention_mask: torch.Tensor, pos: torch.Tensor) -> int:
    """Leading columns that are the same attended token in every row and lie before every graph slot.

    In right-padded training batches this is the chat-template head (system prompt + user header): its
    states do not depend on the sample or the graph token, so :func:`answer_nll` computes them once.
    """
    limit = int(pos.min()) if pos.numel() else 0
    if limit <= 0:
        return 0
    same = (input_ids[:, :limit] == input_ids[:1, :limit]).all(0) & attention_mask[:, :limit].bool().all(0)
    return limit if bool(same.all()) else int(same.long().cumprod(0).sum())


def answer_logits(lm, embeds: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                  labels: torch.Tensor, shared_prefix: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The LM's float logits at the positions whose next token is a label, with the LM head applied only there.

    Returns ``(logits [N, vocab], targets [N], rows [N])``: the ``N`` label tokens of the batch in row
    order, then column order (so the ``i``-th answer token of a row is its ``i``-th entry), each label's
    logits, the label itself and its row. ``shared_prefix`` = ``P`` > 0 says the first ``P`` columns are
    identical in every row and carry no labels (see :func:`shared_prefix_length`): they run once, for
    one row and without gradients, as a key/value cache the rest of the batch attends to; the logits are
    the same, the prefix costs ``1/B`` of its forward and nothing in backward.
    """
    decoder = base_model(lm)
    P = int(shared_prefix)
    if P > 0:
        if (labels[:, : P + 1] != IGNORE_INDEX).any():
            raise ValueError(f"a shared prefix of {P} columns must not hold labels")
        with torch.no_grad():
            cache = decoder(inputs_embeds=embeds[:1, :P], attention_mask=attention_mask[:1, :P],
                            position_ids=position_ids[:1, :P], use_cache=True).cache
        cache.batch_repeat_interleave(embeds.size(0))
        hidden = decoder(inputs_embeds=embeds[:, P:], attention_mask=attention_mask,
                         position_ids=position_ids[:, P:], cache=cache, use_cache=True).last_hidden_state
        labels = labels[:, P:]
    else:
        hidden = decoder(inputs_embeds=embeds, attention_mask=attention_mask,
                         position_ids=position_ids, use_cache=False).last_hidden_state
    target = labels[:, 1:]
    keep = target != IGNORE_INDEX
    logits = lm.get_output_embeddings()(hidden[:, :-1][keep]).float()
    return logits, target[keep], keep.nonzero()[:, 0]


def answer_nll(lm, embeds: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
               labels: torch.Tensor, reduction: str = "mean", shared_prefix: int = 0) -> torch.Tensor:
    """Cross-entropy of the label tokens over :func:`answer_logits` (the LM head only where a label follows).

    Equals the loss of the full-logits path (``lm(inputs_embeds=..., labels=...)``) while computing
    ``[num_answer_tokens, vocab]`` logits instead of ``[B, T, vocab]``. ``reduction="none"`` gives the
    per-row mean (rows without labels give 0) for per-sample reporting.
    """
    logits, target, rows = answer_logits(lm, embeds, attention_mask, position_ids, labels, shared_prefix)
    nll = F.cross_entropy(logits, target, reduction="none")
    if reduction == "mean":
        return nll.mean()
    B = labels.size(0)
    total = torch.zeros(B, device=nll.device, dtype=nll.dtype).index_add_(0, rows, nll)
    counts = torch.zeros(B, device=nll.device, dtype=nll.dtype).index_add_(0, rows, torch.ones_like(nll))
    return total / counts.clamp(min=1)
