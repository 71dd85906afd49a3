"""Markdown for the one comparison of two sides (``cellbench.stats.comparison``): the serving
table with its noise line, the GSM8K tables, the per-point verdict rows of the PR file and the
server starts of arms that cannot differ. The statistics return rows; this module only words
and lays them out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd

from cellbench.stats import comparison, starts
from cellbench.stats import core as stats
from cellbench.stats.comparison import compare_gsm8k, compare_serve


def _f(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _pct(x: float | None, digits: int = 1) -> str:
    text = _f(x, digits)
    if text != "n/a" and x > 1000:  # an interval's bound at a look with almost no data
        return "over +1000%"
    return text if text == "n/a" else f"{'+' if x > 0 else ''}{text}%"


def _point_label(row: dict, several_levels: bool) -> str:
    label = f"{row['isl']}-{row['osl']}"
    load = row.get("load") or f"c{row['max_concurrency']}"
    return f"{label} @{load}" if several_levels else label


def _md(rows: list[dict]) -> list[str]:
    """A Markdown table, one line per list item."""
    return pd.DataFrame(rows).to_markdown(index=False, disable_numparse=True).splitlines()


def _interval(r: Mapping) -> str:
    if math.isnan(r.get("ci_low", math.nan)):
        return "n/a"
    return f"[{_pct(r['ci_low'])}, {_pct(r['ci_high'])}]"


def could_see(r: Mapping) -> str:
    """The smallest change the row would have detected (80% power at its level)."""
    mdc = r.get("mdc_pct", math.inf)
    if mdc is None or math.isinf(mdc) or math.isnan(mdc):
        return "n/a"
    # past 1000% the figure says only that the row could see next to nothing
    return f"{mdc:.1f}%" if mdc <= 1000 else "over 1000%"


def verdict_text(r: Mapping) -> str:
    """The verdict as a reader needs it: an inconclusive row says what it could have seen."""
    if r["verdict"] == starts.INCONCLUSIVE:
        see = could_see(r)
        if see.startswith("over"):
            return f"inconclusive (could have seen only changes {see})"
        return f"inconclusive (could have seen changes of at least {see})"
    return r["verdict"]


def spread_line(rows: list[dict], min_change_pct: float) -> str:
    """The noise measured here: the median spread between server starts (of the paired
    log-ratio, or of each side), the starts per side, and the median detectable change."""
    spreads = []
    for r in rows:
        comps = r.get("components") or {}
        for side in ("d",) if "d" in comps else ("a", "b"):
            between = (comps.get(side) or {}).get("between")
            if between is not None and not math.isnan(between):
                spreads.append(100 * math.sqrt(between))
    mdcs = [r["mdc_pct"] for r in rows if math.isfinite(r.get("mdc_pct", math.inf))]
    if not mdcs:
        return (
            "Start-to-start noise not measured (one server start a side, no earlier runs): "
            "no change can be told from noise."
        )
    median = float(pd.Series(mdcs).median())
    text = "Median detectable change over the table: " + (
        f"{median:.1f}%" if median <= 1000 else "over 1000%"
    )
    if spreads:
        text += (
            f"; median spread between server starts {float(pd.Series(spreads).median()):.2f}% "
            "(measured here)"
        )
    return text + f"; the equivalence margin is +-{min_change_pct:g}%."


def render_serve(
    serve_a: pd.DataFrame,
    serve_b: pd.DataFrame,
    *,
    min_change_pct: float,
    priors: Mapping[tuple, Mapping[str, starts.Components]] | None = None,
) -> list[str]:
    rows = compare_serve(serve_a, serve_b, min_change_pct=min_change_pct, priors=priors)
    if not rows:
        return ["(no common grid points)", ""]
    several = len({r.get("load", r["max_concurrency"]) for r in rows}) > 1
    table = [
        {
            "ISL-OSL": _point_label(r, several),
            "metric": r["metric"],
            "geomean A": _f(r["geomean_a"]),
            "geomean B": _f(r["geomean_b"]),
            "change %": _pct(r["change_pct"]),
            "interval": _interval(r),
            "p adj": _f(r.get("p_adj"), 3),
            "verdict": r["verdict"],
            "could see": could_see(r),
            "starts A/B": f"{r.get('starts_a', 0)}/{r.get('starts_b', 0)}",
            "repeats A/B": f"{r.get('repeats_a', 0)}/{r.get('repeats_b', 0)}",
            "test": _test(r),
            "invalid A/B": _invalid(r),
            **({"stopped": stopped_text(r)} if any("starts_cap" in x for x in rows) else {}),
        }
        for r in rows
    ]
    lines = [*_md(table), "", spread_line(rows, min_change_pct), ""]
    reasons = sorted({why for r in rows for why in r.get("invalid_reasons", [])})
    if reasons:
        lines += [f"Invalid repeats, left out of the tests above: {'; '.join(reasons)}.", ""]
    return lines


def _test(row: Mapping) -> str:
    """The row's test, and the earlier runs' degrees of freedom pooled into it, if any."""
    test = row.get("test") or "n/a"
    return f"{test} + history ({row['prior_df']} df)" if row.get("prior_df") else test


def stopped_text(row: Mapping) -> str:
    """How a sequentially measured row settled, at which look, and the point's starts used
    of its cap and why it stopped: "futile at 2; 2 of 3 starts: settled"."""
    if "starts_used" not in row:
        return ""
    how = row.get("stop_status", "")
    at = f" at {row['stop_starts']}" if "stop_starts" in row else ""
    of = f" of {row['starts_cap']}" if "starts_cap" in row else ""
    return f"{how}{at}; {row['starts_used']}{of} starts: {row.get('stop_reason', 'n/a')}"


def point_verdicts(
    a: pd.DataFrame, b: pd.DataFrame, *, min_change_pct: float, labels: Mapping[str, str]
) -> list[dict]:
    """One row per grid point of ``compare_serve``: its ISL-OSL (and load), per metric of
    ``labels`` (metric -> column title) the verdict with its change and interval (or what it
    could have seen), the starts used and why it stopped, and its invalid repeats A/B. For
    tables that give a point one line (the PR file)."""
    rows = compare_serve(a, b, min_change_pct=min_change_pct)
    several = len({r.get("load", r["max_concurrency"]) for r in rows}) > 1
    out: dict[str, dict] = {}
    for r in rows:
        label = _point_label(r, several)
        line = out.setdefault(label, {"ISL-OSL": label})
        if r["metric"] in labels:
            if math.isnan(r["change_pct"]):
                line[labels[r["metric"]]] = r["verdict"]
            else:
                shown = f"{_pct(r['change_pct'])} {_interval(r)}"
                line[labels[r["metric"]]] = f"{verdict_text(r)}: {shown}"
        starts_ = f"{r.get('starts_a', 0)}/{r.get('starts_b', 0)}"
        line["starts used"] = (
            f"{r['starts_used']} of {r['starts_cap']}: {r.get('stop_reason', 'n/a')}"
            if "starts_used" in r
            else f"{starts_}: fixed count"
        )
        line["invalid A/B"] = _invalid(r)
    return list(out.values())


def render_repeats(a: pd.DataFrame, b: pd.DataFrame) -> list[str]:
    """Where no verdict is drawn (arms that cannot differ): per grid point measured with
    sequential starts, the starts it used, of its cap, why it stopped and its invalid
    repeats, as the serve stage recorded them; [] otherwise."""
    table = [
        {
            "ISL-OSL": _point_label({"max_concurrency": None, **r["point"]}, True),
            "starts used": f"{r['starts_used']} of {r.get('starts_cap', '?')}: "
            f"{r.get('stop_reason', 'n/a')}",
            "invalid repeats": r["invalid_repeats"],
        }
        for r in comparison.repeat_stops(a, b)
    ]
    if not table:
        return []
    return ["Server starts per point (sequential, serve.starts):", "", *_md(table), ""]


def _invalid(row: dict) -> str:
    text = f"{row.get('invalid_a', 0)}/{row.get('invalid_b', 0)}"
    return f"{text} (+{row['unpaired']} unpaired)" if row.get("unpaired") else text


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
    priors: Mapping[tuple, Mapping[str, starts.Components]] | None = None,
) -> list[str]:
    """Markdown lines comparing side A with side B: ``title`` (a heading line as given when it
    starts with ``#``, else a level-4 heading), ``note`` (a paragraph, if any), the serving table
    with its noise line (when both sides have serving rows; ``priors``: earlier runs'
    components, as ``compare_serve`` takes them) and the GSM8K table (when both sides have a
    GSM8K result)."""
    if not min_change_pct > 0:
        raise ValueError(
            f"min_change_pct (the equivalence margin) must be > 0, got {min_change_pct}"
        )
    heading = title if title.startswith("#") else f"#### {title}"
    lines = [heading, ""]
    if note:
        lines += [note, ""]
    have_serve = serve_a is not None and serve_b is not None and len(serve_a) and len(serve_b)
    if have_serve:
        lines += render_serve(serve_a, serve_b, min_change_pct=min_change_pct, priors=priors)
    if gsm_a is not None and gsm_b is not None:
        lines += render_gsm8k(gsm_a, gsm_b)
    if not have_serve and (gsm_a is None or gsm_b is None):
        lines += ["(nothing measured on both sides)", ""]
    return lines
