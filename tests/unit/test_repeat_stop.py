"""Sequential server starts of the serve stage: which points get another round
(cellbench.serve.repeat_stop), what each point records, the checked loader that reads it
back, the config and job that switch it on, and the report's tables of it."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from cellbench.common import atomicio
from cellbench.config import jobargs
from cellbench.config import loader as cbconfig
from cellbench.contracts.point import point_key
from cellbench.contracts.result_file import ResultError
from cellbench.report import comparison_tables
from cellbench.results import loaders
from cellbench.runtime import pins
from cellbench.serve.job import StageConfig
from cellbench.serve.repeat_stop import RepeatStop, valid_groups
from cellbench.stats import comparison, sequential

ROOT = Path(__file__).resolve().parents[2]
METRICS = list(comparison.METRICS)
# Side B's value per start (one repeat a start; A is 100 with a small start offset), per
# grid point: the same as A (equivalent at the second look), twice A (changed there), and a
# noisy +25% that needs more starts (all checked against sequential.decide below).
A_OFFSET = [100.0, 100.4, 99.7, 100.2, 99.9, 100.1]
SERIES = {
    (8, 4): [100.1, 100.5, 99.8, 100.2, 100.0, 100.1],
    (16, 4): [200.0, 201.0, 199.0, 200.5, 200.0, 199.5],
    (32, 4): [125.0, 119.0, 131.0, 120.0, 129.0, 122.0],
}
CAP = 6


def _point(isl: int, osl: int, start: int, value: float, **extra) -> dict:
    p = {"isl": isl, "osl": osl, "max_concurrency": 1, "load_shape": "concurrency"}
    p.update(start=start, repeat=start, num_prompts=4, failed=0, completed=4, **extra)
    # throughput moves the other way, as it would (higher is better)
    return {**p, **{m: value for m in METRICS[:-1]}, METRICS[-1]: 10000.0 / value}


def _run(stop: RepeatStop, series: dict, invalid: set | None = None):
    """The serve stage's loop (measure.py) without servers: per round, the points
    ``stop.wanted`` names are 'measured' on both sides, then each gets its decision."""
    a: list[dict] = []
    b: list[dict] = []
    round_ = 0
    while wanted := stop.wanted(round_):
        for (isl, osl), values in series.items():
            key = point_key(_point(isl, osl, 0, 1.0))
            if key not in wanted:
                continue
            bad = (
                {"invalid": "server restarted"} if (isl, osl, round_) in (invalid or set()) else {}
            )
            # one job-wide order over both sides: the interleaving the report pairs on
            a.append(_point(isl, osl, round_, A_OFFSET[round_], seq=2 * len(a)))
            b.append(_point(isl, osl, round_, values[round_], seq=2 * len(b) + 1, **bad))
            mine = [p for p in a if point_key(p) == key], [p for p in b if point_key(p) == key]
            stop.record(key, *mine)
        round_ += 1
    stop.annotate([a, b])
    return a, b, round_


def _stop(series: dict, minimum: int = 2, cap: int = CAP) -> RepeatStop:
    keys = [point_key(_point(isl, osl, 0, 1.0)) for isl, osl in series]
    return RepeatStop(keys, minimum=minimum, cap=cap, margin_pct=2.0, max_failed_share=0.0)


def _oracle(a: list[dict], b: list[dict], key: tuple, cap: int = CAP, minimum: int = 2) -> dict:
    design = sequential.Design(rows=len(SERIES) * len(METRICS), cap=cap, min_starts=minimum,
                               margin_pct=2.0)  # fmt: skip
    mine = [x for x in a if (x["isl"], x["osl"]) == key]
    theirs = [x for x in b if (x["isl"], x["osl"]) == key]
    groups, invalid = valid_groups(mine, theirs, 0.0)
    return sequential.decide(groups, comparison.METRICS, design, invalid=invalid)


def test_points_stop_when_settled_and_the_rest_go_on():
    stop = _stop(SERIES)
    a, b, rounds = _run(stop, SERIES)
    used = {(p["isl"], p["osl"]): p["starts_used"] for p in b}
    # no change: equivalent at the second look (the first, at 2 starts, has 1 degree of
    # freedom and O'Brien-Fleming's tiny level: too wide an interval to be inside the margin)
    assert used[(8, 4)] == 3
    # twice as slow: changed at the second look; the noisy +25% needs more starts
    assert used[(16, 4)] == 3 and used[(32, 4)] == 5
    assert rounds == max(used.values())  # the job ran as many rounds as its longest point
    # Each point measured in exactly the starts it records, on both sides.
    for side in (a, b):
        for key, n in used.items():
            got = sorted(p["start"] for p in side if (p["isl"], p["osl"]) == key)
            assert got == list(range(n))
    by_key = {(p["isl"], p["osl"]): p for p in b}
    assert by_key[(16, 4)]["stop_statuses"]["mean_ttft_ms"] == sequential.CHANGED
    # B is twice as slow: its throughput (higher is better) changed too
    assert by_key[(16, 4)]["stop_statuses"]["output_throughput"] == sequential.CHANGED
    # What each point records is what the rule says on its recorded starts, with the design
    # the report uses (rows = points x metrics, the cap, the margin).
    for key, p in by_key.items():
        step = _oracle(a, b, key)
        assert step["action"] == "stop" and p["stop_reason"] == step["reason"]
        assert p["stop_statuses"] == {m: s["status"] for m, s in step["metrics"].items()}
        assert (p["starts_cap"], p["starts_min"], p["invalid_repeats"]) == (CAP, 2, 0)


def test_no_point_stops_before_the_minimum():
    stop = _stop(SERIES, minimum=3)
    _, b, _ = _run(stop, SERIES)
    assert min(p["starts_used"] for p in b) == 3


def test_the_cap_ends_an_open_point():
    series = {(32, 4): SERIES[(32, 4)]}
    stop = _stop(series, cap=2)
    _, b, rounds = _run(stop, series)
    assert rounds == 2 and {p["starts_used"] for p in b} == {2}
    assert {p["stop_reason"] for p in b} <= {sequential.CAP, sequential.SETTLED}


def test_invalid_repeats_are_left_out_and_counted():
    series = {(8, 4): SERIES[(8, 4)]}
    stop = _stop(series)
    # start 1 of side B is invalid (a server restart): that start does not count, so the
    # point needs more starts than the 3 it takes without it.
    a, b, _ = _run(stop, series, invalid={(8, 4, 1)})
    assert {p["starts_used"] for p in b} == {5}
    assert {p["invalid_repeats"] for p in b} == {1}
    groups, invalid = valid_groups(a, b, 0.0)
    assert invalid == 1 and len(groups["mean_ttft_ms"][0]) == 4


def test_too_many_invalid_repeats_stop_a_point_and_say_so():
    series = {(8, 4): SERIES[(8, 4)]}
    stop = _stop(series)
    _, b, _ = _run(stop, series, invalid={(8, 4, 0), (8, 4, 1), (8, 4, 2)})
    assert {p["stop_reason"] for p in b} == {sequential.INVALID}
    assert {p["invalid_repeats"] for p in b} == {3}


def test_a_points_key_is_the_same_before_and_after_it_is_measured():
    """The loop picks points by the load point it is about to run (measure._key) and decides
    on the measured records (JSON has no infinity: loadgen writes "inf")."""
    import math

    from cellbench.contracts import load_shapes
    from cellbench.serve.measure import _key

    lps = load_shapes.load_points([2, 4], math.inf, [1.5, 3.0], math.inf, 2, 1, 8)
    keys = set()
    for lp in lps:
        recorded = {**lp, "isl": 8, "osl": 4}
        for name in ("request_rate", "burstiness"):
            recorded[name] = "inf" if lp[name] == math.inf else lp[name]
        assert _key({"isl": 8, "osl": 4}, lp) == point_key(recorded)
        keys.add(point_key(recorded))
    assert len(keys) == len(lps)  # every load point its own


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError, match="2 <= starts min <= starts cap"):
        _stop(SERIES, minimum=4, cap=3)
    with pytest.raises(ValueError, match="2 <= starts min"):
        _stop(SERIES, minimum=1, cap=3)


# --- the loader ---------------------------------------------------------------------------


def _bench(tmp_path: Path, points: list[dict]) -> Path:
    """A schema-valid bench.json of one arm holding ``points`` (full vllm-bench keys)."""
    path = tmp_path / "untuned" / "bench.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    full = []
    for i, p in enumerate(points):
        q = {k: v for k, v in p.items() if k != "load_shape"}
        q.update(seq=i, started_at="2026-12-06T00:00:00.000+00:00", request_rate="inf")
        q.update(duration=1.0, total_input_tokens=8, total_output_tokens=4)
        q.update(request_throughput=1.0, total_token_throughput=1.0)
        for name in ("ttft", "tpot", "itl", "e2el"):
            q.update({f"{s}_{name}_ms": 1.0 for s in ("mean", "median", "std", "p99")})
        q.update({m: p[m] for m in METRICS})
        full.append(q)
    bench = {
        "schema_version": 1,
        "cell": "host-cpu/m/tp1-ep1",
        "arm": "untuned",
        "runtime": "local",
        "image_digest": "local:x",
        "cold": None,
        "server": {"launcher": "local", "model": "m", "model_id": "m", "ready_s": 1.0},
        "ignore_eos": False,
        "points": full,
    }
    atomicio.write_json(path, bench, checksum=True)  # as the stage writes it
    return path


def test_the_loader_reads_what_the_stage_records_and_refuses_disagreements(tmp_path):
    stop = _stop(SERIES)
    _, b, _ = _run(stop, SERIES)
    assert loaders.load_bench(_bench(tmp_path, b)).data["points"][0]["starts_cap"] == CAP
    # Files of fixed starts (no such fields) load as before.
    plain = [{k: v for k, v in p.items() if k not in stop.outcome(point_key(p))} for p in b]
    loaders.load_bench(_bench(tmp_path, plain))
    bad = copy.deepcopy(b)
    bad[0]["starts_used"] += 1  # no longer the point's starts here
    with pytest.raises(ResultError, match="starts_used"):
        loaders.load_bench(_bench(tmp_path, bad))
    half = copy.deepcopy(b)
    del half[-1]["starts_cap"]
    with pytest.raises(ResultError, match="starts_cap.*every point or none"):
        loaders.load_bench(_bench(tmp_path, half))


# --- config and job -----------------------------------------------------------------------


class Cell:
    image, model, tp, ep = "host-cpu", "tiny-qwen3-moe", "1", "1"


def _config(**serve) -> dict:
    import yaml

    raw = yaml.safe_load((ROOT / "config" / "local.yaml").read_text())
    raw["serve"].update(serve)
    raw["serve"] = {k: v for k, v in raw["serve"].items() if v is not None}
    return cbconfig.validate(raw)


@pytest.mark.parametrize(
    ("serve", "message"),
    [
        ({"starts": {"min": 3, "cap": 2}}, "serve.starts.cap = 2: below serve.starts.min = 3"),
        ({"starts": {"min": 0, "cap": 2}}, "serve.starts.min"),
        ({"starts": {"min": 2, "cap": 2.5}}, "serve.starts.cap"),
        ({"starts": {"min": 2.0, "cap": 3}}, "serve.starts.min"),
        ({"repeats": 1.5}, "serve.repeats"),
        ({"repeat_cap": 3}, "repeat_cap"),
    ],
)
def test_the_config_refuses_counts_that_cannot_work(serve, message):
    with pytest.raises(cbconfig.ConfigError, match=message):
        _config(**serve)


@pytest.mark.parametrize("margin", [0, -1.0])
def test_the_config_refuses_a_margin_that_cannot_work(margin):
    import yaml

    raw = yaml.safe_load((ROOT / "config" / "local.yaml").read_text())
    raw["report"] = {"min_change_pct": margin}
    with pytest.raises(cbconfig.ConfigError, match="report.min_change_pct"):
        cbconfig.validate(raw)


def test_the_job_carries_the_starts_and_the_margin_only_when_they_stop():
    on = _config()  # the embedded default sets starts {min: 2, cap: 3}
    off = _config(starts={"min": 2, "cap": 2})
    p = pins.Pins.for_config(on)
    job_on = jobargs.serve_job(on, p, Cell, "pair")
    job_off = jobargs.serve_job(off, p, Cell, "pair")
    assert (job_on["starts_min"], job_on["starts_cap"]) == (2, 3)
    assert job_on["min_change_pct"] == on["report"]["min_change_pct"] == 2.0
    # Without stopping the margin shapes nothing measured: not in the job.
    assert (job_off["starts_min"], job_off["starts_cap"]) == (2, 2)
    assert "min_change_pct" not in job_off
    host = {"out_dir": "x", "server_command": ["a-server"], "gsm8k": False}
    cfg = StageConfig.from_job({**job_on, **host, "tuned_config_dir": str(ROOT / "config")})
    assert (cfg.starts_min, cfg.starts_cap, cfg.min_change_pct) == (2, 3, 2.0)
    # Arms served apart (interleave_arms false): min starts, fixed.
    apart = jobargs.serve_job(_config(interleave_arms=False), p, Cell, "tuned")
    assert apart["starts_cap"] == apart["starts_min"] == 2 and "min_change_pct" not in apart
    with pytest.raises(ValueError, match="needs --arm pair or images"):
        StageConfig.from_job({**job_on, **host, "arm": "untuned"})
    with pytest.raises(ValueError, match="--starts-cap 1 is below --starts-min 2"):
        StageConfig.from_job({**job_on, **host, "starts_cap": 1, "tuned_config_dir": "config"})
    with pytest.raises(ValueError, match="--starts-min: a count of 1 or more, got 2.0"):
        StageConfig.from_job({**job_on, **host, "starts_min": 2.0, "tuned_config_dir": "config"})


# --- the report ---------------------------------------------------------------------------


def _frame(moe_source: str = "tuned"):
    """The serve frame of one cell measured with sequential starts (as report.cell_frames
    makes it: one row per point and repeat, scalars only)."""
    import pandas as pd

    stop = _stop(SERIES)
    a, b, _ = _run(stop, SERIES, invalid={(16, 4, 1)})
    cell = "host-cpu/m/tp1-ep1"
    rows = [
        {"cell": cell, "arm": arm, "moe_source": moe_source, "load": "c1"}
        | {k: v for k, v in p.items() if not isinstance(v, dict)}
        for arm, side in (("untuned", a), ("tuned", b))
        for p in side
    ]
    return pd.DataFrame(rows), cell


def test_the_comparison_table_shows_verdict_starts_why_and_invalid_repeats():
    serve, _ = _frame()
    lines = comparison_tables.render(
        "t", serve[serve.arm == "untuned"], serve[serve.arm == "tuned"], min_change_pct=2.0
    )
    header = next(ln for ln in lines if ln.startswith("| ISL-OSL"))
    for column in ("verdict", "could see", "interval", "p adj", "starts A/B", "stopped",
                   "invalid A/B", "geomean A"):  # fmt: skip
        assert f" {column} " in header
    row_16 = [ln for ln in lines if ln.startswith("| 16-4") and "mean_ttft_ms" in ln][0]
    # 16-4: twice as slow, called worse by the rule; its invalid start 1 of B is counted
    assert "worse" in row_16 and "changed at" in row_16 and "0/1" in row_16
    row_8 = [ln for ln in lines if ln.startswith("| 8-4") and "mean_ttft_ms" in ln][0]
    assert "3 of 6 starts: settled" in row_8
    assert "equivalent" in row_8 or "inconclusive" in row_8
    assert any("server restarted" in ln for ln in lines)


def test_the_pr_file_gives_each_point_its_verdicts_starts_and_invalid_count():
    from cellbench.report import pr_markdown

    serve, cell = _frame()
    text = "\n".join(pr_markdown.verdict_lines(serve, cell, 2.0))
    assert "#### Verdicts, tuned against untuned" in text
    assert "| ISL-OSL | TTFT | TPOT | E2E | output tok/s | starts used | invalid A/B |" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("| 16-4"))
    # the change of the geometric means with its interval, beside the verdict
    assert "| worse: +" in line and "% [+" in line and "of 6: settled" in line
    assert line.endswith("| 0/1 (+1 unpaired) |")


def test_arms_that_cannot_differ_still_list_starts_used_and_why():
    from cellbench.report import pr_markdown

    serve, cell = _frame(moe_source="none seen")
    lines = pr_markdown.verdict_lines(serve, cell, 2.0)
    assert lines[0] == "#### Server starts per point" and "verdict" not in "\n".join(lines)
    line = next(ln for ln in lines if ln.startswith("| 8-4"))
    assert "3 of 6: settled" in line


def test_the_stage_log_gives_the_reason_the_records_carry(capsys):
    """measure._decide_round's log line per stopped point says what its records say."""
    from types import SimpleNamespace

    from cellbench.serve import measure

    stop = _stop(SERIES, minimum=3, cap=3)
    runs = {"untuned": SimpleNamespace(points=[]), "tuned": SimpleNamespace(points=[])}
    for round_ in range(3):
        for (isl, osl), values in SERIES.items():
            runs["untuned"].points.append(_point(isl, osl, round_, A_OFFSET[round_]))
            runs["tuned"].points.append(_point(isl, osl, round_, values[round_]))
        measure._decide_round(stop, runs, ["untuned", "tuned"], round_)
    said = [ln for ln in capsys.readouterr().err.splitlines() if "after 3 starts" in ln]
    assert len(said) == 3
    for key in SERIES:
        reason = stop.outcome(point_key(_point(*key, 0, 1.0)))["stop_reason"]
        assert any(f"{key[0]}-{key[1]} c1: {reason} after 3 starts" in ln for ln in said), said
