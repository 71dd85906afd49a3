#!/usr/bin/env bash
# The device call for benchmarks/tuner_default_vs_exhaustive_vllm_kernel.py, on one H200:
#
#   command:   BUDGET_S=270 bash benchmarks/tuner_default_vs_exhaustive_vllm_kernel.sh
#   carry:     [".vllm-src/vllm-0.34.0"]   (made here by workflow/scripts/vllm-kernel-src.sh)
#   timeout_s: 600
#
# The image's python3 (torch and Triton, no vLLM, no network) runs the script with a wall
# budget of BUDGET_S (default 270 s: bf16's default run at 18 batch sizes, ~90 s, and
# exhaustive at M=16,256, ~140 s, and their re-time; fp8 only with more) and a hard stop 50 s
# later (SIGINT: the tables written after each finished stage stay). Everything lands in
# $OUT: the .txt/.json per dtype, the tuning logs, the console log, nvidia-smi's view of the
# GPU. `python3 benchmarks/tuner_default_vs_exhaustive_vllm_kernel.py --count-only` plans it on the CPU.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-benchmarks/results/tmp}"
mkdir -p "$OUT"
SRC="${CELLBENCH_VLLM_SOURCE:-.vllm-src/vllm-0.34.0}"
if [[ ! -f "$SRC/SOURCE.json" ]]; then
  echo "no vLLM sources at $SRC: run workflow/scripts/vllm-kernel-src.sh and carry them" >&2
  exit 2
fi
BUDGET_S="${BUDGET_S:-270}"
# The GPU in the output names (default: this device's, h100, h200, ...), passed on as --gpu.
GPU="${GPU:-$(python3 benchmarks/gpu_label.py)}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv \
  >"$OUT/nvidia-smi.csv" 2>&1 || true
export PYTHONPATH="$PWD/workflow${PYTHONPATH:+:$PYTHONPATH}"
timeout -s INT -k 10 "$((BUDGET_S + 50))" python3 benchmarks/tuner_default_vs_exhaustive_vllm_kernel.py \
  --out "$OUT" --budget-s "$BUDGET_S" --vllm-source "$SRC" --gpu "$GPU" "$@" 2>&1 |
  tee "$OUT/tuner_vllm_kernel_${GPU}.log"
exit "${PIPESTATUS[0]}"
