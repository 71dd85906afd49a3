"""Docker faults of the fault suite (docs/faults.md, section Docker), caused for real.

The engine and the local registry are real; the test image (a CPU-only stand-in for a ROCm vLLM
image, see containers/README.md) has no ``vllm`` command, which is the fault of a server image
that lacks its server. Every test counts the containers carrying its run's label afterwards:
the goal is none left, and no output that looks complete.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import uuid

import docker
import pytest
from cellbench.runtime import images
from cellbench.runtime.container import run_step
from cellbench.runtime.images import ImageError
from cellbench.serve.server import ServerError, ServerSpec, _docker, serve
from support.docker_env import (  # noqa: F401
    PYTHON,
    REPO_ROOT,
    TEST_REPO,
    TEST_TAGS,
    docker_client,
    fresh_tag,
    labelled,
    move_tag,
    pinned,
    registry,
)

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def image(docker_client, registry):  # noqa: F811
    ref = pinned(docker_client, TEST_TAGS["7.0"])
    docker_client.images.pull(ref)
    return ref


@pytest.fixture
def run_id(monkeypatch):
    """A run id of this test's own, as Snakemake's common.smk sets CELLBENCH_RUN_ID."""
    rid = f"fault-{uuid.uuid4().hex}"
    monkeypatch.setenv("CELLBENCH_RUN_ID", rid)
    return rid


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- server fails to start ------------------------------------------------------------------


def test_server_missing_from_the_image_fails_with_the_engines_words(
    docker_client,  # noqa: F811
    image,
    run_id,
    tmp_path,
):
    spec = ServerSpec(
        runtime="docker",
        model="cellbench-test/tiny",
        port=_free_port(),
        log_path=tmp_path / "server.log",
        image_ref=image,
        ready_timeout_s=30,
        labels={"cellbench.cell": "rocm7.0/tiny/tp1-ep1"},
    )
    with pytest.raises(ServerError) as info, serve(spec):
        pass
    message = str(info.value)
    # The engine's own message, not "cannot join thread before it is started".
    assert 'exec: "vllm": executable file not found' in message, message
    assert "did not start" in message and "vllm" in message
    assert "executable file not found" in (tmp_path / "server.log").read_text()
    # Removed, in any state (the engine leaves such a container "created").
    assert labelled(docker_client, "cellbench.run", run_id) == []


def test_serve_job_with_a_missing_server_says_why_and_writes_nothing(
    docker_client,  # noqa: F811
    image,
    run_id,
    tmp_path,
):
    """The same fault through the serve job's own entry point, as Snakemake runs it: the
    engine's words on stderr (which the rule's log and the terminal show), exit 1, no
    bench.json, no container."""
    out = tmp_path / "serve"
    r = subprocess.run(
        [PYTHON, "-m", "cellbench.serve", "--runtime", "docker",
         "--cell-id", "rocm7.0/tiny/tp1-ep1", "--arm", "untuned", "--model", "cellbench-test/tiny",
         "--image-ref", image, "--image-digest", image.split("@", 1)[1],
         "--grid-json", json.dumps([{"isl": 8, "osl": 4}]), "--concurrency", "1",
         "--no-gsm8k", "--ready-timeout", "30", "--lease-dir", str(tmp_path / "leases"),
         "--cache-dir", str(tmp_path / "cache"), "--out-dir", str(out)],
        capture_output=True, text=True, cwd=tmp_path, timeout=180,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT / "workflow")},
    )  # fmt: skip
    assert r.returncode == 1, r.stdout + r.stderr
    assert 'exec: "vllm": executable file not found' in r.stderr, r.stderr
    assert "cannot join thread" not in r.stderr
    assert not list(out.rglob("bench.json"))
    assert labelled(docker_client, "cellbench.run", run_id) == []


def test_server_container_carries_the_run_and_cell_labels(docker_client, image, run_id, tmp_path):  # noqa: F811
    port = _free_port()
    spec = ServerSpec(
        runtime="docker",
        model="unused",
        port=port,
        log_path=tmp_path / "server.log",
        image_ref=image,
        command=["python3", "-m", "http.server", "{port}", "--bind", "{host}"],
        labels={"cellbench.cell": "rocm7.0/tiny/tp1-ep1", "cellbench.arm": "tuned"},
    )
    with _docker(spec) as server:  # the docker launcher without the readiness wait
        (container,) = labelled(docker_client, "cellbench.run", run_id)
        assert container.labels["cellbench.cell"] == "rocm7.0/tiny/tp1-ep1"
        assert container.labels["cellbench.arm"] == "tuned"
        assert server.alive()
    assert labelled(docker_client, "cellbench.run", run_id) == []


# --- images: a missing digest, an unreachable registry, a moved tag -------------------------


def test_missing_digest_is_a_clear_error_and_creates_nothing(
    docker_client,  # noqa: F811
    registry,  # noqa: F811
    run_id,
    tmp_path,
):
    ref = f"{TEST_REPO}@sha256:{'0' * 64}"
    with pytest.raises(ImageError, match=r"not found"):
        run_step(ref, ["true"], log_path=tmp_path / "step.log")
    assert labelled(docker_client, "cellbench.run", run_id) == []


def test_unreachable_registry_is_a_clear_error_and_creates_nothing(docker_client, run_id, tmp_path):  # noqa: F811
    # Nothing listens on port 9 here: the engine cannot reach that registry.
    ref = f"127.0.0.1:9/cellbench/x@sha256:{'0' * 64}"
    with pytest.raises(ImageError, match=r"registry unreachable"):
        run_step(ref, ["true"], log_path=tmp_path / "step.log")
    assert labelled(docker_client, "cellbench.run", run_id) == []


def test_a_moved_tag_is_not_pulled_the_pinned_digest_runs(
    docker_client,  # noqa: F811
    registry,  # noqa: F811
    run_id,
    tmp_path,
    capsys,
):
    tag = fresh_tag(docker_client, "7.2", prefix="moved")
    old = move_tag(docker_client, tag)  # content of this test's own, pinned below
    old_ref = images.ImageRef.parse(tag).with_digest(old)
    new = move_tag(docker_client, tag)  # the nightly moves on
    assert new != old
    # Forget the pinned reference locally, so the step must pull, and we can see what.
    with contextlib.suppress(docker.errors.ImageNotFound):
        docker_client.images.remove(old_ref, noprune=True)
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(old_ref)
    run_step(old_ref, ["sh", "-c", "cat /opt/rocm/.info/version"], log_path=tmp_path / "s.log")
    err = capsys.readouterr().err
    assert f"pull {old_ref}:" in err
    assert new not in err and f"pull {tag}" not in err
    # The tag itself was never pulled: no local image answers to it.
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(tag)
    assert "7.2" in (tmp_path / "s.log").read_text()
    assert labelled(docker_client, "cellbench.run", run_id) == []
