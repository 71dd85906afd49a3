#!/usr/bin/env bash
# The serving verdict's calibration on real servers (benchmarks/calibrate_real_servers.py) on
# a machine with many cores: the embedded default's own server (transformers serve with the
# project's Triton MoE, interpreted on the CPU), one core per table, tables side by side.
#
#   bash benchmarks/calibrate_real_servers.sh OUT_DIR [calibrate_real_servers.py flags]
#
# WHEELS=DIR (a machine without the project's venv, e.g. .whl of benchmarks/gpu_local/README.md):
# its wheels are installed into /tmp/site first; otherwise $PYTHON (default python3) is used.
set -euo pipefail
out=${1:?usage: calibrate_real_servers.sh OUT_DIR [flags]}
shift
repo=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
py=${PYTHON:-python3}
if [ -n "${WHEELS:-}" ]; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "$WHEELS"/*.whl
    export PYTHONPATH=/tmp/site:$repo/workflow
else
    export PYTHONPATH=$repo/workflow${PYTHONPATH:+:$PYTHONPATH}
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=${CALIBRATION_WORK:-/tmp/calibration-work}
mkdir -p "$work"
cd "$work"
{ date -u; nproc; "$py" -c 'import torch, transformers; print(torch.__version__, transformers.__version__)'; } \
    >"$out/host.txt" 2>&1
[ -d results/assets/models/tiny-qwen3-moe ] ||
    "$py" -m cellbench.assets model --kind tiny-qwen3-moe \
        --out results/assets/models/tiny-qwen3-moe >"$out/assets.log" 2>&1
"$py" "$repo/benchmarks/calibrate_real_servers.py" --config "$repo/config/local.yaml" \
    --out "$out" "$@" 2>&1 | grep --line-buffered '^\[calibrate\]\|^{\|^ \|^}' || true
