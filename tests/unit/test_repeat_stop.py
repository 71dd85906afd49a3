"""Sequential repeats of the serve stage (issue 32 item 3): which points get another
interleaved pair (cellbench.serve.repeat_stop), what each point records, the checked loader
that reads it back, and the config and job that switch it on."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from cellbench.common import atomicio
from cellbench.config import jobargs
from cellbench.config import loader as cbconfig
from cellbench.results import loaders
from cellbench.results.result_file import ResultError
from cellbench.runtime import pins
from cellbench.serve.job import StageConfig
from cellbench.serve.repeat_stop import RepeatStop, point_key, valid_pairs
from cellbench.stats import comparison, sequential

ROOT = Path(__file__).resolve().parents[2]
METRICS = list(comparison.METRICS)
# Side B's value per repeat (A is 100 at every repeat), per grid point: the same as A (its
# verdict is known after 2 pairs), twice A (known after 2), and a noisy +25% that the rule
# keeps open past the minimum, to its 3rd pair (checked against sequential.decide below).
SERIES = {
    (8, 4): [100.2, 100.1, 100.3, 100.2, 100.1],
    (16, 4): [200.0, 201.0, 199.0, 200.0, 200.0],
    (32, 4): [130.0, 118.0, 128.0, 121.0, 126.0],
}


def _point(isl: int, osl: int, rep: int, value: float, **extra) -> dict:
    p = {"isl": isl, "osl": osl, "max_concurrency": 1, "load_shape": "concurrency"}
    p.update(repeat=rep, num_prompts=4, failed=0, completed=4, **extra)
    # throughput moves the other way, as it would (higher is better)
    return {**p, **{m: value for m in METRICS[:-1]}, METRICS[-1]: 10000.0 / value}


def _run(stop: RepeatStop, series: dict, invalid: set | None = None):
    """The serve stage's loop (measure.py) without servers: per repeat, the points
    ``stop.wanted`` names are 'measured' on both sides, then each gets its decision."""
    a: list[dict] = []
    b: list[dict] = []
    rep = 0
    while wanted := stop.wanted(rep):
        for (isl, osl), values in series.items():
            key = point_key(_point(isl, osl, rep, 1.0))
            if key not in wanted:
                continue
            bad = {"invalid": "server restarted"} if (isl, osl, rep) in (invalid or set()) else {}
            a.append(_point(isl, osl, rep, 100.0))
            b.append(_point(isl, osl, rep, values[rep], **bad))
            mine = [p for p in a if point_key(p) == key], [p for p in b if point_key(p) == key]
            stop.record(key, *mine)
        rep += 1
    stop.annotate([a, b])
    return a, b, rep


def _stop(series: dict, minimum: int = 2, cap: int = 5) -> RepeatStop:
    keys = [point_key(_point(isl, osl, 0, 1.0)) for isl, osl in series]
    return RepeatStop(keys, minimum=minimum, cap=cap, floor_pct=10.0, max_failed_share=0.0)


def test_points_stop_when_settled_and_the_rest_go_on_to_the_cap():
    stop = _stop(SERIES)
    a, b, repeats = _run(stop, SERIES)
    used = {(p["isl"], p["osl"]): p["repeats_used"] for p in b}
    assert used == {(8, 4): 2, (16, 4): 2, (32, 4): 3}
    assert repeats == 3  # the job ran as many repeats as its longest point
    # Each point measured in exactly the repeats it records, on both sides.
    for side in (a, b):
        for key, n in used.items():
            assert sorted(p["repeat"] for p in side if (p["isl"], p["osl"]) == key) == list(
                range(n)
            )
    by_key = {(p["isl"], p["osl"]): p for p in b}
    assert by_key[(16, 4)]["stop_statuses"]["mean_ttft_ms"] == sequential.WORSE
    # B is twice as slow: its throughput (higher is better) is worse too
    assert by_key[(16, 4)]["stop_statuses"]["output_throughput"] == sequential.WORSE
    assert by_key[(8, 4)]["stop_reason"] == "settled"
    # What each point records is what the rule says on its recorded pairs, with the design
    # the report uses (rows = points x metrics, the cap, the floor).
    design = sequential.Design(rows=len(SERIES) * len(METRICS), cap=5, floor_pct=10.0)
    for key, p in by_key.items():
        mine = [x for x in a if (x["isl"], x["osl"]) == key]
        theirs = [x for x in b if (x["isl"], x["osl"]) == key]
        pairs, invalid = valid_pairs(mine, theirs, 0.0)
        step = sequential.decide(pairs, comparison.METRICS, design, invalid=invalid)
        assert step["action"] == "stop" and p["stop_reason"] == step["reason"] == "settled"
        assert p["stop_statuses"] == {m: s["status"] for m, s in step["metrics"].items()}
        assert p["repeat_cap"] == 5 and p["invalid_repeats"] == 0


def test_no_point_stops_before_the_minimum():
    stop = _stop(SERIES, minimum=3)
    _, b, _ = _run(stop, SERIES)
    assert {(p["isl"], p["osl"]): p["repeats_used"] for p in b} == {
        (8, 4): 3,
        (16, 4): 3,
        (32, 4): 3,
    }


def test_the_cap_ends_an_open_point():
    stop = _stop({(32, 4): SERIES[(32, 4)]}, cap=3)
    _, b, repeats = _run(stop, {(32, 4): SERIES[(32, 4)]})
    assert repeats == 3
    assert {p["stop_reason"] for p in b} == {sequential.CAP}
    assert {p["repeats_used"] for p in b} == {3}


def test_a_point_whose_metrics_all_settled_by_the_cap_says_settled():
    """decide's point reason is "cap reached" once the pairs reach the cap; the record says
    "settled" where no metric was left open there, "cap reached" where one was."""
    stop = _stop(SERIES, minimum=3, cap=3)
    _, b, _ = _run(stop, SERIES)
    got = {(p["isl"], p["osl"]): (p["repeats_used"], p["stop_reason"]) for p in b}
    assert got == {(8, 4): (3, "settled"), (16, 4): (3, "settled"), (32, 4): (3, sequential.CAP)}
    open_ = [p for p in b if p["isl"] == 32][0]["stop_statuses"]
    assert set(open_.values()) == {sequential.CAP}


def test_invalid_repeats_are_left_out_of_the_pairs_and_counted():
    series = {(8, 4): SERIES[(8, 4)]}
    stop = _stop(series, cap=5)
    # repeat 1 of side B is invalid (a server restart): that pair does not count, so the
    # point needs a third pair to have two valid ones.
    a, b, _ = _run(stop, series, invalid={(8, 4, 1)})
    assert {p["repeats_used"] for p in b} == {3}
    assert {p["invalid_repeats"] for p in b} == {1}
    pairs, invalid = valid_pairs(a, b, 0.0)
    assert invalid == 1 and len(pairs["mean_ttft_ms"][0]) == 2


def test_too_many_invalid_repeats_stop_a_point_and_say_so():
    series = {(8, 4): SERIES[(8, 4)]}
    stop = _stop(series, cap=5)
    _, b, _ = _run(stop, series, invalid={(8, 4, 0), (8, 4, 1), (8, 4, 2)})
    assert {p["stop_reason"] for p in b} == {sequential.INVALID}
    assert {p["invalid_repeats"] for p in b} == {3}


def test_a_points_key_is_the_same_before_and_after_it_is_measured():
    """The loop picks points by the load point it is about to run (measure._key) and decides
    on the measured records (JSON has no infinity: loadgen writes "inf")."""
    import math

    from cellbench.serve import load_shapes
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
    with pytest.raises(ValueError, match="2 <= repeats <= repeat_cap"):
        _stop(SERIES, minimum=4, cap=3)
    with pytest.raises(ValueError, match="2 <= repeats"):
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
    assert loaders.load_bench(_bench(tmp_path, b)).data["points"][0]["repeat_cap"] == 5
    # Files of fixed repeats (no such fields) load as before.
    plain = [{k: v for k, v in p.items() if k not in stop.outcome(point_key(p))} for p in b]
    loaders.load_bench(_bench(tmp_path, plain))
    bad = copy.deepcopy(b)
    bad[0]["repeats_used"] += 1  # no longer the point's repeats here
    with pytest.raises(ResultError, match="repeats_used"):
        loaders.load_bench(_bench(tmp_path, bad))
    half = copy.deepcopy(b)
    del half[-1]["repeat_cap"]
    with pytest.raises(ResultError, match="repeat_cap.*every point or none"):
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
        ({"repeats": 4, "repeat_cap": 3}, "serve.repeat_cap = 3: below serve.repeats = 4"),
        ({"repeats": 1, "repeat_cap": 3}, "serve.repeats = 1 with serve.repeat_cap = 3"),
        ({"repeat_cap": 1}, "repeat_cap"),
    ],
)
def test_the_config_refuses_a_cap_that_cannot_work(serve, message):
    with pytest.raises(cbconfig.ConfigError, match=message):
        _config(**serve)


def test_the_job_carries_the_cap_and_floor_only_when_set():
    on = _config()  # the embedded default sets repeat_cap
    off = _config(repeat_cap=None, repeats=3)
    p = pins.Pins.for_config(on)
    job_on = jobargs.serve_job(on, p, Cell, "pair")
    job_off = jobargs.serve_job(off, p, Cell, "pair")
    assert job_on["repeat_cap"] == on["serve"]["repeat_cap"]
    assert job_on["min_change_pct"] == on["report"]["min_change_pct"]
    # Without a cap the job has neither key: configs that never set it keep their settings.
    assert "repeat_cap" not in job_off and "min_change_pct" not in job_off
    host = {"out_dir": "x", "server_command": ["a-server"], "gsm8k": False}
    cfg = StageConfig.from_job({**job_on, **host, "tuned_config_dir": str(ROOT / "config")})
    assert (cfg.repeat_cap, cfg.min_change_pct) == (3, on["report"]["min_change_pct"])
    # Arms served apart (interleave_arms false) have no pairs: their jobs run fixed repeats.
    apart = jobargs.serve_job(_config(interleave_arms=False), p, Cell, "tuned")
    assert "repeat_cap" not in apart and "min_change_pct" not in apart
    with pytest.raises(ValueError, match="needs --arm pair or images"):
        StageConfig.from_job({**job_on, **host, "arm": "untuned"})


# --- the report ---------------------------------------------------------------------------


def _frame(moe_source: str = "tuned"):
    """The serve frame of one cell measured with sequential repeats (as report.cell_frames
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


def test_the_comparison_table_shows_verdict_repeats_used_why_and_invalid_repeats():
    serve, _ = _frame()
    lines = comparison.render(
        "t", serve[serve.arm == "untuned"], serve[serve.arm == "tuned"], min_change_pct=10.0
    )
    header = next(ln for ln in lines if ln.startswith("| ISL-OSL"))
    for column in ("stopped", "repeats used", "invalid A/B", "verdict"):
        assert f" {column} " in header
    row_16 = [ln for ln in lines if ln.startswith("| 16-4") and "mean_ttft_ms" in ln][0]
    # 16-4: twice as slow, called worse by the rule; its invalid repeat 1 of B took a third
    # pair and is counted, not dropped.
    assert "| sequential " in row_16 and "worse" in row_16
    assert "3 of 5: settled" in row_16 and "0/1" in row_16
    row_8 = [ln for ln in lines if ln.startswith("| 8-4") and "mean_ttft_ms" in ln][0]
    assert "2 of 5: settled" in row_8 and "within noise" in row_8
    assert any("server restarted" in ln for ln in lines)


def test_the_pr_file_gives_each_point_its_verdicts_repeats_and_invalid_count():
    from cellbench.report import pr_markdown

    serve, cell = _frame()
    text = "\n".join(pr_markdown.verdict_lines(serve, cell, 10.0))
    assert "#### Verdicts, tuned against untuned" in text
    assert "| ISL-OSL | TTFT | TPOT | E2E | output tok/s | repeats used | invalid A/B |" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("| 16-4"))
    # the median change of its valid pairs, settled at its 2nd valid pair, of 3 measured
    assert "| worse (+99.5%); worse at 2 |" in line and "3 of 5: settled" in line
    assert line.endswith("| 0/1 (+1 unpaired) |")


def test_arms_that_cannot_differ_still_list_repeats_used_and_why():
    from cellbench.report import pr_markdown

    serve, cell = _frame(moe_source="none seen")
    lines = pr_markdown.verdict_lines(serve, cell, 10.0)
    assert lines[0] == "#### Repeats per point" and "verdict" not in "\n".join(lines)
    line = next(ln for ln in lines if ln.startswith("| 32-4"))
    assert "3 of 5: settled" in line


def test_the_stage_log_gives_the_reason_the_records_carry(capsys):
    """measure._decide_repeat's log line per stopped point, in the case where decide's own
    reason ("cap reached") and the record's ("settled", no metric open at the cap) differ."""
    from types import SimpleNamespace

    from cellbench.serve import measure

    stop = _stop(SERIES, minimum=3, cap=3)
    runs = {"untuned": SimpleNamespace(points=[]), "tuned": SimpleNamespace(points=[])}
    for rep in range(3):
        for (isl, osl), values in SERIES.items():
            runs["untuned"].points.append(_point(isl, osl, rep, 100.0))
            runs["tuned"].points.append(_point(isl, osl, rep, values[rep]))
        measure._decide_repeat(stop, runs, ["untuned", "tuned"], rep)
    said = [ln for ln in capsys.readouterr().err.splitlines() if "valid pairs" in ln]
    assert len(said) == 3
    assert any("8-4 c1: settled after 3 valid pairs" in ln for ln in said), said
    assert any("16-4 c1: settled after 3 valid pairs" in ln for ln in said), said
    assert any(f"32-4 c1: {sequential.CAP} after 3 valid pairs" in ln for ln in said), said
