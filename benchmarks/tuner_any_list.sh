#!/usr/bin/env bash
# One device call of benchmarks/tuner_any_list.py (the pre-registered lists of
# benchmarks/tuner_lists.json), on one GPU:
#
#   command:   BUDGET_S=560 bash benchmarks/tuner_any_list.sh TAG [--runs-from F] STEP...
#   carry:     [".vllm-src/vllm-0.34.0"]   (made here by workflow/scripts/vllm-kernel-src.sh)
#   timeout_s: 600
#
# The image's python3 (torch and Triton, no vLLM, no network) runs the steps with a wall budget
# of BUDGET_S and a hard stop 30 s later (SIGINT; what each finished step wrote stays). In
# $OUT: runs_TAG.json, retime_TAG.json, logs_TAG.tar.gz, console_TAG.log, nvidia-smi_TAG.csv.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-benchmarks/results/tmp}"
mkdir -p "$OUT"
TAG="${1:?usage: tuner_any_list.sh TAG STEP...}"
shift
SRC="${CELLBENCH_VLLM_SOURCE:-.vllm-src/vllm-0.34.0}"
if [[ ! -f "$SRC/SOURCE.json" ]]; then
  echo "no vLLM sources at $SRC: run workflow/scripts/vllm-kernel-src.sh and carry them" >&2
  exit 2
fi
BUDGET_S="${BUDGET_S:-560}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv \
  >"$OUT/nvidia-smi_$TAG.csv" 2>&1 || true
export PYTHONPATH="$PWD/workflow${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
timeout -s INT -k 10 "$((BUDGET_S + 30))" python3 benchmarks/tuner_any_list.py run \
  --out "$OUT" --tag "$TAG" --budget-s "$BUDGET_S" --vllm-source "$SRC" "$@" 2>&1 |
  tee "$OUT/console_$TAG.log"
exit "${PIPESTATUS[0]}"
