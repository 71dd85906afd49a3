"""Comparisons with archived runs: a cell now against its previous archived run (the report's
sections) and two archived runs against each other (``cellbench archive diff``), both through
``cellbench.stats.comparison``. Reads the archive through ``cellbench.results.archived``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from cellbench.contracts.result_file import ResultError
from cellbench.report import comparison_tables
from cellbench.report.frames import cell_frames, digest_of, load_inputs
from cellbench.results.archived import (
    ArchiveError,
    previous_run,
    read_manifest,
    resolve,
    server_versions,
    stage_results,
)
from cellbench.stats import comparison


def frames_of(root: Path, cells: Iterable[str]):
    """The serve, GSM8K and tune frames of ``cells`` under ``root`` (a run's results folder or
    an archived run's folder)."""
    files = [p for cell in cells for p in stage_results(root / cell) if p.is_file()]
    return cell_frames(load_inputs(files, root))


ARM_ORDER = ("untuned", "tuned")


def compare_cell(
    root_a: Path, root_b: Path, cell: str, name_a: str, name_b: str, **options
) -> list[str]:
    """Markdown for one cell held under two result roots (an archived run's folder or
    results/): per arm both hold, serving metrics and GSM8K, A against B, through
    ``comparison_tables.render`` (``options`` go to it, e.g. ``min_change_pct``)."""
    serve_a, gsm_a, _ = frames_of(root_a, [cell])
    serve_b, gsm_b, _ = frames_of(root_b, [cell])

    def arms(serve, gsm) -> set[str]:
        return set(serve.get("arm", [])) | set(gsm.get("arm", []))

    common = arms(serve_a, gsm_a) & arms(serve_b, gsm_b)
    lines: list[str] = []
    for arm in sorted(common, key=lambda a: (ARM_ORDER.index(a) if a in ARM_ORDER else 9, a)):

        def side(serve, gsm, arm=arm):
            rows = serve[serve.arm == arm] if len(serve) else None
            g = gsm[gsm.arm == arm] if len(gsm) else gsm
            return (rows if rows is not None and len(rows) else None), (
                g.iloc[0].to_dict() if len(g) else None
            )

        sa, ga = side(serve_a, gsm_a)
        sb, gb = side(serve_b, gsm_b)
        lines += comparison_tables.render(
            f"{arm} arm: {name_a} (A) vs {name_b} (B)", sa, sb, ga, gb, **options
        )
    if not lines:
        lines = ["(no arm measured in both)", ""]
    return lines


def diff_runs(archive_root: Path, ref_a: str, ref_b: str, **options) -> str:
    """Markdown comparison of the cells two archived runs both hold. Raises ArchiveError for
    an unknown run or runs with no cell in common."""
    run_a, run_b = resolve(archive_root, ref_a), resolve(archive_root, ref_b)
    man_a, man_b = read_manifest(run_a.path) or {}, read_manifest(run_b.path) or {}
    common = sorted(set(man_a.get("cells", [])) & set(man_b.get("cells", [])))
    if not common:
        raise ArchiveError(
            f"runs {run_a.ref} and {run_b.ref} hold no cell in common "
            f"(A: {', '.join(man_a.get('cells', [])) or 'none'}; "
            f"B: {', '.join(man_b.get('cells', [])) or 'none'})"
        )
    lines = [f"# {run_a.ref} (A) vs {run_b.ref} (B)", ""]
    for cell in common:
        lines += [f"## {cell}", ""]
        lines += compare_cell(run_a.path, run_b.path, cell, run_a.ref, run_b.ref, **options)
    lines += [comparison.footer(**options), ""]
    return "\n".join(lines)


def _served_line(before: dict[str, str | None], now: dict[str, str | None]) -> str:
    """Which vLLM served each arm before and now, as the servers answered GET /version."""

    def said(versions: dict[str, str | None]) -> str:
        found = sorted({v for v in versions.values() if v})
        return "vLLM " + " / ".join(found) if found else "a server that named no version"

    return (
        f"Served by {said(before)} (previous) and {said(now)} (now), as each arm's running "
        "server answered `GET /version`."
    )


def previous_run_sections(
    archive_root: Path, current_results_dir: Path, cells: Iterable[str], **options
) -> list[str]:
    """Report sections, one per cell of ``cells`` that has a previous archived run with other
    results: that run (A) against the current results (B), per arm, labelled "image bump"
    when the image digest changed and "re-measured, same digest" when it did not."""
    archive_root, current = Path(archive_root), Path(current_results_dir)
    if not archive_root.is_dir():
        return []
    lines: list[str] = []
    for cell in sorted(cells):
        run = previous_run(archive_root, current, cell)
        if run is None:
            continue
        manifest = read_manifest(run.path) or {}
        image = cell.split("/")[0]
        serve_now, _, _ = frames_of(current, [cell])
        try:
            serve_prev, _, _ = frames_of(run.path, [cell])
        except ResultError as exc:
            # An archived copy that fails its check spoils only its own comparison.
            lines += [
                f"## {cell}: previous run {run.ref} not compared",
                "",
                f"Its archived results fail their check ({exc}); "
                f"`cellbench archive verify {run.ref}` names what changed.",
                "",
            ]
            continue
        old = digest_of(serve_prev, cell, manifest.get("images", {}).get(image))
        new = digest_of(serve_now, cell, None)
        what = "re-measured, same digest" if old == new else "image bump"
        lines += [
            f"## {cell}: previous run {run.ref} (digest {old}) vs now (digest {new})",
            "",
            f"{what.capitalize()}: A is the run archived as `{run.ref}` "
            f"(created {manifest.get('created', '?')}), B the results in this report.",
            "",
            _served_line(server_versions(run.path, cell), server_versions(current, cell)),
            "",
        ]
        lines += compare_cell(run.path, current, cell, "previous", "now", **options)
        lines.append("")
    return lines
