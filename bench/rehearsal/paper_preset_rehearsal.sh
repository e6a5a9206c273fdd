#!/usr/bin/env bash
# The qwen3_8b preset rehearsed end to end on this machine (see bench/rehearsal/paper_preset_rehearsal.py):
#
#     bash bench/rehearsal/paper_preset_rehearsal.sh [WORK_DIR] [extra flags]     # default WORK_DIR: checkpoints/rehearsal
#
# Prints one JSON line; the run's logs (every command, the LLM server's requests) are under WORK_DIR/logs.
set -euo pipefail
cd "$(dirname "$0")/../.."
work="${1:-checkpoints/rehearsal}"
shift || true
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec python -m bench.rehearsal.paper_preset_rehearsal --work "$work" --fresh "$@"
