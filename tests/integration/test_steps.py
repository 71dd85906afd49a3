"""`python -m cellbench.runtime.steps`: argument checks, host runs, containerised runs,
interrupts."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import uuid

import pytest
from support.docker_env import (  # noqa: F401
    PYTHON,
    TEST_TAGS,
    WORKFLOW,
    docker_client,
    labelled,
    pinned,
    registry,
    tiny_model_config,
)
from support.stage_jobs import tune_argv, tune_job

STEPS = [PYTHON, "-m", "cellbench.runtime.steps"]
ENV = {**os.environ, "PYTHONPATH": str(WORKFLOW)}


def _steps(cwd, *argv, env=None, **kw):
    return subprocess.run(
        [*STEPS, *argv], cwd=cwd, env=env or ENV, capture_output=True, text=True, **kw
    )


# --- arguments -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--runtime", "docker", "--image-ref", "repo:tag"], "docker steps run a pinned digest"),
        (["--runtime", "local", "--gpus", "2", "--total-gpus", "1"], "--gpus 2 exceeds"),
        (["--runtime", "local", "--gpus", "1", "--total-gpus", "1"], "with --gpu-vendor none"),
        (
            ["--runtime", "local", "--gpus", "1", "--total-gpus", "1", "--gpu-vendor", "amd"],
            "--gpus needs --lease-dir",
        ),
        (["--runtime", "local", "--mount", "/no/such:/x"], "source '/no/such' does not exist"),
        (["--runtime", "local", "--mount", "/tmp"], "expected SRC:DST"),
        (["--runtime", "local", "--env", "NOVALUE"], "--env 'NOVALUE': expected KEY=VALUE"),
    ],
)
def test_bad_arguments_exit_2_naming_the_flag(tmp_path, argv, message):
    r = _steps(tmp_path, *argv, "--log", "l.log", "--", "true")
    assert r.returncode == 2
    assert message in r.stderr
    assert not (tmp_path / "l.log").exists()  # refused before anything ran


def test_no_command(tmp_path):
    r = _steps(tmp_path, "--runtime", "local", "--log", "l.log")
    assert r.returncode == 2 and "no command given" in r.stderr


# --- host runs -----------------------------------------------------------------------------


def test_local_step_logs_output_port_and_exit_code(tmp_path):
    env = {**ENV, "HF_TOKEN": "hf_local_secret"}
    script = "echo port=$CELLBENCH_PORT arg=$1 token=$HF_TOKEN; exit 4"
    r = _steps(
        tmp_path, "--runtime", "local", "--lease-dir", "leases", "--port-base", "18100",
        "--log", "logs/s.log", "--", "sh", "-c", script, "sh", "@PORT@", env=env,
    )  # fmt: skip
    assert r.returncode == 4
    text = (tmp_path / "logs" / "s.log").read_text()
    port = int(re.search(r"port=(\d+)", text).group(1))
    assert 18100 <= port < 18300 and f"arg={port}" in text
    assert "hf_local_secret" not in text and "token=***" in text


def test_concurrent_host_steps_get_disjoint_gpus_and_ports(tmp_path):
    script = "echo gpus=$HIP_VISIBLE_DEVICES port=$CELLBENCH_PORT; sleep 2"
    procs = [
        subprocess.Popen(
            [
                *STEPS,
                "--runtime",
                "local",
                "--gpu-vendor",
                "amd",
                "--gpus",
                "2",
                "--total-gpus",
                "4",
                "--lease-dir",
                "leases",
                "--log",
                f"s{i}.log",
                "--",
                "sh",
                "-c",
                script,
            ],
            cwd=tmp_path,
            env=ENV,
        )  # fmt: skip
        for i in range(2)
    ]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    seen = []
    for i in range(2):
        m = re.search(r"gpus=([\d,]+) port=(\d+)", (tmp_path / f"s{i}.log").read_text())
        seen.append((set(m.group(1).split(",")), m.group(2)))
    assert len(seen[0][0]) == 2 and seen[0][0].isdisjoint(seen[1][0])
    assert seen[0][1] != seen[1][1]


def _wait_for(predicate, timeout_s=60.0, what="condition"):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_host_step_kills_its_process_group(tmp_path, sig):
    script = "sleep 300 & echo $! > child.pid; wait"
    proc = subprocess.Popen(
        [*STEPS, "--runtime", "local", "--log", "s.log", "--", "sh", "-c", script],
        cwd=tmp_path, env=ENV, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    pidfile = tmp_path / "child.pid"
    _wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), what="the child")
    child = int(pidfile.read_text())
    proc.send_signal(sig)
    assert proc.wait(timeout=30) == 130
    assert "interrupted" in proc.stderr.read()
    _wait_for(lambda: not _alive(child), timeout_s=15, what="the child to die")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purpose.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


# --- containerised runs --------------------------------------------------------------------


@pytest.fixture(scope="module")
def image(docker_client, registry):  # noqa: F811
    ref = pinned(docker_client, TEST_TAGS["7.2"])
    docker_client.images.pull(ref)
    return ref


@pytest.mark.docker
@pytest.mark.slow
def test_tuner_runs_in_the_pinned_image(docker_client, image, tmp_path):  # noqa: F811
    """A real pipeline step in the container: the tuner on the embedded default's tiny shape."""
    tiny_model_config(tmp_path / "results" / "model")
    # The job as the tune rule passes it: one JSON argument through the step into the image.
    job = tune_job("results/model/config.json", tp=1, dtype="none", block_shape=None,
                   batch_sizes=[1, 4], max_configs=2)  # fmt: skip
    run_id = uuid.uuid4().hex
    r = _steps(
        tmp_path, "--runtime", "docker", "--image-ref", image, "--gpu-vendor", "none",
        "--lease-dir", "results/.leases", "--label", f"cellbench.test={run_id}",
        "--log", "results/logs/tune.log", "--",
        "python3", "-m", "cellbench.tune", *tune_argv(job, "results/cell/tune"),
        timeout=300,
    )  # fmt: skip
    log = (tmp_path / "results" / "logs" / "tune.log").read_text()
    assert r.returncode == 0, r.stderr + log
    summary = json.loads((tmp_path / "results" / "cell" / "tune" / "summary.json").read_text())
    assert summary["interpreter"] is True
    assert sorted(summary["entries"], key=int) == ["1", "4"]
    assert list((tmp_path / "results" / "cell" / "tune" / "configs").glob("E=8,N=32,*.json"))
    assert f"image {image}" in log
    assert labelled(docker_client, "cellbench.test", run_id) == []


@pytest.mark.docker
def test_workflow_is_read_only_and_paths_match_the_host(docker_client, image, tmp_path):  # noqa: F811
    script = (
        "pwd; touch /cellbench/workflow/x 2>/dev/null || echo workflow-ro; "
        "touch outside 2>/dev/null || echo cwd-ro; echo ok > results/inside; "
        "python3 -c 'import cellbench.runtime.container as c, sys; print(c.__file__)'"
    )
    r = _steps(
        tmp_path, "--runtime", "docker", "--image-ref", image,
        "--log", "results/s.log", "--", "sh", "-c", script,
    )  # fmt: skip
    log = (tmp_path / "results" / "s.log").read_text()
    assert r.returncode == 0, r.stderr + log
    assert str(tmp_path.resolve()) in log
    assert "workflow-ro" in log and "cwd-ro" in log
    assert "/cellbench/workflow/cellbench/runtime/container.py" in log
    assert (tmp_path / "results" / "inside").read_text() == "ok\n"


@pytest.mark.docker
def test_concurrent_container_steps_get_distinct_ports(docker_client, image, tmp_path):  # noqa: F811
    procs = [
        subprocess.Popen(
            [
                *STEPS,
                "--runtime",
                "docker",
                "--image-ref",
                image,
                "--lease-dir",
                "leases",
                "--log",
                f"s{i}.log",
                "--",
                "sh",
                "-c",
                "echo port=$CELLBENCH_PORT; sleep 2",
            ],
            cwd=tmp_path,
            env=ENV,
        )  # fmt: skip
        for i in range(2)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    ports = {
        re.search(r"port=(\d+)", (tmp_path / f"s{i}.log").read_text()).group(1) for i in range(2)
    }
    assert len(ports) == 2


@pytest.mark.docker
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_container_step_leaves_no_container(docker_client, image, tmp_path, sig):  # noqa: F811
    run_id = uuid.uuid4().hex
    proc = subprocess.Popen(
        [*STEPS, "--runtime", "docker", "--image-ref", image, "--label",
         f"cellbench.test={run_id}", "--log", "s.log", "--", "sleep", "300"],
        cwd=tmp_path, env=ENV, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip

    def running():
        containers = labelled(docker_client, "cellbench.test", run_id, sparse=True)
        return any(c.status == "running" for c in containers)

    try:
        _wait_for(running, what="the container to run")
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 130
    finally:  # a failure before the signal must not leave the step (and its container) behind
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
    assert labelled(docker_client, "cellbench.test", run_id) == []
