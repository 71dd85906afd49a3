#!/usr/bin/env bash
# The whole mission on one GPU in one device call: install the carried
# wheels, check the environment, run the workflow on the local runtime with
# config/gpu-local.yaml under a deadline, and pack what it made into $OUT (at most 8 files,
# each under 16 MiB), whether it finished or not. README.md beside this file says more.
#
#   bash benchmarks/gpu_local/run.sh [--config FILE] [--deadline S] [--cores N]
#                                    [--wheels DIR | --no-wheels] [--dry-run] [--python PY]
#
# Defaults: config/gpu-local.yaml, a 480 s deadline for snakemake (then SIGINT, 30 s grace),
# 8 cores, python3. The device call's own limit is 600 s: install, check and packing take
# ~30 s more.
# --wheels DIR installs DIR/*.whl (default .whl) into $CELLBENCH_SITE (default /tmp/site);
# --no-wheels uses the interpreter's own packages (a machine that has the project installed);
# --dry-run plans with `snakemake -n` and packs that. Exit status: snakemake's (124 when the
# deadline stopped it), 2 for a bad argument, 3 when the environment check fails.
set -u -o pipefail

config=config/gpu-local.yaml
deadline=480
cores=8
wheels=1
wheel_dir=.whl
dry=0
py=python3
while [ $# -gt 0 ]; do
    case "$1" in
        --config) config=$2; shift 2 ;;
        --deadline) deadline=$2; shift 2 ;;
        --cores) cores=$2; shift 2 ;;
        --python) py=$2; shift 2 ;;
        --no-wheels) wheels=0; shift ;;
        --dry-run) dry=1; shift ;;
        --wheels) wheel_dir=$2; shift 2 ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) echo "run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
case "$deadline$cores" in
    *[!0-9]*|'') echo "run.sh: --deadline and --cores take whole numbers, got '$deadline' '$cores'" >&2; exit 2 ;;
esac
[ -f "$config" ] || { echo "run.sh: --config $config: no such file" >&2; exit 2; }

repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
out=${OUT:-$repo/results/gpu_local_out}
mkdir -p "$out"
start=$(date +%s)
say() { printf '[run.sh +%ss] %s\n' "$(( $(date +%s) - start ))" "$*"; }

# NVLink multicast stays off on these hosts (KINDS.md), in every process started from here.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# No network there: nothing may try the hub.
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

if [ "$wheels" = 1 ]; then
    site=${CELLBENCH_SITE:-/tmp/site}
    ls "$wheel_dir"/*.whl >/dev/null 2>&1 ||
        { echo "run.sh: no wheels in $wheel_dir (see benchmarks/gpu_local/README.md)" >&2; exit 2; }
    say "installing $(ls "$wheel_dir"/*.whl | wc -l) wheels from $wheel_dir into $site"
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$site" "$wheel_dir"/*.whl || { echo "run.sh: wheel install failed" >&2; exit 3; }
    export PYTHONPATH=$site:$repo/workflow${PYTHONPATH:+:$PYTHONPATH}
    # datasets 5 wants pyarrow >= 24; an older image gets datasets 4.8 (pyarrow >= 21) instead.
    if ! "$py" -c 'import pyarrow, sys; sys.exit(int(pyarrow.__version__.split(".")[0]) < 24)'; then
        alt=$(ls "$wheel_dir"/alt/datasets-*.whl 2>/dev/null | head -1)
        say "pyarrow older than 24: installing ${alt:-nothing (no .whl/alt/datasets wheel)}"
        [ -n "$alt" ] && "$py" -m pip install -q --no-index --no-deps --no-compile \
            --no-cache-dir --upgrade --target "$site" "$alt"
    fi
else
    export PYTHONPATH=$repo/workflow${PYTHONPATH:+:$PYTHONPATH}
fi

# Rules call `python`: Snakemake puts its interpreter's folder first on PATH, so that folder
# must hold a `python` (a venv's does; a bare python3 install may not).
pydir=$(dirname "$("$py" -c 'import sys; print(sys.executable)')")
if [ ! -x "$pydir/python" ]; then
    mkdir -p /tmp/cellbench-bin
    printf '#!/bin/sh\nexec %s "$@"\n' "$pydir/$(basename "$("$py" -c 'import sys; print(sys.executable)')")" \
        >/tmp/cellbench-bin/python
    chmod +x /tmp/cellbench-bin/python
    export PATH=/tmp/cellbench-bin:$PATH
    say "no python beside $py: wrapper in /tmp/cellbench-bin"
fi

say "environment check"
{
    date -u
    uname -a
    nvidia-smi -L 2>&1 || echo "nvidia-smi: not available"
    "$py" benchmarks/gpu_local/envcheck.py
} 2>&1 | tee "$out/env.txt"
check=${PIPESTATUS[0]}
[ "$check" = 0 ] || { echo "run.sh: environment check failed (see above)" >&2; exit 3; }

pack() {
    # Everything the run made except the model weights (~10 GB, rebuilt from the seed), in
    # two archives: results without logs, and the logs (each log cut to its last 4 MiB).
    local status=$1
    say "packing results into $out (snakemake exit $status)"
    if [ "$dry" = 0 ] && [ -d results ]; then
        tar -czf "$out/results.tar.gz" --exclude='results/assets/models' \
            --exclude='results/logs' --exclude='results/.leases' \
            --exclude='results/gpu_local_out' --exclude='*.log' results 2>/dev/null
        local logs=/tmp/cellbench-logs
        rm -rf "$logs" && mkdir -p "$logs"
        find results -name '*.log' -not -path 'results/gpu_local_out/*' -print0 |
            while IFS= read -r -d '' f; do
                mkdir -p "$logs/$(dirname "$f")"
                tail -c 4194304 "$f" >"$logs/$f"
            done
        tar -czf "$out/logs.tar.gz" -C "$logs" . 2>/dev/null
        [ -f results/report/h200-local/report.md ] && cp results/report/h200-local/report.md "$out/report.md"
    fi
    ls -la "$out"
}

mode=()
[ "$dry" = 1 ] && mode=(-n)
say "snakemake all --configfile $config (deadline ${deadline}s)"
# A progress line every 30 s: the log being written most recently and its last line.
(
    while sleep 30; do
        f=$(find results/logs -name '*.log' -newer "$out/env.txt" -printf '%T@ %p\n' 2>/dev/null |
            sort -n | tail -1 | cut -d' ' -f2)
        [ -n "$f" ] && say "progress: $f: $(tail -n 1 "$f" | cut -c1-160)"
    done
) &
ticker=$!
# SIGINT first: the workflow stops its jobs (servers, tuner) within seconds and keeps no
# half-written result; then --kill-after.
timeout --signal=INT --kill-after=30 "$deadline" \
    "$py" -m snakemake all "${mode[@]}" --cores "$cores" --scheduler greedy --keep-going \
    --configfile "$config" 2>&1 | tee "$out/snakemake.txt"
status=${PIPESTATUS[0]}
kill "$ticker" 2>/dev/null
wait "$ticker" 2>/dev/null
[ "$status" = 124 ] && say "deadline of ${deadline}s reached: snakemake stopped; packing what finished"
pack "$status"
say "done: snakemake exit $status"
exit "$status"
