#!/usr/bin/env bash
# Debian's chromium, for the test that opens Snakemake's HTML report in a real headless
# browser (tests/workflow/test_pipeline_local.py). Installed only if missing; safe to run again.
set -euo pipefail

log() { printf '[browser-up] %s\n' "$*" >&2; }

if command -v chromium >/dev/null; then
  exit 0
fi
log "installing chromium"
export NEEDRESTART_SUSPEND=1  # no service-restart prompt or noise from needrestart
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
command -v chromium >/dev/null || { log "chromium is still not on PATH after installing it"; exit 1; }
log "$(chromium --version 2>/dev/null || echo 'chromium installed')"
