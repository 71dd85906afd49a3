#!/usr/bin/env bash
# Fill .whl/ (ignored by git) with the wheels benchmarks/gpu_local/wheels.txt lists, for the
# H200's Python 3.12 on x86-64. Run here, where PyPI is reachable; the device has no network.
#
#   bash benchmarks/gpu_local/fetch_wheels.sh [DEST]      # DEST default .whl
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=${1:-.whl}
list=benchmarks/gpu_local/wheels.txt
platforms=()
for p in manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 \
    manylinux_2_24 manylinux_2_17 manylinux2014 manylinux_2_5 manylinux1; do
    platforms+=(--platform "${p}_x86_64")
done
mkdir -p "$dest/alt"
grep -v '^#' "$list" | while read -r req how; do
    [ -n "$req" ] || continue
    case "${how:-}" in
        sdist)  # no wheel on the index: build one here (pure Python, so it runs anywhere)
            python3 -m pip wheel -q --no-deps -w "$dest" "$req" ;;
        alt)
            python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
                --implementation cp "${platforms[@]}" -d "$dest/alt" "$req" ;;
        *)
            python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
                --implementation cp "${platforms[@]}" -d "$dest" "$req" ;;
    esac
done
echo "$(ls "$dest"/*.whl | wc -l) wheels in $dest, $(du -sh "$dest" | cut -f1)"
