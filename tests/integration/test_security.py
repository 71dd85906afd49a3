"""Security: never privileged, only the GPUs a job holds, servers on loopback, secrets in no file,
files readable by colleagues (644/755 under umask 022).

Secrets are planted for real: ``HF_TOKEN`` (tests/conftest.py plants a canary for the whole
session, so every pipeline a test runs carries it) and a registry credential in a temporary
``DOCKER_CONFIG`` that the engine client sends on each pull. The docker-runtime workflow's own
run is scanned in tests/integration/test_docker_workflow.py (no second pipeline on 2 cores); the
last test
here scans every file the session's tests wrote so far, local pipeline included when it ran;
since that depends on the test order, a local step with the token is scanned on its own too.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import docker
import pytest
from cellbench.runtime.container import GpuSpec, host_config_for
from cellbench.serve.server import ServerSpec, _docker, docker_command, local_command
from support.docker_env import (  # noqa: F401
    REPO_ROOT,
    TEST_TAGS,
    docker_client,
    files_holding,
    fresh_tag,
    labelled,
    move_tag,
    not_shared,
    pinned,
    registry,
    registry_credential,
)

# --- never privileged, only the job's devices ----------------------------------------------

_PRIVILEGED = re.compile(r"--privileged|privileged\s*[=:]\s*True|\"privileged\":\s*true", re.I)


def test_nothing_asks_for_privileged_mode():
    places = ["workflow", "containers", ".ci", "profiles", "config", "Snakefile"]
    hits = []
    for place in places:
        root = REPO_ROOT / place
        files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
        for path in files:
            if path.suffix in (".pyc", ".so") or "__pycache__" in path.parts:
                continue
            text = path.read_text(errors="replace")
            hits += [f"{path}: {m.group(0)}" for m in _PRIVILEGED.finditer(text)]
    assert hits == []
    for gpus in (GpuSpec("amd", (0,)), GpuSpec("nvidia", (0,)), GpuSpec("none")):
        assert host_config_for(gpus)["privileged"] is False


def test_devices_are_exactly_the_jobs():
    amd = host_config_for(GpuSpec("amd", (3,)))
    assert amd["devices"] == ["/dev/kfd:/dev/kfd:rwm", "/dev/dri:/dev/dri:rwm"]
    (req,) = host_config_for(GpuSpec("nvidia", (3,)))["device_requests"]
    assert req["DeviceIDs"] == ["3"] and req.get("Count") in (None, 0)
    for vendor in ("amd", "nvidia"):  # no GPU held: nothing passed through
        kw = host_config_for(GpuSpec(vendor, ()))
        assert "devices" not in kw and "device_requests" not in kw


# --- servers on loopback -------------------------------------------------------------------


def test_server_commands_bind_loopback(tmp_path):
    spec = ServerSpec(runtime="docker", model="m", port=8123, log_path=tmp_path / "l")
    cmd = docker_command(spec, "/cellbench/model")
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    local = ServerSpec(runtime="local", model="m", port=8123, log_path=tmp_path / "l")
    args = local_command(local)
    assert args[args.index("--host") + 1] == "127.0.0.1"


def _listening(port: int) -> list[str]:
    """Local addresses (hex, as /proc/net/tcp writes them) listening on ``port``."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, hexport = local.rsplit(":", 1)
            if state == "0A" and int(hexport, 16) == port:
                found.append(addr)
    return found


@pytest.mark.docker
def test_server_container_publishes_nothing_and_listens_on_loopback(
    docker_client,  # noqa: F811
    registry,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    run_id = f"sec-{uuid.uuid4().hex}"
    monkeypatch.setenv("CELLBENCH_RUN_ID", run_id)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    image = pinned(docker_client, TEST_TAGS["7.0"])
    spec = ServerSpec(
        runtime="docker",
        model="unused",
        port=port,
        log_path=tmp_path / "server.log",
        image_ref=image,
        command=["python3", "-m", "http.server", "{port}", "--bind", "{host}"],
    )
    with _docker(spec) as server:
        (container,) = labelled(docker_client, "cellbench.run", run_id)
        host_config = docker_client.api.inspect_container(container.id)["HostConfig"]
        assert host_config["NetworkMode"] == "host"
        assert not host_config.get("PortBindings") and host_config["Privileged"] is False
        deadline = 30.0
        start = time.monotonic()
        while not _listening(port):
            assert server.alive() and time.monotonic() - start < deadline, server.log_tail()
            time.sleep(0.2)
        assert _listening(port) == ["0100007F"]  # 127.0.0.1, nothing else
    assert labelled(docker_client, "cellbench.run", run_id) == []


# --- secrets and file modes of a containerised step ----------------------------------------


@pytest.mark.docker
def test_a_step_with_planted_secrets_writes_them_nowhere(
    docker_client,  # noqa: F811
    registry,  # noqa: F811
    planted_hf_token,
    tmp_path,
):
    work = tmp_path / "work"
    work.mkdir()
    config_dir, credential = registry_credential(tmp_path / "docker-config")
    # An image the engine lacks, so the step pulls it with the credential attached.
    tag = fresh_tag(docker_client, "7.0", prefix="sec")
    ref = tag.rsplit(":", 1)[0] + "@" + move_tag(docker_client, tag)  # content of its own
    with contextlib.suppress(docker.errors.ImageNotFound):
        docker_client.images.remove(ref, noprune=True)
    script = (
        "echo token=$HF_TOKEN; env | sort; cat $HOME/.docker/config.json 2>/dev/null; "
        "python3 -c 'from cellbench.common.atomicio import write_json; "
        'write_json("results/cell/out.json", {"ok": 1})\'; '
        "mkdir -p results/cell/sub && echo made > results/cell/sub/plain.txt"
    )
    env = {**os.environ, "DOCKER_CONFIG": str(config_dir), "HF_TOKEN": planted_hf_token}
    r = subprocess.run(
        [sys.executable, "-m", "cellbench.runtime.steps", "--runtime", "docker", "--image-ref", ref,
         "--pass-env", "HF_TOKEN", "--log", "results/logs/step.log", "--", "sh", "-c", script],
        cwd=work, env=env, capture_output=True, text=True, timeout=300,
        preexec_fn=lambda: os.umask(0o022),
    )  # fmt: skip
    log = (work / "results" / "logs" / "step.log").read_text()
    assert r.returncode == 0, r.stderr + log
    assert "token=***" in log and "HF_TOKEN=***" in log  # the step did see it
    assert f"pull {ref}" in r.stderr  # the pull went through the credentialed client
    secrets = [planted_hf_token, *credential]
    assert files_holding(work, secrets) == []
    for stream in (r.stdout, r.stderr):
        assert not any(s in stream for s in secrets)
    assert json.loads((work / "results" / "cell" / "out.json").read_text()) == {"ok": 1}
    assert not_shared(work / "results") == []


def test_no_file_this_session_wrote_holds_the_token(planted_hf_token, tmp_path_factory):
    """Every file under the session's temporary root: pipelines (local and docker), steps,
    servers' logs, reports and archives of the tests that ran before this one."""
    root = tmp_path_factory.getbasetemp()
    assert files_holding(root, [planted_hf_token]) == []
    # Result folders the session's runs wrote are readable by colleagues.
    unreadable = []
    for results in root.rglob("results"):
        if results.is_dir() and not results.is_symlink():
            unreadable += not_shared(results)
    assert unreadable == []


def test_the_scans_see_a_leak_and_a_private_file(tmp_path):
    # The scans above must be able to fail: a planted leak and a 600 file are found.
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "leak.log").write_text("Authorization: hf_leaked_value\n")
    private = tmp_path / "results" / "private.json"
    private.write_text("{}")
    private.chmod(0o600)
    assert files_holding(tmp_path, ["hf_leaked_value"]) == [
        f"{tmp_path}/results/leak.log: secret #0"
    ]
    assert not_shared(tmp_path / "results") == [f"{private}: 600"]


def test_a_local_step_with_the_token_writes_it_nowhere(planted_hf_token, tmp_path):
    """Runs whatever the test order: the session-wide scan above sees only what earlier tests
    wrote (little when this file runs alone), so this one makes its own real step, on the
    local runtime, that prints the token and its environment and writes results, then scans
    everything it wrote."""
    work = tmp_path / "work"
    work.mkdir()
    script = (
        "echo token=$HF_TOKEN; env | sort; "
        f"{sys.executable} -c 'from cellbench.common.atomicio import write_json; "
        'write_json("results/cell/out.json", {"ok": 1})\'; '
        "mkdir -p results/cell/sub && echo made > results/cell/sub/plain.txt"
    )
    env = {**os.environ, "HF_TOKEN": planted_hf_token,
           "PYTHONPATH": str(REPO_ROOT / "workflow")}  # fmt: skip
    r = subprocess.run(
        [sys.executable, "-m", "cellbench.runtime.steps", "--runtime", "local",
         "--pass-env", "HF_TOKEN", "--log", "results/logs/step.log", "--", "sh", "-c", script],
        cwd=work, env=env, capture_output=True, text=True, timeout=120,
        preexec_fn=lambda: os.umask(0o022),
    )  # fmt: skip
    log = (work / "results" / "logs" / "step.log").read_text()
    assert r.returncode == 0, r.stderr + log
    assert "token=***" in log  # the step did see the token; the log masks it
    assert files_holding(work, [planted_hf_token]) == []
    assert planted_hf_token not in r.stdout + r.stderr
    assert json.loads((work / "results" / "cell" / "out.json").read_text()) == {"ok": 1}
    assert not_shared(work / "results") == []
