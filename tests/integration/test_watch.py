"""`cellbench watch` against the real local registry: with every tag at its pin it runs nothing
and exits 0; after a tag moves, --dry-run names the image, the cells it would rerun and their
estimated cost, and changes no pin; a second watch started while one holds the lock exits 75
with a message, or waits for it with --wait. The full run (bump, `snakemake all`, history,
verdict) needs images that serve: docs/watch.md gives its commands on the rehearsal images."""

from __future__ import annotations

import os
import subprocess

import pytest
from filelock import FileLock
from support.docker_env import (  # noqa: F401
    PYTHON,
    WORKFLOW,
    docker_client,
    fresh_tag,
    move_tag,
    registry,
    write_test_config,
)


def _watch(tmp_path, cfg, *argv):
    return subprocess.run(
        [PYTHON, "-m", "cellbench.watch.watch", "--configfile", str(cfg), *argv],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
        env={**os.environ, "PYTHONPATH": str(WORKFLOW)},
    )  # fmt: skip


@pytest.mark.docker
@pytest.mark.slow
def test_watch_dry_run_lock_and_nothing_moved(docker_client, registry, tmp_path):  # noqa: F811
    tags = {"rocm7.0": fresh_tag(docker_client, "7.0"), "rocm7.2": fresh_tag(docker_client, "7.2")}
    lock = tmp_path / "images.lock.yaml"
    cfg = write_test_config(tmp_path / "cfg.yaml", tags, lock=lock)
    r = _watch(tmp_path, cfg, "--dry-run")
    assert r.returncode == 0 and "unpinned" in r.stdout, r.stdout + r.stderr
    assert not lock.exists()  # a dry run pins nothing
    r = subprocess.run([PYTHON, "-m", "cellbench.config.images_command", "lock",
                        "--configfile", str(cfg)], cwd=tmp_path, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(WORKFLOW)})  # fmt: skip
    assert r.returncode == 0, r.stderr
    r = _watch(tmp_path, cfg)
    assert r.returncode == 0 and "nothing to run" in r.stdout, r.stdout + r.stderr

    pinned = lock.read_bytes()
    move_tag(docker_client, tags["rocm7.2"])
    r = _watch(tmp_path, cfg, "--dry-run")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "rocm7.2 moved" in r.stdout and "rocm7.0 " not in r.stdout
    would = [line for line in r.stdout.splitlines() if "would rerun" in line]
    assert len(would) == 3 and all("rocm7.2/" in line and "GPU-hours" in line for line in would)
    assert "GPU-hours (cellbench plan's estimate)" in r.stdout
    assert lock.read_bytes() == pinned

    guard = FileLock(str(tmp_path / "results/.watch.lock"))
    with guard:
        r = _watch(tmp_path, cfg, "--dry-run")
        assert r.returncode == 75 and "another watch holds" in r.stderr, r.stderr
        r = _watch(tmp_path, cfg, "--dry-run", "--wait", "2")
        assert r.returncode == 75 and "waited 2 s" in r.stderr
    assert lock.read_bytes() == pinned
