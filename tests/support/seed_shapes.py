"""Checks that a PR file holds seed 000's tables in the seed's shapes."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def seed_dirs() -> list[Path]:
    """Where seed 000 may be: $CELLBENCH_SEEDS_DIR, a shared/ folder in or beside the tree."""
    env = os.environ.get("CELLBENCH_SEEDS_DIR")
    return [Path(env)] if env else [ROOT / "shared" / "seeds", ROOT.parent / "shared" / "seeds"]


def seed_000() -> str:
    for folder in seed_dirs():
        found = sorted(folder.glob("000_*.txt"))
        if found:
            return found[0].read_text()
    pytest.skip(
        "seed 000 (000_*.txt) not found in "
        + ", ".join(map(str, seed_dirs()))
        + "; set CELLBENCH_SEEDS_DIR to the seeds folder"
    )


def seed_tables(text: str) -> list[dict]:
    """Seed 000's tables (tab-separated lines) with the line above each as its title."""
    tables, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        if "\t" not in lines[i]:
            i += 1
            continue
        title = next(t.strip() for t in reversed(lines[:i]) if t.strip())
        rows = []
        while i < len(lines) and "\t" in lines[i]:
            rows.append([c.strip() for c in lines[i].split("\t")])
            i += 1
        tables.append({"title": title, "header": rows[0], "rows": rows[1:]})
    return tables


def markdown_tables(text: str) -> list[dict]:
    """The pipe tables of a Markdown file, each with the heading above it as its title."""
    tables, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].startswith("|"):
            i += 1
            continue
        title = next(t.lstrip("#").strip() for t in reversed(lines[:i]) if t.startswith("#"))
        block = []
        while i < len(lines) and lines[i].startswith("|"):
            block.append([c.strip() for c in lines[i].strip().strip("|").split("|")])
            i += 1
        assert set("".join(block[1])) <= set("- :"), f"no separator row under {block[0]}"
        tables.append({"title": title, "header": block[0], "rows": block[2:]})
    return tables


def seed_shapes() -> tuple[list[dict], dict]:
    """Seed 000's latency tables of its first model (the three metric tables), and its
    first GSM8K table."""
    tables = seed_tables(seed_000())
    latency = [t for t in tables if t["header"][0] == "ISL-OSL"]
    gsm8k = [t for t in tables if t["header"][0] == "Metric" and "strict" in t["rows"][0][0]]
    assert latency and gsm8k, "seed 000 no longer holds its tables"
    titles = list(dict.fromkeys(t["title"] for t in latency))
    return latency[: len(titles)], gsm8k[0]


def label_form(label: str) -> str:
    """A row label's form: digits become 9 (512-512 and 16384-2048 have the same form)."""
    return re.sub(r"\d+", "9", label)


def value_form(value: str) -> str:
    """A value's form without our spread (" ± x"): digits become 9."""
    return re.sub(r"\d+", "9", value.split(" ± ")[0])


OUR_TABLES = ("Verdicts, tuned against untuned", "Repeats per point")


def assert_seed_shapes(text: str, sections: int) -> None:
    """Every cell section of a PR file holds seed 000's tables, in the seed's order, with its
    titles, header rows, row-label forms, value forms, the Average row last, GSM8K's rows."""
    seed_latency, seed_gsm8k = seed_shapes()
    # Tables of ours after the seed's (per-point verdicts, repeats used): not the seed's shapes.
    got = [t for t in markdown_tables(text) if t["title"] not in OUR_TABLES]
    per_cell = len(seed_latency) + 1
    assert len(got) == sections * per_cell, [t["title"] for t in got]
    for k in range(sections):
        section = got[k * per_cell : (k + 1) * per_cell]
        for mine, seed in zip(section, seed_latency, strict=False):
            assert mine["title"] == seed["title"]
            assert mine["header"] == seed["header"]
            assert mine["rows"][-1][0] == seed["rows"][-1][0] == "Average"
            seed_forms = {label_form(r[0]) for r in seed["rows"][:-1]}
            assert {label_form(r[0]) for r in mine["rows"][:-1]} <= seed_forms
            for row in mine["rows"]:
                assert len(row) == len(seed["header"])
                assert {value_form(v) for v in row[1:]} <= {
                    value_form(v) for v in seed["rows"][0][1:]
                }
        gsm = section[-1]
        assert gsm["header"] == seed_gsm8k["header"]
        assert [r[0] for r in gsm["rows"]] == [r[0] for r in seed_gsm8k["rows"]]
        seed_values = {value_form(v) for r in seed_gsm8k["rows"] for v in r[1:]}
        assert {value_form(v) for r in gsm["rows"] for v in r[1:]} <= seed_values
