"""The bad-input catalogue: every probe is refused with its message, and nothing runs.

PROBES is the catalogue (its parts in tests/support/bad_input_*.py); docs/bad-input.md holds
the same table, rendered from it (`.venv/bin/python -m pytest` runs it; `PYTHONPATH=tests
python tests/workflow/test_bad_input.py` rewrites it; a test fails when the two differ). Kinds:

* config: an edit of a shipped config, written to a file and loaded by
`cellbench.config.loader.load`
  in-process (what `snakemake` and `cellbench cells` both call);
* yaml: a config file's text, loaded the same way;
* cli: a `cellbench` command line, run in-process;
* snakemake: a config file given to a real `snakemake -n` (a few, to show the wiring).

Every probe must fail (exit 2 for the CLI, non-zero for Snakemake) with the expected words, and
leave nothing behind: no results/ in a fresh working folder, no tuner output folder.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cellbench import cli
from cellbench.config import loader as cbconfig
from support.bad_input_cli_probes import PROBES as CLI_PROBES
from support.bad_input_config_rules import PROBES as RULE_PROBES
from support.bad_input_guard import PROBES as GUARD_PROBES
from support.bad_input_latency_bounds import PROBES as BOUND_PROBES
from support.bad_input_probes import CONFIG_PROBES, Probe, _base
from support.bad_input_sla import PROBES as SLA_PROBES

# The catalogue, in the order docs/bad-input.md shows it.
PROBES: list[Probe] = (
    CONFIG_PROBES + RULE_PROBES + BOUND_PROBES + SLA_PROBES + CLI_PROBES + GUARD_PROBES
)

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "bad-input.md"
BEGIN, END = "<!-- probes:begin -->", "<!-- probes:end -->"


def _fill(value: str, tmp: Path) -> str:
    return value.replace("{tmp}", str(tmp))


def _config_file(probe: Probe, tmp: Path) -> Path:
    path = tmp / f"{probe.id}.yaml"
    if probe.kind == "yaml":
        if probe.text != "<missing>":
            path.write_text(probe.text)
        return path
    if probe.edit is None:  # text only: a file that is not YAML
        path.write_text(probe.text)
        return path
    cfg = copy.deepcopy(_base(probe.base))
    probe.edit(cfg)
    # NaN and infinity as YAML writes them (.nan, .inf), so the file is what a user writes
    path.write_text(yaml.safe_dump(cfg, sort_keys=False) + (probe.text or ""))
    return path


def _prepare_cli_inputs(tmp: Path) -> None:
    (tmp / "broken.json").write_text("{not json")
    (tmp / "a-file").write_text("not a folder\n")
    # An archive whose one run lost its manifest's end (a copy cut short).
    run = tmp / "archive" / "embedded-cpu" / "20261205T000000Z-local"
    run.mkdir(parents=True, exist_ok=True)
    (run / "MANIFEST.json").write_text('{"label": "embedded-cpu", "cel')
    # The embedded default's cells, whole, for commands that read live results.
    from support import result_fixtures as fx

    for model in ("tiny-qwen3-moe", "tiny-qwen3-moe-16e"):
        cell = f"host-cpu/{model}/tp1-ep1"
        fx.write_tune(tmp / "results", cell)
        for arm in ("untuned", "tuned"):
            fx.write_bench(tmp / "results", cell, arm, [fx.point()])
            fx.write_gsm8k(tmp / "results", cell, arm, [True, False])
    (tmp / "dense.json").write_text(
        json.dumps({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128})
    )


def run_probe(probe: Probe, tmp: Path, capsys, monkeypatch) -> str:
    """The probe's message; asserts it was refused."""
    if probe.kind in ("config", "yaml"):
        path = _config_file(probe, tmp)
        with pytest.raises(cbconfig.ConfigError) as err:
            cbconfig.load(path)
        return str(err.value)
    if probe.kind == "cli":
        _prepare_cli_inputs(tmp)
        for key, value in probe.env.items():
            monkeypatch.setenv(key, _fill(value, tmp))
        monkeypatch.chdir(ROOT)
        capsys.readouterr()
        rc = cli.main([_fill(a, tmp) for a in probe.argv])
        out = capsys.readouterr()
        assert rc == probe.rc, (rc, out)
        assert not (tmp / "tune-out").exists() and not (tmp / "t").exists()
        return out.err
    assert probe.kind == "snakemake", probe.kind
    path = _config_file(probe, tmp)
    work = tmp / "work"
    work.mkdir()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "all",  # targets before --configfile, which takes every word after it
            "-n",
            "--cores",
            "1",
            "-s",
            str(ROOT / "Snakefile"),
            "--directory",
            str(work),
            "--configfile",
            str(path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT / "workflow")},
    )
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert not (work / "results").exists()
    return proc.stdout + proc.stderr


def _md_cell(text: str) -> str:
    # The checkout's own path varies by machine; the table shows it as {repo}.
    text = text.replace(str(ROOT), "{repo}")
    return text.replace("|", "\\|").replace("\n", " ")


def render_table() -> str:
    rows = ["| # | Kind | Probe | Message holds |", "|---|---|---|---|"]
    for i, p in enumerate(PROBES, 1):
        rows.append(f"| {i} | {p.kind} | {_md_cell(p.probe)} | `{_md_cell(p.expected)}` |")
    return "\n".join(rows)


def _doc_table() -> str:
    text = DOC.read_text(encoding="utf-8")
    match = re.search(re.escape(BEGIN) + r"\n(.*?)\n" + re.escape(END), text, re.S)
    assert match, f"{DOC}: no table between {BEGIN} and {END}"
    return match.group(1)


def test_catalogue_size_and_ids():
    assert len(PROBES) >= 200
    assert len({p.id for p in PROBES}) == len(PROBES)


def test_doc_table_is_the_catalogue():
    assert _doc_table() == render_table(), (
        "docs/bad-input.md and PROBES differ: run `python tests/workflow/test_bad_input.py`"
    )


FAST = [p for p in PROBES if p.kind != "snakemake"]
SLOW = [p for p in PROBES if p.kind == "snakemake"]


@pytest.mark.parametrize("probe", FAST, ids=[p.id for p in FAST])
def test_probe_is_refused_by_name(probe, tmp_path, capsys, monkeypatch):
    message = run_probe(probe, tmp_path, capsys, monkeypatch)
    expected = _fill(probe.expected, tmp_path)
    assert expected in message, f"{expected!r} not in {message!r}"
    assert "Traceback" not in message
    if probe.kind in ("config", "yaml") and probe.text != "<missing>":
        # one line; a file fault names the file
        assert "\n" not in message.strip(), message
        if re.search(r"\bline \d|top level", probe.expected):  # a fault of the file itself
            assert str(tmp_path / f"{probe.id}.yaml") in message, message


@pytest.mark.parametrize(
    "name", ["TOKENIZERS_PARALLELISM", "VLLM_ROCM_USE_AITER", "KEYBOARD_LAYOUT", "PASSES", "PATH_X"]
)
def test_near_miss_variable_names_are_not_taken_for_secrets(name, tmp_path):
    """The secret rule works on whole words: these hold no credential and stay allowed."""
    cfg = copy.deepcopy(_base("local"))
    cfg["cells"][0]["env"] = {name: "1"}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert cbconfig.load(path)["cells"][0]["env"] == {name: "1"}


def test_shipped_configs_pass_the_new_checks():
    """The layout, integer, serve_args, shape and context checks refuse none of the shipped
    configs (the production models' --max-model-len 65536 holds the default grid)."""
    for name in ("config", "local", "gpu-local", "local-vllm"):
        if (ROOT / f"config/{name}.yaml").is_file() and name != "local-vllm":
            cbconfig.load(ROOT / f"config/{name}.yaml")


def test_values_of_a_serve_arg_are_not_options():
    """Negative numbers and plain values after an option are not read as reserved options."""
    assert cbconfig.reserved_serve_option("-1") is None
    assert cbconfig.reserved_serve_option("0.95") is None
    assert cbconfig.reserved_serve_option("--max-model-len") is None
    assert cbconfig.reserved_serve_option("--model-impl") is None
    assert cbconfig.reserved_serve_option("--tensor_parallel_size") == "--tensor-parallel-size"


@pytest.mark.slow
@pytest.mark.parametrize("probe", SLOW, ids=[p.id for p in SLOW])
def test_probe_through_snakemake(probe, tmp_path, capsys, monkeypatch):
    message = run_probe(probe, tmp_path, capsys, monkeypatch)
    assert probe.expected in message, f"{probe.expected!r} not in {message!r}"


if __name__ == "__main__":  # rewrite the table in docs/bad-input.md from PROBES
    text = DOC.read_text(encoding="utf-8")
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    DOC.write_text(f"{head}{BEGIN}\n{render_table()}\n{END}{tail}", encoding="utf-8")
    print(f"wrote {len(PROBES)} probes to {DOC}")
