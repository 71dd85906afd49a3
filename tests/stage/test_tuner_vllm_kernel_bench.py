"""benchmarks/tuner_default_vs_exhaustive_vllm_kernel.py (issue 23): its CPU smoke mode runs the
whole script
(default and exhaustive tuner runs on vLLM's kernel from its sources, the side-by-side re-time,
with --builtin against the builtin kernel too) on a tiny shape under the interpreter, and it
refuses bad input before any work. The smoke's numbers are interpreter timings: only their
presence is checked. The exhaustive-set planning and --count-only run on the CPU alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "tuner_default_vs_exhaustive_vllm_kernel.py"
SRC = Path(os.environ.get("CELLBENCH_VLLM_SOURCE") or ROOT / ".vllm-src" / "vllm-0.34.0")


def _run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "workflow")}
    env.pop("CELLBENCH_VLLM_SOURCE", None)
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=ROOT)  # fmt: skip


def test_bad_input_is_refused_before_any_work(tmp_path) -> None:
    p = _run("--smoke", "--dtypes", "fp4", "--out", str(tmp_path / "a"))
    assert p.returncode == 2 and "--dtypes='fp4'" in p.stderr
    p = _run("--smoke", "--vllm-source", str(tmp_path / "none"), "--out", str(tmp_path / "b"))
    assert p.returncode == 2 and "none does not exist" in p.stderr
    assert "vllm-kernel-src.sh" in p.stderr
    p = _run("--smoke", "--batch-sizes", "1,8", "--exhaustive-ms", "16", "--out",
             str(tmp_path / "c"))  # fmt: skip
    assert p.returncode == 2 and "--exhaustive-ms='16'" in p.stderr
    assert not any((tmp_path / x).exists() for x in "abc")


def _bench():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    sys.path.insert(0, str(ROOT / "workflow"))
    import tuner_default_vs_exhaustive_vllm_kernel as bench

    return bench


def test_exhaustive_set_fits_the_budget_left() -> None:
    """auto picks the first set of EXH_SETS whose planned run fits, larger sets with more time,
    and none when even the smallest does not fit."""
    bench = _bench()
    ms = [1, 2, 4, 8, 16, 64, 256, 4096]
    t = bench.exhaustive_timings("bf16", ms, False)
    need = {s: bench.plan_exhaustive_s(t, s) + bench.PLAN_SBS_S_PER_M * len(s)
            for s in bench.EXH_SETS}  # fmt: skip
    for s in bench.EXH_SETS:
        got = tuple(bench.choose_exhaustive_ms(t, ms, need[s]))
        assert need[got] <= need[s]
        assert all(need[x] > need[s] for x in bench.EXH_SETS[: bench.EXH_SETS.index(got)])
    assert bench.choose_exhaustive_ms(t, ms, min(need.values()) - 1) == []
    # a set is only chosen where all its batch sizes are tuned
    assert bench.choose_exhaustive_ms(t, [1, 16], 1e9) == [16]


def test_exhaustive_timings_are_the_pruned_space_plus_finalists() -> None:
    from cellbench.tune import spaces

    bench = _bench()
    lim = spaces.HardwareLimits(spaces.H200_SMEM_BYTES, "cuda", "3.6.0")
    t = bench.exhaustive_timings("fp8", [1, 4096], False, lim)
    for m in (1, 4096):
        kept, dropped = spaces.prune(spaces.cuda_space((128, 128)), m=m, n=768, k=2048,
                                     operand_bytes=1, limits=lim)  # fmt: skip
        assert t[m] == len(kept) + bench.FINALISTS and dropped
    assert t[4096] > t[1]  # bigger row blocks survive at larger M


def test_walls_over_covered_and_extrapolated() -> None:
    """default/exhaustive wall over the covered M from each run's per-M wall; the estimate for
    all M scales exhaustive's seconds per timing by the counted timings."""
    bench = _bench()
    t = {1: 100, 16: 100, 256: 400}
    d = {"entries": {"1": {"tune_wall_s": 5.0}, "16": {"tune_wall_s": 2.0},
                     "256": {"tune_wall_s": 3.0}}, "seconds": {"wall": 12.0}}  # fmt: skip
    e = {"entries": {"16": {"tune_wall_s": 10.0}}, "seconds": {"wall": 11.0}}
    w = bench.walls(d, e, [16, 256], t)
    assert w["covered"] == [16]  # 256 did not finish in the exhaustive run
    assert w["ratio"] == pytest.approx(2.0 / 10.0)
    per = 10.0 / 100
    assert w["exhaustive_all_estimated_s"] == pytest.approx(per * 600 + 1.0)
    assert w["ratio_all_estimated"] == pytest.approx(12.0 / (per * 600 + 1.0))
    assert bench.walls(d, {"failed": True}, [16], t) == {}


def test_count_only_needs_no_gpu_and_reads_the_recorded_run(tmp_path) -> None:
    p = _run("--count-only", "--dtypes", "bf16", "--batch-sizes", "1,16,256")
    assert p.returncode == 0, p.stderr
    assert "exhaustive timings per M" in p.stdout and "estimate: exhaustive at all" in p.stdout
    p = _run("--count-only", "--dtypes", "fp8", "--estimate-from", str(tmp_path))
    assert p.returncode == 0 and "counts only" in p.stdout


@pytest.mark.slow
def test_smoke_writes_the_side_by_side_tables(tmp_path) -> None:
    if not (SRC / "SOURCE.json").is_file():
        pytest.skip(f"vLLM's kernel sources absent at {SRC} (workflow/scripts/vllm-kernel-src.sh)")
    out = tmp_path / "out"
    p = _run("--smoke", "--batch-sizes", "1", "--exhaustive-ms", "1", "--builtin",
             "--vllm-source", str(SRC), "--gpu", "h100", "--out", str(out))  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:] + p.stdout[-3000:]
    res = json.loads((out / "tuner_vllm_kernel_h100_bf16.json").read_text())
    meta = res["meta"]
    for key in ("date", "device", "torch", "triton", "python"):
        assert meta[key]
    assert (
        meta["vllm_source"]["version"] == json.loads((SRC / "SOURCE.json").read_text())["version"]
    )
    assert meta["stage_reached"] == "picks re-timed side by side, vLLM and builtin"
    assert meta["exhaustive_batch_sizes"] == [1]
    assert "fused_moe_kernel" in res["vllm_kernel"]["vllm_parts"]
    for mode in ("default", "exhaustive"):
        assert res[mode]["backend"] == "vllm" and res[mode]["complete"]
        assert set(res[mode]["seconds"]) >= {"wall", "cpu", "gpu"}
    sbs = res["side_by_side"]["1"]
    for label in ("vllm:default", "vllm:shipped", "vllm:exhaustive", "builtin:default",
                  "builtin:shipped"):  # fmt: skip
        assert sbs[label]["call_us"] > 0 and sbs[label]["gemms_us"] > 0, label
        assert sbs[label]["error"] < 1.5e-2
    r = sbs["ratios"]["builtin/vllm:shipped:call"]
    assert r == pytest.approx(sbs["builtin:shipped"]["call_us"] / sbs["vllm:shipped"]["call_us"])
    txt = (out / "tuner_vllm_kernel_h100_bf16.txt").read_text()
    assert "The targets on vLLM's kernel" in txt and "date: " in txt
    assert res["walls"]["covered"] == [1] and res["walls"]["exhaustive_s"] > 0
    assert "tuning wall at M=1: default" in txt
