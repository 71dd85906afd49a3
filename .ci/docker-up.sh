#!/usr/bin/env bash
# Bring up what cellbench's Docker-backed tests need, on a Debian bookworm machine where we
# are root (apt and debootstrap download from Debian's mirror; nothing from PyPI):
#   1. Debian's docker.io engine and docker-registry (installed if missing),
#   2. dockerd, and a registry on 127.0.0.1:5000 without auth (started if not answering),
#   3. the test images 127.0.0.1:5000/cellbench-test:rocm7.0 and :rocm7.2 (built and pushed).
# Safe to run again: every step checks before it acts. See containers/README.md for the recipe.
#
# Environment: CELLBENCH_VENV (default: <repo>/.venv) is where torch and triton are copied
# from; CELLBENCH_STATE (default: /var/lib/cellbench-ci) holds logs, the registry's storage
# and the cached rootfs.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${CELLBENCH_VENV:-$REPO/.venv}"
STATE="${CELLBENCH_STATE:-/var/lib/cellbench-ci}"
REGISTRY="127.0.0.1:5000"
TEST_REPO="$REGISTRY/cellbench-test"
ROCM_VERSIONS=(7.0 7.2)
# Bump when the base recipe below changes, so a cached base is not reused.
RECIPE=2
# Debian's client matches Debian's engine; another client earlier on PATH may not.
DOCKER=/usr/bin/docker

log() { printf '[docker-up] %s\n' "$*" >&2; }

mkdir -p "$STATE"

# --- 1. packages ---------------------------------------------------------------------------
need=()
[ -x /usr/sbin/dockerd ] || need+=(docker.io)
command -v docker-registry >/dev/null || need+=(docker-registry)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v curl >/dev/null || need+=(curl)
if [ "${#need[@]}" -gt 0 ]; then
  log "installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

# --- 2. engine and registry ----------------------------------------------------------------
if ! "$DOCKER" info >/dev/null 2>&1; then
  log "starting dockerd (log: $STATE/dockerd.log)"
  setsid nohup /usr/sbin/dockerd >"$STATE/dockerd.log" 2>&1 </dev/null &
  for _ in $(seq 1 60); do
    "$DOCKER" info >/dev/null 2>&1 && break
    sleep 1
  done
  "$DOCKER" info >/dev/null 2>&1 || { log "dockerd did not come up"; tail -20 "$STATE/dockerd.log"; exit 1; }
fi

registry_up() { curl -fsS -o /dev/null "http://$REGISTRY/v2/" 2>/dev/null; }
if ! registry_up; then
  mkdir -p "$STATE/registry"
  cat >"$STATE/registry.yml" <<EOF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $STATE/registry
  delete:
    enabled: true
http:
  addr: $REGISTRY
EOF
  log "starting docker-registry on $REGISTRY (log: $STATE/registry.log)"
  setsid nohup docker-registry serve "$STATE/registry.yml" >"$STATE/registry.log" 2>&1 </dev/null &
  for _ in $(seq 1 30); do
    registry_up && break
    sleep 0.5
  done
  registry_up || { log "registry did not come up"; tail -20 "$STATE/registry.log"; exit 1; }
fi

# --- 3. test images ------------------------------------------------------------------------
SITE="$VENV/lib/python3.11/site-packages"
[ -d "$SITE/torch" ] && [ -d "$SITE/triton" ] || { log "no torch/triton in $SITE"; exit 1; }
# Copied as installed: torch, triton and what they import at run time, with their metadata.
PKGS=(torch torchgen functorch triton sympy mpmath networkx jinja2 markupsafe fsspec filelock
      typing_extensions.py setuptools pkg_resources _distutils_hack numpy numpy.libs)
versions="$(cd "$SITE" && ls -d torch-*.dist-info triton-*.dist-info | tr '\n' ' ')"
key="$(printf '%s %s' "$RECIPE" "$versions" | sha256sum | cut -c1-12)"
BASE="cellbench-test-base:$key"

if ! "$DOCKER" image inspect "$BASE" >/dev/null 2>&1; then
  rootfs_tar="$STATE/bookworm-python3.tar"
  if [ ! -s "$rootfs_tar" ]; then
    log "debootstrap bookworm (minbase + python3)"
    tmp="$(mktemp -d "$STATE/rootfs.XXXX")"
    debootstrap --variant=minbase --include=python3 bookworm "$tmp" http://deb.debian.org/debian \
      >"$STATE/debootstrap.log" 2>&1 || { tail -20 "$STATE/debootstrap.log"; exit 1; }
    rm -rf "$tmp"/var/cache/apt/archives/*.deb "$tmp"/var/lib/apt/lists/*
    tar -C "$tmp" -cf "$rootfs_tar.part" .
    mv "$rootfs_tar.part" "$rootfs_tar"
    rm -rf "$tmp"
  fi
  log "assembling $BASE from $rootfs_tar and $SITE"
  work="$(mktemp -d "$STATE/base.XXXX")"
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$work/root"
  tar -C "$work/root" -xf "$rootfs_tar"
  dest="$work/root/usr/local/lib/python3.11/dist-packages"
  mkdir -p "$dest"
  for p in "${PKGS[@]}"; do
    [ -e "$SITE/$p" ] && cp -a "$SITE/$p" "$dest/"
  done
  for p in "${PKGS[@]}"; do
    name="${p%.py}"
    cp -a "$SITE"/"$name"-*.dist-info "$dest/" 2>/dev/null || true
  done
  # GPU toolchains and headers are dead weight on a CPU-only interpreter image.
  rm -rf "$dest/triton/backends/nvidia/bin" "$dest/triton/backends/nvidia/lib" \
         "$dest/triton/backends/amd/lib" "$dest/torch/include" "$dest/torch/test"
  find "$dest" -name __pycache__ -type d -prune -exec rm -rf {} +
  tar -C "$work/root" -c . | "$DOCKER" import \
    -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    -c 'CMD ["python3"]' - "$BASE" >/dev/null
  rm -rf "$work"
  trap - EXIT
  "$DOCKER" run --rm "$BASE" python3 -c 'import torch, triton; print("base ok", torch.__version__, triton.__version__)'
fi

for v in "${ROCM_VERSIONS[@]}"; do
  tag="$TEST_REPO:rocm$v"
  DOCKER_BUILDKIT=0 "$DOCKER" build -q --build-arg BASE="$BASE" --build-arg ROCM_VERSION="$v" \
    -t "$tag" "$REPO/containers/test" >/dev/null
  "$DOCKER" push -q "$tag" >/dev/null
  log "pushed $tag ($("$DOCKER" image inspect -f '{{index .RepoDigests 0}}' "$tag"))"
done
log "ready: engine $("$DOCKER" version -f '{{.Server.Version}}'), registry $REGISTRY"
