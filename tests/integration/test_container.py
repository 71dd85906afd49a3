"""Containers through the real engine: passthrough as prescribed, logs, failures, clean-up."""

from __future__ import annotations

import socket
import time
import uuid

import pytest
import requests
from cellbench.runtime.container import (
    ContainerFailed,
    GpuSpec,
    Mount,
    amd_devices,
    gpu_env,
    host_config_for,
    run_step,
    serve_container,
)
from support.docker_env import TEST_TAGS, docker_client, labelled, pinned, registry  # noqa: F401

# --- without the engine --------------------------------------------------------------------


def test_amd_passthrough_arguments():
    kw = host_config_for(GpuSpec("amd", (2, 3)), "8g")
    assert kw["devices"] == ["/dev/kfd:/dev/kfd:rwm", "/dev/dri:/dev/dri:rwm"]
    assert kw["group_add"][0] == "video"
    assert kw["ipc_mode"] == "host" and kw["shm_size"] == "8g"
    assert kw["security_opt"] == ["seccomp=unconfined"]
    assert kw["privileged"] is False
    assert "device_requests" not in kw
    assert gpu_env(GpuSpec("amd", (2, 3))) == {"HIP_VISIBLE_DEVICES": "2,3"}


def test_amd_device_paths_can_be_replaced():
    assert amd_devices({}) == ["/dev/kfd:/dev/kfd:rwm", "/dev/dri:/dev/dri:rwm"]
    env = {"CELLBENCH_AMD_DEVICES": "/dev/null:/dev/kfd, /dev/dri/renderD129"}
    assert amd_devices(env) == [
        "/dev/null:/dev/kfd:rwm",
        "/dev/dri/renderD129:/dev/dri/renderD129:rwm",
    ]
    with pytest.raises(ValueError, match=r"CELLBENCH_AMD_DEVICES=.*'dev/kfd' is not HOST"):
        amd_devices({"CELLBENCH_AMD_DEVICES": "dev/kfd"})


def test_nvidia_passthrough_arguments():
    kw = host_config_for(GpuSpec("nvidia", (1, 5)), "16g")
    (req,) = kw["device_requests"]
    assert req["DeviceIDs"] == ["1", "5"] and req["Capabilities"] == [["gpu"]]
    assert "devices" not in kw and kw["privileged"] is False
    # The request hides other GPUs; inside, the two are numbered 0 and 1.
    assert gpu_env(GpuSpec("nvidia", (1, 5))) == {"CUDA_VISIBLE_DEVICES": "0,1"}


def test_no_gpu_has_no_passthrough():
    kw = host_config_for(GpuSpec("none"), "1g")
    assert kw == {"shm_size": "1g", "privileged": False}
    assert gpu_env(GpuSpec("none")) == {}


@pytest.mark.parametrize("vendor", ["amd", "nvidia"])
def test_a_job_holding_no_gpu_gets_no_device(vendor):
    # Only the devices a job needs: without indices it needs none (not every GPU of the host).
    assert host_config_for(GpuSpec(vendor, ()), "1g") == {"shm_size": "1g", "privileged": False}
    assert gpu_env(GpuSpec(vendor, ())) == {}


@pytest.mark.parametrize(
    ("vendor", "indices", "match"),
    [
        ("intel", (), "expected amd, nvidia or none"),
        ("none", (0,), "with GPU indices"),
        ("amd", (1, 1), "distinct"),
    ],
)
def test_bad_gpu_spec(vendor, indices, match):
    with pytest.raises(ValueError, match=match):
        GpuSpec(vendor, indices)


def test_bad_arguments_fail_before_any_container(tmp_path):
    with pytest.raises(ValueError, match="pinned digest"):
        run_step("repo:tag", ["true"], log_path=tmp_path / "l")
    ref = "127.0.0.1:9/none@sha256:" + "0" * 64
    with pytest.raises(ValueError, match="does not exist"):
        run_step(ref, ["true"], mounts=[Mount("/no/such/dir", "/x")], log_path=tmp_path / "l")
    with pytest.raises(ValueError, match="non-empty list"):
        run_step(ref, [], log_path=tmp_path / "l")


# --- with the engine -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def image(docker_client, registry):  # noqa: F811
    ref = pinned(docker_client, TEST_TAGS["7.0"])
    docker_client.images.pull(ref)
    return ref


@pytest.mark.docker
def test_run_step_streams_log_redacts_token_and_removes(docker_client, image, tmp_path):  # noqa: F811
    run_id = uuid.uuid4().hex
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "x.txt").write_text("from host\n")
    (tmp_path / "out").mkdir()
    log = tmp_path / "logs" / "step.log"
    script = (
        "echo token=$HF_TOKEN; cat /in/x.txt; cat /opt/rocm/.info/version; "
        "echo made > /out/y.txt; (echo no > /in/z.txt) 2>/dev/null || echo in-is-read-only"
    )
    run_step(
        image,
        ["sh", "-c", script],
        mounts=[Mount(str(tmp_path / "in"), "/in"), Mount(str(tmp_path / "out"), "/out", False)],
        env={"HF_TOKEN": "hf_secret_value_123"},
        labels={"cellbench.test": run_id},
        log_path=log,
    )
    text = log.read_text()
    assert "hf_secret_value_123" not in text
    assert "token=***" in text and "HF_TOKEN=***" in text
    assert "from host" in text and "7.0" in text and "in-is-read-only" in text
    assert (tmp_path / "out" / "y.txt").read_text() == "made\n"
    assert labelled(docker_client, "cellbench.test", run_id) == []


@pytest.mark.docker
def test_run_step_failure_reports_exit_code_and_tail(docker_client, image, tmp_path):  # noqa: F811
    run_id = uuid.uuid4().hex
    with pytest.raises(ContainerFailed) as info:
        run_step(
            image,
            ["sh", "-c", "echo about to fail; exit 7"],
            labels={"cellbench.test": run_id},
            log_path=tmp_path / "f.log",
        )
    assert info.value.exit_code == 7 and info.value.oom_killed is False
    assert "about to fail" in info.value.log_tail
    assert labelled(docker_client, "cellbench.test", run_id) == []


@pytest.mark.docker
def test_run_step_reports_oom_kill(docker_client, image, tmp_path):  # noqa: F811
    run_id = uuid.uuid4().hex
    hog = "x = bytearray(400 * 1024 * 1024); x[::4096] = b'y' * len(x[::4096]); print('survived')"
    with pytest.raises(ContainerFailed) as info:
        run_step(
            image,
            ["python3", "-c", hog],
            labels={"cellbench.test": run_id},
            log_path=tmp_path / "oom.log",
            mem_limit="64m",
        )
    assert info.value.oom_killed is True, info.value
    assert info.value.exit_code == 137
    assert "OOM" in str(info.value)
    assert labelled(docker_client, "cellbench.test", run_id) == []


def _inspect_created(client, image, gpus):
    """Create (never start: no GPU here) a container with the passthrough; its HostConfig."""
    container = client.containers.create(
        image,
        command=["true"],
        labels={"cellbench.test": "passthrough"},
        **host_config_for(gpus, "16g"),
    )
    try:
        return client.api.inspect_container(container.id)["HostConfig"]
    finally:
        container.remove(force=True)


@pytest.mark.docker
def test_amd_passthrough_as_docker_sees_it(docker_client, image):  # noqa: F811
    hc = _inspect_created(docker_client, image, GpuSpec("amd", (0, 1)))
    devices = {
        (d["PathOnHost"], d["PathInContainer"], d["CgroupPermissions"]) for d in hc["Devices"]
    }
    assert devices == {("/dev/kfd", "/dev/kfd", "rwm"), ("/dev/dri", "/dev/dri", "rwm")}
    assert "video" in hc["GroupAdd"]
    assert hc["IpcMode"] == "host"
    assert hc["ShmSize"] == 16 * 1024**3
    # The engine adds "label=disable" itself alongside host IPC; ours must be there.
    assert "seccomp=unconfined" in hc["SecurityOpt"]
    assert hc["Privileged"] is False
    assert not hc.get("DeviceRequests")


@pytest.mark.docker
def test_nvidia_passthrough_as_docker_sees_it(docker_client, image):  # noqa: F811
    hc = _inspect_created(docker_client, image, GpuSpec("nvidia", (3,)))
    (req,) = hc["DeviceRequests"]
    assert req["DeviceIDs"] == ["3"] and req["Capabilities"] == [["gpu"]]
    assert hc["Privileged"] is False and not hc.get("Devices")
    assert hc["IpcMode"] == "host"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.docker
def test_serve_container_runs_a_server_and_is_removed(docker_client, image, tmp_path):  # noqa: F811
    run_id = uuid.uuid4().hex
    port = _free_port()
    cmd = ["python3", "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    with serve_container(
        image, cmd, labels={"cellbench.test": run_id}, log_path=tmp_path / "server.log"
    ) as server:
        deadline = time.monotonic() + 30
        while True:
            try:
                r = requests.get(f"http://127.0.0.1:{port}/", timeout=2)
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline, server.log_tail()
                time.sleep(0.2)
        assert r.status_code == 200
        assert server.alive() and server.exit_status() is None
        assert len(labelled(docker_client, "cellbench.test", run_id)) == 1
        server.container.kill()
        deadline = time.monotonic() + 10
        while server.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        code, oom = server.exit_status()
        assert code == 137 and oom is False
    assert labelled(docker_client, "cellbench.test", run_id) == []
    assert "GET / HTTP" in (tmp_path / "server.log").read_text()
