#!/usr/bin/env bash
# vLLM's fused-MoE Triton kernel sources, without installing vLLM.
#
# Downloads vLLM's CUDA wheel from PyPI (no dependencies, nothing installed) and extracts only
# the Python files the tuner's `vllm` backend loads its kernel and launch code from:
#   vllm/model_executor/layers/fused_moe/fused_moe.py   (the Triton kernel and its launcher)
#   vllm/model_executor/layers/fused_moe/utils.py       (the operand-swap rule)
#   vllm/_version.py                                    (the version, for the record)
# plus SOURCE.json (wheel file name, its sha256, the version). A few hundred KB, so it can be
# carried to a machine without network; point CELLBENCH_VLLM_SOURCE (or the tuner's --vllm-source) at it.
#
# Usage: workflow/scripts/vllm-kernel-src.sh [DEST] [VERSION]
#   DEST     default .vllm-src/vllm-VERSION (git-ignored); left alone when already complete
#   VERSION  default 0.34.0
# Env: PYTHON (default .venv/bin/python, else python3) runs pip; VLLM_WHEEL_DIR keeps the
#   downloaded wheel (default .vllm-src/wheels) so a second call downloads nothing.
set -euo pipefail

VERSION="${2:-0.34.0}"
DEST="${1:-.vllm-src/vllm-${VERSION}}"
WHEEL_DIR="${VLLM_WHEEL_DIR:-.vllm-src/wheels}"
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
FILES=(
  vllm/model_executor/layers/fused_moe/fused_moe.py
  vllm/model_executor/layers/fused_moe/utils.py
  vllm/_version.py
)

if [[ -f "$DEST/SOURCE.json" ]]; then
  echo "$DEST: already extracted ($(cat "$DEST/SOURCE.json"))"
  exit 0
fi
if ! [[ "$VERSION" =~ ^[0-9]+\.[0-9]+\.[0-9]+([.a-z0-9]*)$ ]]; then
  echo "vllm-kernel-src.sh: VERSION=$VERSION is not a release version like 0.34.0" >&2
  exit 2
fi

mkdir -p "$WHEEL_DIR"
wheel=$(ls "$WHEEL_DIR"/vllm-"$VERSION"-*.whl 2>/dev/null | head -n 1 || true)
if [[ -z "$wheel" ]]; then
  "$PY" -m pip download -q --no-deps --only-binary=:all: -d "$WHEEL_DIR" "vllm==$VERSION"
  wheel=$(ls "$WHEEL_DIR"/vllm-"$VERSION"-*.whl | head -n 1)
fi

# Extract next to DEST, then move into place: an interrupted run leaves no half folder.
parent=$(dirname "$DEST")
mkdir -p "$parent"
tmp=$(mktemp -d "$parent/.vllm-src-tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
"$PY" - "$wheel" "$tmp" "$VERSION" "${FILES[@]}" <<'EOF'
import hashlib, json, sys, zipfile
from pathlib import Path

wheel, dest, version, *files = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    names = set(z.namelist())
    missing = [f for f in files if f not in names]
    if missing:
        sys.exit(f"{wheel}: lacks {', '.join(missing)}: not a vLLM layout this loader knows")
    for f in files:
        out = Path(dest) / f
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(z.read(f))
h = hashlib.sha256()
with open(wheel, "rb") as fh:
    for chunk in iter(lambda: fh.read(1 << 20), b""):
        h.update(chunk)
record = {"package": "vllm", "version": version, "wheel": Path(wheel).name,
          "wheel_sha256": h.hexdigest(), "files": files}
(Path(dest) / "SOURCE.json").write_text(json.dumps(record, indent=1) + "\n")
EOF
rm -rf "$DEST"
mv "$tmp" "$DEST"
trap - EXIT
echo "$DEST: vLLM $VERSION kernel sources ($(du -sh "$DEST" | cut -f1))"
