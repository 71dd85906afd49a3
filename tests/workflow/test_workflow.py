"""The workflow's DAG as `snakemake -n` plans it, without Docker or a GPU."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from cellbench.common import atomicio
from support.workflow_runs import fresh_copy, planned_jobs  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]


def _config_without_interleaving(tmp_path: Path, name: str) -> Path:
    config = yaml.safe_load((ROOT / "config" / name).read_text())
    config.setdefault("serve", {})["interleave_arms"] = False
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    return path


def test_production_dry_run_lists_every_job(tmp_path):
    # No lock file and no engine: the plan is still complete (pins are checked when a job runs).
    jobs = planned_jobs("all", "--configfile", str(ROOT / "config/config.yaml"))
    cells, arms = 4, 2
    # Interleaved arms (the default): one job per cell serves both arms.
    assert jobs == Counter(
        {
            "tune": cells,
            "serve_pair": cells,
            "gsm8k": cells * arms,
            "plots": cells,
            "report": 1,
            "archive": 2,
            "configs": 2,  # results/configs/{rocm7.0,rocm7.2}
            "gate": cells,
            "check_gates": 1,
            "all": 1,
        }
    )
    jobs = planned_jobs(
        "all", "--configfile", str(_config_without_interleaving(tmp_path, "config.yaml"))
    )
    assert jobs == Counter(
        {
            "tune": cells,
            "serve": cells * arms,
            "gsm8k": cells * arms,
            "plots": cells,
            "report": 1,
            "archive": 2,
            "configs": 2,  # results/configs/{rocm7.0,rocm7.2}
            "gate": cells,
            "check_gates": 1,
            "all": 1,
        }
    )


def test_embedded_default_dry_run(tmp_path):
    work = fresh_copy(tmp_path)
    jobs = planned_jobs("all", cwd=work)  # the default workflow profile selects local.yaml
    assert jobs["tiny_model"] == 2 and jobs["gsm8k_set"] == 1
    assert jobs["tune"] == 2 and jobs["serve_pair"] == 2 and jobs["gsm8k"] == 4
    assert "serve" not in jobs
    assert jobs["report"] == 1 and jobs["archive"] == 1
    assert jobs["configs"] == 1  # one label (run_label): results/configs/embedded-cpu/
    jobs = planned_jobs(
        "all", "--configfile", str(_config_without_interleaving(tmp_path, "local.yaml")), cwd=work
    )
    assert jobs["serve"] == 4 and "serve_pair" not in jobs


def test_one_cell_is_one_target(tmp_path):
    target = "results/rocm7.2/qwen3-30b-a3b-fp8/tp2-ep2/gsm8k/tuned.json"
    jobs = planned_jobs(target, "--configfile", str(ROOT / "config/config.yaml"))
    assert jobs == Counter({"tune": 1, "serve_pair": 1, "gsm8k": 1})
    jobs = planned_jobs(
        target, "--configfile", str(_config_without_interleaving(tmp_path, "config.yaml"))
    )
    assert jobs == Counter({"tune": 1, "serve": 1, "gsm8k": 1})


def test_slurm_profile_plans_the_production_matrix():
    # The same workflow through Snakemake's own Slurm executor plugin: a dry run needs no cluster.
    jobs = planned_jobs("--workflow-profile", str(ROOT / "profiles/slurm"), "all")
    assert jobs["tune"] == 4 and jobs["report"] == 1 and jobs["archive"] == 2


def test_lint_clean() -> None:
    """`snakemake --lint` finds nothing (it exits 1 on any lint), with every rule naming the
    host environment file."""
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--lint"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    texts = [p.read_text() for p in (ROOT / "workflow" / "rules").glob("*.smk")]
    rules = sum(len(re.findall(r"^\s*rule \w+:", t, flags=re.M)) for t in texts)

    def count(directive: str) -> int:
        return sum(len(re.findall(rf"^\s*{directive}:\s*$", t, flags=re.M)) for t in texts)

    # Every rule names the host environment, keeps a log and a benchmark file (the `all` rule,
    # in the Snakefile, runs nothing).
    assert rules > 0 and count("conda") == rules
    assert count("log") == count("benchmark") == count("shell") == rules


def test_host_env_lists_pyprojects_dependencies() -> None:
    """The conda environment file (for `--sdm conda`) pins exactly what pyproject.toml pins:
    two lists that must not drift apart."""
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    env = yaml.safe_load((ROOT / "workflow" / "envs" / "cellbench.yaml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert pip == deps
    assert "python=3.11" in env["dependencies"]


def test_failed_job_prints_its_reason_on_the_terminal(tmp_path):
    """A job that fails shows the reason from its log on Snakemake's terminal output, not only
    "check log file(s)". The fault is real: lm-eval output truncated mid-file."""
    work = fresh_copy(tmp_path)
    lm_eval = work / "results/host-cpu/tiny-qwen3-moe/tp1-ep1/serve/untuned/lm_eval/m"
    lm_eval.mkdir(parents=True)
    (lm_eval / "results_2026-01-01T00-00-00.json").write_text('{"results": ')
    atomicio.write_tree_checksum(lm_eval.parent)  # recorded as the serve job found it
    target = "results/host-cpu/tiny-qwen3-moe/tp1-ep1/gsm8k/untuned.json"
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "1", target, "--allowed-rules", "gsm8k"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0
    terminal = proc.stdout + proc.stderr
    assert "cellbench: the job failed; from its log" in terminal
    # One line naming the file (gsm8k summarize prints no traceback for a bad lm-eval file).
    assert "results_2026-01-01T00-00-00.json: lm-eval's results file is not whole JSON" in terminal
    assert not (work / target).exists()


def test_meaningful_tail_keeps_the_exception_and_drops_progress_bars():
    from cellbench.joblog import meaningful_tail

    log = "\n".join(
        ["starting", " 50%|#####     | 5/10", "Traceback (most recent call last):"]
        + [f'  File "x.py", line {i}, in f' for i in range(30)]
        + ["    raise ValueError('bad grid')", "ValueError: bad grid: isl must be > 0"]
    )
    tail = meaningful_tail(log)
    assert tail[0].startswith("Traceback") and tail[-1].startswith("ValueError: bad grid")
    assert len(tail) <= 20 and not any("%|" in line for line in tail)
    plain = "\n".join(["line"] * 50 + ["server failed to start: port 8000 taken"] + ["x"] * 3)
    assert "server failed to start: port 8000 taken" in meaningful_tail(plain)


def test_python_and_rules_are_formatted_and_lint_clean() -> None:
    """`ruff check` on the whole tree and `snakefmt --check` on the Snakefile and rules files
    report nothing (.ci/run runs both before the tests too, so a slip fails in a minute)."""
    bin_dir = Path(sys.executable).parent
    for cmd in (
        [str(bin_dir / "ruff"), "check", "."],
        [str(bin_dir / "snakefmt"), "--check", "Snakefile", "workflow/rules"],
    ):
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, " ".join(cmd) + "\n" + proc.stdout + proc.stderr


def _shell_commands(config: Path) -> dict[str, list[str]]:
    """Each planned job's shell command by rule, from a dry run that prints them."""
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "all", "-n", "-p", "--cores", "2",
         "--configfile", str(config)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    commands: dict[str, list[str]] = {}
    rule = None
    for line in proc.stdout.splitlines():
        if m := re.match(r"(?:local)?rule (\w+):", line):
            rule = m.group(1)
        elif line.startswith("Shell command: ") and rule:
            commands.setdefault(rule, []).append(line)
    return commands


def test_latency_bounds_reach_the_report_job_alone(tmp_path):
    """Issue 32 item 5: report.latency_bounds is read by the report only. With bounds on, the
    report's command carries them; every other job's command (tune, serve, GSM8K, gates,
    archive) is what it was. What a finished run reruns: test_latency_bounds_rerun.py."""
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    plain = tmp_path / "plain.yaml"
    plain.write_text(yaml.safe_dump(config))
    config.setdefault("report", {})["latency_bounds"] = {"ttft_ms": 2000, "tpot_ms": 200}
    bounded = tmp_path / "bounded.yaml"
    bounded.write_text(yaml.safe_dump(config))
    before, after = _shell_commands(plain), _shell_commands(bounded)
    assert {"tune", "serve_pair", "report"} <= set(before)
    # As sets: the order in which a dry run lists jobs that do not depend on each other is not
    # part of what a job runs.
    assert {r: sorted(c) for r, c in after.items() if r != "report"} == {
        r: sorted(c) for r, c in before.items() if r != "report"
    }
    (report_before,), (report_after,) = before["report"], after["report"]
    assert "--latency-bounds" not in report_before
    flag = '--latency-bounds \'{"confidence":99,"percentile":99,"points":[],"tpot_ms":200,'
    assert flag in report_after
    assert re.sub(r" --latency-bounds '[^']*'", "", report_after) == report_before


@pytest.mark.parametrize(
    ("config_name", "cell"),
    [
        ("config.yaml", "rocm7.2/qwen3-30b-a3b-fp8/tp2-ep2"),
        ("local.yaml", "host-cpu/tiny-qwen3-moe/tp1-ep1"),
    ],
)
def test_the_tune_rule_hands_the_tuner_its_job_whole(tmp_path, config_name, cell):
    """The tune rule's command as Snakemake prints it: the step's own flags, then the tuner
    with its job, one shell-quoted JSON argument, which reads back into the same TuneJob as
    jobargs.tune_job builds (docker: through the container step; local: a host process)."""
    from types import SimpleNamespace

    from cellbench.config import jobargs
    from cellbench.config import loader as cbconfig
    from cellbench.runtime import pins, steps
    from cellbench.tune.job import TuneJob
    from cellbench.tune.plan import job_from_argv

    work = fresh_copy(tmp_path)
    config_file = work / "config" / config_name
    target = f"results/{cell}/tune/summary.json"
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "-p", "--cores", "2", target,
         "--configfile", str(config_file)],
        cwd=work, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if "-m cellbench.runtime.steps" in x)
    words = shlex.split(line.split(" || ")[0])
    step = steps.build_parser().parse_args(words[words.index("cellbench.runtime.steps") + 1 :])
    command = step.command[1:]  # after "--"
    assert command[1:3] == ["-m", "cellbench.tune"]
    tuned, out = job_from_argv(command[3:])
    assert out == f"results/{cell}/tune"
    config = cbconfig.load(config_file)
    image, model, layout = cell.split("/")
    tp, ep = layout.removeprefix("tp").split("-ep")
    wildcards = SimpleNamespace(image=image, model=model, tp=tp, ep=ep)
    job = jobargs.tune_job(config, pins.Pins.for_config(config), wildcards)
    assert tuned == TuneJob.from_job(job)
    assert step.runtime == config["runtime"]
