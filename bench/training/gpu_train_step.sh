#!/usr/bin/env bash
# The GPU run of bench/training/train_step.py: the Qwen3-8B shape in bf16 on one GPU, with SDPA, at batch sizes
# 1, 4, 8 and prompts of 600, 1024 and 2048 tokens, beside the full-logits baseline. Writes the table and
# the final JSON line to OUT_DIR (default bench-out/) and prints them.
#
#     bash bench/training/gpu_train_step.sh [OUT_DIR]
set -euo pipefail
out="${1:-bench-out}"
mkdir -p "$out"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.csv"
python -m bench.training.train_step --shape qwen3-8b --device cuda --batch-sizes 1,4,8 --prompt-tokens 600,1024,2048 \
  --steps 5 2>&1 | tee "$out/train_step_qwen3_8b.txt"
tail -n 1 "$out/train_step_qwen3_8b.txt" > "$out/train_step_qwen3_8b.json"
