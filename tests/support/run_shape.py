"""The shape of a finished run, for comparing one tree's run with another's on the same seed.

A run's *shape* is what a redesign must not change: which result files exist, the keys (and
value types) of each JSON result, the columns of each table, the headings and table headers
of the Markdown report, and the values that the seed alone decides (the built model's and
data's bytes, the grid, request and token counts, the untuned arm's GSM8K score). Timings,
tuned picks and anything else a CPU decides from one run to the next are left out.

`python tests/support/run_shape.py RESULTS_DIR OUT.json` writes one; the pipeline test
compares its own run with the one committed from the tree before issue 31's redesign.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
import sys
from pathlib import Path

# Left out of the file list: logs, locks, Snakemake's markers, caches and per-job timings
# (the benchmark files), none of which is a result another stage reads.
SKIP_PARTS = {"logs", ".leases", ".cache", "benchmarks", "__pycache__"}
SKIP_NAMES = {".snakemake_timestamp"}
# Parts of names that change from run to run: lm-eval's time stamps, archive run ids.
STAMP = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}[-:]\d{2}[-:]\d{2}(\.\d+)?")
ARCHIVE_RUN = re.compile(r"^(archive/[^/]+)/[^/]+/")


# Folders of one config's own (its run label's; the question set's count): their place moved
# there on purpose so another config's run leaves them alone; the files in them did not change.
PER_CONFIG = re.compile(r"^(report|plan|gates)/embedded-cpu/|^(assets/gsm8k)/n\d+/")


def _name(rel: str) -> str:
    rel = PER_CONFIG.sub(lambda m: f"{m.group(1) or m.group(2)}/", rel)
    return ARCHIVE_RUN.sub(r"\1/<run>/", STAMP.sub("<time>", rel))


def _files(res: Path) -> list[Path]:
    out = []
    for p in sorted(res.rglob("*")):
        rel = p.relative_to(res)
        # results/README.md is the checkout's tracked guide, not a result: a copy of the
        # workflow without it (the pipeline test's) makes the same results
        if str(rel) == "README.md":
            continue
        if p.is_file() and not SKIP_PARTS & set(rel.parts) and p.name not in SKIP_NAMES:
            out.append(p)
    return out


def _key_paths(value, prefix: str = "") -> set[str]:
    """Every key path of a JSON value with its type; list items are merged under `[]`, and
    dicts keyed by data (batch sizes, hashes, file names) are merged under `{}`."""
    out: set[str] = set()
    if isinstance(value, dict):
        data_keys = value and all(_is_data_key(k) for k in value)
        for k, v in value.items():
            key = "{}" if data_keys else k
            out.add(f"{prefix}.{key}:{type(v).__name__}")
            out |= _key_paths(v, f"{prefix}.{key}")
    elif isinstance(value, list):
        for v in value:
            out.add(f"{prefix}[]:{type(v).__name__}")
            out |= _key_paths(v, f"{prefix}[]")
    return out


def _is_data_key(key: str) -> bool:
    return bool(re.fullmatch(r"[\d.]+|[0-9a-f]{12,}|.*[/=].*", key))


def _markdown_outline(text: str) -> list[str]:
    """Headings and table header rows (cells stripped: padding follows the data), in order."""
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        if line.startswith("#"):
            out.append(line.strip())
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if line.startswith("|") and re.match(r"^\|[\s:|-]+\|$", nxt.strip()):
            out.append(
                "| " + " | ".join(c.strip() for c in line.strip().strip("|").split("|")) + " |"
            )
    return out


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()[:16]


def _seeded_values(res: Path) -> dict:
    """Values the seed decides: built assets' bytes, the served grid with its request and
    token counts, the untuned arm's GSM8K score."""
    vals: dict = {}
    for p in sorted((res / "assets").rglob("*")):
        if (
            p.is_file()
            and p.suffix in {".json", ".jsonl", ".safetensors"}
            and p.name != "meta.json"
        ):
            vals[f"asset {_name(str(p.relative_to(res))).removeprefix('assets/')}"] = _sha(p)
    for bench in sorted(res.glob("*/*/*/serve/*/bench.json")):
        cell = "/".join(bench.relative_to(res).parts[1:3]) + "/" + bench.parent.name
        doc = json.loads(bench.read_text())
        # one entry per distinct point: how many repeats ran is a setting (and, with
        # sequential stopping, an outcome), not part of the shape
        points = []
        for pt in doc.get("points", []):
            points.append(
                {
                    k: pt.get(k)
                    for k in (
                        "isl",
                        "osl",
                        "max_concurrency",
                        "num_prompts",
                        "completed",
                        "total_input_tokens",
                        "total_output_tokens",
                    )
                    if k in pt
                }
            )
        vals[f"serve {cell}"] = [
            dict(t) for t in sorted({tuple(sorted(p.items())) for p in points})
        ]
    for g in sorted(res.glob("*/*/*/gsm8k/untuned.json")):
        cell = "/".join(g.relative_to(res).parts[1:3])
        doc = json.loads(g.read_text())
        vals[f"gsm8k {cell}"] = {
            k: doc.get(k) for k in ("n_samples", "strict_match", "flexible_extract") if k in doc
        }
    return vals


def run_shape(res: Path) -> dict:
    files = _files(res)
    shape: dict = {"files": sorted({_name(str(p.relative_to(res))) for p in files})}
    keys: dict[str, list[str]] = {}
    columns: dict[str, list[str]] = {}
    outline: dict[str, list[str]] = {}
    for p in files:
        rel = _name(str(p.relative_to(res)))
        if p.suffix == ".json" and "lm_eval" not in p.relative_to(res).parts:
            # (lm-eval's own files are left out: their keys are lm-eval's, and its git_hash
            # is null or a string as the working folder is a git checkout or not)
            try:
                doc = json.loads(p.read_text())
            except ValueError:
                continue
            merged = set(keys.get(rel, [])) | _key_paths(doc)
            keys[rel] = sorted(merged)
        elif p.suffix == ".csv":
            with p.open(newline="") as fh:
                columns[rel] = next(csv.reader(fh), [])
        elif p.suffix == ".md" and "report" in p.relative_to(res).parts:
            outline[rel] = _markdown_outline(p.read_text())
    shape["json_keys"] = keys
    shape["csv_columns"] = columns
    shape["markdown"] = outline
    shape["seeded_values"] = _seeded_values(res)
    return shape


def differences(before: dict, after: dict) -> list[str]:
    """Each difference as one line: `section: what` (+ added, - removed, ~ changed)."""
    out = []
    for f in sorted(set(before["files"]) - set(after["files"])):
        out.append(f"files: - {f}")
    for f in sorted(set(after["files"]) - set(before["files"])):
        out.append(f"files: + {f}")
    for section in ("json_keys", "markdown"):
        for name in sorted(set(before[section]) & set(after[section])):
            b, a = before[section][name], after[section][name]
            out += [f"{section} {name}: - {x}" for x in b if x not in a]
            out += [f"{section} {name}: + {x}" for x in a if x not in b]
    for name in sorted(set(before["csv_columns"]) & set(after["csv_columns"])):
        b, a = before["csv_columns"][name], after["csv_columns"][name]
        out += [f"csv_columns {name}: - {x}" for x in b if x not in a]
        out += [f"csv_columns {name}: + {x}" for x in a if x not in b]
    for name in sorted(set(before["seeded_values"]) | set(after["seeded_values"])):
        b, a = before["seeded_values"].get(name), after["seeded_values"].get(name)
        if b != a:
            out.append(f"seeded_values {name}: ~ {b!r} -> {a!r}")
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python tests/support/run_shape.py RESULTS_DIR OUT.json")
    shape = run_shape(Path(sys.argv[1]))
    Path(sys.argv[2]).write_text(json.dumps(shape, indent=1, sort_keys=True) + "\n")
