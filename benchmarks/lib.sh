# Set-up shared by the benchmark launchers (benchmarks/*.sh): sourced by each, never run.
#
#   source "$(dirname "$0")/lib.sh"    # then call what the launcher needs:
#
# bench_root          work from the repository root
# bench_pythonpath    this checkout's workflow/ first on PYTHONPATH (what was there stays after)
# bench_out           OUT (default benchmarks/results/tmp), created
# bench_vllm_source   SRC: vLLM's kernel sources (CELLBENCH_VLLM_SOURCE, else the carried folder)
# bench_need_vllm_source  SRC checked; a message and status 2 where it holds no sources
# bench_gpu           GPU: the label output names carry (GPU, else this device's: gpu_label.py)
# bench_smi FILE      nvidia-smi's view of the GPU into FILE (its error there, where it has none)
# bench_timed [-a] LIMIT LOG CMD...
#                     CMD under a hard stop after LIMIT seconds (SIGINT, SIGKILL 10 s later),
#                     its output shown and written to LOG (-a: appended); returns CMD's status

BENCH_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

bench_root() {
  cd "$BENCH_ROOT" || exit 2
}

bench_pythonpath() {
  export PYTHONPATH="$PWD/workflow${PYTHONPATH:+:$PYTHONPATH}"
}

bench_out() {
  OUT="${OUT:-benchmarks/results/tmp}"
  mkdir -p "$OUT"
}

bench_vllm_source() {
  SRC="${CELLBENCH_VLLM_SOURCE:-.vllm-src/vllm-0.34.0}"
}

bench_need_vllm_source() {
  bench_vllm_source
  if [[ ! -f "$SRC/SOURCE.json" ]]; then
    echo "no vLLM sources at $SRC: run workflow/scripts/vllm-kernel-src.sh and carry them" >&2
    return 2
  fi
}

bench_gpu() {
  GPU="${GPU:-$(python3 benchmarks/gpu_label.py)}"
}

bench_smi() {
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv \
    >"$1" 2>&1 || true
}

bench_timed() {
  local tee_args=()
  if [[ "$1" == -a ]]; then
    tee_args=(-a)
    shift
  fi
  local limit="$1" log="$2"
  shift 2
  timeout -s INT -k 10 "$limit" "$@" 2>&1 | tee "${tee_args[@]}" "$log"
  return "${PIPESTATUS[0]}"
}
