"""The untrained node-word probe of the learning check: can the frozen LM read a graph's node texts
from soft tokens, before any training?

Each sample's first K node texts, as the LM's own mean word embeddings (the target of
:mod:`qgmem.model.alignment`), are inserted as K soft tokens; answer NLL with the sample's own words,
with another sample's (the protocol's derangement), the evidence-ablated graph's and none. If the own
words beat another sample's, the LM can use soft tokens that lie in its word-embedding space.
``bench.studies.graph_token.learning_check`` scores it beside each setting (``--probe``).
"""

from __future__ import annotations


def probe_scores(dm, items, groups, *, conditions=("own", "ablated", "shuffled", "none"), k: int = 16, lm=None,
                 batch_size: int = 8, counterfactuals=None):
    """Answer NLL per condition with the first ``k`` node texts' LM word embeddings as soft tokens.

    The prompt is ``dm``'s (text+graph, graph-only or a memory budget); ``shuffled`` takes the
    protocol's derangement partner's node texts, ``ablated`` and ``sham`` those of the item's graphs in
    ``counterfactuals`` (``qa_id`` -> :func:`qgmem.evaluation.counterfactuals.to_item`; items without one
    score ``None``). Returns :class:`qgmem.evaluation.protocol.SampleScores`.
    """
    import torch

    from qgmem.lm import load_causal_lm
    from qgmem.model.alignment import node_word_ids, word_targets
    from qgmem.model.fusion import answer_nll, insert_token
    from qgmem.evaluation.protocol import SampleScores, derangement, graph_signature

    lm = lm if lm is not None else load_causal_lm(dm.lm).eval()
    table = lm.get_input_embeddings().weight.detach()
    tok = dm.tokenizer

    def words(texts) -> torch.Tensor:
        texts = list(texts)[:k] or [""]
        ids = node_word_ids([texts], [len(texts)], tok)
        vecs = word_targets(ids, table)[0]
        return torch.cat([vecs, vecs.new_zeros(k - vecs.size(0), vecs.size(1))])

    partner = derangement([graph_signature(it["graph"]) for it in items], 0)
    extra = [(counterfactuals or {}).get(str(it.get("qa_id")), {}) for it in items]

    def counterfactual(name):
        return lambda i: extra[i].get(f"{name}_node_text") if extra[i].get(f"{name}_graph") is not None else None

    source = {"own": lambda i: items[i].get("node_text"),
              "shuffled": lambda i: items[partner[i]].get("node_text"),
              "ablated": counterfactual("ablated"), "sham": counterfactual("sham"),
              "none": lambda i: []}
    scores = SampleScores(qa_id=[str(it.get("qa_id", i)) for i, it in enumerate(items)], group=[str(g) for g in groups],
                          category=[str(it.get("category", "")) for it in items], answer=[str(it["answer"]) for it in items])
    with torch.no_grad():
        for condition in conditions:
            keep = [i for i in range(len(items)) if source[condition](i) is not None]
            rows = [None] * len(items)
            for start in range(0, len(keep), batch_size):
                index = keep[start:start + batch_size]
                batch = dm.collator([items[i] for i in index])
                embeds = lm.get_input_embeddings()(batch["input_ids"])
                token = None if condition == "none" else torch.stack([words(source[condition](i)) for i in index])
                fused = insert_token(embeds, batch["attention_mask"], batch["graph_pos"], token, batch["labels"])
                for i, v in zip(index, answer_nll(lm, *fused, reduction="none").tolist()):
                    rows[i] = v
            scores.nll[condition] = rows
    return scores

