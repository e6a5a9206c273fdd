#!/usr/bin/env bash
# The GPU step of the qwen3_8b rehearsal: the preset's training step at the preset's shapes on one GPU.
#
# The frozen LM is Qwen3-8B's architecture at random init in bf16 (hidden 4096, 36 layers, vocabulary
# 151,936; built on the GPU from a config, nothing downloaded), the network is the preset's own
# (`python train.py --config qwen3_8b --print_config`'s model section: encoder hidden 1024, 8 heads,
# projector 4096, one mean-pooled graph token, gradient checkpointing on), the batch is the preset's per-GPU
# batch (data.batch_size) of prompts of about PROMPT_TOKENS (default 1,200) tokens, under bf16 autocast as
# `precision: bf16-mixed`. It prints step time, tokens/s, peak GPU memory and MFU against a bf16 matmul
# measured in the same run, with and without gradient checkpointing, as one JSON line (also in OUT_DIR).
# Sized for well under 8 minutes of one H100 (model init about a minute, 2 x (1 + STEPS) steps), no network.
#
# Then, when vLLM installs on the machine, `vllm serve --enable-prompt-embeds` over the embedded SmolLM2
# and `--lm-url`'s answers against the in-process ones (the last step below; it adds vLLM's install and
# start, a few minutes, to the budget above; LM_URL=0 skips it).
#
#     bash bench/rehearsal/gpu_rehearsal.sh [OUT_DIR]              # one GPU
#     DEVICE=cpu SHAPE=small bash bench/rehearsal/gpu_rehearsal.sh  # the same code on a CPU at a small shape (a check)
set -euo pipefail
out="${1:-bench-out}"
cd "$(dirname "$0")/../.."
mkdir -p "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export DEVICE="${DEVICE:-cuda}" SHAPE="${SHAPE:-qwen3-8b}" PROMPT_TOKENS="${PROMPT_TOKENS:-1200}" STEPS="${STEPS:-3}"
if [ "$DEVICE" = cuda ]; then
  if ! command -v nvidia-smi >/dev/null || ! nvidia-smi >/dev/null 2>&1; then
    echo "bench/rehearsal/gpu_rehearsal.sh: no GPU here (nvidia-smi fails); run it on a GPU machine, or DEVICE=cpu SHAPE=small for a check" >&2
    exit 2
  fi
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.csv"
fi
python - <<'PY' 2>&1 | tee "$out/gpu_rehearsal.txt"
import json, os, time
from contextlib import nullcontext
from unittest import mock

import torch

from qgmem.job import resolved_config
from qgmem.model.encoder import EncoderConfig
from qgmem.training import module as module_lib
from qgmem.training.collate import GraphTextCollator
from bench.training.train_step import ANSWER_TOKENS, lm_flops, make_items, matmul_tflops, random_lm, timed

device, shape = os.environ["DEVICE"], os.environ["SHAPE"]
length, steps = int(os.environ["PROMPT_TOKENS"]), int(os.environ["STEPS"])
cuda = device.startswith("cuda")
started = time.perf_counter()
preset = resolved_config(["--config", "qwen3_8b"], default_config=None)
model_cfg, data_cfg = preset["model"], preset["data"]
batch_size = int(data_cfg["batch_size"])
sync = torch.cuda.synchronize if cuda else (lambda: None)
peak_tflops = matmul_tflops(device)
dtype = torch.bfloat16 if cuda else torch.float32
lm = random_lm(shape, dtype, device, "sdpa")
init_s = time.perf_counter() - started
rows = []
for checkpointing in (bool(model_cfg["gradient_checkpointing"]), not model_cfg["gradient_checkpointing"]):
    with mock.patch.object(module_lib, "load_causal_lm", lambda *a, **k: lm):
        module = module_lib.QGMemModule(
            lm_dtype=model_cfg["lm_dtype"] if cuda else "float32", feature_dim=384 if shape == "small" else 768,
            encoder=EncoderConfig(**{k: v for k, v in model_cfg["encoder"].items()}),
            projector_hidden=model_cfg["projector_hidden"], features=model_cfg["features"],
            readout=model_cfg["readout"], num_graph_tokens=model_cfg["num_graph_tokens"],
            gradient_checkpointing=checkpointing).to(device)
    module.train()
    params = [p for p in module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=2e-4)
    # prompts of about PROMPT_TOKENS: the memory text fills and is trimmed to that cap (the preset allows 2,048)
    collate = GraphTextCollator(module.tokenizer, max_answer_tokens=ANSWER_TOKENS,
                                max_prompt_tokens=min(int(data_cfg["max_prompt_tokens"]), length))
    items = make_items(batch_size, module.hparams.feature_dim, length)
    batch = collate(items)
    batch = {k: (v.to(device) if hasattr(v, "to") else v) for k, v in batch.items()}
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else nullcontext()

    def step():
        with autocast:
            loss = module(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    real = (batch["attention_mask"].sum(1) + 1).tolist()
    answers = int((batch["labels"][:, 1:] != -100).sum())
    flops = lm_flops(module.lm, real, answers)
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    row = {"gradient_checkpointing": checkpointing, "batch": batch_size, "tokens": sum(real),
           "prompt_tokens_mean": round(sum(real) / len(real))}
    try:
        seconds = timed(step, steps, sync)
        row.update(step_s=round(seconds, 3), tokens_per_s=round(sum(real) / seconds, 1),
                   tflops=round(flops / seconds / 1e12, 2), mfu=round(flops / seconds / 1e12 / peak_tflops, 3),
                   peak_gib=round(torch.cuda.max_memory_allocated() / 2 ** 30, 2) if cuda else None)
    except torch.OutOfMemoryError:
        row["error"] = "out of memory"
    rows.append(row)
    print(json.dumps(row), flush=True)
    del module, optimizer
result = {"device": torch.cuda.get_device_name() if cuda else "cpu", "shape": shape, "lm_dtype": str(dtype),
          "lm_params_b": round(sum(p.numel() for p in lm.parameters()) / 1e9, 3), "matmul_tflops": round(peak_tflops, 1),
          "init_s": round(init_s, 1), "total_s": round(time.perf_counter() - started, 1), "runs": rows}
print(json.dumps(result))
PY
tail -n 1 "$out/gpu_rehearsal.txt" > "$out/gpu_rehearsal.json"

# --lm-url against the real engine: `vllm serve --enable-prompt-embeds` over the embedded SmolLM2 on this GPU,
# in a venv of its own (vLLM pins its own torch), when vLLM installs here (pip needs the package index or a
# wheel cache: the lent machine may have neither, and then the step says so and is skipped). bench/serving/lm_url.py
# answers LM_URL_QUESTIONS real ConvoMem questions in process (CPU, float32) and through the engine, and counts
# the equal answers. VLLM_DTYPE (default float32, the in-process dtype) is what vLLM runs the LM at; LM_URL=0
# skips the step (it needs a GPU, so DEVICE=cpu skips it too).
[ "${LM_URL:-1}" = 1 ] && [ "$DEVICE" = cuda ] || exit 0
vllm_bin="$out/vllm-venv/bin/vllm"
if [ ! -x "$vllm_bin" ]; then
  python -m venv "$out/vllm-venv" && "$out/vllm-venv/bin/pip" install -q --retries 0 --timeout 20 vllm \
    >"$out/vllm_install.txt" 2>&1 || true
fi
if [ -x "$vllm_bin" ]; then
  lm_dir="$(python -c 'from qgmem.lm import EMBEDDED_LM, resolve_lm_path; print(resolve_lm_path(EMBEDDED_LM))')"
  lm_name="$(python -c 'from qgmem.lm import EMBEDDED_LM_HUB_ID; print(EMBEDDED_LM_HUB_ID)')"
  "$vllm_bin" serve "$lm_dir" --served-model-name "$lm_name" --enable-prompt-embeds --dtype "${VLLM_DTYPE:-float32}" \
    --max-model-len 2048 --port 8100 >"$out/vllm_serve.txt" 2>&1 &
  vllm_pid=$!
  for _ in $(seq 1 150); do
    python -c 'import httpx; httpx.get("http://127.0.0.1:8100/v1/models", timeout=2).raise_for_status()' \
      >/dev/null 2>&1 && break
    kill -0 "$vllm_pid" 2>/dev/null || break
    sleep 2
  done
  python -m bench.serving.lm_url --export "$out/untrained-export" --untrained-export --questions "${LM_URL_QUESTIONS:-20}" \
    --engine-url http://127.0.0.1:8100/v1 2>&1 | tee "$out/lm_url_vllm.txt" || true
  kill "$vllm_pid" 2>/dev/null || true
  wait "$vllm_pid" 2>/dev/null || true
else
  echo "vLLM did not install here (see $out/vllm_install.txt); the --lm-url engine step is skipped" \
    | tee "$out/lm_url_vllm.txt"
fi
