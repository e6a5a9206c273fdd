"""Probe: can the frozen LM read a graph's node texts from soft tokens, before any training?

Two measurements on one split of the data cache, graph-only prompts (no textual working memory):

1. **Word tokens, no network.** Each sample's first K node texts, as the LM's own mean word embeddings
   (the target of :mod:`qgmem.model.alignment`), are inserted as K soft tokens; answer NLL with the
   sample's own words, with another sample's (the protocol's derangement) and with none. If the own
   words beat another sample's, the LM can use soft tokens that lie in its word-embedding space.
2. **How much of a word embedding a sentence embedding predicts.** A ridge regression from each
   node's sentence-encoder features to its word target, fitted on the training split's nodes and
   scored on this split's (relative squared error: 0 exact, 1 = predicting zeros). It bounds what
   the ``text`` features can give a node token without the word vectors.

    python bench/node_word_probe.py --split val
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def probe_scores(dm, items, groups, *, conditions=("own", "ablated", "shuffled", "none"), k: int = 16, lm=None,
                 batch_size: int = 8):
    """Answer NLL per condition with the first ``k`` node texts' LM word embeddings as soft tokens.

    The prompt is ``dm``'s (text+graph, graph-only or a memory budget); ``shuffled`` takes the
    protocol's derangement partner's node texts, ``ablated`` the evidence-ablated graph's (items
    without one score ``None``). Returns :class:`qgmem.evaluation.protocol.SampleScores`.
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
    source = {"own": lambda i: items[i].get("node_text"),
              "shuffled": lambda i: items[partner[i]].get("node_text"),
              "ablated": lambda i: items[i].get("ablated_node_text") if items[i].get("ablated_graph") is not None
              else None,
              "sham": lambda i: items[i].get("sham_node_text") if items[i].get("sham_graph") is not None else None,
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(REPO / "configs" / "default.yaml"))
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--num-cases", type=int, default=None, help="cases to sample (default: all)")
    p.add_argument("--split", choices=["val", "test"], default="val")
    p.add_argument("--k", type=int, default=16, help="node tokens per sample")
    p.add_argument("--ridge", type=float, default=1.0)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)

    import numpy as np
    import torch
    import yaml

    from qgmem.lm import load_causal_lm
    from qgmem.model.alignment import node_word_ids, word_targets
    from qgmem.model.fusion import answer_nll, insert_token
    from qgmem.training.datamodule import QGMemDataModule
    from qgmem.evaluation.protocol import paired_bootstrap

    sys.path.insert(0, str(REPO / "bench"))
    from learning_check import usable

    torch.set_num_threads(args.threads)
    data = dict(yaml.safe_load(Path(args.config).read_text())["data"])
    data.update(num_cases=args.num_cases, answer_filter="none", graph_only=True)
    if args.cache_dir:
        data["cache_dir"] = args.cache_dir
    dm = QGMemDataModule(**data)
    dm.prepare_data()
    dm.setup()
    lm = load_causal_lm(dm.lm).eval()
    table = lm.get_input_embeddings().weight.detach()
    tok = dm.tokenizer
    items, groups, left_out = usable(dm.split(args.split))

    scores = probe_scores(dm, items, groups, conditions=("own", "shuffled", "none"), k=args.k, lm=lm)
    nll = scores.nll
    own, shuffled, none = (np.asarray(nll[c]) for c in ("own", "shuffled", "none"))
    categories = [it["category"] for it in items]

    def contrast(diff):
        out = paired_bootstrap(diff, groups)
        out["per_category"] = {c: paired_bootstrap(diff[np.asarray(categories) == c],
                                                   np.asarray(groups)[np.asarray(categories) == c])["mean"]
                               for c in sorted(set(categories))}
        out["share_below_zero"] = float((diff < 0).mean())
        return out

    def node_arrays(split):
        xs, ts = [], []
        for i in range(len(split)):
            row = split.row(i)
            n, d = int(row["num_nodes"]), int(row["feature_dim"])
            if not n:
                continue
            xs.append(np.asarray(row["x"], dtype=np.float32).reshape(n, d))
            ids = node_word_ids([row["node_text"]], [n], tok)
            ts.append(word_targets(ids, table)[0].numpy())
        return np.concatenate(xs), np.concatenate(ts)

    x_train, t_train = node_arrays(dm.split("train"))
    x_eval, t_eval = node_arrays(dm.split(args.split))
    design = np.hstack([x_train, np.ones((len(x_train), 1), np.float32)])
    w = np.linalg.solve(design.T @ design + args.ridge * np.eye(design.shape[1]), design.T @ t_train)

    def rel(x, t):
        pred = np.hstack([x, np.ones((len(x), 1), np.float32)]) @ w
        return float(((pred - t) ** 2).mean() / (t ** 2).mean())

    result = {"split": args.split, "n": len(items), "rubric_left_out": left_out, "k": args.k,
              "cache_key": dm.cache_key,
              "nll": {"own_words": float(own.mean()), "shuffled_words": float(shuffled.mean()), "none": float(none.mean())},
              "own_vs_shuffled": contrast(own - shuffled), "own_vs_none": contrast(own - none),
              "ridge_text_to_words": {"train_nodes": len(x_train), "eval_nodes": len(x_eval),
                                      "train_rel_err": rel(x_train, t_train), "eval_rel_err": rel(x_eval, t_eval)}}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
