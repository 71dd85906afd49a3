#!/usr/bin/env bash
# Wall time of the README's first command's `snakemake` part on this machine: the embedded
# default from nothing, in a fresh copy of the tracked tree (the checkout's results/ untouched).
#
#   bash benchmarks/embedded_default_time.sh [OUT_FILE]
#
# Prints (and writes to OUT_FILE, if given) the machine, the commit, /usr/bin/time -v's summary
# and each job's wall seconds from Snakemake's benchmark files. Run it on an otherwise idle
# machine: the figure is meant for the README. KEEP_RESULTS=DIR keeps a copy of the run's
# results/ there (the shape test's snapshot is made from one).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/cellbench-time.XXXXXX)
keep() { if [ -n "${KEEP_RESULTS:-}" ]; then rm -rf "$KEEP_RESULTS"; cp -a "$work/results" "$KEEP_RESULTS"; fi; }
trap 'keep; rm -rf "$work"' EXIT
(cd "$repo" && git ls-files -z | xargs -0 cp --parents -t "$work")
# the copy has no .git: stamp it, so its archive records the commit that ran
"$repo/.venv/bin/python" -m cellbench.common.gitstate stamp "$work" --repo "$repo" >/dev/null
report() {
    echo "# embedded default, snakemake all --cores 2, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "# commit $(git -C "$repo" rev-parse HEAD)$(git -C "$repo" diff --quiet || echo ' (dirty)')"
    echo "# $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -m), load before: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "# cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1)"
    (cd "$work" && /usr/bin/time -v -o "$work/time.txt" "$repo/.venv/bin/snakemake" all \
        --cores 2 >snakemake.out 2>&1) || { tail -30 "$work/snakemake.out"; exit 1; }
    grep -E "Elapsed|Maximum resident|Exit status|Percent of CPU" "$work/time.txt"
    echo "# per job: wall seconds (Snakemake benchmark files)"
    (cd "$work/results/benchmarks" && for f in $(find . -name '*.tsv' | sort); do
        printf '%-60s %s\n' "$f" "$(tail -1 "$f" | cut -f1)"; done)
}
if [ $# -ge 1 ]; then report | tee "$1"; else report; fi
