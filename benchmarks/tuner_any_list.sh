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
source "$(dirname "$0")/lib.sh"
bench_root
bench_out
TAG="${1:?usage: tuner_any_list.sh TAG STEP...}"
shift
bench_need_vllm_source || exit 2
BUDGET_S="${BUDGET_S:-560}"
bench_smi "$OUT/nvidia-smi_$TAG.csv"
bench_pythonpath
export PYTHONUNBUFFERED=1
bench_timed "$((BUDGET_S + 30))" "$OUT/console_$TAG.log" python3 benchmarks/tuner_any_list.py run \
  --out "$OUT" --tag "$TAG" --budget-s "$BUDGET_S" --vllm-source "$SRC" "$@"
exit $?
