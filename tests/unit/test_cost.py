"""The cost stated before a run (cellbench.config.cost, `cellbench plan`) and the report's
estimate-against-actual table (issue 32 item 4).

Inputs are real files: the embedded default's config through the real loader, result files
through the project's writers (support/result_fixtures.py), and benchmark files in the format
Snakemake writes them (a tab-separated header and one row; column ``s`` is the wall).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from cellbench import cli
from cellbench.archive import write as archive_write
from cellbench.common import atomicio
from cellbench.config import cost, detect_plan, loader
from cellbench.report import sections
from cellbench.results import archived, job_times
from cellbench.runtime import pins
from cellbench.stats import plan_noise
from support import result_fixtures as fx

ROOT = Path(__file__).resolve().parents[2]
CELL = "host-cpu/tiny-qwen3-moe/tp1-ep1"
LABEL = "embedded-cpu"  # config/local.yaml's run_label
HEADER = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"


def config(**serve) -> dict:
    """The embedded default with one server start of two repeats (no sequential starts)
    unless ``serve`` says otherwise: the starts have their own test below."""
    cfg = loader.load(ROOT / "config" / "local.yaml")
    cfg["serve"].update(repeats=2, starts={"min": 1, "cap": 1})
    cfg["serve"].pop("sla")  # the capacity search has its own tests below
    cfg["serve"].update(serve)
    return cfg


LOCAL_SLA = loader.load(ROOT / "config" / "local.yaml")["serve"]["sla"]


def write_tsv(results: Path, cell: str, name: str, seconds: float) -> Path:
    path = results / "benchmarks" / cell / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(HEADER + f"{seconds}\t0:00:00\t1\t1\t1\t1\t0\t0\t0\t0\n")
    return path


def last_run(
    results: Path, cfg: dict, durations: dict[tuple[int, int], float], serve_s: float = 200.0
) -> None:
    """A cell's last run: both arms' points (with their measured durations), the tune summary,
    GSM8K and every job's benchmark file."""
    repeats = cfg["serve"]["repeats"]
    for arm in ("untuned", "tuned"):
        grid = [(isl, osl, d, r) for (isl, osl), d in durations.items() for r in range(repeats)]
        points = [
            fx.point(isl, osl, repeat=r, seq=k, concurrency=2, prompts=4) | {"duration": d}
            for k, (isl, osl, d, r) in enumerate(grid)
        ]
        fx.write_bench(results, CELL, arm, points)
        fx.write_gsm8k(results, CELL, arm, [True, False, True, True])
        write_tsv(results, CELL, f"gsm8k-{arm}.tsv", 2.0)
    fx.write_tune(results, CELL, batch_sizes=tuple(cfg["tune"]["batch_sizes"]))
    summary = results / CELL / "tune" / "summary.json"
    data = json.loads(summary.read_text())
    data["max_configs"] = cfg["tune"]["max_configs"]
    atomicio.write_json(summary, data, checksum=True)  # as the tune stage writes it
    write_tsv(results, CELL, "tune.tsv", 60.0)
    write_tsv(results, CELL, "serve-pair.tsv", serve_s)


def test_without_history_every_figure_is_the_configs_assumption(tmp_path):
    cfg = config(sla=LOCAL_SLA)
    plan, serve = cfg["plan"], cfg["serve"]
    est = cost.estimate(cfg, tmp_path)
    jobs = est["cells"][CELL]
    assert jobs["tune"]["seconds"] == pytest.approx(3 * plan["tune_s_per_batch_size"])
    waves = serve["prompts_per_concurrency"] + serve["warmups_per_concurrency"]
    per_repeat = sum(
        waves * (plan["ttft_ms_per_1k_input"] * g["isl"] / 1000 + plan["tpot_ms"] * g["osl"]) / 1000
        for g in serve["grid"]
    )
    gsm8k = 2 * cfg["gsm8k"]["limit"] * plan["gsm8k_s_per_question"]
    # every round starts a fresh server per arm and measures the grid serve.repeats times
    rounds = serve["starts"]["cap"]
    # serve.sla's search on its one point (32-8): at most 2 probes (its cap) x 2 arms, each of
    # 2 requests (a median at 75%) at concurrency 2 and up: one wave at the plan's assumed times
    sla = serve["sla"]
    assert (sla["max_probes"], sla["start"], sla["points"][0]["isl"]) == (2, 2, 32)
    assert (sla["percentile"], sla["confidence"]) == (50, 75)
    search = 2 * 2 * 1 * (plan["ttft_ms_per_1k_input"] * 32 / 1000 + plan["tpot_ms"] * 8) / 1000
    expected = (
        2 * rounds * plan["server_start_s"]
        + 2 * rounds * serve["repeats"] * per_repeat
        + gsm8k
        + search
    )
    assert jobs["serve"]["seconds"] == pytest.approx(expected)
    assert (
        "capacity search (serve.sla): up to 2 probes x 2 arms per point" in jobs["serve"]["basis"]
    )
    assert all(j["basis"].startswith("assumed") for j in jobs.values())
    # The embedded default holds no GPU: no GPU-hours, whatever the wall.
    assert est["totals"]["serve"]["gpu_hours"] == 0.0
    # An assumption the user sets moves the figure it makes, and only that one.
    cfg2 = config(sla=LOCAL_SLA)
    cfg2["plan"]["server_start_s"] = plan["server_start_s"] + 100
    jobs2 = cost.estimate(cfg2, tmp_path)["cells"][CELL]
    assert jobs2["serve"]["seconds"] == pytest.approx(expected + 2 * rounds * 100)
    assert jobs2["tune"]["seconds"] == jobs["tune"]["seconds"]


def test_with_history_the_last_jobs_scale_to_what_is_planned_now(tmp_path):
    cfg = config()
    durations = {(32, 8): 1.5, (64, 8): 2.5}
    last_run(tmp_path, cfg, durations)
    repeats = cfg["serve"]["repeats"]
    measured = 2 * repeats * sum(durations.values())
    jobs = cost.estimate(cfg, tmp_path)["cells"][CELL]
    # Same plan as last time: the last walls come back.
    assert jobs["serve"]["seconds"] == pytest.approx(200.0)
    assert jobs["tune"]["seconds"] == pytest.approx(60.0)
    assert jobs["gsm8k"]["seconds"] == pytest.approx(4.0)
    assert all(j["basis"].startswith("history") for j in jobs.values())
    # Twice the repeats: the fixed part stays, the points double.
    more = cost.estimate(config(repeats=2 * repeats), tmp_path)["cells"][CELL]
    assert more["serve"]["seconds"] == pytest.approx(200.0 + measured)
    # A point never measured falls back to the assumption for that point alone.
    cfg3 = config(grid=[{"isl": 32, "osl": 8}, {"isl": 4096, "osl": 8}])
    one = cost.estimate(cfg3, tmp_path)["cells"][CELL]["serve"]["seconds"]
    plan, serve = cfg3["plan"], cfg3["serve"]
    waves = serve["prompts_per_concurrency"] + serve["warmups_per_concurrency"]
    assumed = waves * (plan["ttft_ms_per_1k_input"] * 4096 / 1000 + plan["tpot_ms"] * 8) / 1000
    fixed = 200.0 - measured
    assert one == pytest.approx(fixed + 2 * repeats * (1.5 + assumed))


def _probe(conc: int, ttft: float, duration: float) -> dict:
    return {"step": 0, "concurrency": conc, "num_prompts": conc, "completed": conc, "failed": 0,
            "duration": duration, "values_ms": {"ttft": ttft, "tpot": 500.0, "e2el": 6000.0},
            "passed": ttft <= 3000, "over": [] if ttft <= 3000 else ["ttft"],
            "request_throughput": 0.5, "output_throughput": 4.0, "request_goodput": 0.5,
            "started_at": None}  # fmt: skip


def test_the_capacity_search_is_priced_at_its_probe_cap(tmp_path):
    cfg = config(sla=LOCAL_SLA)
    durations = {(32, 8): 1.5, (64, 8): 2.5}
    last_run(tmp_path, cfg, durations)
    base = cost.estimate(config(), tmp_path)["cells"][CELL]["serve"]["seconds"]
    assert base == pytest.approx(200.0)  # no search planned, none ran: the last wall
    # The last run searched 32-8 on both arms (probes of 6 s and 9 s): its 30 s are part of
    # the 200 s wall. Priced anew: the cap's 2 probes x 2 arms at its longest probe.
    section = {**LOCAL_SLA, "points": [{
        "isl": 32, "osl": 8, "bounds_ms": {"ttft": 3000}, "capacity": 2, "first_fail": 4,
        "status": "probe cap reached", "non_monotone": False,
        "probes": [_probe(2, 1700.0, 6.0), _probe(4, 4100.0, 9.0)]}]}  # fmt: skip
    for arm in ("untuned", "tuned"):
        path = tmp_path / CELL / "serve" / arm / "bench.json"
        bench = json.loads(path.read_text())
        atomicio.write_json(path, {**bench, "capacity": section}, checksum=True)
    serve = cost.estimate(cfg, tmp_path)["cells"][CELL]["serve"]
    assert serve["seconds"] == pytest.approx(200.0 - 2 * (6.0 + 9.0) + 2 * 2 * 9.0)
    assert "32-8: 9.0 s (the last run's longest probe)" in serve["basis"]
    # A larger cap is counted up to what growth and bisection can take: 2 then 4 (max), and
    # a bisection of 2..4 per arm: 4 probes
    wider = cost.estimate(config(sla={**LOCAL_SLA, "max_probes": 12}), tmp_path)
    assert "up to 4 probes x 2 arms" in wider["cells"][CELL]["serve"]["basis"]


def test_report_sets_the_estimate_against_each_jobs_wall(tmp_path):
    cfg = config()
    last_run(tmp_path, cfg, {(32, 8): 1.5, (64, 8): 2.5})
    cost.write(cost.estimate(cfg, tmp_path), tmp_path)
    # The serve job reruns and takes 250 s; the tune job does not rerun.
    serve_tsv = write_tsv(tmp_path, CELL, "serve-pair.tsv", 250.0)
    later = serve_tsv.stat().st_mtime + 5
    os.utime(serve_tsv, (later, later))
    text = "\n".join(sections.cost_section(tmp_path, [CELL], LABEL))
    rows = {line.split(" | ")[1]: line.split(" | ") for line in text.splitlines()[6:] if line}
    assert rows["serve"][2:5] == ["200.0", "250.0", "1.25"]
    assert rows["tune"][4].startswith("not rerun")
    # No estimate written: no section (nothing invented).
    assert sections.cost_section(tmp_path, [CELL], "another-config") == []  # its own only
    assert sections.cost_section(tmp_path, [CELL], None) == []
    (tmp_path / job_times.estimate_file(LABEL)).unlink()
    assert sections.cost_section(tmp_path, [CELL], LABEL) == []


def test_a_damaged_estimate_or_benchmark_file_is_named(tmp_path):
    path = tmp_path / job_times.estimate_file(LABEL)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"kind": "something_else"}))
    with pytest.raises(job_times.JobTimeError, match="not a cellbench cost estimate"):
        job_times.read_estimate(tmp_path, LABEL)
    bad = tmp_path / "benchmarks" / CELL / "tune.tsv"
    bad.parent.mkdir(parents=True)
    bad.write_text("not\ta\nbenchmark\n")
    with pytest.raises(job_times.JobTimeError, match="tune.tsv: not a Snakemake benchmark file"):
        job_times.cell_job_times(tmp_path, CELL)


def test_cellbench_plan_prints_writes_and_refuses_a_bad_config(tmp_path, capsys):
    rc = cli.main(["plan", "--results", str(tmp_path), "--write"])
    out = capsys.readouterr()
    assert rc == 0 and CELL in out.out and "GPU-hours" in out.out
    assert job_times.read_estimate(tmp_path, LABEL)["cells"][CELL]["serve"]["seconds"] > 0
    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / "config" / "local.yaml").read_text() + "\nplan: {tpot_ms: -1}\n")
    assert cli.main(["plan", "--configfile", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "plan" in err and "tpot_ms" in err


def test_the_plan_warns_per_point_whose_prompts_cannot_support_its_bound(tmp_path, capsys):
    """Issue 32 item 5: each bounded point's queries are its prompts over all repeats (what the
    report pools); below MLPerf's 459 for p99 at 99% the plan says so, point by point."""
    # c2: 2 x 2 prompts x 2 repeats = 8 queries; c200: 200 x 2 prompts x 2 repeats = 800
    cfg = config(concurrency=[2, 200])
    assert cost.estimate(cfg, tmp_path)["warnings"] == []  # no bounds, no claim, no warning
    cfg["report"]["latency_bounds"] = {
        "percentile": 99,
        "confidence": 99,
        "ttft_ms": 500,
        # 64-8 keeps TPOT alone at c2 (TTFT unbounded there)
        "points": [{"isl": 64, "osl": 8, "concurrency": 2, "ttft_ms": None, "tpot_ms": 50}],
    }
    warnings = cost.estimate(cfg, tmp_path)["warnings"]
    assert warnings == [
        "report.latency_bounds at 32-8 c2 (ttft_ms), 4 prompts x 2 repeats pooled: "
        "8 prompts "
        "cannot support a p99 latency claim at 99% confidence: even with none over the bound it "
        "needs 459 (MLPerf's early-stopping rule); raise the point's prompt count or drop its "
        "bound",
        "report.latency_bounds at 64-8 c2 (tpot_ms), 4 prompts x 2 repeats pooled: "
        "8 prompts "
        "cannot support a p99 latency claim at 99% confidence: even with none over the bound it "
        "needs 459 (MLPerf's early-stopping rule); raise the point's prompt count or drop its "
        "bound",
    ]
    # A looser claim needs fewer queries: p90 at 90% needs 22, which 12 still cannot give.
    cfg["report"]["latency_bounds"] |= {"percentile": 90, "confidence": 90}
    assert "needs 22 " in cost.estimate(cfg, tmp_path)["warnings"][0]
    # `cellbench plan` prints them after the totals (Snakemake's start prints the same render).
    bounded = tmp_path / "bounded.yaml"
    text = (ROOT / "config" / "local.yaml").read_text()
    bounded.write_text(text + "\nreport:\n  latency_bounds: {ttft_ms: 500}\n")
    assert cli.main(["plan", "--configfile", str(bounded), "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    total = next(i for i, line in enumerate(out) if line.startswith("total: "))
    assert out[total + 1].startswith("warning: report.latency_bounds at 32-8 c2 (ttft_ms), 4 p")
    assert out[total + 2].startswith("warning: report.latency_bounds at 64-8 c2 (ttft_ms)")
    assert out[total + 3].startswith("detectable change (target 3% at 80% power")


def test_the_readmes_bounds_example_loads_on_the_production_config(tmp_path):
    """config/README.md's example is a valid section for config.yaml, whose points (16 x 10
    prompts x 3 repeats = 480 queries) can support a p99 claim: no warning there."""
    text = (ROOT / "config" / "README.md").read_text().split("## Latency bounds")[1]
    example = yaml.safe_load(text.split("```yaml\n")[1].split("```")[0])
    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    cfg.setdefault("report", {}).update(example["report"])
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    loaded = loader.load(path)
    assert loaded["report"]["latency_bounds"]["points"][0]["ttft_ms"] == 8000
    assert cost.estimate(loaded, tmp_path)["warnings"] == []


def test_sequential_starts_pool_their_cap_in_the_bounds_warning(tmp_path):
    """With serve.starts a point pools its repeats over at most the cap's starts: the plan's
    percentile warning counts the queries the cap would pool, the most a point can have."""
    capped = config(repeats=2, starts={"min": 2, "cap": 4})
    capped["report"]["latency_bounds"] = {"percentile": 99, "confidence": 99, "ttft_ms": 500}
    warnings = cost.estimate(capped, tmp_path)["warnings"]
    assert warnings and all(
        "4 prompts x 8 repeats pooled (2 a start x 4 starts, the cap): 32 prompts" in w
        for w in warnings
    )


# --- history from the archive (issue 32 item 4: "from the archive when one exists") --------


def archive_run(tmp_path: Path, cfg: dict, serve_s: float, digest: str | None = None) -> str:
    """A cell's run archived by the real writer into RESULTS/archive (RESULTS = tmp_path /
    "results", left without history); its results and benchmark files lived elsewhere, as in
    a results folder cleaned after archiving. Returns LABEL/RUN."""
    old = tmp_path / f"old-{serve_s}"
    last_run(old, cfg, {(32, 8): serve_s / 100, (64, 8): 2.5}, serve_s=serve_s)
    image = CELL.split("/")[0]
    digest = digest or pins.Pins.for_config(cfg).digest(image)
    done = archive_write.build_run(
        "local", old, [CELL], {image: digest}, "f00", tmp_path / "results" / "archive", "local"
    )
    assert done.added
    return f"local/{done.run}"


def test_the_archive_keeps_each_cells_benchmark_files_in_its_manifest(tmp_path):
    cfg = config()
    ref = archive_run(tmp_path, cfg, serve_s=300.0)
    run = tmp_path / "results" / "archive" / ref
    manifest = json.loads((run / "MANIFEST.json").read_text())
    source = tmp_path / "old-300.0" / "benchmarks" / CELL
    names = sorted(p.name for p in source.iterdir())
    assert names == ["gsm8k-tuned.tsv", "gsm8k-untuned.tsv", "serve-pair.tsv", "tune.tsv"]
    for name in names:
        rel = f"benchmarks/{CELL}/{name}"
        assert (run / rel).read_bytes() == (source / name).read_bytes()
        assert manifest["files"][rel] == archived.sha256_file(source / name)
    assert archived.verify(run) == []
    # A benchmark file that is not one is refused before anything is archived.
    (source / "tune.tsv").write_text("s\th:m:s\n")  # a header and no job's row
    with pytest.raises(archive_write.ResultError, match="tune.tsv: not a Snakemake benchmark"):
        archive_write.build_run("local", tmp_path / "old-300.0", [CELL], {}, "f01", tmp_path / "a")
    assert not (tmp_path / "a" / "local").exists()


def test_without_history_here_the_newest_archived_run_is_used_and_named(tmp_path, capsys):
    cfg = config()
    results = tmp_path / "results"
    ref = archive_run(tmp_path, cfg, serve_s=300.0)
    jobs = cost.estimate(cfg, results)["cells"][CELL]
    # The same plan as the archived run: its walls come back, each naming the run and file.
    assert jobs["serve"]["seconds"] == pytest.approx(300.0)
    assert jobs["tune"]["seconds"] == pytest.approx(60.0)
    assert jobs["gsm8k"]["seconds"] == pytest.approx(4.0)
    assert jobs["serve"]["basis"].startswith(f"archive: {ref}: benchmarks/{CELL}/serve-pair.tsv")
    work = len(cfg["tune"]["batch_sizes"]) * cfg["tune"]["max_configs"]
    tune_basis = f"archive: {ref}: benchmarks/{CELL}/tune.tsv x {work}/{work}"
    assert jobs["tune"]["basis"].startswith(tune_basis)
    assert all("image digest" not in j["basis"] for j in jobs.values())
    # An archived copy is never this results folder's job: the report compares, not "not rerun".
    assert all("history_mtime" not in j for j in jobs.values())
    # More repeats scale the archived points, as they scale this folder's.
    repeats = cfg["serve"]["repeats"]
    more = cost.estimate(config(repeats=2 * repeats), results)["cells"][CELL]["serve"]
    assert more["seconds"] == pytest.approx(300.0 + 2 * repeats * (3.0 + 2.5))
    # `cellbench plan` prints the same, reading another archive root when told.
    elsewhere = tmp_path / "elsewhere"
    (results / "archive").rename(elsewhere)
    assert cost.estimate(cfg, results)["cells"][CELL]["serve"]["basis"].startswith("assumed")
    told = cost.estimate(cfg, results, elsewhere)["cells"][CELL]["serve"]
    assert told["basis"].startswith(f"archive: {ref}")
    args = ["plan", "--results", str(results), "--archive-root", str(elsewhere)]
    assert cli.main(args) == 0
    assert f"archive: {ref}: benchmarks/{CELL}/serve-pair.tsv" in capsys.readouterr().out
    # This results folder's own history wins over the archive.
    last_run(results, cfg, {(32, 8): 1.5, (64, 8): 2.5}, serve_s=200.0)
    here = cost.estimate(cfg, results, elsewhere)["cells"][CELL]
    assert here["serve"]["seconds"] == pytest.approx(200.0)
    assert all(j["basis"].startswith("history: benchmarks/") for j in here.values())


def test_an_archived_run_of_another_digest_is_used_and_the_difference_said(tmp_path):
    cfg = config()
    ref = archive_run(tmp_path, cfg, serve_s=300.0, digest="local:python0.0.0")
    now = pins.Pins.for_config(cfg).digest(CELL.split("/")[0])
    jobs = cost.estimate(cfg, tmp_path / "results")["cells"][CELL]
    assert jobs["serve"]["seconds"] == pytest.approx(300.0)
    for job in jobs.values():
        assert job["basis"].startswith(f"archive: {ref}: ")
        assert f"image digest then local:python0.0.0, pinned now {now}" in job["basis"]


def test_an_archived_run_that_fails_its_check_is_skipped_with_the_reason(tmp_path):
    cfg = config()
    results = tmp_path / "results"
    older = archive_run(tmp_path, cfg, serve_s=300.0)
    newer = archive_run(tmp_path, cfg, serve_s=400.0)
    assert archived.runs(results / "archive")[-1].ref == newer
    # One byte of the newer run's serve wall changed after it was archived.
    tsv = results / "archive" / newer / "benchmarks" / CELL / "serve-pair.tsv"
    tsv.chmod(0o644)
    tsv.write_text(tsv.read_text().replace("400.0", "40.0"))
    jobs = cost.estimate(cfg, results)["cells"][CELL]
    assert jobs["serve"]["seconds"] == pytest.approx(300.0)
    reason = f"skipped archive: {newer}: fails its check (changed benchmarks/{CELL}/serve-pair.tsv)"
    for job in jobs.values():
        assert job["basis"].startswith(f"archive: {older}: ") and reason in job["basis"]
    # The older run's manifest gone too: no run is trusted, every figure is assumed, and the
    # basis says why each archived run was not used.
    manifest = results / "archive" / older / "MANIFEST.json"
    manifest.parent.chmod(0o755)
    manifest.unlink()
    jobs = cost.estimate(cfg, results)["cells"][CELL]
    for job in jobs.values():
        assert job["basis"].startswith("assumed: ") and reason in job["basis"]
        assert f"archive: {older}: MANIFEST.json missing or unreadable" in job["basis"]
    assert jobs["tune"]["seconds"] == pytest.approx(3 * cfg["plan"]["tune_s_per_batch_size"])


def test_no_archive_or_none_of_this_cell_leaves_the_assumptions(tmp_path):
    cfg = config()
    results = tmp_path / "results"
    assumed = cost.estimate(cfg, results)["cells"][CELL]  # no archive folder at all
    assert all(j["basis"].startswith("assumed: ") for j in assumed.values())
    assert all("archive" not in j["basis"] for j in assumed.values())
    # An archived run of another cell only (tp2) is not this cell's history.
    other = "host-cpu/tiny-qwen3-moe/tp2-ep1"
    src = tmp_path / "other"
    fx.write_tune(src, other)
    for arm in ("untuned", "tuned"):
        fx.write_bench(src, other, arm, [fx.point(32, 8, duration=9.0)])
        fx.write_gsm8k(src, other, arm, [True, False])
    write_tsv(src, other, "serve-pair.tsv", 999.0)
    archive_write.build_run("local", src, [other], {}, "f00", results / "archive", "local")
    assert cost.estimate(cfg, results)["cells"][CELL] == assumed


# --- what a run can see: starts and repeats for report.target_detectable_pct ---------------


def _design(cfg: dict, var_s: float, var_r: float, c_start: float, c_rep: float) -> tuple:
    """(repeats per start, starts needed) as the plan must choose them, from plan_noise;
    paired where one job interleaves the arms (the components then the pairs' ratio's)."""
    plan, paired = cfg["plan"], cfg["serve"]["interleave_arms"]
    low, high = plan["repeats_per_start_min"], plan["repeats_per_start_max"]
    r = plan_noise.repeats_per_start(var_s, var_r, c_start, c_rep, low, high)
    target = cfg["report"]["target_detectable_pct"]
    # r* where it reaches the target within the cap, else the fewest repeats that do, else
    # the most allowed
    for repeats in range(r, high + 1):
        n = plan_noise.starts_needed(var_s, var_r, repeats, target, plan["max_starts"], paired)
        if n is not None:
            return repeats, n
    return high, None


def test_without_history_the_plan_rests_on_the_stated_noise_model(tmp_path):
    cfg = config()
    plan, serve = cfg["plan"], cfg["serve"]
    est = cost.estimate(cfg, tmp_path)
    entry = est["detect"]["cells"][CELL]
    # interleaved arms (the embedded default): a pair's log-ratio holds two arms' variance
    var_s = 2 * plan_noise.pct_to_var(plan["noise_start_pct"])
    var_r = 2 * plan_noise.pct_to_var(plan["noise_repeat_pct"])
    waves = serve["prompts_per_concurrency"] + serve["warmups_per_concurrency"]
    for p, g in zip(entry["points"], serve["grid"], strict=True):
        c_rep = (
            waves * (plan["ttft_ms_per_1k_input"] * g["isl"] / 1000 + plan["tpot_ms"] * 8) / 1000
        )
        r, n = _design(cfg, var_s, var_r, plan["server_start_s"], c_rep)
        assert (p["repeats_per_start"], p["starts"]) == (r, n)
        assert "plan.noise_start_pct" in p["noise"] and "plan.noise_repeat_pct" in p["noise"]
    # At the default 3% and these spreads no point gets there within 10 starts: each is named.
    assert [p["starts"] for p in entry["points"]] == [None, None]
    warnings = [w for w in est["detect"]["warnings"] if w.startswith(f"{CELL} ")]
    assert len(warnings) == 2 and warnings[0].startswith(
        f"{CELL} 32-8 c2: cannot see a 3% change within plan.max_starts 10 starts x"
    )
    assert est["warnings"] == []  # the latency-bound warnings are apart
    # A target the noise allows: starts come back, nothing named, and the GPU-hours follow.
    cfg["report"]["target_detectable_pct"] = 25.0
    looser = cost.estimate(cfg, tmp_path)["detect"]
    assert looser["warnings"] == []
    starts = [p["starts"] for p in looser["cells"][CELL]["points"]]
    assert all(isinstance(n, int) and 2 <= n <= 10 for n in starts)
    points = looser["cells"][CELL]["points"]
    per_start = plan["server_start_s"] + sum(p["repeats_per_start"] * p["repeat_s"] for p in points)
    gsm8k = 2 * cfg["gsm8k"]["limit"] * plan["gsm8k_s_per_question"]
    assert looser["cells"][CELL]["seconds"] == pytest.approx(2 * max(starts) * per_start + gsm8k)


def _noisy_bench(results: Path, spreads: dict[str, list[list[float]]]) -> None:
    """Both arms' 32-8 c2 points, one list of TTFT factors per server start (``start``)."""
    for arm, table in spreads.items():
        points = []
        for s, factors in enumerate(table):
            for r, f in enumerate(factors):
                k = len(points)
                points.append(
                    fx.point(32, 8, repeat=r, seq=k, concurrency=2, prompts=4, ttft=100.0 * f)
                    | {"start": s}
                )
        fx.write_bench(results, CELL, arm, points)


def test_with_history_the_components_are_measured(tmp_path):
    cfg = config(grid=[{"isl": 32, "osl": 8}])
    table = {
        "untuned": [[1.0, 1.1], [1.3, 1.2], [0.9, 1.0]],
        "tuned": [[1.0, 1.05], [1.2, 1.1], [1.0, 0.9]],
    }
    _noisy_bench(tmp_path, table)
    point = cost.estimate(cfg, tmp_path)["detect"]["cells"][CELL]["points"][0]
    # Interleaved arms: the components of each repeat's untuned / tuned ratio, per start.
    ratios = [
        [a / b for a, b in zip(sa, sb, strict=True)]
        for sa, sb in zip(table["untuned"], table["tuned"], strict=True)
    ]
    comp = plan_noise.start_repeat_components(ratios)
    # TTFT is the only metric that varies (the others' spread is 0): it decides.
    assert point["metric"] == "mean_ttft_ms"
    assert point["noise"] == (
        f"start {plan_noise.var_to_pct(comp.var_start / 2):.1f}% per arm measured (2 df of the "
        f"pairs' ratio), repeat {plan_noise.var_to_pct(comp.var_repeat / 2):.1f}% per arm "
        "measured (3 df of the pairs' ratio)"
    )
    r, n = _design(cfg, comp.var_start, comp.var_repeat, 1.0, 10.0)  # fixture ready_s, duration
    assert (point["repeats_per_start"], point["starts"]) == (r, n)
    # An invalid repeat is no measurement of the noise: its pair leaves the table.
    bench = json.loads((tmp_path / CELL / "serve/tuned/bench.json").read_text())
    bench["points"][1]["invalid"] = "1 of 2 requests sent all their tokens in one chunk"
    atomicio.write_json(tmp_path / CELL / "serve/tuned/bench.json", bench, checksum=True)
    again = cost.estimate(cfg, tmp_path)["detect"]["cells"][CELL]["points"][0]
    assert "(2 df of the pairs' ratio)" in again["noise"].split("repeat")[1]
    # Arms measured apart (no pairs): each arm's own components, pooled over the arms.
    apart = config(grid=[{"isl": 32, "osl": 8}], interleave_arms=False)
    point = cost.estimate(apart, tmp_path)["detect"]["cells"][CELL]["points"][0]
    table["tuned"][0] = table["tuned"][0][:1]  # the invalid repeat
    comp = plan_noise.pooled(plan_noise.start_repeat_components(t) for t in table.values())
    assert point["noise"] == (
        f"start {plan_noise.var_to_pct(comp.var_start):.1f}% per arm measured (4 df), "
        f"repeat {plan_noise.var_to_pct(comp.var_repeat):.1f}% per arm measured (5 df)"
    )


def test_an_archived_run_is_a_further_server_start(tmp_path):
    cfg = config()
    ref = archive_run(tmp_path, cfg, serve_s=300.0)
    entry = cost.estimate(cfg, tmp_path / "results")["detect"]["cells"][CELL]
    # One run: one start per arm, so its spread between starts comes from the noise model.
    assert entry["basis"].endswith(f"history: archive {ref}")
    assert all("plan.noise_start_pct" in p["noise"] for p in entry["points"])
    # The same cell measured again here (other values): two starts per arm, measured.
    last_run(tmp_path / "results", config(), {(32, 8): 2.0, (64, 8): 2.5})
    for arm in ("untuned", "tuned"):
        path = tmp_path / "results" / CELL / "serve" / arm / "bench.json"
        bench = json.loads(path.read_text())
        for p in bench["points"]:
            p["mean_tpot_ms"] *= 1.1 + 0.01 * p["repeat"]
        atomicio.write_json(path, bench, checksum=True)
    entry = cost.estimate(cfg, tmp_path / "results")["detect"]["cells"][CELL]
    assert entry["basis"].endswith(f"history: archive {ref}, results")
    assert all("per arm measured (1 df of the pairs' ratio)" in p["noise"] for p in entry["points"])


def test_gsm8k_full_run_counts_its_questions(tmp_path):
    cfg = config()
    plan = cfg["plan"]
    with_limit = cost.estimate(cfg, tmp_path)["cells"][CELL]["serve"]["seconds"]
    cfg["gsm8k"]["limit"] = None  # the whole generated set: gsm8k.local_questions
    whole = cost.estimate(cfg, tmp_path)["cells"][CELL]["serve"]
    extra = 2 * (cfg["gsm8k"]["local_questions"] - 8) * plan["gsm8k_s_per_question"]
    assert whole["seconds"] == pytest.approx(with_limit + extra)
    assert "40 GSM8K questions (gsm8k.local_questions) x 1 instances x 2 arms" in whole["basis"]
    # The hub's test split: its real size, never 0 s.
    cfg["gsm8k"].update(local_questions=0, dataset="openai/gsm8k", instances=2)
    hub = cost.estimate(cfg, tmp_path)["cells"][CELL]["serve"]
    assert hub["seconds"] == pytest.approx(
        with_limit + 2 * 2 * (1319 - 4) * plan["gsm8k_s_per_question"]
    )
    assert "1319 GSM8K questions (openai/gsm8k test split) x 2 instances" in hub["basis"]
    # A local file: its lines.
    local = tmp_path / "gsm8k.jsonl"
    local.write_text('{"question": "q", "answer": "#### 1"}\n' * 12)
    cfg["gsm8k"].update(dataset=str(local), instances=1)
    assert detect_plan.gsm8k_questions(cfg) == (12, f"{local} lines")


def test_a_history_job_that_asked_fewer_gsm8k_questions_is_scaled(tmp_path):
    cfg = config()
    last_run(tmp_path, cfg, {(32, 8): 1.5, (64, 8): 2.5})
    # The last serve job recorded its GSM8K run: gsm8k.limit 8, one instance.
    for arm in ("untuned", "tuned"):
        path = tmp_path / CELL / "serve" / arm / "bench.json"
        bench = json.loads(path.read_text())
        bench["gsm8k"] = {"dataset": "x.jsonl", "instances": 1, "limit": 8}
        atomicio.write_json(path, bench, checksum=True)
    same = cost.estimate(cfg, tmp_path)["cells"][CELL]["serve"]
    assert same["seconds"] == pytest.approx(200.0) and "GSM8K" not in same["basis"]
    cfg["gsm8k"]["limit"] = None  # now the whole generated set, 40 questions
    whole = cost.estimate(cfg, tmp_path)["cells"][CELL]["serve"]
    per = cfg["plan"]["gsm8k_s_per_question"]
    assert whole["seconds"] == pytest.approx(200.0 + 2 * (40 - 8) * per)
    assert (
        "+ GSM8K 40 questions per arm now (gsm8k.local_questions, x instances) instead of 8"
        in (whole["basis"])
    )
    # Written with limit null: the whole set then was its GSM8K result's n_samples (4 here).
    for arm in ("untuned", "tuned"):
        path = tmp_path / CELL / "serve" / arm / "bench.json"
        bench = json.loads(path.read_text())
        bench["gsm8k"]["limit"] = None
        atomicio.write_json(path, bench, checksum=True)
    assert "instead of 4," in cost.estimate(cfg, tmp_path)["cells"][CELL]["serve"]["basis"]
