"""The one comparison of two sides A and B, whatever they are: arm against arm, image against
image, or a run against an archived run of the same cell.

A side is plain data: its rows of the tidy serve frame (``report.cell_frames``: one row per
repeat and grid point, keys ``isl``, ``osl`` and ``max_concurrency``) and, optionally, its GSM8K
result dict (``gsm8k/{arm}.json``'s fields, ``per_sample`` included). ``render`` turns two sides
into Markdown; ``compare_serve`` and ``compare_gsm8k`` return the rows behind it. The statistics
are ``cellbench.stats.core``'.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

import pandas as pd

from cellbench.stats import core as stats
from cellbench.stats import sequential

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
    "Serving verdicts: per grid point and metric, the t-test of the log-ratios of the "
    "interleaved pairs of repeats (test *paired*; Welch's t-test over the repeats where the "
    "repeats do not pair up), with the spread between two server starts ({floor}%, which the "
    "repeats of one run cannot see) added to its variance; Holm-adjusted within each table; "
    "*better*/*worse* only when the adjusted p < {alpha} and the change is at least {floor}%; "
    "otherwise *within noise*. The interval is the test's 95% interval of the change. Repeats "
    "that failed or were invalid are left out of the test and counted in *invalid A/B*. "
    "Points measured with sequential repeats (serve.repeat_cap; test *sequential*) take the "
    "stopping rule's verdict on the same pairs, which keeps the table's false-change rate "
    "under {alpha} however the repeats stopped: *stopped* says how each metric settled and "
    "after how many pairs, *repeats used* the pairs the point took, of its cap, and why it "
    "stopped. "
    "GSM8K verdicts: McNemar's mid-p on the questions paired by document (p < {alpha}), with a "
    "95% paired bootstrap interval of the accuracy difference."
)
# A point with a larger failed share of its requests is an invalid repeat (the default of
# serve.max_failed_share, past which the serve stage fails the job today).
MAX_FAILED_SHARE = 0.05


def _keys(frame: pd.DataFrame) -> list[str]:
    keys = ["isl", "osl", "max_concurrency"] if "max_concurrency" in frame else ["isl", "osl"]
    # The load label (report.cell_frames) keeps a request-rate point apart from a
    # concurrency point whose max_concurrency happens to equal its prompt count.
    return [*keys, "load"] if "load" in frame else keys


def invalid_reason(row: Mapping, metric: str, max_failed_share: float = MAX_FAILED_SHARE):
    """Why one repeat (a row of the serve frame) cannot count for ``metric``, or None: the
    point's own ``invalid`` field (a reason the serve stage recorded: a server restart, the
    wrong MoE config seen), a failed share of requests above ``max_failed_share``, or no
    finite positive value."""
    reason = row.get("invalid")
    if isinstance(reason, str) and reason:
        return reason
    failed, prompts = row.get("failed"), row.get("num_prompts")
    if _number(failed) and _number(prompts) and prompts and failed / prompts > max_failed_share:
        return f"{int(failed)} of {int(prompts)} requests failed"
    value = row.get(metric)
    if not _number(value) or value <= 0:
        return f"no {metric}"
    return None


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _split_valid(rows: pd.DataFrame, metric: str, max_failed_share: float):
    """(valid rows, reasons of the invalid ones) of one side at one point."""
    reasons = [invalid_reason(r, metric, max_failed_share) for r in rows.to_dict("records")]
    keep = [r is None for r in reasons]
    return rows[keep], [r for r in reasons if r is not None]


def _pairable(va: pd.DataFrame, vb: pd.DataFrame) -> bool:
    """Both sides' valid repeats carry the same repeat numbers, each once: pair k of A and B."""
    if "repeat" not in va or "repeat" not in vb or len(va) < 2:
        return False
    ra, rb = va["repeat"].tolist(), vb["repeat"].tolist()
    return len(set(ra)) == len(ra) and sorted(ra) == sorted(rb)


def compare_serve(
    a: pd.DataFrame,
    b: pd.DataFrame,
    *,
    min_change_pct: float = stats.DEFAULT_MIN_CHANGE_PCT,
    alpha: float = stats.ALPHA,
    max_failed_share: float = MAX_FAILED_SHARE,
) -> list[dict]:
    """Per grid point both sides have and per metric: ``stats.compare_metric`` over the
    repeats (paired by ``repeat`` where both sides' valid repeats carry the same repeat
    numbers, Welch otherwise; ``restart_pct`` = the floor), then ``stats.verdicts`` over the
    whole list (one Holm family). Each row also carries ``isl``, ``osl``, ``max_concurrency``
    (None when the frame has none), ``metric``, and ``invalid_a``/``invalid_b`` with
    ``invalid_reasons``: the repeats left out of the test and why (``invalid_reason``); a
    pair whose other side is invalid is left out too and counted in ``unpaired``. A point
    with fewer than two usable repeats a side keeps a row with an "n/a" verdict, so nothing
    measured disappears from the table.

    Points whose repeats were stopped by ``cellbench.stats.sequential`` (both sides' points carry
    the same ``repeat_cap``) take their verdict from ``sequential.decide`` on the same pairs
    with the same design (rows: this table's tested rows; the floor), as the serve stage
    decided while measuring; re-testing them with the fixed-count rule would not keep the
    error rate the stopping rule keeps. Their rows say ``test`` "sequential" and ``stopped``
    (how and after how many pairs)."""
    if not len(a) or not len(b):
        return []
    keys = _keys(a)
    missing = [k for k in keys if k not in b]
    if missing:
        raise ValueError(f"compare_serve: side B lacks the grid columns {missing}")
    rows, stopped = [], {}
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
            ok_a, why_a = _split_valid(pa, metric, max_failed_share)
            ok_b, why_b = _split_valid(pb, metric, max_failed_share)
            counts = {
                "invalid_a": len(why_a),
                "invalid_b": len(why_b),
                "invalid_reasons": sorted(set(why_a) | set(why_b)),
                "unpaired": 0,
            }
            if "repeat" in ok_a and "repeat" in ok_b and len(ok_a) and len(ok_b):
                common = set(ok_a["repeat"]) & set(ok_b["repeat"])
                pa_, pb_ = ok_a[ok_a["repeat"].isin(common)], ok_b[ok_b["repeat"].isin(common)]
                if _pairable(pa_, pb_) and (len(why_a) or len(why_b)):
                    # an invalid repeat takes its partner out of the paired test with it
                    counts["unpaired"] = len(ok_a) + len(ok_b) - len(pa_) - len(pb_)
                    ok_a, ok_b = pa_, pb_
            paired = _pairable(ok_a, ok_b)
            if paired:
                ok_a, ok_b = ok_a.sort_values("repeat"), ok_b.sort_values("repeat")
            va, vb = ok_a[metric].tolist(), ok_b[metric].tolist()
            base = {"max_concurrency": None, **where, "metric": metric, **counts}
            if not va or not vb:
                rows.append({**base, **_untested(len(va), len(vb), higher)})
                continue
            result = stats.compare_metric(
                va, vb, higher_is_better=higher, paired=paired, restart_pct=min_change_pct
            )
            rows.append({**base, **result, **_recorded_stop(pa, pb)})
            cap = _repeat_cap(pa, pb)
            if paired and cap:
                stopped.setdefault(tuple(where.items()), {"cap": cap, "pairs": {}, "invalid": 0})
                entry = stopped[tuple(where.items())]
                entry["pairs"][metric] = (va, vb)
                entry["invalid"] = max(entry["invalid"], len(why_a), len(why_b))
    rows = stats.verdicts(rows, min_change_pct=min_change_pct, alpha=alpha)
    return _sequential_verdicts(rows, stopped, min_change_pct, alpha)


def _repeat_cap(pa: pd.DataFrame, pb: pd.DataFrame) -> int | None:
    """The cap of a point measured with sequential stopping, when both sides record one."""
    if "repeat_cap" not in pa or "repeat_cap" not in pb:
        return None
    caps = set(pa["repeat_cap"].dropna()) | set(pb["repeat_cap"].dropna())
    return int(caps.pop()) if len(caps) == 1 else None


def _recorded_stop(pa: pd.DataFrame, pb: pd.DataFrame) -> dict:
    """What the serve stage recorded for a point measured with sequential repeats: the pairs
    it used (``repeats_used``, one value per side) and why it stopped; {} for fixed repeats."""
    out = {}
    for field in ("repeat_cap", "repeats_used", "stop_reason"):
        if field in pa and field in pb:
            found = set(pa[field].dropna()) | set(pb[field].dropna())
            if len(found) == 1:
                value = found.pop()
                out[field] = str(value) if field == "stop_reason" else int(value)
    return out


def _sequential_verdicts(rows: list[dict], stopped: dict, floor: float, alpha: float) -> list:
    tested = sum(1 for r in rows if not r["verdict"].startswith("n/a"))
    for key, entry in stopped.items():
        lengths = {len(a) for a, _ in entry["pairs"].values()}
        if len(lengths) != 1 or lengths.pop() < 2:
            continue  # metrics with different pairs: the fixed-count verdict stands
        design = sequential.Design(
            rows=max(tested, 1), cap=max(entry["cap"], 2), floor_pct=floor, alpha=alpha
        )
        step = sequential.decide(entry["pairs"], METRICS, design, invalid=entry["invalid"])
        where = dict(key)
        for r in rows:
            if all(r.get(k) == v for k, v in where.items()) and r["metric"] in step["metrics"]:
                m = step["metrics"][r["metric"]]
                r["verdict"], r["test"] = m["verdict"], "sequential"
                how = step["reason"] if step["reason"] == sequential.INVALID else m["status"]
                # fewer pairs than the rule asked for (the job was cut short): say so
                how = "unsettled" if how == sequential.CONTINUE else how
                r["stopped"] = f"{how} ({m['pairs']} of {entry['cap']} pairs)"
                r["stop_status"], r["stop_pairs"] = how, m["pairs"]
    return rows


def _untested(n_a: int, n_b: int, higher: bool) -> dict:
    nan = math.nan
    return {
        "median_a": nan, "median_b": nan, "change_pct": nan, "mean_change_pct": nan,
        "ci_low": nan, "ci_high": nan, "p": nan, "n_a": n_a, "n_b": n_b, "cv_a": nan,
        "cv_b": nan, "higher_is_better": higher, "test": None,
        "verdict": "n/a (no valid repeat on a side)",
    }  # fmt: skip


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
    """How many repeats a 5% and a 1% change need, from the spread measured in ``rows``:
    for paired rows the median spread of a pair's log-ratio, with the floor as restart noise
    (``stats.pairs_needed``), else the median over the table of each side's coefficient of
    variation (``stats.repeats_needed``)."""
    pair_cvs = [r["cv_pair"] for r in rows if r.get("test") == stats.PAIRED]
    pair_cvs = [c for c in pair_cvs if not math.isnan(c)]
    if pair_cvs:
        return _pairs_line(float(pd.Series(pair_cvs).median()), min_change_pct)
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


def _pairs_line(cv: float, floor: float) -> str:
    def need(change: float) -> str:
        n = stats.pairs_needed(cv, change, floor)
        return "no number of pairs in one run (restart noise)" if n is None else f"{n} pairs"

    text = (
        f"With the spread measured here (median spread of a pair's log-ratio {cv:.2f}%, and "
        f"{floor:g}% between server starts), a 5% change needs {need(5.0)} to be seen (80% "
        f"power, p < {stats.ALPHA}, before Holm), 10% needs {need(10.0)}, 30% needs {need(30.0)}"
    )
    return text + (f"; changes below the {floor:g}% floor are never called." if floor else ".")


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
            "test": r.get("test") or "n/a",
            "p (Holm)": _f(r["p_holm"], 3),
            "invalid A/B": _invalid(r),
            **({"stopped": r.get("stopped", "")} if any("stopped" in x for x in rows) else {}),
            **({"repeats used": _used(r)} if any("repeats_used" in x for x in rows) else {}),
            "verdict": r["verdict"],
        }
        for r in rows
    ]
    lines = [*_md(table), "", spread_line(rows, min_change_pct), ""]
    reasons = sorted({why for r in rows for why in r.get("invalid_reasons", [])})
    if reasons:
        lines += [f"Invalid repeats, left out of the tests above: {'; '.join(reasons)}.", ""]
    return lines


def _used(row: dict) -> str:
    """The pairs a sequentially measured point used, of its cap, and why it stopped."""
    if "repeats_used" not in row:
        return ""
    of = f" of {row['repeat_cap']}" if "repeat_cap" in row else ""
    return f"{row['repeats_used']}{of}: {row.get('stop_reason', 'n/a')}"


def point_verdicts(
    a: pd.DataFrame, b: pd.DataFrame, *, min_change_pct: float, labels: Mapping[str, str]
) -> list[dict]:
    """One row per grid point of ``compare_serve``: its ISL-OSL (and load), per metric of
    ``labels`` (metric -> column title) the verdict with its change, the pairs it used and
    why it stopped (sequential repeats; "fixed count" otherwise), and its invalid repeats
    A/B. For tables that give a point one line (the PR file)."""
    rows = compare_serve(a, b, min_change_pct=min_change_pct)
    several = len({r.get("load", r["max_concurrency"]) for r in rows}) > 1
    out: dict[str, dict] = {}
    for r in rows:
        label = _point_label(r, several)
        line = out.setdefault(label, {"ISL-OSL": label})
        if r["metric"] in labels:
            change = "" if math.isnan(r["change_pct"]) else f" ({_pct(r['change_pct'])})"
            how = ""
            if "stop_status" in r:  # how the stopping rule settled it: "futile at 2"
                how = f"; {r['stop_status'].split(':')[0]} at {r['stop_pairs']}"
            line[labels[r["metric"]]] = f"{r['verdict']}{change}{how}"
        line["repeats used"] = _used(r) or f"{max(r['n_a'], r['n_b'])}: fixed count"
        line["invalid A/B"] = _invalid(r)
    return list(out.values())


def render_repeats(a: pd.DataFrame, b: pd.DataFrame) -> list[str]:
    """Where no verdict is drawn (arms that cannot differ): per grid point measured with
    sequential repeats, the pairs it used, of its cap, why it stopped and its invalid
    repeats, as the serve stage recorded them; [] for fixed repeats."""
    if "repeat_cap" not in a or "repeat_cap" not in b or not len(a) or not len(b):
        return []
    keys = _keys(a)
    table = []
    for point, pa in a.groupby(keys, sort=True):
        pb = b
        for k, v in zip(keys, point, strict=True):
            pb = pb[pb[k] == v]
        stop = _recorded_stop(pa, pb)
        if not stop:
            continue
        where = {k: v if k == "load" else int(v) for k, v in zip(keys, point, strict=True)}
        invalid = [
            int(x["invalid_repeats"].max()) if "invalid_repeats" in x else 0 for x in (pa, pb)
        ]
        table.append(
            {
                "ISL-OSL": _point_label({"max_concurrency": None, **where}, True),
                "repeats used": _used(stop),
                "invalid repeats": max(invalid),
            }
        )
    if not table:
        return []
    return ["Repeats per point (sequential, serve.repeat_cap):", "", *_md(table), ""]


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
