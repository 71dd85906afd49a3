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
source "$(dirname "$0")/lib.sh"
bench_root
bench_out
bench_need_vllm_source || exit 2
BUDGET_S="${BUDGET_S:-240}"
bench_gpu
bench_smi "$OUT/nvidia-smi-builtin-vs-vllm.csv"
bench_pythonpath
bench_timed "$((BUDGET_S + 40))" "$OUT/builtin_vs_vllm_${GPU}.log" \
  python3 benchmarks/builtin_vs_vllm_kernel_speed.py \
  --out "$OUT" --budget-s "$BUDGET_S" --vllm-source "$SRC" --gpu "$GPU" "$@"
exit $?
