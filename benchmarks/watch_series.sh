#!/usr/bin/env bash
# `cellbench watch` on five real vLLM releases moved in turn under one nightly tag, then the
# history page, then `cellbench bisect` between the first and the last release and the
# exhaustive walk that checks it (docs/watch.md). Needs `bash .ci/vllm-images.sh --series`.
#   bash benchmarks/watch_series.sh [OUT]          (default benchmarks/results/watch_series_DATE)
# POINT and METRIC (environment) choose what the bisect and the walk compare (default: every
# point of the config's grid and the four serving metrics).
set -uo pipefail
source "$(dirname "$0")/lib.sh"
bench_root
CFG=config/rehearsal-series.yaml
REPO=127.0.0.1:5000/vllm-cpu-series
OUT="${1:-benchmarks/results/watch_series_$(date -u +%F)}"
VERSIONS=(0.28.0 0.29.0 0.30.0 0.31.0 0.32.0)
moved=()
mkdir -p "$OUT"
log() { printf '[watch-series] %s\n' "$*" | tee -a "$OUT/RUN.txt" >&2; }

log "host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for v in "${VERSIONS[@]}"; do
  # (the series may still be being pushed by .ci/vllm-images.sh --series)
  until curl -fsS -o /dev/null -H 'Accept: application/vnd.docker.distribution.manifest.v2+json' \
      "http://127.0.0.1:5000/v2/vllm-cpu-series/manifests/nightly-2026110$(( ${#moved[@]} + 1 ))"; do
    sleep 10
  done
  moved+=("$v")
  docker tag "$REPO:$v" "$REPO:nightly" && docker push -q "$REPO:nightly" >/dev/null
  log "nightly -> $v ($(docker image inspect -f '{{index .RepoDigests 0}}' "$REPO:$v"))"
  start=$(date +%s)
  .venv/bin/cellbench watch --configfile "$CFG" --cores 2 >"$OUT/watch-$v.log" 2>&1
  code=$?
  log "cellbench watch --configfile $CFG --cores 2: exit $code after $(( $(date +%s) - start )) s"
  grep -E "^(watch:|worse:|GSM8K gate|change point)" "$OUT/watch-$v.log" | tee -a "$OUT/RUN.txt" >&2
  gzip -f "$OUT/watch-$v.log"
done
mkdir -p "$OUT/history"
cp -r results/history/rocm0.0/. "$OUT/history/"
args=(vllm-series --good nightly-20261101 --bad nightly-20261105 --configfile "$CFG")
[ -n "${POINT:-}" ] && args+=(--point "$POINT")
[ -n "${METRIC:-}" ] && args+=(--metric "$METRIC")
for mode in bisect exhaustive; do
  extra=(); [ "$mode" = exhaustive ] && extra=(--exhaustive)
  start=$(date +%s)
  .venv/bin/cellbench bisect "${args[@]}" "${extra[@]}" --out "results/bisect-$mode" \
    >"$OUT/$mode.log" 2>&1
  code=$?
  log "cellbench bisect ${args[*]} ${extra[*]}: exit $code after $(( $(date +%s) - start )) s"
  session=$(ls -d results/bisect-$mode/vllm-series/2*/ | tail -1)
  mkdir -p "$OUT/$mode"
  cp "$session"/result.json "$session"/step-*.json "$OUT/$mode/"
  cp "$session"/result.md "$OUT/$mode/report.md"
done
log "done: $OUT"
