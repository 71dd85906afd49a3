"""GSM8K gates: the accuracy a cell must keep for its speed numbers to count.

Gates are set per model in the config (``models.NAME.gsm8k_gate``):

* ``floor``: each arm's score (``metric``, strict-match by default) must reach it;
* ``max_drop``: the tuned arm may score below the untuned one by at most this much (absolute,
  e.g. 0.02 = two points) *when the drop is beyond noise*: the two arms answered the same
  questions, so the drop is judged by the report's own GSM8K comparison
  (``comparison.compare_gsm8k``: McNemar's mid-p on the questions paired by document, an
  unpaired test only when they cannot be paired); a drop it calls inconclusive never fails the
  gate.

``evaluate`` writes one observation per cell, ``gate.json`` (pass or fail, with the numbers),
which the report shows; ``check`` reads every cell's gate file at the end of the run and fails
the run, naming model, arm, metric, value and gate, unless ``gates.on_failure`` is
``continue``. A failed gate destroys nothing: the cell's results, the report and the archive
stay.

    python -m cellbench.gates evaluate --cell ID --model NAME --gate JSON \
        --untuned gsm8k/untuned.json --tuned gsm8k/tuned.json --out CELL/gate.json
    python -m cellbench.gates check --on-failure fail|continue --out SUMMARY.json GATE...
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cellbench.common import atomicio
from cellbench.contracts import result_file
from cellbench.contracts.result_file import ResultError
from cellbench.results.loaders import load as load_result
from cellbench.stats import comparison

METRICS = ("strict_match", "flexible_extract")


def evaluate(
    cell: str,
    model: str,
    gate: dict[str, Any] | None,
    untuned: dict[str, Any] | None,
    tuned: dict[str, Any] | None,
) -> dict[str, Any]:
    """The gate's checks on one cell's two GSM8K results (either may be None: not run)."""
    gate = dict(gate or {})
    metric = gate.get("metric", "strict_match")
    checks: list[dict[str, Any]] = []
    arms = {"untuned": untuned, "tuned": tuned}
    floor = gate.get("floor")
    if floor is not None:
        for arm, result in arms.items():
            if result is None:
                continue
            value = float(result[metric])
            checks.append(
                {
                    "check": "floor",
                    "arm": arm,
                    "metric": metric,
                    "value": value,
                    "limit": float(floor),
                    "passed": value >= float(floor),
                    "n_samples": result["n_samples"],
                }
            )
    max_drop = gate.get("max_drop")
    if max_drop is not None and untuned is not None and tuned is not None:
        # The report's own GSM8K comparison: paired by question where the runs pair.
        (test,) = [
            row
            for row in comparison.compare_gsm8k(untuned, tuned)
            if comparison.GSM8K_FIELD[row["metric"]] == metric
        ]
        drop = float(untuned[metric]) - float(tuned[metric])
        beyond_noise = test["verdict"] == "worse"
        checks.append(
            {
                "check": "max_drop",
                "arm": "tuned",
                "metric": metric,
                "value": drop,
                "limit": float(max_drop),
                "untuned": float(untuned[metric]),
                "tuned": float(tuned[metric]),
                "paired_by": test["paired_by"],
                "paired_n": test.get("n", 0),
                "fixed": test.get("fixed", 0),
                "broken": test.get("broken", 0),
                "p": test["p_mid"] if test["paired_by"] else test["p"],
                "verdict": test["verdict"],
                "passed": not (beyond_noise and drop > float(max_drop)),
            }
        )
    return {
        "kind": "gate",
        "cell": cell,
        "model": model,
        "metric": metric,
        "gate": gate or None,
        "checks": checks,
        # No time stamp: the same results and gate give the same file, so a re-judged run
        # with an unchanged verdict is not archived twice.
        "passed": all(c["passed"] for c in checks),
    }


def describe(check: dict[str, Any], model: str, cell: str) -> str:
    """One line a user can act on: model, arm, metric, value and the gate it failed."""
    where = f"model {model} (cell {cell}), arm {check['arm']}"
    if check["check"] == "floor":
        return (
            f"{where}: {check['metric']} = {check['value']:.4f} on {check['n_samples']} "
            f"questions, below the gate's floor {check['limit']:.4f}"
        )
    if check["paired_by"]:
        how = (
            f"paired on {check['paired_n']} questions: {check['fixed']} fixed, "
            f"{check['broken']} broken, mid-p {check['p']:.3g}"
        )
    else:
        how = f"unpaired (questions could not be matched), p {check['p']:.3g}"
    return (
        f"{where}: {check['metric']} dropped {check['value']:.4f} against the untuned arm "
        f"({check['untuned']:.4f} -> {check['tuned']:.4f}; {how}, {check['verdict']}), "
        f"beyond the gate's max_drop {check['limit']:.4f}"
    )


def report_lines(gate: dict[str, Any] | None) -> list[str]:
    """The cell's gate in the report: what was checked and, for a failure, the numbers."""
    if gate is None or not gate.get("checks"):
        return []
    if gate["passed"]:
        parts = []
        for c in gate["checks"]:
            if c["check"] == "floor":
                parts.append(f"{c['arm']} {c['value']:.4f} >= floor {c['limit']:.4f}")
            else:
                parts.append(
                    f"tuned vs untuned {0.0 - c['value'] or 0.0:+.4f} ({c['verdict']}; max_drop "
                    f"{c['limit']:.4f})"
                )
        return [f"GSM8K gate ({gate['metric']}): **passed**: " + "; ".join(parts) + ".", ""]
    failed = [describe(c, gate["model"], gate["cell"]) for c in gate["checks"] if not c["passed"]]
    return [
        f"> **GSM8K gate failed ({gate['metric']}).** This cell's speed numbers come with an "
        "accuracy that does not meet its gate:",
        *[f"> - {line}" for line in failed],
        "",
    ]


def check(gate_files: list[Path], results: Path | None = None) -> tuple[list[str], list[dict]]:
    """Failures over every cell's gate file (lines to print), and the gates read."""
    gates = [load_result(path, results).data for path in gate_files]
    failures = [
        describe(c, g["model"], g["cell"]) for g in gates for c in g["checks"] if not c["passed"]
    ]
    return failures, gates


def _load_optional(path: Path | None) -> dict[str, Any] | None:
    return None if path is None else load_result(path).data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cellbench.gates",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    ev = sub.add_parser("evaluate", help="one cell's gate.json from its two GSM8K results")
    ev.add_argument("--cell", required=True)
    ev.add_argument("--model", required=True)
    ev.add_argument("--gate", default="null", help="the model's gsm8k_gate as JSON")
    ev.add_argument("--untuned", type=Path)
    ev.add_argument("--tuned", type=Path)
    ev.add_argument("--out", required=True, type=Path)
    ck = sub.add_parser("check", help="fail the run when a cell failed its gate")
    ck.add_argument("--on-failure", choices=["fail", "continue"], default="fail")
    ck.add_argument("--results", type=Path, default=None)
    ck.add_argument("--out", required=True, type=Path)
    ck.add_argument("gates", nargs="*", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.cmd == "evaluate":
            gate = json.loads(args.gate)
            result = evaluate(
                args.cell,
                args.model,
                gate,
                _load_optional(args.untuned),
                _load_optional(args.tuned),
            )
            result_file.check_gate(result, args.out)  # the loaders' check, before it is written
            atomicio.write_json(args.out, result, checksum=True)
            print(
                f"{args.cell}: gate {'passed' if result['passed'] else 'FAILED'} "
                f"({len(result['checks'])} checks)"
            )
            return 0
        failures, gates = check(args.gates, args.results)
    except ResultError as exc:
        print(f"cellbench gates: error: {exc}", file=sys.stderr)
        return 1
    for line in failures:
        print(f"cellbench gates: FAILED: {line}", file=sys.stderr)
    if failures and args.on_failure == "fail":
        print(
            f"cellbench gates: {len(failures)} gate check(s) failed; the cells' results, the "
            "report and the archive are kept. To finish the run anyway, set "
            "gates.on_failure: continue.",
            file=sys.stderr,
        )
        return 1
    summary = {
        "kind": "gates_summary",
        "written": datetime.now(UTC).isoformat(timespec="seconds"),
        "cells": len(gates),
        "failed": failures,
        "on_failure": args.on_failure,
    }
    atomicio.write_json(args.out, summary)
    print(f"gates: {len(gates)} cells, {len(failures)} failed check(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
