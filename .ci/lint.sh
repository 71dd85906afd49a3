#!/usr/bin/env bash
# Format and lint checks on a venv that holds only the linters (no project install): ruff's
# check and format, snakefmt. Pinned like pyproject's dev extra pins them (lower bounds there).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.ci/work/lint-venv
if [ ! -x "$VENV/bin/ruff" ] || [ ! -x "$VENV/bin/snakefmt" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --progress-bar off 'ruff>=0.6' 'snakefmt>=0.10'
fi
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
"$VENV/bin/snakefmt" --check Snakefile workflow/rules
echo "lint: ruff check, ruff format --check and snakefmt --check clean"
