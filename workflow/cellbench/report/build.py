"""Tidy tables over every cell and a PR-ready Markdown report.

Inputs are the stage outputs (their schemas are the interface): `tune/summary.json`,
`serve/{arm}/bench.json` and `gsm8k/{arm}.json` per cell. Outputs: `serve.csv` (one row per
cell, arm, repeat and grid point), `gsm8k.csv` (one row per cell and arm), `tune.csv` (one row
per cell and batch size) and `report.md` in the seeds' shapes (TTFT, TPOT, E2E tables by
ISL-OSL with arms as columns and an Average row; GSM8K strict-match and flexible-extract),
followed by diff sections (untuned vs tuned; image A vs image B) that tell change from noise
(`cellbench.stats.comparison`, the one comparison also used for a run against an archived run).

Every input goes through `cellbench.results.loaders` (schema, invariants, recorded checksum); a bad
one stops the report with a message naming the file, the field and the job to rerun, and the
previous report stays in place: the new one is built in a temporary folder and swapped in
whole, `INDEX.json` (the rule's output) last.

Image comparisons (`results/compare/A-vs-B/MODEL/tpN-epM/bench.json`, serve.compare_images),
when given, are what the image-vs-image section of the tuned arm uses ("interleaved on one
host"); otherwise, and for the untuned arm, it compares the separately run cells ("separate
runs"). Their points go to `compare.csv`.

    python -m cellbench.report --results results --out-dir results/report \
        [--min-change-pct 2] [FILES...]
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from cellbench.common import atomicio
from cellbench.common.gitstate import TREE_FILE, git_state
from cellbench.common.paths import REPO_DIR
from cellbench.contracts import result_file
from cellbench.contracts.result_file import Result, ResultError
from cellbench.gates import check as gates_mod
from cellbench.report import capacity as report_capacity
from cellbench.report import comparison_tables, percentile_claims, plots, pr_markdown, tidy
from cellbench.report.frames import (
    arm_columns,
    arms_cannot_differ,
    cell_frames,
    comparison_frame,
    gsm8k_side,
    load_inputs,
    select,
)
from cellbench.report.previous import previous_run_sections
from cellbench.report.priors import archive_priors
from cellbench.report.sections import (
    NO_TRITON_MOE_NOTE,
    cost_section,
    gsm8k_table,
    image_sections,
    latency_tables,
    moe_config_lines,
    observed_lines,
    parallelism_note,
    served_lines,
    tune_table,
)
from cellbench.results import whole_sets
from cellbench.stats import comparison
from cellbench.stats import core as stats


def _one(serve: pd.DataFrame, column: str) -> str | None:
    """The single value ``column`` holds over every serve row, or None (absent, or several)."""
    if column not in serve or serve[column].isna().any():
        return None
    values = set(serve[column])
    return values.pop() if len(values) == 1 else None


def local_banner(serve: pd.DataFrame, tune: pd.DataFrame, cells: list[str]) -> list[str]:
    """The local runtime's banner. What served and on which device is read from each arm's
    bench.json (the server's command line; its log's device, else its ``--device``); what the
    model is, from the recipe file the assets stage left in its folder (``model_origin``).
    A fact the results do not hold is said to be unrecorded, not guessed from the config."""
    program, device = _one(serve, "server_program"), _one(serve, "server_device")
    built, kind = _one(serve, "model_built_by"), _one(serve, "model_kind")
    if built == "cellbench.assets":
        model = f"A random-weight {kind or 'Qwen3-MoE'} model built by the workflow"
        random_note = " GSM8K scores of a random model are near zero by design."
    else:
        model = "A model whose origin the results do not record"
        random_note = ""
    pipeline_only = (
        "These figures measure this pipeline on this machine, not any GPU or real model."
        if built == "cellbench.assets"
        else ""
    )
    if program == "vllm" and device == "cpu" and cells:
        if all(arms_cannot_differ(serve, c) for c in cells):
            return [
                "> **Embedded default, served by vLLM on the CPU.** "
                f"{model}, served by vLLM's CPU build (the servers' command lines and logs), "
                "whose MoE runs a CPU backend rather than a Triton kernel: neither arm's server "
                "reads fused-MoE configs, so the arms cannot differ (each cell says so instead "
                f"of comparing them). {pipeline_only}{random_note}",
                "",
            ]
    served = (
        f"served by `{program}` on {device}"
        if program and device
        else "served by a program or on a device the results do not record"
    )
    if len(tune) and not tune["interpreter"].fillna(True).any():
        # Every cell tuned with compiled Triton: the local runtime on a GPU (config/gpu-local.yaml).
        devices = ", ".join(sorted(set(tune["device_name"].dropna())))
        return [
            f"> **Local runtime on a GPU ({devices}).** {model}, {served}"
            + (
                " with the project's Triton fused-MoE kernel (compiled) as its experts"
                if program == "transformers serve"
                else ""
            )
            + "; the kernel tuned on the same GPU. The tuned arm's server loads the tuned "
            "configs (each cell's *Fused-MoE config* line shows what each server's log said)."
            + (" Serving overheads are transformers', not vLLM's." if program != "vllm" else "")
            + random_note,
            "",
        ]
    interpreted = program == "transformers serve" and device == "cpu"
    tuned_interp = bool(len(tune)) and bool(tune["interpreter"].fillna(False).all())
    text = f"> **Embedded default.** {model}, {served}" + (
        " with the project's Triton fused-MoE kernel as its experts, run by the Triton interpreter."
        if interpreted
        else "."
    )
    text += " The kernel was tuned under the Triton interpreter." if tuned_interp else ""
    text += (
        " The tuned arm's server loads the tuned configs (each cell's *Fused-MoE config* line "
        "shows what each server's log said)"
        + (", so the arms differ for real, but in interpreter time." if interpreted else ".")
    )
    return [" ".join(f"{text} {pipeline_only}{random_note}".split()), ""]


def render(
    serve: pd.DataFrame,
    gsm: pd.DataFrame,
    tune: pd.DataFrame,
    runtime: str,
    compare: pd.DataFrame | None = None,
    min_change_pct: float = stats.DEFAULT_MIN_CHANGE_PCT,
    previous: list[str] | None = None,
    gates: dict[str, dict] | None = None,
    figures: dict[str, list[tuple[str, str]]] | None = None,
    run: list[str] | None = None,
    claims: pd.DataFrame | None = None,
    priors: dict[str, dict] | None = None,
    capacity: dict[str, list[str]] | None = None,
) -> str:
    """report.md; ``priors``: per cell, earlier runs' noise components pooled into its
    untuned-vs-tuned verdicts (``report.priors.archive_priors``); ``previous``: sections
    comparing cells with their previous archived run
    (``previous.previous_run_sections``), placed after the cells' own sections; ``gates``: each
    cell's gate.json (``cellbench.gates.check``), shown under its GSM8K table; ``figures``: per
    cell,
    (name, path relative to report.md) of its plots (``cellbench.report.plots``), linked at its
    end; ``claims``: the percentile claims (``percentile_claims.claims_frame``)."""
    cells = sorted(
        set(serve.get("cell", [])) | set(gsm.get("cell", [])) | set(tune.get("cell", []))
    )
    lines = ["# cellbench report", "", *(run or [])]
    if runtime == "local":
        lines += local_banner(serve, tune, cells)
    for cell in cells:
        lines += [f"## {cell}", ""]
        digests = sorted(set(serve[serve.cell == cell].image_digest.dropna())) if len(serve) else []
        if digests:
            lines += [f"Image: `{', '.join(digests)}`", ""]
        lines += served_lines(serve, cell)
        lines += parallelism_note(serve, cell)
        lines += moe_config_lines(serve, cell)
        if len(tune):
            lines.append(tune_table(tune, cell))
        if len(serve) and (serve.cell == cell).any():
            lines += latency_tables(serve, cell)
            lines += observed_lines(serve, cell)
        lines += percentile_claims.section_lines(claims, cell, labels=arm_columns(serve, cell))
        lines += (capacity or {}).get(cell, [])  # serve.sla's search (report.capacity)
        if len(gsm) and (gsm.cell == cell).any():
            lines.append(gsm8k_table(gsm, cell, arm_columns(serve, cell)))
        lines += gates_mod.report_lines((gates or {}).get(cell))
        if len(serve) and {"untuned", "tuned"} <= set(serve[serve.cell == cell].arm):
            if arms_cannot_differ(serve, cell):
                # No serving verdicts; GSM8K still paired: two runs of the same code (A/A).
                lines += comparison_tables.render(
                    "#### Untuned (A) vs tuned (B)",
                    None,
                    None,
                    gsm8k_side(gsm, cell=cell, arm="untuned"),
                    gsm8k_side(gsm, cell=cell, arm="tuned"),
                    note=NO_TRITON_MOE_NOTE,
                    min_change_pct=min_change_pct,
                )
                lines += comparison_tables.render_repeats(
                    select(serve, cell=cell, arm="untuned"), select(serve, cell=cell, arm="tuned")
                )
            else:
                lines += comparison_tables.render(
                    "#### Untuned (A) vs tuned (B)",
                    select(serve, cell=cell, arm="untuned"),
                    select(serve, cell=cell, arm="tuned"),
                    gsm8k_side(gsm, cell=cell, arm="untuned"),
                    gsm8k_side(gsm, cell=cell, arm="tuned"),
                    min_change_pct=min_change_pct,
                    priors=(priors or {}).get(cell),
                )
        lines += figure_lines((figures or {}).get(cell, []))
    lines += previous or []
    lines += image_sections(serve, compare, gsm, min_change_pct)
    lines += ["", comparison.footer(min_change_pct), ""]
    return "\n".join(lines)


def _values(frame: pd.DataFrame, column: str) -> str:
    if column not in frame:
        return "n/a"
    found = sorted({v for v in frame[column].dropna().tolist()}, key=str)
    return ", ".join(str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)
                     for v in found) or "n/a"  # fmt: skip


def run_lines(
    serve: pd.DataFrame,
    tune: pd.DataFrame,
    runtime: str,
    min_change_pct: float,
    written: str,
    git: dict,
) -> list[str]:
    """What a reader needs to judge the numbers: when the report was written, from which
    commit, and the settings the measurements ran with (as the result files record them)."""
    commit = git.get("commit") or f"unknown ({git.get('reason') or 'not a git checkout'})"
    if git.get("source") == TREE_FILE:
        commit += f" (from the {TREE_FILE} stamped into this copied tree)"
    if git.get("dirty"):
        commit += " (with uncommitted changes)"
    lines = ["## Run", "", f"- Written {written} UTC from commit `{commit}`; runtime {runtime}."]
    if len(serve):
        grid = sorted({(int(i), int(o)) for i, o in zip(serve.isl, serve.osl, strict=True)})
        repeats = serve.groupby(["cell", "arm", "isl", "osl"])["repeat"].nunique()
        low, high = int(repeats.min()), int(repeats.max())
        span = str(low) if low == high else f"{low}-{high}"
        starts_ = serve.assign(start=serve["start"].fillna(0) if "start" in serve else 0)
        per_start = starts_.groupby(["cell", "arm", "isl", "osl"])["start"].nunique()
        s_low, s_high = int(per_start.min()), int(per_start.max())
        s_span = str(s_low) if s_low == s_high else f"{s_low}-{s_high}"
        lines.append(
            f"- Serving: ISL-OSL {', '.join(f'{i}-{o}' for i, o in grid)}; concurrency "
            f"{_values(serve, 'max_concurrency')}; {_values(serve, 'num_prompts')} prompts per "
            f"point; {s_span} server start{'s' if s_high > 1 else ''} and {span} repeats in all "
            "per point and arm"
            + (
                f" (sequential: starts stop once a point's answer is known, at most "
                f"{_values(serve, 'starts_cap')}; see *stopped*)."
                if "starts_cap" in serve and serve["starts_cap"].notna().any()
                else "."
            )
        )
    if len(tune):
        lines.append(
            f"- Tuner: backend {_values(tune, 'backend')}, mode {_values(tune, 'mode')}, batch "
            f"sizes {_values(tune, 'batch_size')}, device {_values(tune, 'device_name')}."
        )
    lines += [
        f"- Equivalence margin {min_change_pct:g}%: a change inside it is not worth calling; "
        "every verdict is better, worse, equivalent or inconclusive (with what it could have "
        "seen).",
        "",
    ]
    return lines


def figure_lines(figures: list[tuple[str, str]]) -> list[str]:
    """Markdown image links to a cell's plots (PNG; the SVG lies beside each)."""
    if not figures:
        return []
    lines = ["#### Figures", ""]
    for name, rel in figures:
        if rel.startswith(MISSING):  # said, not linked: a link to nothing breaks --report
            lines += [f"Figure `{name}` is missing: {rel.removeprefix(MISSING)}", ""]
        else:
            lines += [f"![{name}]({rel})", ""]
    return lines


MISSING = "missing:"


PLOTS_FOLDER = "plots"
PR_FOLDER = "pr"  # one PR-ready Markdown file per model (cellbench.report.pr_markdown)


def cell_figures(out_dir: Path, cells: Iterable[str]) -> dict[str, list[tuple[str, str]]]:
    """Per cell, the plots that exist under ``out_dir/plots`` (drawn by the plots jobs before
    the report runs), as (name, path relative to report.md)."""

    found: dict[str, list[tuple[str, str]]] = {}
    for cell in cells:
        drawn = (out_dir / PLOTS_FOLDER / cell).is_dir()  # its plots job has run
        for name, paths in plots.report_relative(cell).items():
            if (out_dir / paths["png"]).is_file():
                found.setdefault(cell, []).append((name, str(paths["png"])))
            elif drawn and name != "bump":  # bump is drawn only for a changed cell
                rebuild = f"snakemake --cores 2 {out_dir / paths['png']}"
                found.setdefault(cell, []).append((name, f"{MISSING}rebuild it: `{rebuild}`"))
    return found


def _carry_plots(out_dir: Path, staging: Path) -> Path | None:
    """Move the plots folder (other jobs' outputs) from the current report into the new one,
    so that swapping the report in keeps them; returns where it came from, for undoing."""
    source = out_dir / PLOTS_FOLDER
    if not source.is_dir():
        return None
    source.rename(staging / PLOTS_FOLDER)
    return source


INDEX_NAME = "INDEX.json"


@dataclass(frozen=True)
class _Frames:
    """The report's tables of one set of checked results."""

    serve: pd.DataFrame
    gsm: pd.DataFrame
    tune: pd.DataFrame
    compare: pd.DataFrame
    claims: pd.DataFrame

    @classmethod
    def of(cls, loaded: list[Result], latency_bounds: dict | None) -> _Frames:
        serve, gsm, tune = cell_frames(loaded)
        claims = percentile_claims.claims_frame(loaded, latency_bounds)
        return cls(serve, gsm, tune, comparison_frame(loaded), claims)

    @property
    def cells(self) -> set[str]:
        return (
            set(self.serve.get("cell", []))
            | set(self.gsm.get("cell", []))
            | set(self.tune.get("cell", []))
        )

    def tables(self, latency_bounds: dict | None) -> list[tuple[str, pd.DataFrame]]:
        """The CSV tables written beside report.md: name -> frame."""
        tables = [("serve", self.serve), ("gsm8k", self.gsm), ("tune", self.tune)]
        if len(self.compare):
            tables.append(("compare", self.compare))
        if latency_bounds:
            tables.append((percentile_claims.CSV_NAME.removesuffix(".csv"), self.claims))
        return tables


def _report_text(
    frames: _Frames,
    runtime: str,
    min_change_pct: float,
    previous: list[str] | None,
    gates: dict[str, dict],
    figures: dict[str, list[tuple[str, str]]],
    priors: dict[str, dict] | None,
    capacity: dict[str, list[str]],
) -> str:
    """report.md without its cost section."""
    written = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S")
    git = git_state(REPO_DIR)
    run_info = run_lines(frames.serve, frames.tune, runtime, min_change_pct, written, git)
    return render(
        frames.serve,
        frames.gsm,
        frames.tune,
        runtime,
        frames.compare,
        min_change_pct,
        previous,
        gates,
        figures,
        run_info,
        frames.claims,
        priors,
        capacity,
    )


def _index(
    staging: Path, pr_files: list[Path], loaded: list[Result], latency_bounds: dict | None
) -> dict[str, Any]:
    """INDEX.json: the files written (with their sha256) and the inputs read."""
    return {
        "kind": "report_index",
        "written": datetime.now(UTC).isoformat(timespec="seconds"),
        "files": {
            **{p.name: atomicio.sha256_file(p) for p in sorted(staging.iterdir()) if p.is_file()},
            **{f"{PR_FOLDER}/{p.name}": atomicio.sha256_file(p) for p in pr_files},
        },
        "inputs": [r.index_entry() for r in loaded]
        + percentile_claims.index_entries(loaded, latency_bounds),
    }


def write_report(
    files: Iterable[str | Path],
    out_dir: str | Path,
    results: str | Path = "results",
    runtime: str = "docker",
    min_change_pct: float = stats.DEFAULT_MIN_CHANGE_PCT,
    archive_root: str | Path | None = None,
    run: str = tidy.LIVE_RUN,
    digests: dict[str, str] | None = None,
    latency_bounds: dict | None = None,
    run_label: str | None = None,
) -> Path:
    """Check every input, build the tables and report.md in a temporary folder beside
    ``out_dir``, and put it in ``out_dir``'s place only once whole, with ``INDEX.json`` (the
    files written, the inputs read and their checksums) written last. A bad input raises
    ``ResultError`` before anything of ``out_dir`` is touched. ``min_change_pct``: the smallest
    serving change a verdict calls better or worse (``report.min_change_pct``). With
    ``archive_root``, each cell whose results differ from its previous archived run gets a
    previous-vs-now section (``previous.previous_run_sections``). ``tidy.parquet`` and
    ``tidy.csv`` (``cellbench.report.tidy``) carry ``run`` (``live``, or an archived run's
    LABEL/RUN) and take a cell's digest from ``digests`` (image -> digest) when its serve
    results do not record one. Plots already under ``out_dir/plots`` (the plots jobs') are
    linked from report.md and kept. ``latency_bounds`` (``report.latency_bounds``): each
    point's percentile claims, from the arms' per-request files (``percentile_claims``).
    ``run_label``: the config whose plan estimate the cost section reads."""
    if not min_change_pct > 0:
        raise ValueError(f"min_change_pct must be a number > 0, got {min_change_pct}")
    loaded = load_inputs(files, results)
    frames = _Frames.of(loaded, latency_bounds)
    out_dir = Path(out_dir)
    long_table = tidy.tidy_frame(loaded, run, digests)
    figures = cell_figures(out_dir, sorted(frames.cells))
    staging = atomicio.staging_dir(out_dir.parent, f".{out_dir.name}.")
    carried = None
    try:
        for name, df in frames.tables(latency_bounds):
            atomicio.write_text(staging / f"{name}.csv", df.to_csv(index=False))
        tidy.write_tidy(long_table, staging)
        report_capacity.write(loaded, staging, min_change_pct)  # capacity.csv and figures
        previous, priors = None, None
        if archive_root is not None:
            previous = previous_run_sections(
                archive_root, results, frames.cells, min_change_pct=min_change_pct
            )
            priors = archive_priors(archive_root, Path(results), frames.cells)
        gates = {r.data["cell"]: r.data for r in loaded if r.kind == result_file.GATE}
        capacity = {
            c: report_capacity.section_lines(
                loaded, c, min_change_pct, same_code=arms_cannot_differ(frames.serve, c)
            )
            for c in frames.cells
        }
        text = _report_text(
            frames, runtime, min_change_pct, previous, gates, figures, priors, capacity
        )
        text += "\n".join(["", *cost_section(Path(results), sorted(frames.cells), run_label)])
        atomicio.write_text(staging / "report.md", text)

        # One PR-ready file per model, its plot links checked against out_dir's plots.
        pr_files = pr_markdown.write_all(
            loaded,
            staging / PR_FOLDER,
            report_dir=out_dir,
            claims=frames.claims,
            min_change_pct=min_change_pct,
        )
        index = _index(staging, pr_files, loaded, latency_bounds)
        atomicio.write_json(staging / INDEX_NAME, index)  # last: the rule's output
        carried = _carry_plots(out_dir, staging)
        atomicio.replace_dir(staging, out_dir)
    except BaseException:
        if carried is not None and (staging / PLOTS_FOLDER).is_dir():
            (staging / PLOTS_FOLDER).rename(carried)  # the plots jobs' files go back
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir / "report.md"


def _kept(out_dir: Path) -> str:
    report = out_dir / "report.md"
    if report.is_file():
        when = datetime.fromtimestamp(report.stat().st_mtime, UTC).isoformat(timespec="seconds")
        return f"the previous report was kept: {report} (written {when})"
    return f"no report was written, and there was none before in {out_dir}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cellbench.report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--results", default="results")
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--runtime", default="docker", choices=["docker", "local"])
    parser.add_argument(
        "--min-change-pct",
        type=float,
        default=stats.DEFAULT_MIN_CHANGE_PCT,
        help="the equivalence margin in %% (report.min_change_pct)",
    )
    parser.add_argument(
        "--archive-root", help="compare each cell with its previous run archived here"
    )
    parser.add_argument(
        "--latency-bounds",
        default="null",
        help="report.latency_bounds as JSON: check each point's percentile claims",
    )
    parser.add_argument(
        "--run-label", help="the config's run_label: its plan estimate is set against the walls"
    )
    parser.add_argument("files", nargs="+")
    args = parser.parse_args(argv)
    if not args.min_change_pct > 0:  # also refuses nan
        parser.error(f"--min-change-pct must be a number > 0, got {args.min_change_pct}")
    try:
        bounds = percentile_claims.parse_bounds(args.latency_bounds)
    except ValueError as exc:
        parser.error(str(exc))
    out_dir = Path(args.out_dir)
    try:
        # The whole-run report refuses a cell with a stage result missing, naming each.
        whole_sets.check_whole_files(args.files)
        path = write_report(
            args.files,
            out_dir,
            args.results,
            args.runtime,
            args.min_change_pct,
            archive_root=args.archive_root,
            latency_bounds=bounds,
            run_label=args.run_label,
        )
    except ResultError as exc:
        print(f"cellbench report: error: {exc}", file=sys.stderr)
        print(f"cellbench report: {_kept(out_dir)}", file=sys.stderr)
        return 1
    except BaseException:
        print(f"cellbench report: failed; {_kept(out_dir)}", file=sys.stderr)
        raise
    print(f"report written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
