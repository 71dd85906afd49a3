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
source "$(dirname "$0")/lib.sh"
bench_root
bench_out
bench_need_vllm_source || exit 2
BUDGET_S="${BUDGET_S:-270}"
# The GPU in the output names (default: this device's, h100, h200, ...), passed on as --gpu.
bench_gpu
bench_smi "$OUT/nvidia-smi.csv"
bench_pythonpath
bench_timed "$((BUDGET_S + 50))" "$OUT/tuner_vllm_kernel_${GPU}.log" \
  python3 benchmarks/tuner_default_vs_exhaustive_vllm_kernel.py \
  --out "$OUT" --budget-s "$BUDGET_S" --vllm-source "$SRC" --gpu "$GPU" "$@"
exit $?
