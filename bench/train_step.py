"""Cost of one graph-token training step on the frozen LM, and what the answer-only LM head saves.

For each prompt length: a full optimizer step (forward + backward to the graph token + AdamW) with the
LM head applied only at answer positions, the same with full-vocabulary logits over every position
(the naive path), a no-grad validation forward, and greedy generation. Items are synthetic contract
items whose memory text is long enough to fill the prompt budget, so only the sizes matter.

    python bench/train_step.py                                   # embedded SmolLM2-135M on CPU
    python bench/train_step.py --device cuda --precision bf16 --random-lm qwen3:1024:16 --steps 200
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time

import torch

from qgmem.lm import EMBEDDED_LM
from qgmem.model.encoder import EncoderConfig
from qgmem.model.fusion import answer_nll
from qgmem.training.collate import GraphTextCollator
from qgmem.training.synthetic import synthetic_items
from qgmem.training.module import QGMemModule


def make_items(n: int, dim: int) -> list[dict]:
    items = synthetic_items(n, dim, seed=0, max_nodes=20)
    filler = "\n".join(f"[M{i}] The user said they moved the weekly planning meeting to room {i} on Thursday."
                       for i in range(1, 80))
    for it in items:
        it["memory_text"] = filler
    return items


def timed(fn, repeats: int, sync) -> float:
    fn()  # warm-up
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lm", default=EMBEDDED_LM)
    parser.add_argument("--random-lm", default=None, help="ARCH:HIDDEN:LAYERS, a random LM instead of --lm")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--prompt-tokens", default="128,256,384")
    parser.add_argument("--steps", type=int, default=2, help="timed repeats per measurement (median reported)")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--feature-dim", type=int, default=384)
    args = parser.parse_args()

    lm = args.lm
    if args.random_lm:
        from qgmem.model.random_lm import save_random_lm

        arch, hidden, layers = args.random_lm.split(":")
        lm = str(save_random_lm(tempfile.mkdtemp() + "/lm", arch=arch, hidden_size=int(hidden), layers=int(layers),
                                heads=max(1, int(hidden) // 64), kv_heads=max(1, int(hidden) // 256)))
    dtype = "bfloat16" if args.precision == "bf16" else "auto"
    module = QGMemModule(lm=lm, lm_dtype=dtype, feature_dim=args.feature_dim, encoder=EncoderConfig(),
                         max_new_tokens=args.new_tokens).to(args.device)
    module.train()
    cuda = args.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda and args.precision == "bf16")
    params = [p for p in module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    lm_params = sum(p.numel() for p in module.lm.parameters())
    print(f"LM {lm} ({lm_params / 1e6:.1f}M params, {module.lm.dtype}), trainable {sum(p.numel() for p in params) / 1e6:.2f}M, "
          f"device {args.device}, threads {torch.get_num_threads()}, batch {args.batch_size}")
    print("| prompt tokens | train step, answer-only head (s) | train step, full logits (s) | answer-only speed-up "
          "| step GFLOP answer-only / full | val forward (s) | generate {} tokens (s) | prompt tokens/s in training |"
          .format(args.new_tokens))
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    items = make_items(args.batch_size, args.feature_dim)
    for length in [int(x) for x in args.prompt_tokens.split(",")]:
        batch = GraphTextCollator(module.tokenizer, max_prompt_tokens=length, max_answer_tokens=16)(items)
        batch = {k: (v.to(args.device) if hasattr(v, "to") else v) for k, v in batch.items()}

        def step(full: bool = False):
            with autocast:
                if full:
                    e, m, p, lab = module.fused_inputs(batch)
                    loss = module.lm(inputs_embeds=e, attention_mask=m, position_ids=p, labels=lab).loss
                else:
                    loss = module(batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        def val():
            with torch.no_grad(), autocast:
                e, m, p, lab = module.fused_inputs(batch)
                answer_nll(module.lm, e, m, p, lab)

        def gen():
            with autocast:
                module.generate(batch)

        from torch.utils.flop_counter import FlopCounterMode

        flops = []
        for full in (False, True):  # exact operation counts: immune to a noisy, shared machine
            with FlopCounterMode(display=False) as counter:
                step(full)
            flops.append(counter.get_total_flops() / 1e9)
        t_ours = timed(step, args.steps, sync)
        t_full = timed(lambda: step(True), args.steps, sync)
        t_val = timed(val, args.steps, sync)
        t_gen = timed(gen, 1, sync)
        tokens = int(batch["attention_mask"].sum())
        print(f"| {length} | {t_ours:.2f} | {t_full:.2f} | {t_full / t_ours:.2f}x | {flops[0]:.0f} / {flops[1]:.0f} "
              f"| {t_val:.2f} | {t_gen:.2f} "
              f"| {tokens / t_ours:.0f} |", flush=True)
    if cuda:
        print(f"peak GPU memory: {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")
    print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


if __name__ == "__main__":
    main()
