"""The embedded default through Snakemake's Slurm executor, on a real one-node Slurm.

`.ci/slurm-up.sh` starts the cluster (Debian's slurm-wlm 22.05, munge, slurmdbd): every job
goes through sbatch, and sacct is asked afterwards which jobs ran. The run uses
`profiles/slurm` with the embedded config and the small local cluster's partition, memory and
CPUs on the command line (SLURM_OVERRIDES; docs/cluster.md shows the same command). Then one
serve job is cancelled with scancel mid-benchmark, and the rerun must redo only it and the jobs
that depend on it (docs/faults.md).

Skips, naming Slurm, when sinfo is missing or the cluster is not up; tests/conftest.py turns
that skip into a failure under CI=true, where .ci/run starts the cluster.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

import jsonschema
import psutil
import pytest
from support.workflow_runs import fresh_copy

ROOT = Path(__file__).resolve().parents[2]
CELLS = ["host-cpu/tiny-qwen3-moe/tp1-ep1", "host-cpu/tiny-qwen3-moe-16e/tp1-ep1"]
# Rules Snakemake finishes itself, never submitting them: `all` has no action.
NOT_SUBMITTED = {"all"}


def _cluster() -> tuple[str | None, str]:
    """(partition, "") when a Slurm node is up and sacct answers, else (None, why not)."""
    if shutil.which("sinfo") is None or shutil.which("sacct") is None:
        return None, "Slurm is not installed (no sinfo/sacct): run `bash .ci/slurm-up.sh`"
    try:
        info = subprocess.run(
            ["sinfo", "-h", "-o", "%P %t"], capture_output=True, text=True, timeout=30
        )
        acct = subprocess.run(["sacct", "-n", "-X"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return None, "Slurm cluster not answering (sinfo/sacct timed out): run .ci/slurm-up.sh"
    if info.returncode != 0:
        return None, f"Slurm cluster not up (sinfo: {info.stderr.strip()}): run .ci/slurm-up.sh"
    if acct.returncode != 0:
        return None, f"Slurm accounting not up (sacct: {acct.stderr.strip()}): run slurm-up.sh"
    for line in info.stdout.splitlines():
        partition, state = line.split()
        if partition.endswith("*") and state in ("idle", "mix", "alloc"):
            return partition.rstrip("*"), ""
    return None, f"Slurm cluster has no usable default partition (sinfo: {info.stdout.strip()!r})"


def slurm_overrides(partition: str) -> list[str]:
    """The embedded default on the small local cluster, through profiles/slurm."""
    return [
        "--workflow-profile",
        "profiles/slurm",
        "--configfile",
        "config/local.yaml",
        "--default-resources",
        f"slurm_partition={partition}",
        "mem_mb=2000",
        "cpus_per_task=1",
        "runtime=60",
        "--jobs",
        "4",
        # No association is enforced on this cluster (docs/cluster.md, "Versions").
        "--slurm-no-account",
        # The plugin's first status check waits 40 s by default; short stages add that up.
        "--slurm-init-seconds-before-status-checks",
        "5",
    ]


def snakemake(work: Path, *args: str, timeout: int = 1800) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "snakemake", *args],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def planned(work: Path, *args: str) -> Counter:
    """Job counts by rule from a dry run."""
    proc = snakemake(work, "-n", *args, "--quiet", "rules", timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    counts = Counter()
    for line in proc.stdout.splitlines():
        m = re.fullmatch(r"(\w+)\s+(\d+)", line.strip())
        if m and m.group(1) != "total":
            counts[m.group(1)] = int(m.group(2))
    return counts


def output_files(work: Path, *args: str) -> dict[str, str]:
    """Every output file of the plan, with Snakemake's status for it (`--summary`)."""
    proc = snakemake(work, "--summary", *args, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [line.split("\t") for line in proc.stdout.splitlines()]
    assert rows and rows[0][0] == "output_file", proc.stdout[:2000]
    return {row[0]: row[4] for row in rows[1:] if len(row) >= 5}


def sacct_jobs(work: Path, since: datetime) -> list[dict[str, str]]:
    """The Slurm jobs submitted from ``work`` since ``since``: id, state, rule."""
    proc = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-S", since.strftime("%Y-%m-%dT%H:%M:%S")]
        + ["-o", "JobID,Submit,State,WorkDir,Comment"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    jobs = []
    for line in proc.stdout.splitlines():
        job_id, submit, state, workdir, comment = line.split("|", 4)
        # -S also selects jobs still running then; only those submitted since count.
        if Path(workdir) != work or datetime.fromisoformat(submit) < since:
            continue
        # The plugin's --comment: rule_<rule> or rule_<rule>_wildcards_<values>.
        rule = comment.removeprefix("rule_").split("_wildcards_")[0]
        jobs.append({"id": job_id, "state": state, "rule": rule})
    return jobs


def submitted(plan: Counter) -> Counter:
    return Counter({rule: n for rule, n in plan.items() if rule not in NOT_SUBMITTED})


@pytest.fixture(scope="module")
def partition() -> str:
    name, why = _cluster()
    if name is None:
        pytest.skip(why)
    return name


@pytest.fixture(scope="module")
def slurm_run(tmp_path_factory, partition):
    work = fresh_copy(tmp_path_factory.mktemp("slurm"))
    flags = slurm_overrides(partition)
    plan = planned(work, "all", *flags)
    # The DAG a local run builds (the default profile) is the one Slurm runs.
    local_outputs = output_files(work, "--cores", "2")
    assert planned(work, "all", "--cores", "2") == plan
    started = datetime.now().replace(microsecond=0)
    t0 = time.monotonic()
    proc = snakemake(work, "all", *flags)
    wall_s = time.monotonic() - t0
    print(f"\n[test_slurm] embedded default through Slurm: {wall_s:.0f} s wall")
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    return {
        "work": work,
        "flags": flags,
        "plan": plan,
        "local_outputs": local_outputs,
        "started": started,
        "terminal": proc.stdout + proc.stderr,
        "wall_s": wall_s,
    }


@pytest.mark.slow
@pytest.mark.cluster
def test_every_job_went_through_sbatch_and_sacct_shows_one_per_planned_job(slurm_run):
    jobs = sacct_jobs(slurm_run["work"], slurm_run["started"])
    expected = submitted(slurm_run["plan"])
    assert Counter(j["rule"] for j in jobs) == expected, jobs
    assert {j["state"] for j in jobs} == {"COMPLETED"}, jobs
    # The terminal's submissions, one per job, each with its Slurm id.
    ids = re.findall(r"has been submitted with SLURM jobid (\d+)", slurm_run["terminal"])
    assert sorted(ids) == sorted(j["id"] for j in jobs)
    assert len(ids) == sum(expected.values())


@pytest.mark.slow
@pytest.mark.cluster
def test_results_have_the_local_runs_structure(slurm_run):
    work = slurm_run["work"]
    after = output_files(work, *slurm_run["flags"])
    assert set(after) == set(slurm_run["local_outputs"])
    assert all(status == "ok" for status in after.values()), after
    for path in after:
        assert (work / path).exists(), path
    schema = json.loads((ROOT / "workflow/schemas/bench.schema.json").read_text())
    for cell in CELLS:
        for arm in ("untuned", "tuned"):
            bench = json.loads((work / "results" / cell / f"serve/{arm}/bench.json").read_text())
            jsonschema.validate(bench, schema)
            assert bench["points"] and all(p["failed"] == 0 for p in bench["points"])
            # The host-CPU cell asks Slurm for no GPU; the lease says so, not "lease files".
            assert bench["gpu_indices"] == []
            assert bench["gpu_source"] == "Slurm allocation (no GPUs asked)"
    # Nothing left to do for the same command.
    assert sum(submitted(planned(work, "all", *slurm_run["flags"])).values()) == 0


def test_a_real_allocation_names_the_gpus_the_step_reads(partition, tmp_path):
    # srun in a real allocation with one of the node's `gpu` generic resources: the lease
    # reads what slurmd exported.
    code = (
        "from cellbench.runtime.leases import gpu_lease\n"
        "with gpu_lease(1, 0, 'unused', vendor='amd') as lease:\n"
        "    print(list(lease.gpu_indices), lease.gpu_source)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "workflow")}
    proc = subprocess.run(
        ["srun", "-p", partition, "--gpus=1", "--mem=500", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    indices, source = proc.stdout.strip().split(" ", 1)
    assert source == "ROCR_VISIBLE_DEVICES"
    assert len(json.loads(indices)) == 1


def _serve_jobs_running(work: Path) -> list[str]:
    proc = subprocess.run(
        ["squeue", "-h", "-t", "RUNNING", "-o", "%i|%k|%Z"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    jobs = []
    for line in proc.stdout.splitlines():
        job_id, comment, workdir = line.split("|", 2)
        if Path(workdir) == work and comment.startswith("rule_serve_pair"):
            jobs.append(job_id)
    return jobs


def _servers_in(work: Path) -> list[int]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if "cellbench.serve.tf_serve" in (p.info["cmdline"] or []) and p.cwd() == str(work):
                found.append(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


@pytest.mark.slow
@pytest.mark.cluster
def test_scancel_mid_benchmark_then_the_rerun_redoes_only_that_job(slurm_run):
    work, flags = slurm_run["work"], slurm_run["flags"]
    victim, other = CELLS[0], CELLS[1]
    target = f"results/{victim}/serve/untuned/bench.json"
    # What must rerun after losing this job: it and everything downstream of it.
    expected = planned(work, "all", *flags, "--forcerun", target)
    assert expected["serve_pair"] == 1 and "tune" not in expected, expected
    kept = {
        p: p.stat().st_mtime_ns
        for p in [
            *(work / "results" / other / "serve").glob("*/bench.json"),
            *(work / "results").glob("*/*/*/tune/summary.json"),
        ]
    }
    log = work / "results/logs" / victim / "serve-pair.log"
    old_log_mtime = log.stat().st_mtime_ns
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "snakemake", target, "--force", *flags],
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 600
    while True:
        assert proc.poll() is None, proc.stdout.read()[-4000:]
        assert time.monotonic() < deadline, "the serve job never reached its first point"
        jobs = _serve_jobs_running(work)
        fresh = log.exists() and log.stat().st_mtime_ns != old_log_mtime
        # The stage's line for its first measured point: the job is mid-benchmark.
        if jobs and fresh and "point done: #0 " in log.read_text(errors="replace"):
            break
        time.sleep(1)
    (job_id,) = jobs
    subprocess.run(["scancel", job_id], check=True, timeout=30)
    terminal, _ = proc.communicate(timeout=600)
    assert proc.returncode != 0, terminal[-4000:]
    assert "CANCELLED" in terminal, terminal[-4000:]
    # Slurm took the job's processes down (its servers included); no output looks complete.
    deadline = time.monotonic() + 90
    while _servers_in(work) and time.monotonic() < deadline:
        time.sleep(1)
    assert _servers_in(work) == []
    for arm in ("untuned", "tuned"):
        assert not (work / "results" / victim / "serve" / arm / "bench.json").exists()
    # Rerunning the same command plans and submits that one job, nothing else. (`all` would
    # plan nothing yet: Snakemake does not remake a missing intermediate file whose dependents
    # are up to date, as here, where the cell's later results come from the earlier run.)
    assert planned(work, target, *flags) == Counter({"serve_pair": 1})
    rerun_started = datetime.now().replace(microsecond=0)
    again = snakemake(work, target, *flags)
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-4000:]
    jobs = sacct_jobs(work, rerun_started)
    assert Counter(j["rule"] for j in jobs) == Counter({"serve_pair": 1}), jobs
    # Then `all` plans exactly its dependents: the jobs a forced rerun of it would run.
    assert planned(work, "all", *flags) == expected - Counter({"serve_pair": 1})
    for path, mtime in kept.items():
        assert path.stat().st_mtime_ns == mtime, f"{path} was rewritten"
    print(f"\n[test_slurm] scancel + rerun: {time.monotonic() - t0:.0f} s wall")
