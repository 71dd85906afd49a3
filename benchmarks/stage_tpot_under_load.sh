#!/usr/bin/env bash
# benchmarks/stage_tpot_under_load.py beside two busy loops (a loaded 2-core machine).
#   bash benchmarks/stage_tpot_under_load.sh N PCTS OSL REPEATS PROMPTS OUT
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bench_root
export PYTHONPATH=$PWD/workflow
out="${@: -1}"; set -- "${@:1:$(($#-1))}"
python3 -c "while 1: pass" & b1=$!
python3 -c "while 1: pass" & b2=$!
trap 'kill $b1 $b2' EXIT
.venv/bin/python benchmarks/stage_tpot_under_load.py "$@" > "$out" 2>&1
