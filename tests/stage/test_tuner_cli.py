"""The tuner end to end on the embedded default's tiny shape, with real Triton under the CPU
interpreter: output formats, bad input, default vs exhaustive, resume after a kill."""

from __future__ import annotations

import contextlib
import csv
import importlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from cellbench.common import atomicio  # noqa: E402
from cellbench.tune import artifacts, cli, outputs, plan, spaces  # noqa: E402
from cellbench.tune.backends import BuiltinBackend  # noqa: E402
from cellbench.tune.job import TuneJob  # noqa: E402
from cellbench.tune.timing import time_side_by_side  # noqa: E402
from support.stage_jobs import run_tuner, tune_argv, tune_job  # noqa: E402
from support.tiny_moe import TINY  # noqa: F401

REF = Path(__file__).resolve().parents[1] / "data" / "vllm-configs"
QWEN = Path(__file__).resolve().parents[1] / "data" / "model_configs" / "qwen3-30b-a3b.json"
WORKFLOW = Path(__file__).resolve().parents[2] / "workflow"
VALUE_KEYS = {
    "BLOCK_SIZE_M",
    "BLOCK_SIZE_N",
    "BLOCK_SIZE_K",
    "GROUP_SIZE_M",
    "num_warps",
    "num_stages",
}


def _device_name() -> str:
    """vLLM's device name in the tuner's file names: the GPU's, as the tuner derives it, or the
    interpreter's (stated literally, so the CPU run checks the exact name)."""
    if torch.cuda.is_available():
        from cellbench.tune.shapes import device_name

        return device_name()
    return "CPU_TRITON_INTERPRET"


@pytest.fixture(scope="module")
def tiny_cfg(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("model") / "config.json"
    p.write_text(json.dumps(TINY))
    return p


@pytest.fixture(scope="module")
def tuned_run(tiny_cfg, tmp_path_factory) -> tuple[Path, str]:
    """One default-mode run of the embedded default's shape (TP=1) at M = 1, 4, 16: its
    output folder and what it printed on stderr (its progress)."""
    out = tmp_path_factory.mktemp("tuned")
    t0 = time.perf_counter()
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = run_tuner(tune_job(tiny_cfg, tp=1, batch_sizes=[1, 4, 16]), out)
    assert rc == 0, err.getvalue()[-3000:]
    # A guard against a hang, not a performance claim: the run takes about a minute on 2 idle
    # cores and measured 88 s while other test runs shared them.
    assert time.perf_counter() - t0 < 240
    return out, err.getvalue()


@pytest.fixture(scope="module")
def tuned(tuned_run) -> Path:
    return tuned_run[0]


def test_progress_one_kept_line_per_batch_size(tuned_run) -> None:
    """Progress a person can follow: one line per M, once its baseline is timed, with what
    was timed, the kept config, its time, the baseline's time and the gain, as recorded."""
    out, err = tuned_run
    summary = json.loads((out / "summary.json").read_text())
    kept = [ln for ln in err.splitlines() if ln.startswith(outputs.KEPT_PROGRESS)]
    assert [ln.split("M=")[1].split(":")[0] for ln in kept] == ["1", "4", "16"]
    for line in kept:
        m = line.split("M=")[1].split(":")[0]
        e = summary["entries"][m]
        assert f"kept {e['config_name']} {e['time_us']:.2f} us" in line
        assert f"({e['baseline']['source']}) {e['baseline']['time_us']:.2f} us" in line
        assert f"gain {e['improvement_pct']:+.1f}%" in line
    # Timings per M (finalists timed again count again) add up to the run's count.
    timed = [int(ln.split(": ")[1].split(" configs timed")[0]) for ln in kept]
    assert all(t >= 1 for t in timed) and sum(timed) == summary["counts"]["timed"]
    # The search's own line per M stays (live, before the baselines); nothing else per M.
    assert len([ln for ln in err.splitlines() if ln.startswith("[tune] M=")]) == 3


def test_vllm_json_format(tuned: Path) -> None:
    name = f"E=8,N=32,device_name={_device_name()}.json"
    files = sorted(f.name for f in (tuned / "configs").iterdir())
    # vLLM's file, and beside it the builtin kernel's measured path choices (a name vLLM
    # never opens): M=1 and 4 are few-token calls, where both paths were timed.
    assert files == [name, artifacts.path_choices_file_name(name)]
    got = json.loads((tuned / "configs" / name).read_text())
    ref = json.loads((REF / "E=128,N=768,device_name=NVIDIA_H200.json").read_text())
    assert isinstance(got.pop("triton_version"), str)
    assert list(got) == ["1", "4", "16"]
    ref_keys = {frozenset(v) for v in ref.values()}
    assert ref_keys == {frozenset(VALUE_KEYS)}
    for v in got.values():
        assert set(v) == VALUE_KEYS
        assert all(type(x) is int for x in v.values())


def test_few_token_path_chosen_by_measurement_with_the_kept_config(tuned: Path) -> None:
    """Issue 23 item 3: at M <= DECODE_RULE_MAX_TOKENS the tuner timed the kept config on both
    paths side by side; the faster is recorded in the summary and the sidecar, which the
    transformers experts follow (experts_tf.launch_path); above it nothing is recorded."""
    policy = importlib.import_module("cellbench.tune.kernels.launch_policy")
    summary = json.loads((tuned / "summary.json").read_text())
    name = summary["config_file"]
    side = json.loads((tuned / "configs" / artifacts.path_choices_file_name(name)).read_text())
    assert sorted(side, key=int) == ["1", "4"]
    for m in ("1", "4"):
        choice = summary["entries"][m]["path_choice"]
        faster = "decode" if choice["decode_us"] < choice["grouped_us"] else "grouped"
        assert choice["path"] == faster == side[m]["path"]
        assert side[m]["config"] == summary["entries"][m]["config"]
    assert "path_choice" not in summary["entries"]["16"] and policy.DECODE_RULE_MAX_TOKENS < 16


def test_rerun_without_few_token_sizes_drops_the_old_path_choices(tuned: Path, tmp_path) -> None:
    """A rerun in the same folder that measures no path choice (no M <= 4) must not leave the
    earlier run's choices, or their checksum, in force beside the new vLLM file."""
    out = tmp_path / "again"
    shutil.copytree(tuned, out)
    name = json.loads((out / "summary.json").read_text())["config_file"]
    side = out / "configs" / artifacts.path_choices_file_name(name)
    assert side.exists() and atomicio.checksum_path(side).exists()
    model = tmp_path / "config.json"
    model.write_text(json.dumps(TINY))
    assert run_tuner(tune_job(model, tp=1, batch_sizes=[16]), out) == 0
    assert not side.exists() and not atomicio.checksum_path(side).exists()
    assert (out / "configs" / name).exists()


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="needs no GPU (a CPU-interpreter test): it checks the interpreter run's records "
    "(fp32 compute, the 'interpreter' tag and timing note, no roofline fraction, the "
    "interpreter's file name); a GPU run computes bf16 and measures a roofline fraction",
)
def test_csv_summary_and_log(tuned: Path) -> None:
    with open(tuned / "tuned_fmoe.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    with open(tuned / "tuned_fmoe.csv") as f:
        header = f.readline().strip().split(",")
    assert header == artifacts.AITER_COLUMNS
    assert [int(r["token"]) for r in rows] == [1, 4, 16]
    for r in rows:
        assert (r["model_dim"], r["inter_dim"], r["expert"], r["topk"]) == ("64", "32", "8", "2")
        assert float(r["us"]) > 0 and float(r["us1"]) > 0 and float(r["us2"]) > 0
        assert r["run_1stage"] == "0"  # two GEMM stages (the grouped path)
        assert "M16" in r["kernelName1"] or "M32" in r["kernelName1"]
        assert r["_tag"] == "interpreter"

    s = json.loads((tuned / "summary.json").read_text())
    assert s["interpreter"] is True and s["complete"] is True
    assert s["compute_dtype"] == "fp32" and s["device_name"] == "CPU_TRITON_INTERPRET"
    assert s["config_file"] == "E=8,N=32,device_name=CPU_TRITON_INTERPRET.json"
    assert s["batch_sizes"] == [1, 4, 16] and set(s["entries"]) == {"1", "4", "16"}
    assert "interpreter" in s["timing"]["note"]
    e1 = s["entries"]["1"]
    assert e1["error_vs_reference"] is not None and e1["error_vs_reference"] < 1e-4
    assert e1["roofline"]["fused"]["roofline_fraction"] is None  # n/a on CPU
    assert e1["roofline"]["fused"]["flops"] == 2 * 1 * 2 * 3 * 32 * 64
    assert s["counts"]["timed"] > 0 and s["counts"]["pruned"] > 0
    assert s["seconds"]["wall"] > 0 and s["seconds"]["cpu"] > 0

    recs = artifacts.TuningLog.read(tuned / "tuning_log.jsonl")
    pruned = [r for r in recs if r["status"] == "pruned"]
    assert pruned and all(r["reason"] for r in pruned)
    assert any("rows per expert" in r["reason"] for r in pruned)
    timed = [r for r in recs if r["status"] == "timed"]
    assert all(r["time_us"] > 0 and r["samples_us"] for r in timed)
    checks = [r for r in recs if r["stage"] == "check"]
    assert checks and {r["m"] for r in checks} == {1}  # correctness at the first batch size
    # the chosen config at each M is among the final side-by-side timings, with the lowest
    # median up to the measured spread
    for m, e in s["entries"].items():
        final = [r for r in timed if r["m"] == int(m) and r["stage"] == "final"]
        best = min(r["time_us"] for r in final)
        noise = max(max(r["spread"] for r in final), 0.005)
        assert e["time_us"] <= best * (1 + noise) + 1e-9


def test_few_token_path_tuning(tiny_cfg, tmp_path, monkeypatch) -> None:
    """With the few-token path enabled for M <= 2, the tuner tunes it at M=1: configs that
    differ only in BLOCK_SIZE_M/GROUP_SIZE_M (which that kernel ignores) are pruned as the
    same kernel, the entry says which path it tuned, and the AITER CSV row is 1-stage."""
    policy = importlib.import_module("cellbench.tune.kernels.launch_policy")
    monkeypatch.setattr(policy, "DECODE_MAX_TOKENS", 2)
    out = tmp_path / "out"
    assert run_tuner(tune_job(tiny_cfg, tp=1, batch_sizes=[1, 4]), out) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["entries"]["1"]["kernel_path"] == "decode"
    assert s["entries"]["4"]["kernel_path"] == "grouped"
    recs = artifacts.TuningLog.read(out / "tuning_log.jsonl")
    same = [r for r in recs if r["status"] == "pruned" and "same kernel" in r["reason"]]
    assert same and {r["m"] for r in same} == {1}
    ignored = ("BLOCK_SIZE_M", "GROUP_SIZE_M")
    screened = [r["config"] for r in recs
                if r["status"] == "timed" and r["m"] == 1 and r["stage"] != "final"]  # fmt: skip
    kernels = {tuple(sorted((k, v) for k, v in c.items() if k not in ignored)) for c in screened}
    assert len(kernels) == len({json.dumps(c, sort_keys=True) for c in screened})

    # default mode screens every distinct kernel on this path (search.SCREEN_ALL_PATHS)
    at1 = [r for r in recs if r["m"] == 1 and r["status"] == "timed" and r["stage"] != "final"]
    assert at1 and {r["stage"] for r in at1} == {"screen-all"}
    kept = {r["key"] for r in recs if r["m"] == 1} - {
        r["key"] for r in recs if r["m"] == 1 and r["status"] == "pruned"
    }
    assert kept == {r["key"] for r in at1}
    with open(out / "tuned_fmoe.csv", newline="") as f:
        rows = {int(r["token"]): r for r in csv.DictReader(f)}
    assert rows[1]["run_1stage"] == "1" and float(rows[1]["us2"]) == 0
    assert "_1stage_" in rows[1]["kernelName1"] and rows[1]["kernelName2"] == ""
    assert rows[4]["run_1stage"] == "0" and float(rows[4]["us2"]) > 0


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"dtype": "int4_w4a16"}, "not supported"),
        ({"dtype": "fp8_w8a8", "block_shape": [128, 128]}, "does not divide"),
        ({"block_shape": [128, 128]}, "quantised dtype"),
        ({"tp": 3}, "not divisible by tp=3"),
        ({"backend": "vllm"}, "vLLM"),
        ({"compile_budget": [0, 4]}, ">= 1"),
        ({"time_budget_s": 0}, "--time-budget-s=0 must be a number of seconds > 0"),
        ({"env": {"CELLBENCH_TEST_UNSET": "1"}}, "CELLBENCH_TEST_UNSET='1' is not this process"),
    ],
)
def test_a_job_the_tuner_cannot_run_exits_2(
    tiny_cfg, tmp_path, capsys, monkeypatch, fields, message
) -> None:
    """What only the tuner's process can know (the model's shape, vLLM installed, the step's
    variables set), and the limits of the fields no config supplies."""
    # no folder of vLLM's sources either (a GPU run of these tests sets one for test_vllm_source)
    monkeypatch.delenv("CELLBENCH_VLLM_SOURCE", raising=False)
    out = tmp_path / "out"
    job = {"model_config": str(tiny_cfg), **fields}  # not tune_job(): it would refuse first
    assert run_tuner(job, out) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()  # nothing written before the input was accepted


@pytest.mark.parametrize(
    "job, message",
    [
        ({"tp": 1}, "missing key(s) model_config"),
        ({"model_config": "m", "tp": "1"}, "tp = '1': expected an integer"),
        ({"model_config": "m", "max_config": 2}, "unknown tune job key(s) max_config"),
        ({"model_config": "m", "batch_sizes": []}, "batch_sizes = []: expected"),
    ],
)
def test_a_malformed_job_exits_2(tmp_path, capsys, job, message) -> None:
    assert run_tuner(job, tmp_path / "out") == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--batch-sizes", ""], "empty"),
        (["--batch-sizes", "1,0"], "positive"),
        (["--batch-sizes", "1,-4"], "positive"),
        (["--batch-sizes", "small"], "not an integer"),
        (["--max-configs", "0"], "--max-configs"),
        (["--tp", "0"], "--tp=0 must be >= 1"),
        (["--compile-budget", "32"], "--compile-budget"),
        (["--block-shape", "128"], "--block-shape='128': expected n,k"),
        (["--job", "[1]"], "--job must be a JSON object"),
        (["--job", '{"tp": 2}'], "given twice (in --job and as a flag): tp"),
    ],
)
def test_bad_hand_flags_exit_2(tiny_cfg, tmp_path, capsys, args, message) -> None:
    """The hand command line's own limits (the config's, for a job the workflow writes)."""
    out = tmp_path / "out"
    rc = cli.main(["--model-config", str(tiny_cfg), "--tp", "1", "--out", str(out), *args])
    assert rc == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_hand_flags_are_a_job(tiny_cfg) -> None:
    """By hand, each flag sets one field of the same job the workflow passes whole."""
    flags = ["--model-config", str(tiny_cfg), "--tp", "2", "--ep", "--dtype", "fp8_w8a8",
             "--block-shape", "16,32", "--batch-sizes", "16,1,16", "--max-configs", "3",
             "--compile-budget", "none", "--keep", "all", "--seed", "4"]  # fmt: skip
    by_hand, out = plan.job_from_argv([*flags, "--out", "o"])
    job = tune_job(tiny_cfg, tp=2, ep=2, dtype="fp8_w8a8", block_shape=[16, 32],
                   batch_sizes=[1, 16], max_configs=3, compile_budget="none", keep="all",
                   seed=4)  # fmt: skip
    assert (by_hand, out) == (TuneJob.from_job(job), "o")
    mixed, _ = plan.job_from_argv(["--job", json.dumps({**job, "seed": 0}), "--out", "o"])
    assert mixed.seed == 0 and mixed.tp == 2


def test_model_without_moe_fields(tmp_path, capsys) -> None:
    p = tmp_path / "dense.json"
    p.write_text(json.dumps({"hidden_size": 64, "intermediate_size": 128}))
    rc = run_tuner(tune_job(p), tmp_path / "o")
    assert rc == 2 and "expert" in capsys.readouterr().err


def test_batch_size_tiers() -> None:
    assert plan.parse_batch_sizes("vllm_default")[-1] == 4096
    assert len(plan.parse_batch_sizes("vllm_default")) == 18
    assert plan.parse_batch_sizes("aiter16") == [2**i for i in range(16)]
    assert plan.parse_batch_sizes("16, 1,16") == [1, 16]


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="needs no GPU (a CPU-interpreter test): it expects the interpreter's three re-timed "
    "leaders and re-times both picks on CPU tensors with the interpreter's timer",
)
@pytest.mark.slow
def test_exhaustive_vs_default(tiny_cfg, tmp_path) -> None:
    """Both modes at M=8 and TP=2; default's pick, re-timed beside exhaustive's, is as fast
    up to interpreter noise, and default times fewer configs."""
    res = {}
    for mode in ("exhaustive", "default"):
        out = tmp_path / mode
        rc = run_tuner(tune_job(tiny_cfg, tp=2, batch_sizes=[8], mode=mode), out)
        assert rc == 0
        res[mode] = json.loads((out / "summary.json").read_text())
    ex, de = res["exhaustive"], res["default"]
    assert ex["shape"]["intermediate_size"] == 16
    recs = artifacts.TuningLog.read(tmp_path / "exhaustive" / "tuning_log.jsonl")
    timed_ex = {r["key"] for r in recs if r["status"] == "timed"}
    assert len(timed_ex) == ex["space"]["size"] - ex["counts"]["pruned"]  # every kept config
    # the leaders of the screen (3 on CPU) are re-timed side by side; the pick is among them
    screen = sorted(
        (r for r in recs if r["status"] == "timed" and r["stage"] == "exhaustive"),
        key=lambda r: r["time_us"],
    )
    final = [r for r in recs if r["status"] == "timed" and r["stage"] == "final"]
    assert {r["key"] for r in final} == {r["key"] for r in screen[:3]}
    assert spaces.config_key(ex["entries"]["8"]["config"]) in {r["key"] for r in final}
    from cellbench.tune.shapes import MoEShape

    be = BuiltinBackend(MoEShape.from_dict(ex["shape"]), "fp32", "cpu")
    probs = [be.make_problem(8, 100 + i) for i in range(2)]
    picks = [ex["entries"]["8"]["config"], de["entries"]["8"]["config"]]
    t_ex, t_de = time_side_by_side(
        [[be.call(p, c) for p in probs] for c in picks], on_gpu=False, repeats=5
    )
    # interpreter timings on shared CI cores: allow 25% besides the measured spread
    assert t_de.median_us <= t_ex.median_us * (1.25 + t_ex.spread + t_de.spread)


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="needs no GPU (a CPU-interpreter test): its child run is forced onto the interpreter "
    "(TRITON_INTERPRET=1), which fails with a GPU present, and it relies on the interpreter's "
    "slow timings to kill the run part-way (a GPU run of M=1,4 takes seconds)",
)
@pytest.mark.slow
def test_resume_after_kill(tiny_cfg, tmp_path) -> None:
    """SIGKILL a real run part-way; the rerun reuses the logged timings and completes."""
    out = tmp_path / "out"
    job = tune_job(tiny_cfg, batch_sizes=[1, 4])
    cmd = [sys.executable, "-m", "cellbench.tune", *tune_argv(job, out)]
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "PYTHONPATH": f"{WORKFLOW}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = out / "tuning_log.jsonl"
    deadline = time.time() + 120
    try:
        while time.time() < deadline:
            recs = artifacts.TuningLog.read(log) if log.exists() else []
            timed = [r for r in recs if r["status"] == "timed"]
            if len(timed) >= 3:
                break
            assert proc.poll() is None, "run ended before it could be killed"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert not (out / "summary.json").exists()  # a killed run leaves nothing that looks done
    before = artifacts.TuningLog.read(log)
    timed_before = [r for r in before if r["status"] == "timed"]
    assert timed_before
    assert run_tuner(job, out) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["resumed_log_records"] == len(before)
    assert s["counts"]["reused"] >= len(timed_before)
    after = artifacts.TuningLog.read(log)
    # nothing timed before the kill was timed again
    keys = [(r["m"], r["key"], r["stage"]) for r in after if r["status"] == "timed"]
    assert len(keys) == len(set(keys))


def test_seed_configs_and_refinement(tiny_cfg, tmp_path) -> None:
    """A --seed-configs entry is always timed; the best tiles' GROUP_M variants join later."""
    seed = {
        "BLOCK_SIZE_M": 16,
        "BLOCK_SIZE_N": 32,
        "BLOCK_SIZE_K": 64,
        # a seed is used only if it is in the search space: GROUP_SIZE_M 8 is in the
        # interpreter's space, 16 (not 8) in the CUDA one
        "GROUP_SIZE_M": 16 if torch.cuda.is_available() else 8,
        "num_warps": 4,
        "num_stages": 2,
    }
    table = tmp_path / "seed.json"
    table.write_text(json.dumps({"triton_version": "3.6.0", "1": seed, "64": seed}))
    out = tmp_path / "out"
    job = tune_job(tiny_cfg, batch_sizes=[4], max_configs=3, seed_configs=str(table))
    rc = run_tuner(job, out)
    assert rc == 0
    recs = artifacts.TuningLog.read(out / "tuning_log.jsonl")
    first = [r for r in recs if r["stage"] == "halving-0" and r["status"] == "timed"]
    assert len(first) == 3
    assert first[0]["config"] == seed  # seeds are timed first
    refine = [r for r in recs if r["stage"] == "refine"]
    assert refine, "no local-search moves around the best round-0 configs were tried"

    def one_key_apart(a: dict, b: dict) -> bool:
        return sum(a[k] != b[k] for k in a) == 1

    # every move changes one key of a config timed before it (round 0 or an earlier move)
    seen = [r["config"] for r in first]
    for r in refine:
        assert any(one_key_apart(r["config"], c) for c in seen), r["config"]
        seen.append(r["config"])
    s = json.loads((out / "summary.json").read_text())
    assert s["seed_configs"] == str(table)


@pytest.mark.parametrize(
    "content, message",
    [
        ("not json", "cannot read"),
        ('{"1": {"BLOCK_SIZE_M": 16}}', "not a vLLM config entry"),
        ('{"triton_version": "3.6.0"}', "no batch-size entries"),
    ],
)
def test_bad_seed_configs(tiny_cfg, tmp_path, capsys, content, message) -> None:
    table = tmp_path / "seed.json"
    table.write_text(content)
    rc = run_tuner(tune_job(tiny_cfg, seed_configs=str(table)), tmp_path / "o")
    assert rc == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize(
    "dtype, compute, file_suffix",
    [("fp16", "fp16", ".json"), ("fp32", "fp32", ",dtype=float32.json"), ("bf16", "fp32", ".json")],
)
def test_float_dtypes(tiny_cfg, tmp_path, dtype, compute, file_suffix) -> None:
    """The config's float dtypes: compute dtype, vLLM file name, and the interpreter's bf16 note."""
    out = tmp_path / "o"
    rc = run_tuner(tune_job(tiny_cfg, dtype=dtype, batch_sizes=[4], max_configs=2), out)
    assert rc == 0
    s = json.loads((out / "summary.json").read_text())
    on_gpu = torch.cuda.is_available()
    if on_gpu and dtype == "bf16":
        compute = "bf16"  # a GPU computes bf16 itself; only the interpreter swaps in fp32
    assert (s["dtype"], s["compute_dtype"]) == (dtype, compute)
    assert s["config_file"] == f"E=8,N=32,device_name={_device_name()}" + file_suffix
    assert (out / "configs" / s["config_file"]).is_file()
    # the note says why bf16 was computed in fp32, so it is there only on the interpreter
    assert (s["compute_dtype_note"] is not None) == (dtype == "bf16" and not on_gpu)


def test_compile_budget_respected(tiny_cfg, tmp_path) -> None:
    """Default mode compiles at most FIRST new kernels at the first batch size of each
    M-dependent specialisation and LATER at the others (counted from the log: a kernel is
    a config at one specialisation, M x top-k == 1 / a multiple of 16 / neither, and naive
    assignment or not: pairs x 4 <= experts)."""
    out = tmp_path / "out"
    ms = [1, 2, 8]  # 8 x top-2 = 16 rows: a second specialisation
    rc = run_tuner(tune_job(tiny_cfg, batch_sizes=ms, compile_budget=[3, 2]), out)
    assert rc == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["compile_budget"] == [3, 2]
    recs = artifacts.TuningLog.read(out / "tuning_log.jsonl")
    topk = TINY["num_experts_per_tok"]

    def spec(m: int) -> tuple[bool, bool, bool]:
        return m * topk == 1, m * topk % 16 == 0, m * topk * 4 <= TINY["num_experts"]

    compiled: set = set()
    class_first: dict = {}
    for m in ms:
        run_here = [r for r in recs if r["m"] == m and r["status"] in ("timed", "checked")]
        assert run_here, f"nothing ran at M={m}"
        new = {r["key"] for r in run_here} - {k for c, k in compiled if c == spec(m)}
        first = class_first.setdefault(spec(m), m) == m
        assert len(new) <= (3 if first else 2), (m, len(new))
        assert s["entries"][str(m)]["new_compiles"] == len(new)
        compiled |= {(spec(m), k) for k in new}
    # the budget is what limits the search: more configs survive pruning than were run at M=1
    kept = s["space"]["size"] - sum(1 for r in recs if r["m"] == 1 and r["status"] == "pruned")
    assert kept > 3
