#!/usr/bin/env bash
# The builtin kernel and the tuner against vLLM's compiled MoE ops, on one Hopper GPU of the
# device tool.
#
#   command:   bash benchmarks/vllm_ops_gpu_runs.sh STEP...
#   carry:     [".vllm-src/vllm-0.34.0", ".vllm-src/vllm-0.34.0-ops"]
#   timeout_s: 600
#
# Made here first: workflow/scripts/vllm-kernel-src.sh (vLLM's kernel sources) and
# benchmarks/vllm_ops_pack.py (vLLM's compiled MoE ops, trimmed to sm_90 and compressed).
# Always first: unpack the ops, check each on the GPU in a process of its own
# (vllm_ops_check.py); the parts that pass run as vLLM's in every step after, the others stay
# the project's and every table says which.
# STEP:
#   sbs               builtin_vs_vllm_kernel_speed.py, bf16 and fp8, vLLM's 18 batch sizes (SBS_BUDGET_S)
#   tuner:DTYPE:MS    tuner_default_vs_exhaustive_vllm_kernel.py, default and exhaustive both at exactly the
#                     batch sizes MS (comma list), each mode one tuner process (TUNER_BUDGET_S)
# Everything lands in $OUT/results.tar.gz (tables, JSON, tuning logs, console), the console in
# $OUT/console.log and the tables in $OUT/*.txt (the device tool returns 8 files at most).
# GPU names the outputs (default: this device's name, h100 or h200: benchmarks/gpu_label.py);
# both scripts get it as --gpu.
set -uo pipefail
source "$(dirname "$0")/lib.sh"
bench_root
bench_out
RUN=/tmp/vllm-ops-gpu-runs
rm -rf "$RUN" && mkdir -p "$RUN"
bench_vllm_source
OPS_PACK="${OPS_PACK:-.vllm-src/vllm-0.34.0-ops}"
bench_pythonpath
export PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
start=$(date +%s)
say() { printf '[vllm_ops_gpu_runs +%ss] %s\n' "$(($(date +%s) - start))" "$*" | tee -a "$RUN/console.log"; }

finish() {
  say "packing"
  tar -czf "$OUT/results.tar.gz" -C "$RUN" . 2>/dev/null
  cp "$RUN/console.log" "$OUT/console.log"
  find "$RUN" -name '*.txt' | sort | head -6 | while read -r f; do cp "$f" "$OUT/"; done
  ls -la "$OUT"
}
trap finish EXIT

if [[ ! -f "$SRC/SOURCE.json" ]]; then
  say "no vLLM sources at $SRC: run workflow/scripts/vllm-kernel-src.sh and carry them"
  exit 2
fi
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit,memory.total \
    --format=csv
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
} >"$RUN/device.txt" 2>&1
cat "$RUN/device.txt" | tee -a "$RUN/console.log"
bench_gpu
say "outputs named for GPU $GPU"

if [[ -f "$OPS_PACK/SOURCE.json" ]]; then
  python3 benchmarks/vllm_ops_pack.py --dest "$OPS_PACK" --unpack /tmp/vllm-ops 2>&1 |
    tee -a "$RUN/console.log"
  bench_timed -a 120 "$RUN/console.log" \
    python3 benchmarks/vllm_ops_check.py /tmp/vllm-ops --out "$RUN/vllm_ops_check.json"
  rc=$?
  say "vllm_ops_check exit $rc (0: every part vLLM's; 1: some the project's)"
  if [[ $rc == 0 || $rc == 1 ]]; then
    export CELLBENCH_VLLM_OPS=/tmp/vllm-ops
  fi
else
  say "no packed ops at $OPS_PACK: the vLLM side keeps the project's align/SiLU/quant/sum"
fi

status=0
for step in "$@"; do
  case "$step" in
    sbs)
      b="${SBS_BUDGET_S:-180}"
      say "step sbs (budget $b s)"
      mkdir -p "$RUN/sbs"
      bench_timed -a "$((b + 40))" "$RUN/console.log" \
        python3 benchmarks/builtin_vs_vllm_kernel_speed.py \
        --out "$RUN/sbs" --budget-s "$b" --vllm-source "$SRC" --gpu "$GPU"
      s=$?
      ;;
    tuner:*)
      IFS=: read -r _ dtype ms <<<"$step"
      b="${TUNER_BUDGET_S:-400}"
      d="$RUN/tuner_${dtype}_${ms//,/-}"
      say "step tuner $dtype M=$ms (budget $b s)"
      mkdir -p "$d"
      bench_timed -a "$((b + 40))" "$RUN/console.log" \
        python3 benchmarks/tuner_default_vs_exhaustive_vllm_kernel.py \
        --out "$d" --budget-s "$b" --default-budget-s 150 --dtypes "$dtype" \
        --batch-sizes "$ms" --exhaustive-ms "$ms" --vllm-source "$SRC" --gpu "$GPU"
      s=$?
      ;;
    *)
      say "unknown step '$step' (expected sbs or tuner:DTYPE:MS)"
      s=2
      ;;
  esac
  say "step $step exit $s"
  [[ $s == 0 ]] || status=$s
done
exit "$status"
