#!/usr/bin/env bash
# The device call for benchmarks/builtin_vs_vllm_kernel_speed.py, on one H200:
#
#   command:   BUDGET_S=240 bash benchmarks/builtin_vs_vllm_kernel_speed.sh
#   carry:     [".vllm-src/vllm-0.34.0"]   (made here by workflow/scripts/vllm-kernel-src.sh)
#   timeout_s: 330 (alone; add it to the same call as tuner_default_vs_exhaustive_vllm_kernel.sh if both fit)
#
# Builtin kernel variants beside vLLM's kernel, shipped configs, bf16 then fp8, under a wall
# budget of BUDGET_S (batch sizes past it are listed as not timed) and a hard stop 40 s later
# (SIGINT). Everything lands in $OUT: builtin_vs_vllm_${GPU}_{bf16,fp8}.{txt,json}, the console
# log, nvidia-smi's view of the GPU. GPU names the outputs (default: this device's name, h100,
# h200, ...: benchmarks/gpu_label.py), passed on as --gpu. `--smoke` runs it on the CPU
# interpreter.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-benchmarks/results/tmp}"
mkdir -p "$OUT"
SRC="${CELLBENCH_VLLM_SOURCE:-.vllm-src/vllm-0.34.0}"
if [[ ! -f "$SRC/SOURCE.json" ]]; then
  echo "no vLLM sources at $SRC: run workflow/scripts/vllm-kernel-src.sh and carry them" >&2
  exit 2
fi
BUDGET_S="${BUDGET_S:-240}"
GPU="${GPU:-$(python3 benchmarks/gpu_label.py)}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv \
  >"$OUT/nvidia-smi-builtin-vs-vllm.csv" 2>&1 || true
export PYTHONPATH="$PWD/workflow${PYTHONPATH:+:$PYTHONPATH}"
timeout -s INT -k 10 "$((BUDGET_S + 40))" python3 benchmarks/builtin_vs_vllm_kernel_speed.py \
  --out "$OUT" --budget-s "$BUDGET_S" --vllm-source "$SRC" --gpu "$GPU" "$@" 2>&1 |
  tee "$OUT/builtin_vs_vllm_${GPU}.log"
exit "${PIPESTATUS[0]}"
