"""The images command and the workflow against a config with image pins (dry runs, stand-ins)."""

from __future__ import annotations

import subprocess

from cellbench.common import atomicio

from support.docker_env import PYTHON, REPO_ROOT
from support.workflow_runs import planned


def _cli(cfg, lock, *argv):
    return subprocess.run(
        [
            PYTHON,
            "-m",
            "cellbench.config.images_command",
            "--configfile",
            str(cfg),
            "--lock",
            str(lock),
            *argv,
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
    )


SNAKEFILE = REPO_ROOT / "Snakefile"


def _snakemake(workdir, cfg, *argv):
    r = subprocess.run(
        [PYTHON, "-m", "snakemake", "-s", str(SNAKEFILE), "-d", str(workdir),
         "--configfile", str(cfg), *argv],
        capture_output=True, text=True, cwd=workdir, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout + r.stderr


def _planned(workdir, cfg) -> set[tuple[str, str]]:
    """(rule, outputs) of every job a dry run plans."""
    return set(
        planned("-s", str(SNAKEFILE), "-d", str(workdir), "--configfile", str(cfg), cwd=workdir)
    )


def stand_ins(workdir, cfg) -> None:
    """Every output the plan names, present (files empty; directory() outputs, such as the
    tuned configs folder, which carry no suffix, as folders)."""
    summary = _snakemake(workdir, cfg, "--summary").splitlines()
    first = summary.index(next(x for x in summary if x.startswith("output_file"))) + 1
    for line in summary[first:]:
        path = workdir / line.split("\t")[0]
        if "." in path.name:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
        else:
            path.mkdir(parents=True, exist_ok=True)
    # lm-eval's folders are whole only with the checksum of their files, as the serve job
    # records it (an empty folder without one is refused and its job planned again).
    for line in summary[first:]:
        path = workdir / line.split("\t")[0]
        if path.name == "lm_eval" and path.is_dir():
            atomicio.write_tree_checksum(path)
