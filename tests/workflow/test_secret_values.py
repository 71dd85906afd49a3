"""Credentials by value: a config whose variable's value holds one (a database URL with its
password, a Hugging Face token under a harmless name) is refused before anything runs, and the
value reaches no output: not the terminal, no file of the working folder (results/, logs,
Snakemake's .snakemake records), not `cellbench cells` or `cellbench plan`.

The values are canaries made fresh for each run (a uuid inside), so a hit can only be this
test's own value; only the config file the test writes holds them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from support.workflow_runs import fresh_copy

ROOT = Path(__file__).resolve().parents[2]


def _canaries() -> dict[str, tuple[str, str, str]]:
    tag = uuid.uuid4().hex
    return {
        "url-password": (
            "DATABASE_URL",
            f"postgres://admin:pw{tag[:12]}@db.example:5432/bench",
            "a URL with a user name and password",
        ),
        "hf-token": ("MODEL_READER", f"hf_{tag}", "a Hugging Face token"),
    }


def _holding(root: Path, needle: str, skip: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink() and path != skip:
            if needle.encode() in path.read_bytes():
                found.append(str(path.relative_to(root)))
    return found


@pytest.mark.parametrize("case", ["url-password", "hf-token"])
def test_a_credential_in_an_env_value_reaches_no_output(tmp_path, case):
    name, value, kind = _canaries()[case]
    work = fresh_copy(tmp_path)
    cfg = yaml.safe_load((ROOT / "config" / "local.yaml").read_text())
    cfg["cells"][0]["env"] = {name: value}
    config = work / "config" / "with-secret.yaml"
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    env = {**os.environ, "PYTHONPATH": str(work / "workflow")}
    runs = [
        [sys.executable, "-m", "snakemake", "all", "--cores", "1", "--configfile", str(config)],
        [sys.executable, "-m", "cellbench.cli", "cells", "--configfile", str(config)],
        [sys.executable, "-m", "cellbench.cli", "plan", "--configfile", str(config)],
    ]
    for argv in runs:
        proc = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=300)
        said = proc.stdout + proc.stderr
        assert proc.returncode != 0, said
        assert f"cells[0].env.{name}: the value looks like {kind}" in said, said
        assert value not in said and value.split("@")[0] not in said
    assert not (work / "results").exists()
    # Snakemake's records, logs and anything else the runs left: none holds the value.
    assert _holding(work, value, skip=config) == []
    assert (work / ".snakemake").is_dir()  # Snakemake did start and keep its records
