"""A tune resumes only a log written for its own image: after a bump it times kernels anew.

Real tuner runs (Triton's CPU interpreter on the embedded default's tiny shape) in one output
folder, as the tune rule reruns a cell in place: the first run under one image digest writes
the log; a second run under the same digest resumes it and times nothing; a run under another
digest sets that log aside, says so in its summary, and times its candidates itself.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from cellbench.tune import artifacts, outputs, resume  # noqa: E402
from support.stage_jobs import run_tuner, tune_job  # noqa: E402
from support.tiny_moe import TINY  # noqa: E402

OLD = "sha256:" + "a" * 64
NEW = "sha256:" + "b" * 64


@pytest.fixture
def tiny_cfg(tmp_path) -> Path:
    p = tmp_path / "config.json"
    p.write_text(json.dumps(TINY))
    return p


def _tune(cfg: Path, out: Path, digest: str) -> dict:
    job = tune_job(cfg, batch_sizes=[1], max_configs=4, image_digest=digest, runtime="docker")
    assert run_tuner(job, out) == 0
    return json.loads((out / outputs.SUMMARY_NAME).read_text())


def test_a_bump_tunes_anew_and_the_same_image_resumes(tiny_cfg, tmp_path, capsys):
    out = tmp_path / "tune"
    first = _tune(tiny_cfg, out, OLD)
    assert first["counts"]["timed"] > 0 and first["log"]["set_aside_records"] == 0
    logged = artifacts.TuningLog.read(out / outputs.LOG_NAME)
    assert logged

    again = _tune(tiny_cfg, out, OLD)  # a rerun of the same image (a killed run's restart)
    assert again["log"] == {
        "resumed_records": len(logged), "set_aside_records": 0, "set_aside_because": None,
    }  # fmt: skip
    assert again["resumed_log_records"] == len(logged) and again["counts"]["timed"] == 0

    capsys.readouterr()
    bumped = _tune(tiny_cfg, out, NEW)
    # The old image's log is not read back: every candidate is timed again, by this image.
    assert bumped["resumed_log_records"] == 0 and bumped["counts"]["reused"] == 0
    # (how many the search times depends on the timings it sees, so no exact count)
    assert bumped["counts"]["timed"] > 0 and bumped["counts"]["new_kernels"] > 0
    assert bumped["log"]["resumed_records"] == 0
    assert bumped["log"]["set_aside_records"] == len(logged)
    assert OLD in bumped["log"]["set_aside_because"] and NEW in bumped["log"]["set_aside_because"]
    printed = capsys.readouterr().out
    assert f"{len(logged)} records of an earlier run set aside" in printed, printed
    # The new log names the new image on its first line and holds only this run's records.
    first_line = (out / outputs.LOG_NAME).read_text().splitlines()[0]
    assert json.loads(first_line)[resume.HEADER_KEY]["image_digest"] == NEW


def test_a_log_that_names_no_image_is_not_resumed(tiny_cfg, tmp_path):
    """A log written before logs named their image (no first line naming one) is set aside."""
    out = tmp_path / "tune"
    _tune(tiny_cfg, out, OLD)
    log = out / outputs.LOG_NAME
    records = log.read_text().splitlines()[1:]  # the old format: records only
    log.write_text("".join(line + "\n" for line in records))
    s = _tune(tiny_cfg, out, OLD)
    assert s["log"]["set_aside_records"] == len(records) and s["resumed_log_records"] == 0
    assert "names no image" in s["log"]["set_aside_because"]
    assert s["counts"]["timed"] > 0


def test_the_cell_variables_key_the_log_as_a_hash(tiny_cfg, tmp_path, monkeypatch):
    """The cell's variables shape the timings, so a changed value is not resumed; they key
    the log as a hash only, so a value (a password, say) never reaches the log file."""
    out = tmp_path / "tune"
    secret = "postgres://admin:s3cr3tPw@db"
    monkeypatch.setenv("DATABASE_URL", secret)
    job = tune_job(tiny_cfg, batch_sizes=[1], max_configs=2, image_digest=OLD,
                   env={"DATABASE_URL": secret})  # fmt: skip
    assert run_tuner(job, out) == 0
    assert secret not in (out / outputs.LOG_NAME).read_text()
    monkeypatch.setenv("DATABASE_URL", "postgres://admin:changed@db")
    assert run_tuner({**job, "env": {"DATABASE_URL": "postgres://admin:changed@db"}}, out) == 0
    s = json.loads((out / outputs.SUMMARY_NAME).read_text())
    assert s["resumed_log_records"] == 0 and s["log"]["set_aside_records"] > 0
    assert "cell variables" in s["log"]["set_aside_because"]
