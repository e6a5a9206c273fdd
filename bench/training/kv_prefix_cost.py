"""What the deep reader costs: projector parameters, training-step time and peak memory, ``kv_prefix`` against ``input``.

Both injections train the same network (graph encoder, ``queries`` readout of ``K`` vectors) against the same
frozen LM (the embedded SmolLM2-135M unless ``--lm`` names another) on the same synthetic batch, with the
project's own step (``QGMemModule``'s forward with the shared template head cached, the backward, an AdamW
step). Only the projector differs: ``input`` maps each readout vector to one input embedding, ``kv_prefix``
to a key and a value at every layer. Each injection runs in a child process of its own, so the peak
resident memory (CPU) or the peak allocated memory (CUDA) is its own. The last line is one JSON object::

    python -m bench.training.kv_prefix_cost                 # CPU, SmolLM2-135M, K = 11, batch 4, 288 prompt tokens
    python -m bench.training.kv_prefix_cost --device cuda
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

INJECTIONS = ("input", "kv_prefix")


def one(args) -> dict:
    """Build the module for ``args.one`` and time ``args.steps`` training steps after one warm-up."""
    import torch

    from bench.training.train_step import make_items
    from qgmem.lm import EMBEDDED_LM
    from qgmem.model.encoder import EncoderConfig
    from qgmem.training.collate import GraphTextCollator
    from qgmem.training.module import QGMemModule

    torch.manual_seed(0)
    cuda = args.device.startswith("cuda")
    module = QGMemModule(lm=args.lm or EMBEDDED_LM, feature_dim=384, encoder=EncoderConfig(), features="text",
                         readout="queries", num_graph_tokens=args.k, injection=args.one,
                         stages=[]).to(args.device)
    module.train()
    collate = GraphTextCollator(module.tokenizer, max_prompt_tokens=args.prompt_tokens, max_answer_tokens=16)
    batch = collate(make_items(args.batch, 384, args.prompt_tokens))
    batch = {k: (v.to(args.device) if hasattr(v, "to") else v) for k, v in batch.items()}
    params = [p for p in module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def step() -> None:
        loss = module(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # warm-up (and AdamW's state)
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"injection": args.one, "projector_params": sum(p.numel() for p in module.net.projector.parameters()),
            "trainable_params": sum(p.numel() for p in params), "step_s": statistics.median(times),
            "step_s_all": [round(t, 4) for t in times], "peak_gib": peak / 2 ** 30,
            "prompt_tokens": int(batch["attention_mask"].sum(1).float().mean()),
            "lm_layers": module.net.config.lm_layers, "lm_kv_width": module.net.config.lm_kv_width}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lm", default=None, help="the frozen LM (default: the embedded SmolLM2-135M)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--k", type=int, default=11, help="graph slots K (the compact prompt's 1 + 10 units)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=288, help="the prompt cap (the product's)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps after one warm-up (median)")
    parser.add_argument("--one", choices=INJECTIONS, default=None, help=argparse.SUPPRESS)  # a child's injection
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args)))
        return
    rows = {}
    for injection in INJECTIONS:
        child = [sys.executable, "-m", "bench.training.kv_prefix_cost", "--one", injection, "--device", args.device,
                 "--k", str(args.k), "--batch", str(args.batch), "--prompt-tokens", str(args.prompt_tokens),
                 "--steps", str(args.steps)] + (["--lm", args.lm] if args.lm else [])
        out = subprocess.run(child, check=True, capture_output=True, text=True).stdout
        rows[injection] = json.loads(out.strip().splitlines()[-1])
        r = rows[injection]
        print(f"{injection}: projector {r['projector_params'] / 1e6:.3f}M params, step {r['step_s']:.3f} s "
              f"(median of {args.steps}), peak {r['peak_gib']:.2f} GiB", flush=True)
    base, kv = rows["input"], rows["kv_prefix"]
    print(json.dumps({"device": args.device, "k": args.k, "batch": args.batch, "prompt_tokens": base["prompt_tokens"],
                      "steps": args.steps, **{f"{i}": rows[i] for i in INJECTIONS},
                      "step_ratio_kv_over_input": kv["step_s"] / base["step_s"],
                      "projector_params_ratio": kv["projector_params"] / base["projector_params"],
                      "peak_gib_kv_minus_input": kv["peak_gib"] - base["peak_gib"]}))


if __name__ == "__main__":
    main()
