"""What the deep reader's prefix does before any training: a diagnostic, not a choice.

``kv0-full`` (the graph alone, keys and values at every layer) trained to a held-out answer NLL far
above the frozen LM without a prefix (docs/graph_token.md, *The deep reader*). This scores a fresh
module of each named ``kv`` variant, at its initialisation (no stage, no step), on fold 0's validation
part of the cross-fit (:mod:`bench.studies.graph_token.crossfit`: the same samples, folds and settings)
with its own graph and with none, so the harm a fresh prefix does is read off beside the trained figure::

    python -m bench.studies.graph_token.kv_init --root checkpoints/crossfit --variants kv0-full kv3-answer

It explains; it chooses nothing (the variants and their rule were named before the study ran).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from bench.studies.graph_token import crossfit as X


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default="checkpoints/crossfit", help="the cross-fit's root (its saved samples)")
    p.add_argument("--config", default=X.parse_args([]).config)
    p.add_argument("--variants", nargs="+", default=["kv0-full", "kv3-answer"])
    p.add_argument("--folds", type=int, default=5)
    p.add_argument("--fold", type=int, default=0)
    p.add_argument("--seed", type=int, default=0, help="the initialisation's seed")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    for name in args.variants:
        if X.variant_of(name)["injection"] != "kv_prefix":
            p.error(f"--variants {name}: not a kv_prefix variant")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    from lightning.pytorch import seed_everything

    from qgmem.evaluation.crossfit import fold_parts
    from qgmem.evaluation.protocol import score_conditions
    from qgmem.evaluation.study_data import InMemoryStudyDataModule
    from qgmem.training.module import QGMemModule

    torch.set_num_threads(args.threads)
    base = X.parse_args(["--root", args.root, "--config", args.config, "--folds", str(args.folds)])
    setting = X.product_setting(args.config)
    cases, folds, scored = X.fold_cases(setting, base)
    folder = X.samples_folder(X.sample_spec(setting, base), base)
    saved = [c for c in cases if X.case_file(folder, c.id).exists()]
    if len(saved) < len(cases):
        print(f"error: {folder}: {len(cases) - len(saved)} of {len(cases)} cases have no saved sample; run the "
              "cross-fit's --samples-only first", file=sys.stderr)
        return 2
    items, counterfactuals = X.load_items(saved, folder)
    scored_qa = {it["qa_id"] for cid in scored if cid in items for it in items[cid]}
    parts = fold_parts(folds, args.fold, base.folds, list(items))
    val = [it for cid in parts["val"] for it in items[cid] if it["qa_id"] in scored_qa]
    train = [it for cid in parts["train"] for it in items[cid]]
    out = {"fold": args.fold, "seed": args.seed, "val_questions": len(val), "variants": {}}
    for name in args.variants:
        run = X.unit_settings(setting, X.variant_of(name), Path(args.root))
        seed_everything(args.seed, verbose=False)
        dm = InMemoryStudyDataModule(train, val, val, order_seed=args.seed, **run["data"])
        module = QGMemModule(**{**run["model"], "feature_dim": dm.feature_dim})
        dm.setup("fit")
        module.adopt_contract(dm.answer_contract)
        module.eval()
        t = time.perf_counter()
        scores, _ = score_conditions(module, val, dm.collator, groups=[it["group"] for it in val],
                                     batch_size=dm.eval_batch_size, seed=args.seed, conditions=["own", "none"],
                                     counterfactuals=counterfactuals)
        own, none = (np.asarray(scores.nll[c], dtype=float) for c in ("own", "none"))
        out["variants"][name] = {"own": float(own.mean()), "none": float(none.mean()),
                                 "own_minus_none": float((own - none).mean()),
                                 "own_worse_share": float((own > none).mean()), "seconds": round(time.perf_counter() - t, 1)}
        r = out["variants"][name]
        print(f"{name} at initialisation, fold {args.fold} validation ({len(val)} questions): answer NLL own "
              f"{r['own']:.3f}, none {r['none']:.3f}, own − none {r['own_minus_none']:+.3f} "
              f"(own worse on {r['own_worse_share']:.0%})", flush=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
