#!/usr/bin/env bash
# Set up cellbench on a fresh machine: a virtual environment at .venv with the project and its
# pinned dependencies. With --docker, also install and start a Docker engine and a local
# registry (Debian packages) and build the test images, as the container tests need.
set -euo pipefail
cd "$(dirname "$0")/../.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
echo "bootstrap: installing cellbench and its dependencies (first time: several minutes)"
.venv/bin/python -m pip install -q --progress-bar off -e '.[dev]'
.venv/bin/python -c "import cellbench, torch, triton, snakemake; print('bootstrap: torch', torch.__version__, 'triton', triton.__version__)"

if [ "${1:-}" = "--docker" ]; then
  bash .ci/docker-up.sh
fi
