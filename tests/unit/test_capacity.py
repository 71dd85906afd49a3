"""The capacity search's logic on recorded probe outcomes: the order of its probes (x2 growth,
then bisection), its caps, a load no side meets, and the comparison of two sides' boundaries."""

from __future__ import annotations

import math

import pytest
from cellbench.contracts import capacity as rules
from cellbench.serve import capacity

SLA = {
    "percentile": 90,
    "confidence": 99,
    "tpot_ms": 50,
    "start": 1,
    "max_concurrency": 256,
    "max_probes": 20,
    "points": [],
}


def _run(boundaries: dict[str, int], **sla) -> dict[str, dict]:
    """The search at one point against sides whose TPOT p90 passes up to ``boundaries[side]``
    (a recorded outcome: 40 ms at or below it, 60 ms above), without a server."""
    cfg = {**SLA, **sla}
    calls = []

    def measure(side, isl, osl, conc, prompts, step):
        calls.append((step, side, conc, prompts))
        tpot = 40.0 if conc <= boundaries[side] else 60.0
        pt = {"failed": 0, "num_prompts": prompts, "completed": prompts, "duration": 2.0,
              "request_throughput": prompts / 2.0, "output_throughput": 10.0 * prompts}  # fmt: skip
        n = prompts
        detail = {"ttfts": [0.1] * n, "latencies": [0.1 + 9 * tpot / 1000] * n,
                  "output_lens": [10] * n, "errors": [""] * n}  # fmt: skip
        return pt, detail

    out = capacity.search_point(cfg, list(boundaries), 512, 512, measure, 0.0)
    out["_calls"] = calls
    return out


def _concs(entry):
    return [p["concurrency"] for p in entry["probes"]]


def test_grows_by_two_then_bisects_to_a_neighbouring_pass_and_fail():
    out = _run({"untuned": 16, "tuned": 24})
    tuned, untuned = out["tuned"], out["untuned"]
    # both sides run every probe: 1..32 grow (32 fails both), then tuned's 16..32 and
    # untuned's 16..32 brackets are bisected: 24 (tuned passes), 28, 26, 25; untuned's 20, 18, 17
    assert _concs(tuned) == _concs(untuned) == [1, 2, 4, 8, 16, 32, 24, 20, 28, 18, 26, 17, 25]
    assert (tuned["capacity"], tuned["first_fail"], tuned["status"]) == (24, 25, "found")
    assert (untuned["capacity"], untuned["first_fail"], untuned["status"]) == (16, 17, "found")
    # the sides alternate who goes first, step by step, at the same load and prompts
    calls = out["_calls"]
    assert [c[1] for c in calls[:4]] == ["untuned", "tuned", "tuned", "untuned"]
    assert all(a[2:] == b[2:] for a, b in zip(calls[::2], calls[1::2], strict=True))
    row = rules.compare(untuned, tuned, margin_pct=2.0)
    assert row["verdict"] == "better" and row["change_pct"] == pytest.approx(50.0)


def test_requests_per_probe_are_the_early_stopping_count_and_fill_every_slot():
    out = _run({"a": 100})
    prompts = {c: p for _, _, c, p in out["_calls"]}
    assert prompts[1] == prompts[32] == 44  # p90 at 99% confidence, none over
    assert prompts[64] == 64 and prompts[128] == 128  # one request per slot at least


def test_probe_cap_ends_the_search_with_an_open_bracket():
    out = _run({"a": 40}, max_probes=7)
    a = out["a"]
    assert _concs(a) == [1, 2, 4, 8, 16, 32, 64]
    assert (a["capacity"], a["first_fail"], a["status"]) == (32, 64, "probe cap reached")
    assert "between 32 and 64: probe cap" in rules.headline_side(a, SLA)


def test_max_concurrency_met_says_at_least():
    a = _run({"a": 1000}, max_concurrency=48)["a"]
    assert _concs(a) == [1, 2, 4, 8, 16, 32, 48]
    assert (a["capacity"], a["first_fail"], a["status"]) == (48, None, "met up to max_concurrency")
    assert "at least this many" in rules.headline_side(a, SLA)


def test_no_load_meets_the_bound_and_the_report_says_what_the_smallest_gave():
    out = _run({"a": 0, "b": 0}, start=4)
    a = out["a"]
    assert _concs(a) == [4, 2, 1]  # bisects below the start down to one request
    assert (a["capacity"], a["first_fail"], a["status"]) == (0, 1, "no load met")
    text = rules.headline_side(a, SLA)
    assert text == "no load met p90 TPOT <= 50 ms; the smallest probed load 1 gave TPOT 60.0 ms"
    row = rules.compare(out["a"], out["b"], margin_pct=2.0)
    assert row["verdict"] == "n/a"


def test_one_side_meets_nothing_the_other_something():
    out = _run({"untuned": 0, "tuned": 3})
    row = rules.compare(out["untuned"], out["tuned"], margin_pct=2.0)
    assert row["verdict"] == "better" and math.isinf(row["change_pct"])


def test_overlapping_brackets_are_inconclusive_at_the_search_resolution():
    untuned = {"capacity": 16, "first_fail": 17}
    tuned = {"capacity": 16, "first_fail": 17}
    row = rules.compare(untuned, tuned, margin_pct=2.0)
    # one request in sixteen is the smallest change the search could see
    assert row["verdict"] == "inconclusive" and row["could_see_pct"] == pytest.approx(6.25)
    assert rules.verdict_text(row).endswith("at least 6.2%)")
    # a resolution inside the margin: the same boundary is equivalent
    wide = {"capacity": 100, "first_fail": 101}
    assert rules.compare(wide, dict(wide), margin_pct=2.0)["verdict"] == "equivalent"
    # a capped search: brackets 16..32 and 24..25 overlap, nothing called
    row = rules.compare({"capacity": 16, "first_fail": 32}, tuned | {"capacity": 24,
                           "first_fail": 25}, margin_pct=2.0)  # fmt: skip
    assert row["verdict"] == "inconclusive" and row["could_see_pct"] == pytest.approx(100.0)


def test_worse_when_tuned_fails_below_untuned_capacity():
    row = rules.compare({"capacity": 8, "first_fail": 9}, {"capacity": 4, "first_fail": 5}, 2.0)
    assert row["verdict"] == "worse" and row["change_pct"] == pytest.approx(-50.0)


def test_a_pass_above_the_first_fail_is_flagged_and_the_fail_kept():
    search = rules.Search(["a"], 1, 64, 20)
    for conc, ok in ((1, True), (2, True), (4, False), (8, True)):
        search.record(conc, {"a": ok})
    out = search.outcome("a")
    assert (out["capacity"], out["first_fail"], out["non_monotone"]) == (2, 4, True)


def test_failed_requests_fail_a_probe():
    values = {"ttft": 10.0, "tpot": 5.0, "e2el": 50.0}
    assert capacity.decide(values, {"tpot": 50}, failed=0, sent=44, max_failed_share=0.0) == []
    over = capacity.decide(values, {"tpot": 50}, failed=1, sent=44, max_failed_share=0.0)
    assert over == ["failed requests"]
    assert capacity.decide({**values, "tpot": None}, {"tpot": 50}, 0, 44, 0.0) == ["tpot"]


def test_per_point_bounds_replace_the_sections():
    sla = {**SLA, "ttft_ms": 900, "points": [{"isl": 32, "osl": 8, "tpot_ms": None}]}
    assert rules.point_bounds(sla, 512, 512) == {"ttft": 900, "tpot": 50}
    assert rules.point_bounds(sla, 32, 8) == {"ttft": 900}


def test_the_plans_probe_count_bounds_the_real_search():
    for boundaries in ({"u": 16, "t": 24}, {"u": 0, "t": 255}, {"u": 1000, "t": 3}):
        steps = len(_run(boundaries, max_probes=100)["_calls"]) // 2
        assert steps <= rules.max_probe_steps({**SLA, "max_probes": 100})
    assert rules.max_probe_steps(SLA) == 20  # the cap binds: 9 doublings + 2 x 7


def test_the_loader_check_finds_a_capacity_its_probes_do_not_give():
    entry = _run({"a": 5})["a"]
    section = {"points": [entry]}
    assert rules.consistency_problem(section) is None
    section = {"points": [{**entry, "capacity": 6}]}
    field, value, expected = rules.consistency_problem(section)
    assert (field, value) == ("points[0].capacity", 6) and "5 with first fail 6" in expected
