"""The one comparison of two sides A and B, whatever they are: arm against arm, image against
image, or a run against an archived run of the same cell.

A side is plain data: its rows of the tidy serve frame (``report.cell_frames``: one row per
repeat and grid point, keys ``isl``, ``osl`` and ``max_concurrency``) and, optionally, its GSM8K
result dict (``gsm8k/{arm}.json``'s fields, ``per_sample`` included). ``render`` turns two sides
into Markdown; ``compare_serve`` and ``compare_gsm8k`` return the rows behind it. The statistics
are ``cellbench.stats``'.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

import pandas as pd

from cellbench import stats

# Each compared serving metric and whether a higher value is better.
METRICS = {
    "mean_ttft_ms": False,
    "mean_tpot_ms": False,
    "mean_e2el_ms": False,
    "output_throughput": True,
}
# (label, per_sample field, result field)
GSM8K_METRICS = (
    ("strict-match", "strict", "strict_match"),
    ("flexible-extract", "flexible", "flexible_extract"),
)
# label -> result field
GSM8K_FIELD = {label: field for label, _, field in GSM8K_METRICS}

VERDICT_RULE = (
    "Serving verdicts: per grid point and metric, Welch's t-test over the repeats, Holm-adjusted "
    "within each table; *better*/*worse* only when the adjusted p < {alpha} and the change of "
    "the medians is at least {floor}% (separate server starts differ by more than the repeats "
    "of one run, so smaller changes are not called); otherwise *within noise*. The interval is "
    "Welch's 95% t-interval of the change of the means. GSM8K verdicts: McNemar's mid-p on the "
    "questions paired by document (p < {alpha}), with a 95% paired bootstrap interval of the "
    "accuracy difference."
)


def _keys(frame: pd.DataFrame) -> list[str]:
    keys = ["isl", "osl", "max_concurrency"] if "max_concurrency" in frame else ["isl", "osl"]
    # The load label (report.cell_frames) keeps a request-rate point apart from a
    # concurrency point whose max_concurrency happens to equal its prompt count.
    return [*keys, "load"] if "load" in frame else keys


def compare_serve(
    a: pd.DataFrame,
    b: pd.DataFrame,
    *,
    min_change_pct: float = stats.DEFAULT_MIN_CHANGE_PCT,
    alpha: float = stats.ALPHA,
) -> list[dict]:
    """Per grid point both sides have and per metric: ``stats.compare_metric`` over the
    repeats, then ``stats.verdicts`` over the whole list (one Holm family). Each row also
    carries ``isl``, ``osl``, ``max_concurrency`` (None when the frame has none) and
    ``metric``."""
    if not len(a) or not len(b):
        return []
    keys = _keys(a)
    missing = [k for k in keys if k not in b]
    if missing:
        raise ValueError(f"compare_serve: side B lacks the grid columns {missing}")
    rows = []
    for point, pa in a.groupby(keys, sort=True):
        pb = b
        for k, v in zip(keys, point, strict=True):
            pb = pb[pb[k] == v]
        if pb.empty:
            continue
        where = {k: v if k == "load" else int(v) for k, v in zip(keys, point, strict=True)}
        for metric, higher in METRICS.items():
            if metric not in pa or metric not in pb:
                continue
            va, vb = pa[metric].dropna().tolist(), pb[metric].dropna().tolist()
            if not va or not vb:
                continue
            result = stats.compare_metric(va, vb, higher_is_better=higher)
            rows.append({"max_concurrency": None, **where, "metric": metric, **result})
    return stats.verdicts(rows, min_change_pct=min_change_pct, alpha=alpha)


def _samples(side: Mapping) -> list[dict]:
    samples = side.get("per_sample") or []
    return json.loads(samples) if isinstance(samples, str) else list(samples)


def pairing_key(a: Mapping, b: Mapping) -> str | None:
    """``doc_key`` (a hash of the question) when every sample of both sides has one, else
    ``doc_id`` (the question's index in the task's test set) when both have it; None when the
    questions cannot be matched (no per-sample log, or a key that repeats on a side)."""
    sa, sb = _samples(a), _samples(b)
    if not sa or not sb:
        return None
    for key in ("doc_key", "doc_id"):
        if all(key in s for s in sa + sb):
            unique = all(len({s[key] for s in side}) == len(side) for side in (sa, sb))
            return key if unique else None
    return None


def compare_gsm8k(a: Mapping, b: Mapping, *, alpha: float = stats.ALPHA) -> list[dict]:
    """Strict-match and flexible-extract of two GSM8K results: paired per question where
    ``pairing_key`` finds a key (``stats.paired_accuracy``), unpaired otherwise
    (``stats.unpaired_accuracy`` on the two accuracies and sample counts). Each row has
    ``metric`` and ``paired_by`` (the key, or None)."""
    key = pairing_key(a, b)
    rows = []
    for label, sample_field, total_field in GSM8K_METRICS:
        if key is not None:
            sa = {s[key]: bool(s[sample_field]) for s in _samples(a)}
            sb = {s[key]: bool(s[sample_field]) for s in _samples(b)}
            if sa.keys() & sb.keys():
                result = stats.paired_accuracy(sa, sb, alpha=alpha)
                rows.append({"metric": label, "paired_by": key, **result})
                continue
        result = stats.unpaired_accuracy(
            float(a[total_field]),
            int(a["n_samples"]),
            float(b[total_field]),
            int(b["n_samples"]),
            alpha=alpha,
        )
        rows.append({"metric": label, "paired_by": None, **result})
    return rows


def _f(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _pct(x: float | None, digits: int = 1) -> str:
    text = _f(x, digits)
    return text if text == "n/a" else f"{'+' if x > 0 else ''}{text}%"


def _point_label(row: dict, several_levels: bool) -> str:
    label = f"{row['isl']}-{row['osl']}"
    load = row.get("load") or f"c{row['max_concurrency']}"
    return f"{label} @{load}" if several_levels else label


def _md(rows: list[dict]) -> list[str]:
    """A Markdown table, one line per list item."""
    return pd.DataFrame(rows).to_markdown(index=False, disable_numparse=True).splitlines()


def spread_line(rows: list[dict], min_change_pct: float) -> str:
    """How many repeats a side a 5% and a 1% change need, from the spread measured in
    ``rows`` (the median over the table of each side's coefficient of variation)."""
    cvs = [r[k] for r in rows for k in ("cv_a", "cv_b") if not math.isnan(r.get(k, math.nan))]
    if not cvs:
        return "Spread not measured: one run a side, so no change can be told from noise."
    cv = float(pd.Series(cvs).median())
    need = {c: stats.repeats_needed(cv, c) for c in (5.0, 1.0)}
    text = (
        f"With the spread measured here (median CV {cv:.2f}% of a repeat), a 5% change needs "
        f"{need[5.0]} repeats a side to be seen (80% power, p < {stats.ALPHA}, before Holm), "
        f"1% needs {need[1.0]}"
    )
    if min_change_pct > 1.0:
        text += f", but changes below the {min_change_pct:g}% floor are never called"
    return text + "."


def render_serve(
    serve_a: pd.DataFrame, serve_b: pd.DataFrame, *, min_change_pct: float
) -> list[str]:
    rows = compare_serve(serve_a, serve_b, min_change_pct=min_change_pct)
    if not rows:
        return ["(no common grid points)", ""]
    several = len({r.get("load", r["max_concurrency"]) for r in rows}) > 1
    table = [
        {
            "ISL-OSL": _point_label(r, several),
            "metric": r["metric"],
            "median A": _f(r["median_a"]),
            "median B": _f(r["median_b"]),
            "change %": _pct(r["change_pct"]),
            "CI of change": (
                "n/a" if math.isnan(r["ci_low"]) else f"[{_pct(r['ci_low'])}, {_pct(r['ci_high'])}]"
            ),
            "runs A/B": f"{r['n_a']}/{r['n_b']}",
            "p (Holm)": _f(r["p_holm"], 3),
            "verdict": r["verdict"],
        }
        for r in rows
    ]
    return [*_md(table), "", spread_line(rows, min_change_pct), ""]


def render_gsm8k(gsm_a: Mapping, gsm_b: Mapping) -> list[str]:
    rows = compare_gsm8k(gsm_a, gsm_b)
    lines = []
    paired = [r for r in rows if r["paired"]]
    if paired:
        r = paired[0]
        extra = ""
        if r["only_a"] or r["only_b"]:
            extra = f"; {r['only_a']} only in A and {r['only_b']} only in B left out"
        lines += [
            f"GSM8K, paired by `{r['paired_by']}` on {r['n']} questions{extra}:",
            "",
            *_md(
                [
                    {
                        "metric": p["metric"],
                        "both right": p["both_right"],
                        "both wrong": p["both_wrong"],
                        "fixed": p["fixed"],
                        "broken": p["broken"],
                        "accuracy A": f"{100 * p['acc_a']:.2f}%",
                        "accuracy B": f"{100 * p['acc_b']:.2f}%",
                        "difference (95% CI)": (
                            f"{_pct(100 * p['diff'], 2)} "
                            f"[{_pct(100 * p['ci_low'], 2)}, {_pct(100 * p['ci_high'], 2)}]"
                        ),
                        "mid-p": _f(p["p_mid"], 3),
                        "exact p": _f(p["p_exact"], 3),
                        "verdict": p["verdict"],
                    }
                    for p in paired
                ]
            ),
            "",
        ]
    unpaired = [r for r in rows if not r["paired"]]
    if unpaired:
        lines += [
            "GSM8K, **unpaired** (the two runs' questions could not be matched: a side has no "
            "per-question log or repeats a key), two-proportion z-test:",
            "",
            *_md(
                [
                    {
                        "metric": u["metric"],
                        "accuracy A": f"{100 * u['acc_a']:.2f}% of {u['n_a']}",
                        "accuracy B": f"{100 * u['acc_b']:.2f}% of {u['n_b']}",
                        "difference (95% CI)": (
                            f"{_pct(100 * u['diff'], 2)} "
                            f"[{_pct(100 * u['ci_low'], 2)}, {_pct(100 * u['ci_high'], 2)}]"
                        ),
                        "stderr": f"{100 * u['stderr']:.2f}",
                        "p": _f(u["p"], 3),
                        "verdict": u["verdict"],
                    }
                    for u in unpaired
                ]
            ),
            "",
        ]
    return lines


def render(
    title: str,
    serve_a: pd.DataFrame | None,
    serve_b: pd.DataFrame | None,
    gsm_a: Mapping | None = None,
    gsm_b: Mapping | None = None,
    note: str = "",
    min_change_pct: float = stats.DEFAULT_MIN_CHANGE_PCT,
) -> list[str]:
    """Markdown lines comparing side A with side B: ``title`` (a heading line as given when it
    starts with ``#``, else a level-4 heading), ``note`` (a paragraph, if any), the serving table
    with its repeats-needed line (when both sides have serving rows) and the GSM8K table (when
    both sides have a GSM8K result)."""
    if min_change_pct < 0:
        raise ValueError(f"min_change_pct must be >= 0, got {min_change_pct}")
    heading = title if title.startswith("#") else f"#### {title}"
    lines = [heading, ""]
    if note:
        lines += [note, ""]
    have_serve = serve_a is not None and serve_b is not None and len(serve_a) and len(serve_b)
    if have_serve:
        lines += render_serve(serve_a, serve_b, min_change_pct=min_change_pct)
    if gsm_a is not None and gsm_b is not None:
        lines += render_gsm8k(gsm_a, gsm_b)
    if not have_serve and (gsm_a is None or gsm_b is None):
        lines += ["(nothing measured on both sides)", ""]
    return lines


def footer(min_change_pct: float = stats.DEFAULT_MIN_CHANGE_PCT) -> str:
    """The line that says how every verdict of the report was made."""
    return VERDICT_RULE.format(alpha=stats.ALPHA, floor=f"{min_change_pct:g}")
