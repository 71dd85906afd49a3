"""Percentile claims from per-request files written by hand (cellbench.report.percentile_claims,
issue 32 item 5): failed requests count as over the bound, repeats are pooled, per-point bounds
override the section's, a missing sidecar is said, a sidecar that disagrees with its bench.json
is refused. The real serve job's files are tests/stage/test_claims_from_serve_job.py's."""

from __future__ import annotations

from pathlib import Path

import pytest
from cellbench.contracts import request_detail
from cellbench.contracts.point import point_bounds
from cellbench.contracts.result_file import ResultError
from cellbench.report import build as report
from cellbench.report import percentile_claims as pc
from support import result_fixtures as fx

CELL = "host-cpu/tiny-qwen3-moe/tp1-ep1"


def _detail(n: int, failed: int, ttft_s: float = 0.05, osl: int = 8) -> dict[str, list]:
    ok = n - failed
    return {
        "input_lens": [512] * n,
        "output_lens": [osl] * ok + [0] * failed,
        "ttfts": [ttft_s] * ok + [0.0] * failed,
        "itls": [[0.01] * (osl - 1)] * ok + [[]] * failed,
        "latencies": [ttft_s + 0.01 * (osl - 1)] * ok + [0.0] * failed,
        "start_times": [0.001 * i for i in range(n)],
        "errors": [""] * ok + ["HTTP 500"] * failed,
    }


def _arm(res: Path, arm: str, per_repeat: list[tuple[int, int]], sidecar: bool = True) -> Path:
    """An arm's bench.json with one 512-512 c16 point per repeat ((prompts, failed) each) and,
    unless told not to, its per-request sidecar as the serve stage writes it."""
    points, records = [], []
    for rep, (n, failed) in enumerate(per_repeat):
        p = fx.point(seq=rep, repeat=rep, prompts=n, completed=n - failed, failed=failed)
        points.append(p)
        records.append(request_detail.record(p, _detail(n, failed)))
    path = fx.write_bench(res, CELL, arm, points)
    if sidecar:
        request_detail.write(path.with_name(request_detail.file_name()), records)
    return path


def _claims(files: list[Path], res: Path, bounds: dict):
    return pc.claims_frame(report.load_inputs(files, res), bounds).set_index(["arm", "metric"])


def test_a_failed_request_is_over_the_bound(tmp_path):
    res = tmp_path / "results"
    # 700 requests, every success at 50 ms: one failure alone is the one over a 100 ms bound
    files = [_arm(res, "untuned", [(700, 1)]), _arm(res, "tuned", [(700, 2)])]
    rows = _claims(files, res, {"ttft_ms": 100})
    one, two = rows.loc[("untuned", "TTFT")], rows.loc[("tuned", "TTFT")]
    assert (one.queries, one.failed, one.over, one.verdict) == (700, 1, 1, "yes")  # 662 with one
    assert one.observed_ms == pytest.approx(50.0)  # of the successful requests
    # two over need more than 700 queries: not shown either way
    assert (two.over, two.verdict) == (2, "cannot tell") and two.queries_needed > 700
    assert ("untuned", "TPOT") not in rows.index  # no TPOT bound: no TPOT claim


def test_repeats_are_pooled_and_a_point_entry_overrides(tmp_path):
    res = tmp_path / "results"
    files = [_arm(res, arm, [(240, 0), (240, 0)]) for arm in ("untuned", "tuned")]
    # TPOT is 10 ms per token: a 5 ms bound at this point (and concurrency) puts all over
    entry = {"isl": 512, "osl": 512, "concurrency": 16, "tpot_ms": 5, "ttft_ms": None}
    rows = _claims(files, res, {"ttft_ms": 100, "tpot_ms": 20, "points": [entry]})
    tpot = rows.loc[("untuned", "TPOT")]
    assert (tpot.repeats, tpot.queries, tpot.over, tpot.bound_ms) == (2, 480, 480, 5.0)
    assert tpot.verdict == "no"
    assert ("untuned", "TTFT") not in rows.index  # null: unbounded at this point
    rows = _claims(files, res, {"ttft_ms": 100})
    assert rows.loc[("tuned", "TTFT")].verdict == "yes"  # 2 x 240 = 480 >= 459, none over


def test_point_bounds_take_the_most_specific_entry():
    bounds = {
        "ttft_ms": 100,
        "tpot_ms": 20,
        "points": [
            {"isl": 512, "osl": 512, "concurrency": 16, "ttft_ms": 300},
            {"isl": 512, "osl": 512, "ttft_ms": 200, "tpot_ms": None},
        ],
    }
    assert point_bounds(bounds, 512, 512, 16) == {"ttft_ms": 300, "tpot_ms": None}
    assert point_bounds(bounds, 512, 512, 4) == {"ttft_ms": 200, "tpot_ms": None}
    # a request-rate point has no concurrency: only the entry without one applies
    assert point_bounds(bounds, 512, 512, None) == {"ttft_ms": 200, "tpot_ms": None}
    assert point_bounds(bounds, 1024, 1024, 16) == {"ttft_ms": 100, "tpot_ms": 20}


def test_an_arm_without_its_sidecar_is_said_not_guessed(tmp_path):
    res = tmp_path / "results"
    files = [_arm(res, "untuned", [(500, 0)], sidecar=False), _arm(res, "tuned", [(500, 0)])]
    claims = pc.claims_frame(report.load_inputs(files, res), {"ttft_ms": 100})
    lines = "\n".join(pc.section_lines(claims, CELL))
    assert f"| cannot tell ({pc.NO_DETAIL}: rerun its serve job) |" in lines
    assert "| 500 | 0 | yes | 459 |" in lines  # the tuned arm's own requests
    assert pc.section_lines(claims, "other/cell/tp1-ep1") == []
    assert pc.section_lines(pc.claims_frame([], None), CELL) == []


def test_a_sidecar_that_disagrees_with_its_bench_is_refused(tmp_path):
    res = tmp_path / "results"
    path = _arm(res, "untuned", [(500, 0)])
    p = fx.point(seq=0, prompts=500)
    request_detail.write(path.with_name(request_detail.file_name()),
                         [request_detail.record(p, _detail(499, 0))])  # fmt: skip
    refused = r"requests.jsonl.gz: \[seq 0\].errors = \(499 requests\)"
    with pytest.raises(ResultError, match=refused):
        pc.claims_frame(report.load_inputs([path], res), {"ttft_ms": 100})
    request_detail.write(path.with_name(request_detail.file_name()),
                         [request_detail.record({**p, "seq": 7}, _detail(500, 0))])  # fmt: skip
    with pytest.raises(ResultError, match="one record per point"):
        pc.claims_frame(report.load_inputs([path], res), {"ttft_ms": 100})


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{not json", "--latency-bounds is not JSON"),
        ("[99]", "a JSON object (report.latency_bounds)"),
        ('{"percentile": 100, "ttft_ms": 5}', "percentile = 100: a number of % in [0, 100)"),
        ('{"confidence": 40, "ttft_ms": 5}', "confidence = 40: a number of % in [50, 100)"),
        ('{"ttft_ms": 0}', "ttft_ms = 0: a bound in ms, > 0"),
        ('{"ttft_ms": 5, "points": [{"isl": "8", "osl": 3}]}', "needs integer isl and osl"),
    ],
)
def test_the_report_refuses_bad_bounds_by_name(text, words, tmp_path, capsys):
    with pytest.raises(ValueError, match=None) as err:
        pc.parse_bounds(text)
    assert words in str(err.value)
    with pytest.raises(SystemExit) as done:
        report.main(["--out-dir", str(tmp_path / "r"), "--latency-bounds", text, "x.json"])
    assert done.value.code == 2 and words in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_no_bounds_parse_to_none_and_defaults_fill_in():
    assert pc.parse_bounds("null") is None
    assert pc.parse_bounds('{"tpot_ms": 40}') == {
        "percentile": 99,
        "confidence": 99,
        "points": [],
        "tpot_ms": 40,
    }


def test_a_bad_sidecar_stops_the_report_and_keeps_the_previous_one(tmp_path, capsys):
    res, out = tmp_path / "results", tmp_path / "report"
    files = [fx.write_tune(res, CELL)]
    for arm in ("untuned", "tuned"):
        files += [_arm(res, arm, [(500, 0)]), fx.write_gsm8k(res, CELL, arm, [True, False])]
    argv = ["--results", str(res), "--out-dir", str(out), "--latency-bounds", '{"ttft_ms": 100}']
    assert report.main([*argv, *map(str, files)]) == 0
    kept = (out / "report.md").read_text()
    assert "| 500 | 0 | yes | 459 |" in kept
    # the tuned arm's requests edited after they were written: their checksum no longer holds
    sidecar = res / CELL / "serve" / "tuned" / request_detail.file_name()
    sidecar.write_bytes(sidecar.read_bytes() + b"\n")
    capsys.readouterr()
    assert report.main([*argv, *map(str, files)]) == 1
    err = capsys.readouterr().err
    assert f"bad result file {sidecar}: (sha256)" in err and "changed after it was written" in err
    assert "the previous report was kept" in err
    assert (out / "report.md").read_text() == kept
