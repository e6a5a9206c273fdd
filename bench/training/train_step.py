"""The graph-token training step against the hardware: tokens/s, peak memory, MFU, and a naive baseline.

The step measured is the project's own: ``QGMemModule``'s forward (graph encoder + projector, the graph
token spliced into the prompt embeddings, the frozen LM, the LM head only at answer positions), the
backward to the graph token, and the AdamW step over the trainable parameters. The baseline is the same
module and batch with full-vocabulary logits at every position and the loss over them (what
``lm(inputs_embeds=..., labels=...)`` does). The frozen LM is built from a config with random weights
(nothing is downloaded or written to disk):

* ``--shape small`` (CPU): a Qwen3-form LM, hidden 256, 4 layers, the real Qwen3 vocabulary;
* ``--shape qwen3-8b`` (GPU, bf16): hidden 4096, 36 layers, 32 heads, 8 KV heads, head dim 128,
  intermediate 12288, vocabulary 151936.

Achieved FLOP/s use the frozen-LM count of the step over the real (unpadded) tokens: forward
``2·N·T`` (N = the LM's non-embedding weights) plus attention ``4·L·T²·d`` per sequence (scores and
values, causal mask not discounted), the backward to the inputs only ≈ one more forward, and the head
``2·V·H`` per answer position, forward and backward. MFU is that over the matmul throughput measured
in the same run (8192³ bf16 on a GPU, 2048³ fp32 on a CPU). The last line is one JSON object.

    python -m bench.training.train_step                                   # CPU, small shape, < 1 minute
    python -m bench.training.train_step --shape qwen3-8b --device cuda    # one H200 (bench/training/gpu_train_step.sh)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time
from contextlib import nullcontext
from unittest import mock

import torch

SHAPES = {
    "small": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                  intermediate_size=768, vocab_size=151936),
    "qwen3-8b": dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, intermediate_size=12288, vocab_size=151936),
}
ANSWER_TOKENS = 16


def random_lm(shape: str, dtype: torch.dtype, device: str, attn: str):
    """A frozen random Qwen3 LM of ``shape``, built on ``device`` directly (no CPU copy of 8B weights)."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    from qgmem.lm import EMBEDDED_LM, load_tokenizer

    tok = load_tokenizer(EMBEDDED_LM)
    config = Qwen3Config(**SHAPES[shape], max_position_embeddings=8192, tie_word_embeddings=False,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    config._attn_implementation = attn
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.eval().requires_grad_(False)
    return model


def matmul_tflops(device: str, repeats: int = 10) -> float:
    """Measured dense matmul throughput: 8192³ bf16 on CUDA, 2048³ fp32 on CPU."""
    n, dtype = (8192, torch.bfloat16) if device.startswith("cuda") else (2048, torch.float32)
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    seconds = timed(lambda: a @ b, repeats if device.startswith("cuda") else 3, sync)
    return 2 * n ** 3 / seconds / 1e12


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


def lm_flops(lm, lengths: list[int], answer_positions: int) -> float:
    """The frozen-LM FLOPs of one step (forward + backward to the inputs) over these sequences."""
    cfg = lm.config
    embed = lm.get_input_embeddings().weight.numel()
    head = lm.get_output_embeddings().weight.numel()
    weights = sum(p.numel() for p in lm.parameters()) - embed - (0 if cfg.tie_word_embeddings else head)
    d_attn = cfg.num_attention_heads * getattr(cfg, "head_dim", cfg.hidden_size // cfg.num_attention_heads)
    forward = sum(2 * weights * t + 4 * cfg.num_hidden_layers * t * t * d_attn for t in lengths)
    forward += 2 * head * answer_positions
    return 2 * forward  # backward to the inputs only: about one more forward


def make_items(n: int, dim: int, length: int) -> list[dict]:
    """Synthetic contract items whose memory text fills a ``length``-token prompt."""
    from qgmem.training.synthetic import synthetic_items

    items = synthetic_items(n, dim, seed=0, max_nodes=20)
    filler = "\n".join(f"[M{i}] The user said they moved the weekly planning meeting to room {i} on Thursday."
                       for i in range(1, length // 12 + 8))
    for it in items:
        it["memory_text"] = filler
    return items


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="small", choices=sorted(SHAPES))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default=None, choices=["fp32", "bf16"],
                        help="default: bf16 on CUDA, fp32 on CPU")
    parser.add_argument("--batch-sizes", default=None, help="comma list (default: 1,2 CPU; 1,4,8 GPU)")
    parser.add_argument("--prompt-tokens", default=None, help="comma list (default: 128,256 CPU; 600,1024,2048 GPU)")
    parser.add_argument("--headline-tokens", type=int, default=1024, help="the JSON line reports this length "
                        "(or the nearest measured)")
    parser.add_argument("--steps", type=int, default=None, help="timed repeats after one warm-up (median; default 1 CPU, 5 GPU)")
    parser.add_argument("--attn", default="sdpa", choices=["sdpa", "eager", "flash_attention_2"])
    parser.add_argument("--feature-dim", type=int, default=384)
    parser.add_argument("--no-baseline", action="store_true")
    args = parser.parse_args()

    from qgmem.model.encoder import EncoderConfig
    from qgmem.training import module as module_lib
    from qgmem.training.collate import GraphTextCollator

    cuda = args.device.startswith("cuda")
    precision = args.precision or ("bf16" if cuda else "fp32")
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    batch_sizes = [int(x) for x in (args.batch_sizes or ("1,4,8" if cuda else "1,2")).split(",")]
    lengths = [int(x) for x in (args.prompt_tokens or ("600,1024,2048" if cuda else "128,256")).split(",")]
    steps = args.steps or (5 if cuda else 1)
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    peak = matmul_tflops(args.device)
    lm = random_lm(args.shape, dtype, args.device, args.attn)
    # the module loads its LM by name; here it gets the random one built above (same code path after that)
    with mock.patch.object(module_lib, "load_causal_lm", lambda *a, **k: lm):
        # the one-token network these figures were measured with (the defaults insert 16 node tokens)
        module = module_lib.QGMemModule(lm_dtype="bfloat16" if precision == "bf16" else "float32",
                                        feature_dim=args.feature_dim, encoder=EncoderConfig(), features="text",
                                        readout="mean", num_graph_tokens=1).to(args.device)
    module.train()
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda and precision == "bf16" else nullcontext()
    params = [p for p in module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    device_name = torch.cuda.get_device_name() if cuda else f"cpu ({torch.get_num_threads()} threads)"
    print(f"shape {args.shape}: LM {sum(p.numel() for p in lm.parameters()) / 1e9:.3f}B params, {dtype}, "
          f"trainable {sum(p.numel() for p in params) / 1e6:.2f}M; device {device_name}; attention {args.attn}; "
          f"measured matmul {peak:.2f} TFLOP/s", flush=True)
    print("| batch | prompt tokens | step (s) | tokens/s | TFLOP/s | MFU | peak GiB | baseline step (s) "
          "| baseline tokens/s | baseline peak GiB | speed-up |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")

    def measure(fn) -> tuple[float, float]:
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        seconds = timed(fn, steps, sync)
        gib = (torch.cuda.max_memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        return seconds, gib / 2 ** 30

    runs = []
    for batch_size in batch_sizes:
        for length in lengths:
            collate = GraphTextCollator(module.tokenizer, max_prompt_tokens=length, max_answer_tokens=ANSWER_TOKENS)
            batch = collate(make_items(batch_size, args.feature_dim, length))
            batch = {k: (v.to(args.device) if hasattr(v, "to") else v) for k, v in batch.items()}

            def step(full: bool = False):
                with autocast:
                    if full:  # the naive path: [B, T, vocab] logits and the loss over them
                        e, m, p, lab, read = module.fused_inputs(batch)
                        with read:
                            loss = module.lm(inputs_embeds=e, attention_mask=m, position_ids=p, labels=lab).loss
                    else:  # the project's step (QGMemModule.forward = the training loss)
                        loss = module(batch)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

            real = (batch["attention_mask"].sum(1) + 1).tolist()  # + the graph token
            answers = int((batch["labels"][:, 1:] != -100).sum())
            tokens = sum(real)
            flops = lm_flops(module.lm, real, answers)
            row = {"batch": batch_size, "prompt_tokens": length, "tokens": tokens}
            try:
                seconds, gib = measure(step)
                row.update(step_s=seconds, tokens_per_s=tokens / seconds, tflops=flops / seconds / 1e12,
                           mfu=flops / seconds / 1e12 / peak, peak_gib=gib)
            except torch.OutOfMemoryError:
                row.update(error="out of memory")
            optimizer.zero_grad(set_to_none=True)
            if not args.no_baseline and "error" not in row:
                try:
                    b_seconds, b_gib = measure(lambda: step(True))
                    row.update(baseline_step_s=b_seconds, baseline_tokens_per_s=tokens / b_seconds,
                               baseline_peak_gib=b_gib, speedup_vs_baseline=b_seconds / row["step_s"])
                except torch.OutOfMemoryError:
                    row.update(baseline_error="out of memory")
                optimizer.zero_grad(set_to_none=True)
            runs.append(row)

            def fmt(key, spec=".2f"):
                return format(row[key], spec) if key in row else row.get("error", row.get("baseline_error", "-"))

            print(f"| {batch_size} | {length} | {fmt('step_s', '.3f')} | {fmt('tokens_per_s', '.0f')} | "
                  f"{fmt('tflops')} | {fmt('mfu', '.1%')} | {fmt('peak_gib')} | {fmt('baseline_step_s', '.3f')} | "
                  f"{fmt('baseline_tokens_per_s', '.0f')} | {fmt('baseline_peak_gib')} | "
                  f"{fmt('speedup_vs_baseline')} |", flush=True)

    done = [r for r in runs if "step_s" in r] or runs
    nearest = min(abs(r["prompt_tokens"] - args.headline_tokens) for r in done)
    head = max((r for r in done if abs(r["prompt_tokens"] - args.headline_tokens) == nearest),
               key=lambda r: r.get("tokens_per_s", 0.0))
    print(json.dumps({
        "tokens_per_s": head.get("tokens_per_s"), "mfu": head.get("mfu"), "peak_gib": head.get("peak_gib"),
        "baseline_tokens_per_s": head.get("baseline_tokens_per_s"),
        "speedup_vs_baseline": head.get("speedup_vs_baseline"), "matmul_tflops": peak,
        "shape": args.shape, "device": device_name, "precision": precision, "attn": args.attn,
        "headline": {"batch": head["batch"], "prompt_tokens": head["prompt_tokens"]},
        "load_avg_1m": round(os.getloadavg()[0], 2), "runs": runs,
    }, default=float))


if __name__ == "__main__":
    main()
