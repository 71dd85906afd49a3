"""Security: never privileged, only the GPUs a job holds, servers on loopback, secrets in no file,
files readable by colleagues (644/755 under umask 022).

Secrets are planted for real: ``HF_TOKEN`` (tests/conftest.py plants a canary for the whole
session, so every pipeline a test runs carries it) and a registry credential in a temporary
``DOCKER_CONFIG`` that the engine client sends on each pull. The docker-runtime workflow's own
run is scanned in tests/integration/test_docker_workflow.py (no second pipeline on 2 cores).
The session-wide scan makes its own material first: a real Snakemake run of the embedded
default's first jobs (the tiny model's build and its tune) with the token in its environment,
so run alone it still scans real pipeline output; run after other tests it scans theirs too.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
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
from support.workflow_runs import fresh_copy

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


# One cell's tune, with the model build before it: the embedded default's first real jobs.
OWN_TARGET = "results/host-cpu/tiny-qwen3-moe/tp1-ep1/tune/summary.json"


@pytest.fixture(scope="module")
def own_pipeline_output(tmp_path_factory, planted_hf_token) -> Path:
    """A workflow copy after a real ``snakemake`` run of OWN_TARGET with the token in the
    environment of every job: the material the scans below always have, whatever ran before."""
    work = fresh_copy(tmp_path_factory.mktemp("leakscan"))
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", OWN_TARGET, "--cores", "2"],
        cwd=work, env={**os.environ, "HF_TOKEN": planted_hf_token},
        capture_output=True, text=True, timeout=1200, preexec_fn=lambda: os.umask(0o022),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = work / "results"
    # What the scan is worth: the run's result, its tuned configs, its logs and benchmarks.
    assert (work / OWN_TARGET).is_file()
    assert list(results.glob("host-cpu/tiny-qwen3-moe/tp1-ep1/tune/configs/*.json"))
    assert list(results.glob("logs/**/tune.log")) and list(results.glob("benchmarks/**/*.tsv"))
    return work


def test_no_file_this_session_wrote_holds_the_token(
    planted_hf_token, tmp_path_factory, own_pipeline_output
):
    """Every file under the session's temporary root: this module's own pipeline output
    (always), and the pipelines, steps, servers' logs, reports and archives of the tests that
    ran before this one."""
    root = tmp_path_factory.getbasetemp()
    own = [p for p in own_pipeline_output.rglob("*") if p.is_file() and not p.is_symlink()]
    assert len(own) >= 10 and all(p.is_relative_to(root) for p in own)
    assert files_holding(root, [planted_hf_token]) == []
    # Result folders the session's runs wrote are readable by colleagues.
    unreadable = []
    for results in root.rglob("results"):
        if results.is_dir() and not results.is_symlink():
            unreadable += not_shared(results)
    assert unreadable == []


def test_the_scans_catch_a_leak_and_a_private_file_in_real_output(
    planted_hf_token, own_pipeline_output, tmp_path
):
    """The scans above must be able to fail on real output. The pipeline cannot be made to
    leak the token without breaking it on purpose, so this test stands in for that fault: in
    a copy of the run above it appends the token to the tune log (as a job printing its
    environment would) and makes the tuned configs' folder's first file private (600)."""
    copy = tmp_path / "work"
    shutil.copytree(own_pipeline_output, copy, symlinks=True)
    assert files_holding(copy, [planted_hf_token]) == []  # the clean copy passes
    assert not_shared(copy / "results") == []
    (log,) = copy.glob("results/logs/**/tune.log")
    with log.open("a") as f:
        f.write(f"HF_TOKEN={planted_hf_token}\n")
    tuned = sorted(copy.glob("results/host-cpu/tiny-qwen3-moe/tp1-ep1/tune/configs/*.json"))[0]
    tuned.chmod(0o600)
    assert files_holding(copy, [planted_hf_token]) == [f"{log}: secret #0"]
    assert not_shared(copy / "results") == [f"{tuned}: 600"]


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
