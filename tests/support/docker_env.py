"""Helpers and fixtures for the tests that need the Docker engine and the local registry.

`.ci/docker-up.sh` starts both and pushes the test images (127.0.0.1:5000/cellbench-test:rocm7.0
and :rocm7.2). Import the fixtures into a test module (``from docker_env import ...``); tests
that use them are marked ``docker`` and skip, saying why, only when no engine or registry answers;
under CI (``CI=true``) such a skip is a failure (tests/conftest.py), since CI provides both.

Tests never move the shared tags: each one that needs a tag it can move copies a test image to
a tag of its own (``fresh_tag``) and moves that (``move_tag``).
"""

from __future__ import annotations

import base64
import io
import json
import sys
import uuid
from pathlib import Path

import pytest
import requests

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = REPO_ROOT / "workflow"
PYTHON = sys.executable
REGISTRY = "127.0.0.1:5000"
TEST_REPO = f"{REGISTRY}/cellbench-test"
TEST_TAGS = {"7.0": f"{TEST_REPO}:rocm7.0", "7.2": f"{TEST_REPO}:rocm7.2"}
DOCKER_UP = "bash .ci/docker-up.sh"

if str(WORKFLOW) not in sys.path:
    sys.path.insert(0, str(WORKFLOW))


def _engine():
    try:
        import docker

        client = docker.from_env(timeout=300)
        client.ping()
        return client, ""
    except Exception as exc:  # any failure here means "no engine to test against"
        return None, f"no Docker engine reachable ({exc}); `{DOCKER_UP}` starts one"


@pytest.fixture(scope="session")
def docker_client():
    """A docker SDK client; skips the test when no engine answers."""
    client, why = _engine()
    if client is None:
        pytest.skip(why)
    return client


@pytest.fixture(scope="session")
def registry(docker_client):
    """The local registry's address, once it answers and holds the test images."""
    try:
        requests.get(f"http://{REGISTRY}/v2/", timeout=5).raise_for_status()
    except requests.RequestException as exc:
        pytest.skip(f"no registry on {REGISTRY} ({exc}); `{DOCKER_UP}` starts one")
    for tag in TEST_TAGS.values():
        try:
            docker_client.images.get_registry_data(tag)
        except Exception as exc:
            pytest.skip(f"test image {tag} missing ({exc}); `{DOCKER_UP}` pushes it")
    return REGISTRY


def pinned(client, tag: str) -> str:
    """``repo@sha256:...`` of ``tag`` as the registry serves it now."""
    from cellbench.runtime import images

    return images.ImageRef.parse(tag).with_digest(client.images.get_registry_data(tag).id)


def fresh_tag(client, rocm: str, prefix: str = "t") -> str:
    """Copy the ROCm ``rocm`` test image to a new unique tag in the registry; return the tag."""
    src = TEST_TAGS[rocm]
    image = client.images.pull(pinned(client, src))
    name = f"{prefix}-{rocm}-{uuid.uuid4().hex[:10]}"
    image.tag(TEST_REPO, name)
    tag = f"{TEST_REPO}:{name}"
    _push(client, tag)
    client.images.remove(tag, noprune=True)
    return tag


def move_tag(client, tag: str) -> str:
    """Push new content under ``tag`` (a label-only layer over it); return the new digest."""
    marker = uuid.uuid4().hex
    dockerfile = f"FROM {pinned(client, tag)}\nLABEL org.cellbench.moved={marker}\n"
    image, _ = client.images.build(fileobj=io.BytesIO(dockerfile.encode()), rm=True, pull=False)
    image.tag(tag)
    _push(client, tag)
    client.images.remove(tag, noprune=True)
    return client.images.get_registry_data(tag).id


def _push(client, tag: str) -> None:
    repo, _, name = tag.rpartition(":")
    for line in client.api.push(repo, tag=name, stream=True, decode=True):
        if "error" in line:
            raise RuntimeError(f"push {tag}: {line['error']}")


def write_test_config(path: Path, refs: dict[str, str], *, lock: Path, **overrides) -> Path:
    """config/test-docker.yaml with its images pointed at ``refs`` (name -> tag) and lock."""
    import yaml

    cfg = yaml.safe_load((REPO_ROOT / "config" / "test-docker.yaml").read_text())
    for name, ref in refs.items():
        cfg["images"][name]["ref"] = ref
    cfg["image_lock"] = str(lock)
    cfg.update(overrides)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def tiny_model_config(folder: Path) -> Path:
    """A Qwen3-MoE config.json with the embedded default's tiny shape, for the tuner."""
    from cellbench.assets.build import TINY_MODEL_SHAPE

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.json"
    cfg = {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"]}
    path.write_text(json.dumps({**cfg, "torch_dtype": "float16", **TINY_MODEL_SHAPE}))
    return path


def labelled(client, key: str, value: str, sparse: bool = False) -> list:
    """Containers in any state carrying label key=value.

    sparse: the list call's own view (id, labels, state), no inspect per container. Use it to
    poll a container that is being created: the engine (20.10) can list a new container a
    moment before it can inspect it, and the inspect then fails with 404 (seen in CI)."""
    return client.containers.list(all=True, filters={"label": f"{key}={value}"}, sparse=sparse)


def files_holding(root: Path, secrets: list[str]) -> list[str]:
    """Files under ``root`` whose bytes contain any of ``secrets`` (as 'path: which')."""
    needles = [(s, s.encode()) for s in secrets if s]
    found = []
    for path in sorted(Path(root).rglob("*")):
        if not path.is_file() or path.is_symlink():
            continue
        data = path.read_bytes()
        for i, (_, needle) in enumerate(needles):
            if needle in data:
                found.append(f"{path}: secret #{i}")
    return found


def not_shared(root: Path) -> list[str]:
    """Files under ``root`` that group and others cannot read, and folders they cannot enter:
    under umask 022 everything a run writes should be 644 / 755. The per-image compile cache
    (``results/.cache``) is left out: vLLM writes it inside the container with its own modes
    (its model-info cache is 600), and only containers, which run as root, read it back."""
    bad = []
    for path in sorted(Path(root).rglob("*")):
        if path.is_symlink() or ".cache" in path.relative_to(root).parts:
            continue
        mode = path.stat().st_mode & 0o777
        need = 0o055 if path.is_dir() else 0o044
        if mode & need != need:
            bad.append(f"{path}: {mode:o}")
    return bad


PASSWORD = "regCanaryPw-" + "7f3a9c"


def registry_credential(folder: Path) -> tuple[Path, list[str]]:
    """A DOCKER_CONFIG folder holding a credential for the local registry; the secret forms."""
    folder.mkdir(parents=True, exist_ok=True)
    auth = base64.b64encode(f"cellbench:{PASSWORD}".encode()).decode()
    (folder / "config.json").write_text(json.dumps({"auths": {"127.0.0.1:5000": {"auth": auth}}}))
    return folder, [PASSWORD, auth]
