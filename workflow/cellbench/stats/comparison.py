"""The one comparison of two sides A and B, whatever they are: arm against arm, image against
image, or a run against an archived run of the same cell.

A side is plain data: its rows of the tidy serve frame (``report.cell_frames``: one row per
repeat and grid point, keys ``isl``, ``osl`` and ``max_concurrency``) and, optionally, its GSM8K
result dict (``gsm8k/{arm}.json``'s fields, ``per_sample`` included). ``compare_serve`` and
``compare_gsm8k`` return the rows of a comparison (``cellbench.report.comparison_tables``
renders them as Markdown). The statistics are ``cellbench.stats.core``'.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

import pandas as pd

from cellbench.stats import core as stats
from cellbench.stats import sequential, starts

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
    "Serving verdicts: per grid point and metric, the change is the ratio of the two sides' "
    "geometric means (*geomean A*, *geomean B*; each the mean over its server starts of a "
    "start's mean log value). Its variance is measured, not assumed: the spread between "
    "server starts (paired by round where the sides were interleaved, each side on its own "
    "where they were not), pooled with earlier runs' where given. Every row of a table is "
    "tested at alpha / rows (Bonferroni; a row measured with sequential starts at its look's "
    "O'Brien-Fleming level instead), its interval is the t interval at that level and *p adj* "
    "is p scaled to it, so *p adj* < {alpha} exactly when the interval excludes no change. "
    "*better*/*worse*: the interval excludes no change and is not inside +-{floor}%; "
    "*equivalent*: the interval lies inside +-{floor}% (report.min_change_pct); "
    "*inconclusive*: neither, and *could see* gives the smallest change the row would have "
    "detected with 80% power at its level, noise and starts. Repeats that failed or were "
    "invalid are left out and counted in *invalid A/B*. "
    "GSM8K verdicts: McNemar's mid-p on the questions paired by document (p < {alpha}), with a "
    "95% paired bootstrap interval of the accuracy difference; *inconclusive* otherwise."
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


def _starts_of(rows: pd.DataFrame) -> pd.Series:
    """Each row's server start (rows measured before starts were recorded: one start)."""
    if "start" not in rows:
        return pd.Series(0, index=rows.index)
    return rows["start"].fillna(0).astype(int)


def interleaved(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    """Whether the two sides were measured in one job, interleaved: their points carry one
    job-wide order (``seq``) that no two points share. A run against an archived run (each
    numbered from 0) is not."""
    if "seq" not in a or "seq" not in b or not len(a) or not len(b):
        return False
    seq_a, seq_b = set(a["seq"].dropna().astype(int)), set(b["seq"].dropna().astype(int))
    return bool(seq_a) and bool(seq_b) and not seq_a & seq_b


def _groups(rows: pd.DataFrame, metric: str, keep: set | None = None) -> list[list[float]]:
    """Per start (in order) the metric's values in repeat order, restricted to ``keep``
    (start, repeat) keys when given."""
    out = []
    starts_ = _starts_of(rows)
    for k in sorted(set(starts_)):
        part = rows[starts_ == k].sort_values("repeat") if "repeat" in rows else rows[starts_ == k]
        if keep is not None:
            part = part[[(k, int(r)) in keep for r in part["repeat"]]]
        if len(part):
            out.append([float(v) for v in part[metric]])
    return out


def _pair_keys(ok_a: pd.DataFrame, ok_b: pd.DataFrame) -> set:
    """The (start, repeat) keys both sides' valid rows have."""
    if "repeat" not in ok_a or "repeat" not in ok_b:
        return set()
    ka = set(zip(_starts_of(ok_a), ok_a["repeat"].astype(int), strict=True))
    kb = set(zip(_starts_of(ok_b), ok_b["repeat"].astype(int), strict=True))
    return ka & kb


def compare_serve(
    a: pd.DataFrame,
    b: pd.DataFrame,
    *,
    min_change_pct: float = stats.DEFAULT_MIN_CHANGE_PCT,
    alpha: float = stats.ALPHA,
    max_failed_share: float = MAX_FAILED_SHARE,
    paired: bool | None = None,
    priors: Mapping[tuple, Mapping[str, starts.Components]] | None = None,
) -> list[dict]:
    """Per grid point both sides have and per metric: ``starts.compare`` over the sides'
    valid repeats grouped by server start, then ``starts.verdicts`` over the whole list (one
    Bonferroni family; ``min_change_pct`` is the equivalence margin). ``paired``: whether
    the sides were interleaved (None: ``interleaved`` decides); paired rows keep the
    (start, repeat) pairs whose both sides are valid and count the others in ``unpaired``.
    ``priors``: earlier runs' components per (``starts.point_key``, metric), from
    ``starts.prior_from_benches``. Each row carries ``isl``, ``osl``, ``max_concurrency``
    (and ``load``), ``metric``, ``invalid_a``/``invalid_b`` with ``invalid_reasons``; a point
    without a valid repeat on a side keeps an "n/a" row, so nothing measured disappears.

    Points measured with sequential starts (both sides record ``starts_cap``) take the row
    ``sequential.decide`` judged at the look where it settled, on the same starts with the
    same design as the serve stage: ``stop_status``, ``starts_used`` and ``stop_reason``
    say how, and the row's level is that look's."""
    if not len(a) or not len(b):
        return []
    keys = _keys(a)
    missing = [k for k in keys if k not in b]
    if missing:
        raise ValueError(f"compare_serve: side B lacks the grid columns {missing}")
    paired = interleaved(a, b) if paired is None else paired
    points = list(a.groupby(keys, sort=True))
    rows = []
    for point, pa in points:
        pb = b
        for k, v in zip(keys, point, strict=True):
            pb = pb[pb[k] == v]
        if pb.empty:
            continue
        where = {k: v if k == "load" else int(v) for k, v in zip(keys, point, strict=True)}
        rows += _point_rows(pa, pb, where, paired, max_failed_share, priors)
    _sequential_rows(rows, points_count=len({_where_key(r) for r in rows}), margin=min_change_pct,
                     alpha=alpha)  # fmt: skip
    return starts.verdicts(rows, margin_pct=min_change_pct, alpha=alpha)


def _where_key(row: Mapping) -> tuple:
    return tuple((k, row.get(k)) for k in ("isl", "osl", "max_concurrency", "load"))


def _point_rows(pa, pb, where, paired, max_failed_share, priors) -> list[dict]:
    rows = []
    first = pa.iloc[0].to_dict()
    recorded = _recorded_stop(pa, pb)
    for metric, higher in METRICS.items():
        if metric not in pa or metric not in pb:
            continue
        ok_a, why_a = _split_valid(pa, metric, max_failed_share)
        ok_b, why_b = _split_valid(pb, metric, max_failed_share)
        base = {
            "max_concurrency": None,
            **where,
            "metric": metric,
            "invalid_a": len(why_a),
            "invalid_b": len(why_b),
            "invalid_reasons": sorted(set(why_a) | set(why_b)),
            "unpaired": 0,
            **recorded,
        }
        keep = _pair_keys(ok_a, ok_b) if paired else None
        if keep is not None:
            base["unpaired"] = len(ok_a) + len(ok_b) - 2 * len(keep)
        ga, gb = _groups(ok_a, metric, keep), _groups(ok_b, metric, keep)
        if not ga or not gb:
            rows.append({**base, **_untested(sum(map(len, ga)), sum(map(len, gb)), higher)})
            continue
        prior = (priors or {}).get((starts.point_key(first), metric))
        result = starts.compare(ga, gb, higher_is_better=higher, paired=paired, prior=prior)
        rows.append({**base, **result, "_groups": (ga, gb) if paired else None})
    return rows


def _recorded_stop(pa: pd.DataFrame, pb: pd.DataFrame) -> dict:
    """What the serve stage recorded for a point measured with sequential starts: the cap,
    the fewest, the starts it used and why it stopped; {} otherwise."""
    out = {}
    for field in ("starts_min", "starts_cap", "starts_used", "stop_reason"):
        if field in pa and field in pb:
            found = set(pa[field].dropna()) | set(pb[field].dropna())
            if len(found) == 1:
                value = found.pop()
                out[field] = str(value) if field == "stop_reason" else int(value)
    return out


def _sequential_rows(rows: list[dict], points_count: int, margin: float, alpha: float) -> None:
    """Rows of points measured with sequential starts take the judged row of
    ``sequential.decide`` on the same starts; the others are left to the table's level."""
    for r in rows:
        groups = r.pop("_groups", None)
        if groups is None or "starts_cap" not in r or str(r.get("verdict", "")).startswith("n/a"):
            continue
        design = sequential.Design(
            rows=max(points_count * len(METRICS), 1),
            cap=max(r["starts_cap"], 2),
            min_starts=max(min(r.get("starts_min", 2), r["starts_cap"]), 2),
            margin_pct=margin,
            alpha=alpha,
        )
        if len(groups[0]) < design.min_starts:
            r["stop_status"] = "unsettled"
            continue
        state = sequential.decide_metric(*groups, r["higher_is_better"], design)
        judged = state["row"]
        status = "unsettled" if state["status"] == sequential.CONTINUE else state["status"]
        keep = {k: r[k] for k in r if k not in judged}
        r.clear()
        r.update({**keep, **judged, "stop_status": status, "stop_starts": state["starts"]})


def _untested(n_a: int, n_b: int, higher: bool) -> dict:
    nan = math.nan
    return {
        "geomean_a": nan, "geomean_b": nan, "change_pct": nan, "ci_low": nan,
        "ci_high": nan, "p": nan, "repeats_a": n_a, "repeats_b": n_b, "starts_a": 0,
        "starts_b": 0, "higher_is_better": higher, "test": None, "df": 0,
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


def repeat_stops(a: pd.DataFrame, b: pd.DataFrame) -> list[dict]:
    """Where no verdict is drawn (arms that cannot differ): per grid point measured with
    sequential starts, its keys (``point``: ``isl``, ``osl``, and ``max_concurrency`` and
    ``load`` where the frame has them), the stop the serve stage recorded (``starts_used``,
    ``starts_cap``, ``stop_reason``) and the most invalid repeats either side had
    (``invalid_repeats``); [] otherwise."""
    if "starts_cap" not in a or "starts_cap" not in b or not len(a) or not len(b):
        return []
    keys = _keys(a)
    rows = []
    for point, pa in a.groupby(keys, sort=True):
        pb = b
        for k, v in zip(keys, point, strict=True):
            pb = pb[pb[k] == v]
        stop = _recorded_stop(pa, pb)
        if "starts_used" not in stop:
            continue
        where = {k: v if k == "load" else int(v) for k, v in zip(keys, point, strict=True)}
        invalid = [
            int(x["invalid_repeats"].max()) if "invalid_repeats" in x else 0 for x in (pa, pb)
        ]
        rows.append({"point": where, **stop, "invalid_repeats": max(invalid)})
    return rows


def footer(min_change_pct: float = stats.DEFAULT_MIN_CHANGE_PCT) -> str:
    """The line that says how every verdict of the report was made."""
    return VERDICT_RULE.format(alpha=stats.ALPHA, floor=f"{min_change_pct:g}")
