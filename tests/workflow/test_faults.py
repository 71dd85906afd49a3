"""Fault suite, local runtime (docs/faults.md, section "Local runtime").

Each test causes its fault for real on the embedded default and checks what was lost (the goal:
nothing) and what the user sees. The Snakemake runs here serve the tiny model with a real
``transformers serve``; the tune job is left out (``--allowed-rules``) and stood in for by a
tuned-config folder, because tuning under the Triton interpreter takes minutes and the local
server does not read tuned configs anyway.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from cellbench.assets import build as assets
from cellbench.common import atomicio
from cellbench.results import loaders
from cellbench.serve.measure import POINT_PROGRESS
from filelock import FileLock, Timeout
from support import result_fixtures as fx
from support.workflow_runs import fresh_copy

# The serve stage's progress line for the first finished point: the job is mid-benchmark.
FIRST_POINT = f"{POINT_PROGRESS} #0 "

ROOT = Path(__file__).resolve().parents[2]
CELL = "results/host-cpu/tiny-qwen3-moe/tp1-ep1"
SERVE_LOG = "results/logs/host-cpu/tiny-qwen3-moe/tp1-ep1/serve-pair.log"
ARMS = ("untuned", "tuned")
MODELS = ("tiny-qwen3-moe", "tiny-qwen3-moe-16e")  # the embedded default's two cells' models


@pytest.fixture(scope="module")
def built_assets(tmp_path_factory) -> Path:
    """The embedded default's model and question set, built once for the module."""
    root = tmp_path_factory.mktemp("assets")
    for kind in MODELS:
        assets.make_model(root / "models" / kind, kind, seed=0)
    # The set of config/local.yaml's 40 questions, where its gsm8k_set rule puts it.
    assets.make_gsm8k_set(root / "gsm8k" / "n40", 40, seed=0)
    return root


def _workdir(tmp_path: Path, built: Path, models: list[str]) -> Path:
    """A fresh copy of the workflow with its assets and, per model's tp1-ep1 cell, a tuned
    config as the tune job would leave it (the tuned arm's server must load it: one valid
    launch config under the name the server looks for; the tune job itself is not run)."""
    work = fresh_copy(tmp_path)
    shutil.copytree(built, work / "results" / "assets")
    # copytree keeps the 0700 of pytest's temporary folder; a workflow run would have made
    # results/assets itself (test_security checks that results are shared).
    os.chmod(work / "results" / "assets", 0o755)
    for model in models:
        shape = json.loads((built / "models" / model / "cellbench_model.json").read_text())
        fm = shape["fused_moe_shape"]
        configs = work / f"results/host-cpu/{model}/tp1-ep1/tune/configs"
        configs.mkdir(parents=True)
        name = f"E={fm['E']},N={fm['N']},device_name=CPU_TRITON_INTERPRET.json"
        (configs / name).write_text(json.dumps({"1": fx.CONFIG}) + "\n")
    return work


def _snakemake(work: Path, *args: str, **kw) -> subprocess.Popen:
    # Own session: a signal to "the group" reaches Snakemake and its jobs, never pytest.
    return subprocess.Popen(
        [sys.executable, "-m", "snakemake", "--cores", "2", *args],
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        **kw,
    )


def _wait_for(path: Path, needle: str, proc: subprocess.Popen, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and needle in path.read_text(errors="replace")):
        if proc.poll() is not None:
            raise AssertionError(f"snakemake ended early:\n{proc.stdout.read()[-3000:]}")
        assert time.monotonic() < deadline, f"{needle!r} not in {path} after {timeout_s} s"
        time.sleep(0.3)


def _processes_in(work: Path) -> list[str]:
    """Processes still running with their working folder inside ``work`` (servers, stages)."""
    left = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            cwd = proc.cwd()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if cwd == str(work) or cwd.startswith(f"{work}/"):
            left.append(f"{proc.pid}: {' '.join(proc.info['cmdline'] or [])[:150]}")
    return left


def _held_leases(work: Path) -> list[str]:
    held = []
    for lock in sorted((work / "results/.leases").glob("*.lock")):
        try:
            FileLock(str(lock), timeout=0).acquire().lock.release()
        except Timeout:
            held.append(lock.name)
    owners = [p.name for p in (work / "results/.leases").glob("*.owner")]
    return held + owners


def _dry_run(work: Path, target: str, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--cores", "2", target, *args],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    "sig, to_group",
    [(signal.SIGINT, False), (signal.SIGTERM, False), (signal.SIGINT, True)],
    ids=["sigint-snakemake-alone", "sigterm-snakemake-alone", "sigint-whole-group"],
)
def test_interrupt_mid_benchmark_stops_everything_and_leaves_nothing(
    built_assets, tmp_path, sig, to_group
):
    work = _workdir(tmp_path, built_assets, ["tiny-qwen3-moe"])
    target = f"{CELL}/serve/untuned/bench.json"
    proc = _snakemake(work, target, "--allowed-rules", "serve_pair")
    # Both servers up and the first point measured: the job is mid-benchmark.
    _wait_for(work / SERVE_LOG, FIRST_POINT, proc)
    if to_group:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)  # Snakemake's pid alone: its jobs get nothing from the kernel
    t0 = time.monotonic()
    terminal, _ = proc.communicate(timeout=60)
    stopped_s = time.monotonic() - t0
    assert proc.returncode != 0, terminal[-3000:]
    assert stopped_s < 30, f"Snakemake took {stopped_s:.0f} s to stop:\n{terminal[-3000:]}"
    if not to_group:
        assert f"{sig.name} received: sent SIGTERM to 1 running job process" in terminal
    assert "interrupted; servers stopped" in terminal  # the job's own words, on the terminal
    # Nothing left running, no lease held, nothing that looks like a result.
    assert _processes_in(work) == []
    assert _held_leases(work) == []
    for arm in ARMS:
        assert not (work / CELL / "serve" / arm / "bench.json").exists()
        assert not (work / CELL / "serve" / arm / "lm_eval").exists()
        # No checksum without its file either (one once outlived its bench.json).
        assert not list((work / CELL / "serve" / arm).glob("*.sha256"))
    # The next run simply runs the job again: no --rerun-incomplete needed.
    plan = _dry_run(work, target, "--allowed-rules", "serve_pair")
    assert "serve_pair" in plan and "incomplete" not in plan.lower(), plan[-3000:]


def test_the_workflow_has_one_onstart_hook():
    """Snakemake keeps only the last ``onstart`` it reads: a second hook once replaced the one
    that installs the signal handler, and the interrupt tests above timed out."""
    root = Path(__file__).resolve().parents[2]
    files = [root / "Snakefile", *sorted((root / "workflow/rules").glob("*.smk"))]
    hooks = [f.name for f in files for line in f.read_text().splitlines() if line == "onstart:"]
    assert hooks == ["onstart.smk"], hooks


def test_forwarding_signals_job_commands_but_not_shells_or_other_sessions(tmp_path):
    """``interrupts.stop_jobs`` as Snakemake's handler uses it, on a real process tree: a shell
    running a command, and a process that put itself in a session of its own."""
    from cellbench.runtime import interrupts

    script = (
        "import os, signal, subprocess, sys, time\n"
        "os.setpgrp()\n"  # stands in for Snakemake: the root of its own group
        "sh = subprocess.Popen(['bash', '-c', 'sleep 60; echo done'])\n"
        "own = subprocess.Popen(['sleep', '60'], start_new_session=True)\n"
        "print(sh.pid, own.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    root = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        sh_pid, own_pid = map(int, root.stdout.readline().split())
        deadline = time.monotonic() + 10
        while not psutil.Process(sh_pid).children():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        (sleep_in_shell,) = psutil.Process(sh_pid).children()
        sent = interrupts.stop_jobs(root.pid)
        assert sent == [sleep_in_shell.pid]  # the command; not its shell, not the other session
        sleep_in_shell.wait(5)
        assert psutil.Process(own_pid).is_running() and psutil.Process(sh_pid).is_running()
    finally:
        for pid in (own_pid, sh_pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        root.kill()
        root.wait()


def _small_config(tmp_path: Path) -> str:
    """The embedded default, shrunk so a whole serve job takes seconds, not minutes."""
    config = yaml.safe_load((ROOT / "config/local.yaml").read_text())
    # Three repeats of one point: 6 points per job (u t t u u t), so a server killed after
    # the first one is found dead mid-grid, whichever point is running when it dies.
    config["serve"].update(grid=[{"isl": 32, "osl": 8}], repeats=3)
    config["gsm8k"].update(limit=2, num_fewshot=0)
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


@pytest.mark.slow
def test_server_killed_mid_benchmark_keep_going_and_rerun_only_the_failed_job(
    built_assets, tmp_path
):
    work = _workdir(tmp_path, built_assets, list(MODELS))
    configfile = _small_config(tmp_path)
    cells = [f"results/host-cpu/{m}/tp1-ep1" for m in MODELS]
    targets = [f"{c}/serve/untuned/bench.json" for c in cells]
    flags = ["--allowed-rules", "serve_pair", "--configfile", configfile]
    proc = _snakemake(work, *targets, *flags, "--keep-going")
    logs = [work / c.replace("results/", "results/logs/") / "serve-pair.log" for c in cells]
    deadline = time.monotonic() + 300
    while not any(log.exists() and FIRST_POINT in log.read_text() for log in logs):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.3)
    (first,) = [i for i, log in enumerate(logs) if log.exists() and FIRST_POINT in log.read_text()]
    # The first-started transformers server of the running job (its untuned arm): killed hard.
    servers = [
        p
        for p in psutil.process_iter(["cmdline", "create_time"])
        if "cellbench.serve.tf_serve" in (p.info["cmdline"] or []) and str(work) == _cwd(p)
    ]
    victim = min(servers, key=lambda p: p.info["create_time"])
    victim.kill()
    terminal, _ = proc.communicate(timeout=600)
    assert proc.returncode != 0
    # The failed job's reason is on the terminal: which server died, and its log's last lines.
    assert "untuned server exited mid-run" in terminal, terminal[-4000:]
    assert "status -9" in terminal and "last lines of" in terminal
    failed, other = cells[first], cells[1 - first]
    for arm in ARMS:
        assert not (work / failed / "serve" / arm / "bench.json").exists()
        assert (work / other / "serve" / arm / "bench.json").exists()  # --keep-going finished it
    assert _processes_in(work) == [] and _held_leases(work) == []
    # A rerun redoes exactly the failed job.
    plan = _dry_run(work, *targets, *flags)
    assert "serve_pair        1" in plan, plan[-3000:]
    planned = [f"model={c.split('/')[2]}," in plan for c in (failed, other)]
    assert planned == [True, False], plan[-3000:]


def _cwd(proc) -> str:
    try:
        return proc.cwd()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return ""


def test_port_taken_between_the_lease_and_the_bind(tmp_path):
    """Another program binds the leased port before the server starts: the stage refuses to
    start a server there (it would measure the other program), naming the port."""
    import socket

    from cellbench.runtime.leases import gpu_lease
    from cellbench.serve.server import ServerError, ServerSpec, serve

    timed = [sys.executable, "-m", "cellbench.serve.timed_server", "--port", "{port}"]
    with gpu_lease(0, 0, tmp_path / "leases") as lease, socket.socket() as squatter:
        squatter.bind(("127.0.0.1", lease.port))
        squatter.listen()
        spec = ServerSpec(
            runtime="local",
            model="timed-model",
            port=lease.port,
            log_path=tmp_path / "server.log",
            command=timed,
        )
        with pytest.raises(ServerError, match=f"port {lease.port} on 127.0.0.1 is already in use"):
            with serve(spec):
                pass
    assert not (tmp_path / "server.log").exists()  # no server was started
    assert _held_leases_in(tmp_path / "leases") == []


def _held_leases_in(lease_dir: Path) -> list[str]:
    held = []
    for lock in sorted(lease_dir.glob("*.lock")):
        try:
            FileLock(str(lock), timeout=0).acquire().lock.release()
        except Timeout:
            held.append(lock.name)
    return held + [p.name for p in lease_dir.glob("*.owner")]


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_results_volume_full(tmp_path):
    """The serve job's output folder on a nearly full file system (a 64 KiB tmpfs, filled
    but for a few pages): the job fails naming the error, and no JSON file is left truncated."""

    vol = tmp_path / "vol"
    vol.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(vol)], check=True)
    try:
        free = os.statvfs(vol).f_bavail * os.statvfs(vol).f_frsize
        (vol / "filler").write_bytes(b"\0" * (free - 2 * 4096))  # two pages left
        timed = [sys.executable, "-m", "cellbench.serve.timed_server", "--port", "{port}"]
        args = [
            "--runtime", "local", "--cell-id", "host-cpu/timed/tp1-ep1", "--arm", "untuned",
            "--model", "timed-model", "--server-command-json",
            __import__("json").dumps([*timed, "--ttft-ms", "1", "--itl-ms", "1"]),
            "--grid-json", '[{"isl": 8, "osl": 4}, {"isl": 16, "osl": 4}]',
            "--concurrency", "1,2", "--repeats", "3", "--prompts-per-concurrency", "2",
            "--no-gsm8k", "--lease-dir", str(tmp_path / "leases"),
            "--cache-dir", str(tmp_path / "cache"), "--out-dir", str(vol / "serve"),
        ]  # fmt: skip
        proc = subprocess.run(
            [sys.executable, "-m", "cellbench.serve", *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 1, proc.stderr[-3000:]
        # The per-request sidecar is written just before bench.json: either may hit the limit.
        written = [vol / "serve" / name for name in ("requests.jsonl.gz", "bench.json")]
        assert any(
            f"cannot write {path}: No space left on device" in proc.stderr for path in written
        ), proc.stderr[-3000:]
        left = sorted(p.name for p in (vol / "serve").iterdir())
        assert left == ["server.log"], left  # no bench.json, no temporary file
        assert _held_leases_in(tmp_path / "leases") == []
    finally:
        subprocess.run(["umount", str(vol)], check=True)


def _whole_cell(res: Path, cell: str) -> None:
    fx.write_tune(res, cell)
    for arm in ARMS:
        fx.write_bench(res, cell, arm, [fx.point(seq=0), fx.point(seq=1, repeat=1)])
        fx.write_gsm8k(res, cell, arm, [True, False, True, True])


@pytest.mark.slow
def test_a_job_that_refuses_its_input_keeps_its_previous_output(tmp_path):
    """Real Snakemake, the plots and gate jobs run for real on hand-made results (the jobs that
    measure are left out: --allowed-rules). A GSM8K result edited after it was written makes
    both jobs refuse it; their previous figures and gate.json stay as they were (update()
    outputs, restored by Snakemake), so the report never links a figure a failed job removed."""
    work = fresh_copy(tmp_path)
    res = work / "results"
    for model in MODELS:
        _whole_cell(res, f"host-cpu/{model}/tp1-ep1")
    plots_dir = work / "results/report/embedded-cpu/plots" / CELL.removeprefix("results/")
    targets = [f"{CELL}/gate.json", str((plots_dir / "latency.png").relative_to(work))]

    def snakemake() -> subprocess.CompletedProcess:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "snakemake",
                "--cores",
                "1",
                "--allowed-rules",
                "plots",
                "gate",
                "--",
                *targets,
            ],  # fmt: skip
            cwd=work,
            capture_output=True,
            text=True,
            timeout=300,
        )

    first = snakemake()
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    before = {p.name: p.read_bytes() for p in plots_dir.glob("*.*")}
    gate_before = (work / CELL / "gate.json").read_bytes()
    assert len(before) == 8, sorted(before)
    tampered = work / CELL / "gsm8k/tuned.json"
    data = json.loads(tampered.read_text())
    data["strict_match"] = 1.0  # no longer the mean of its samples, nor its checksum
    tampered.write_text(json.dumps(data))
    second = snakemake()
    terminal = second.stdout + second.stderr
    assert second.returncode != 0, terminal[-3000:]
    assert f"bad result file {tampered.relative_to(work)}" in terminal, terminal[-3000:]
    assert "Restored previous version" in terminal, terminal[-3000:]
    assert {p.name: p.read_bytes() for p in plots_dir.glob("*.*")} == before
    assert (work / CELL / "gate.json").read_bytes() == gate_before
    # The jobs are still due: the next run plans them again (until the result is rebuilt).
    plan = _dry_run(work, *targets, "--allowed-rules", "plots", "gate")
    assert "plots" in plan and "gate" in plan, plan[-3000:]


def _previous_results(res: Path, cell: str) -> dict[str, bytes]:
    """Whole results of both arms, as an earlier serve job left them: bench.json and lm-eval's
    folder, each with its checksum. Returns every file under the arms' folders by path."""
    for arm in ARMS:
        fx.write_bench(res, cell, arm, [fx.point(seq=0), fx.point(seq=1, repeat=1)])
        lm_eval = res / cell / "serve" / arm / "lm_eval"
        (lm_eval / "instance-1").mkdir(parents=True)
        (lm_eval / "instance-1" / "results_2026-12-05T10-00-00.json").write_text("{}\n")
        atomicio.write_tree_checksum(lm_eval)
    return _files(res / cell / "serve")


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name not in ("server.log", "lm_eval.log", ".snakemake_timestamp")
    }


@pytest.mark.slow
def test_a_failed_serve_rerun_keeps_the_cells_previous_results(built_assets, tmp_path):
    """Real Snakemake, a real serve_pair job that fails: the model it serves is rebuilt broken
    after the cell's results were made, so the job runs again and cannot serve the model.
    Before it ran, Snakemake deleted both arms' bench.json and lm_eval/ (a killed job left a
    bench.json.sha256 with no bench.json). Now each arm's previous files are still there,
    byte for byte with their checksums, and every reader accepts them."""
    work = _workdir(tmp_path, built_assets, ["tiny-qwen3-moe"])
    res = work / "results"
    before = _previous_results(res, CELL.removeprefix("results/"))
    targets = [f"{CELL}/serve/{arm}/bench.json" for arm in ARMS]
    flags = ["--allowed-rules", "serve_pair", "--configfile", _small_config(tmp_path)]
    touched = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "1", "--touch", *targets, *flags],
        cwd=work, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert touched.returncode == 0, touched.stdout[-3000:] + touched.stderr[-3000:]
    assert "Nothing to be done" in _dry_run(work, *targets, *flags)
    model = res / "assets/models/tiny-qwen3-moe"
    next(model.glob("*.safetensors")).write_bytes(b"not a safetensors file")
    os.utime(model)  # the folder as a rebuild leaves it: newer than the cell's results
    proc = _snakemake(work, *targets, *flags)
    terminal, _ = proc.communicate(timeout=600)
    assert proc.returncode != 0, terminal[-3000:]
    assert "serve_stage: " in terminal and "failed" in terminal, terminal[-3000:]
    assert _files(work / CELL / "serve") == before
    for arm in ARMS:
        loaders.load(work / CELL / "serve" / arm / "bench.json", res)
        assert atomicio.tree_problem(work / CELL / "serve" / arm / "lm_eval") is None
        assert not (work / CELL / "serve" / arm / "lm_eval.partial").exists()
    assert _processes_in(work) == [] and _held_leases(work) == []
