"""The real workflow on the docker runtime: interrupting a containerised job, concurrent leases.

Snakemake runs the repository's Snakefile in a temporary working directory, with
config/test-docker.yaml pointed at the local registry's test images, pinned by `cellbench images
lock`. The tune step runs the real tuner in the test image (CPU, Triton interpreter).

No GPU here: AMD passthrough needs /dev/kfd, which this machine lacks, so the engine would refuse
to start the container. ``CELLBENCH_AMD_DEVICES=/dev/null:/dev/kfd`` maps a harmless node in its
place; everything else (amd vendor, leases, HIP_VISIBLE_DEVICES, groups, IPC) is the production
path.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import docker
import pytest
import yaml
from filelock import FileLock, Timeout
from support.docker_env import (  # noqa: F401
    PYTHON,
    REPO_ROOT,
    TEST_TAGS,
    docker_client,
    files_holding,
    not_shared,
    registry,
    registry_credential,
    tiny_model_config,
    write_test_config,
)

SNAKEFILE = REPO_ROOT / "Snakefile"
CELL_A = "rocm7.2/tiny-a/tp1-ep1"
CELL_B = "rocm7.2/tiny-b/tp1-ep1"

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(not SNAKEFILE.exists(), reason="the workflow's Snakefile is not there yet"),
]


def _summary(cell: str) -> str:
    return f"results/{cell}/tune/summary.json"


@pytest.fixture
def workdir(docker_client, registry, tmp_path):  # noqa: F811
    """A working directory with a docker-runtime config whose images are pinned in a lock."""
    model_config = tiny_model_config(tmp_path / "model")
    lock = tmp_path / "images.lock.yaml"
    cfg = write_test_config(
        tmp_path / "cfg.yaml",
        {"rocm7.0": TEST_TAGS["7.0"], "rocm7.2": TEST_TAGS["7.2"]},
        lock=lock,
        hf_cache=str(tmp_path / "hf-cache"),
    )
    data = yaml.safe_load(cfg.read_text())
    for model in data["models"].values():
        # The tuner reads shapes from a local config.json; there is no hub to fetch one from.
        model["model_config"] = str(model_config)
    # One batch size keeps each tune short on 2 cores; the jobs still overlap for seconds.
    data["tune"]["batch_sizes"] = [1]
    cfg.write_text(yaml.safe_dump(data, sort_keys=False))
    r = subprocess.run(
        [PYTHON, "-m", "cellbench.config.images_command", "--configfile", str(cfg),
         "--lock", str(lock), "lock"],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return tmp_path


def _start_snakemake(workdir: Path, run_id: str, cores: int, *targets: str) -> subprocess.Popen:
    config_dir, _ = registry_credential(workdir / "docker-config")
    env = {
        **os.environ,
        "CELLBENCH_RUN_ID": run_id,  # every container of this run carries cellbench.run=run_id
        "CELLBENCH_AMD_DEVICES": "/dev/null:/dev/kfd",
        # A registry credential the engine client sends; HF_TOKEN is planted by conftest.py.
        "DOCKER_CONFIG": str(config_dir),
    }
    return subprocess.Popen(
        [PYTHON, "-m", "snakemake", "-s", str(SNAKEFILE), "-d", str(workdir),
         "--configfile", str(workdir / "cfg.yaml"), "--cores", str(cores), *targets,
         "--resources", "gpu=2"],
        cwd=workdir, env=env, stdout=(workdir / "snakemake.out").open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )  # fmt: skip


def _output(proc: subprocess.Popen) -> str:
    return Path(proc.args[proc.args.index("-d") + 1], "snakemake.out").read_text()[-3000:]


def _ours(client, run_id: str) -> list:
    # The SDK lists, then inspects each container: one removed in between raises NotFound.
    for _ in range(20):
        try:
            return client.containers.list(all=True, filters={"label": f"cellbench.run={run_id}"})
        except docker.errors.NotFound:
            time.sleep(0.05)
    return client.containers.list(all=True, filters={"label": f"cellbench.run={run_id}"})


def _wait_for(predicate, proc: subprocess.Popen, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if proc.poll() is not None:
            pytest.fail(f"snakemake exited ({proc.returncode}) before {what}:\n{_output(proc)}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _held_leases(lease_dir: Path) -> list[str]:
    """Lease locks someone still holds, and owner notes left behind (both must be none)."""
    held = [p.name for p in lease_dir.glob("*.owner")]
    for path in sorted(lease_dir.glob("*.lock")):
        lock = FileLock(str(path), timeout=0)
        try:
            lock.acquire()
        except Timeout:
            held.append(path.name)
        else:
            lock.release()
    return held


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_the_group_during_a_containerised_tune_leaves_nothing(
    docker_client,  # noqa: F811
    workdir,
    sig,
):
    run_id = f"test-{uuid.uuid4().hex}"
    proc = _start_snakemake(workdir, run_id, 1, _summary(CELL_A))
    try:

        def running():
            return [c for c in _ours(docker_client, run_id) if c.status == "running"]

        (container,) = _wait_for(running, proc, 120, "the tune container to run")
        assert container.labels["cellbench.cell"] == CELL_A
        # Ctrl-C in a terminal signals the whole foreground group: snakemake and its job. (SIGINT
        # to the snakemake pid alone makes Snakemake wait for the running job to end by itself,
        # then flag its outputs incomplete: its local executor does not signal running jobs.)
        # SIGTERM: a scheduler or `kill -- -PGID` stopping the whole run.
        os.killpg(proc.pid, sig)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0, _output(proc)
    assert _ours(docker_client, run_id) == []
    assert not (workdir / _summary(CELL_A)).exists()
    lease_dir = workdir / "results" / ".leases"
    assert list(lease_dir.glob("gpu*.lock")), "the job never took a GPU lease"
    assert _held_leases(lease_dir) == []


def _env(container) -> dict[str, str]:
    return dict(item.split("=", 1) for item in container.attrs["Config"]["Env"])


@pytest.mark.slow
def test_concurrent_tune_jobs_get_disjoint_gpus_and_ports(docker_client, workdir):  # noqa: F811
    run_id = f"test-{uuid.uuid4().hex}"
    proc = _start_snakemake(workdir, run_id, 2, _summary(CELL_A), _summary(CELL_B))
    seen: dict[str, tuple[str, str]] = {}  # cell -> (HIP_VISIBLE_DEVICES, CELLBENCH_PORT)
    together = False
    try:
        while proc.poll() is None:
            live = []
            for c in _ours(docker_client, run_id):
                if c.status != "running":
                    continue
                env = _env(c)  # the environment the engine gave the running container
                seen[c.labels["cellbench.cell"]] = (
                    env["HIP_VISIBLE_DEVICES"],
                    env["CELLBENCH_PORT"],
                )
                live.append(c.labels["cellbench.cell"])
            together = together or len(live) == 2
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, _output(proc)
    assert together, f"the two tune containers never ran at the same time: {seen}"
    assert set(seen) == {CELL_A, CELL_B}
    (gpus_a, port_a), (gpus_b, port_b) = seen[CELL_A], seen[CELL_B]
    # One GPU each (TP=1), not the same one.
    assert gpus_a.isdigit() and gpus_b.isdigit() and gpus_a != gpus_b
    assert port_a != port_b
    for cell in (CELL_A, CELL_B):
        assert (workdir / _summary(cell)).exists()
        # The step's log says the same from the host side, before the container was made.
        log = (workdir / "results" / "logs" / cell / "tune.log").read_text()
        assert f"gpus amd [{seen[cell][0]}]" in log
        assert f"HIP_VISIBLE_DEVICES={seen[cell][0]}" in log
    assert _ours(docker_client, run_id) == []
    assert _held_leases(workdir / "results" / ".leases") == []
    # Secrets planted for the run (HF_TOKEN passed into the containers, a registry credential
    # on the client) reach no file; what the containers wrote is readable by colleagues.
    _, credential = registry_credential(workdir / "docker-config")
    written = [p for p in workdir.iterdir() if p.name != "docker-config"]
    secrets = [os.environ["HF_TOKEN"], *credential]
    assert [hit for root in written for hit in files_holding(root, secrets)] == []
    assert not_shared(workdir / "results") == []
