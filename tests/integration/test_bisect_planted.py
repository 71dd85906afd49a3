"""`cellbench bisect` on a planted series in the real local registry: seven nightlies of one
stand-in image whose only difference is the inter-token time its server is given (an ENV in the
image), 10 ms up to the planted one and 40 ms from it on, and one image in between whose server
cannot start. The bisect must skip that one and name exactly the planted image, within its step
bound plus the skip. Real: the registry and its tag list, the pins by digest, the containers,
the pipeline's launcher, load generator and verdict. The server inside is the project's timed
server (the test images carry no vLLM), started by --server-command."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml
from support.archive_cells import tree_checksums
from support.docker_env import PYTHON, REPO_ROOT, WORKFLOW, docker_client, registry  # noqa: F401
from support.history_runs import archive_series
from support.planted_series import SERVER_COMMAND, push_series

# Index 3 cannot serve ("slow" is not a number); the planted slowdown starts at index 5.
SERIES = ["10", "10", "10", "slow", "10", "40", "40"]
PLANTED = 5


def _config(tmp_path, prefix: str, first_tag: str):
    cfg = yaml.safe_load((REPO_ROOT / "config" / "test-docker.yaml").read_text())
    cfg["gpu_vendor"], cfg["gpus"] = "none", 0
    cfg["image_lock"] = str(tmp_path / "lock.yaml")
    cfg["images"] = {
        "rocm7.2": {"ref": first_tag, "nightly_tag_pattern": prefix + r"-nightly-(?P<date>\d{8})"}
    }
    cfg["cells"] = [{"images": ["rocm7.2"], "models": ["tiny-a"], "tp": 1}]
    cfg["serve"].update(grid=[{"isl": 32, "osl": 16}], concurrency=[1], repeats=4)
    path = tmp_path / "bisect.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def _bisect(tmp_path, cfg, *argv, timeout=900):
    env = {**os.environ, "PYTHONPATH": str(WORKFLOW)}
    return subprocess.run(
        [PYTHON, "-m", "cellbench.watch.bisect", "rocm7.2", "--configfile", str(cfg),
         "--server-command", SERVER_COMMAND, *argv],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=timeout,
    )  # fmt: skip


@pytest.mark.docker
@pytest.mark.slow
def test_bisect_names_the_planted_image_and_refuses_bad_input(docker_client, registry, tmp_path):  # noqa: F811
    prefix, tags = push_series(docker_client, tmp_path, SERIES)
    cfg = _config(tmp_path, prefix, tags[0])
    archive = archive_series(tmp_path / "results", [30.0, 30.1, 30.2])
    before = tree_checksums(archive)
    day = [t.rsplit(":", 1)[1] for t in tags]

    # Bad input: each refused before anything runs, the archive untouched.
    refusals = {
        ("nosuch", "--good", day[0], "--bad", day[-1]): "is not defined under images",
        ("--good", day[-1], "--bad", day[0]): "is not older than",
        ("--good", "nightly-19990101", "--bad", day[-1]): "not among",
    }
    for argv, words in refusals.items():
        args = argv if argv[0] != "nosuch" else argv[1:]
        r = subprocess.run(
            [PYTHON, "-m", "cellbench.watch.bisect", *(["nosuch"] if argv[0] == "nosuch"
             else ["rocm7.2"]), "--configfile", str(cfg), *args],
            capture_output=True, text=True, cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(WORKFLOW)}, timeout=120,
        )  # fmt: skip
        assert r.returncode == 2 and words in r.stderr, (argv, r.stderr)
    refs = tmp_path / "refs.txt"
    refs.write_text(f"{tags[0]}\n{tags[0].rsplit(':', 1)[0]}:{prefix}-never-pushed\n{tags[-1]}\n")
    r = _bisect(tmp_path, cfg, "--good", tags[0], "--bad", tags[-1], "--refs-file", str(refs))
    assert r.returncode == 2 and "is not in the registry" in r.stderr, r.stderr
    nomatch = yaml.safe_load(cfg.read_text())
    nomatch["images"]["rocm7.2"]["nightly_tag_pattern"] = "no-such-(?P<date>\\d{8})"
    other = tmp_path / "nomatch.yaml"
    other.write_text(yaml.safe_dump(nomatch))
    r = _bisect(tmp_path, other, "--good", day[0], "--bad", day[-1])
    assert r.returncode == 2 and "matches none" in r.stderr, r.stderr
    assert tree_checksums(archive) == before

    # The bisect itself.
    r = _bisect(tmp_path, cfg, "--good", day[0], "--bad", day[-1])
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "at most 4 steps" in out  # ceil(log2(6)) + 1, printed before the first step
    assert out.index("at most 4 steps") < out.index("step 1:")
    session = next((tmp_path / "results/bisect/rocm7.2").glob("2*"))
    result = json.loads((session / "result.json").read_text())
    assert result["first_bad"]["ref"] == tags[PLANTED]
    digest = docker_client.images.get_registry_data(tags[PLANTED]).id
    assert result["first_bad"]["digest"] == digest
    outcomes = {s["index"]: s["outcome"] for s in result["evidence"]}
    assert outcomes[3] == "skip" and outcomes[PLANTED] == "bad"
    assert all(o == "good" for i, o in outcomes.items() if i < PLANTED and i != 3)
    assert result["steps"] <= result["max_steps"] + 1  # one skip
    planted = next(s for s in result["evidence"] if s["index"] == PLANTED)
    tpot = next(v for v in planted["verdicts"] if v["metric"] == "mean_tpot_ms")
    assert tpot["verdict"] == "worse" and tpot["change_pct"] > 100  # 10 -> 40 ms a token
    assert tags[PLANTED] in (session / "result.md").read_text()
    assert tree_checksums(archive) == before

    # Finished: a new bisect with other arguments starts afresh; an unfinished one with other
    # arguments is refused.
    state = json.loads((tmp_path / "results/bisect/rocm7.2/state.json").read_text())
    state["done"] = False
    (tmp_path / "results/bisect/rocm7.2/state.json").write_text(json.dumps(state))
    r = _bisect(tmp_path, cfg, "--good", day[1], "--bad", day[-1], "--plan")
    assert r.returncode == 2 and "resume it with its own arguments" in r.stderr, r.stderr
