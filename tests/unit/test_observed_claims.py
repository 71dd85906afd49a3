"""Fields that claim something about a server follow what was observed (issue 33 item 3).

Each test changes the observed thing (a server's log lines, its recorded command line, the
model folder's recipe, a result written under an old key) and shows the field follows it.
The log excerpt in tests/data is four lines of a real vLLM 0.32.0 CPU server's log (the
rehearsal's serve pair; the model path shortened to /models).
"""

from __future__ import annotations

import json
from pathlib import Path

from cellbench.archive import write as archive
from cellbench.report import build as report
from cellbench.results.archived import Run
from cellbench.serve import moe_evidence, server
from cellbench.serve.stage import observed_parallelism
from support import result_fixtures as fx

REAL_LOG = Path(__file__).parents[1] / "data" / "vllm_0.32.0_cpu_server_log_excerpt.log"


def _two_rank_log() -> str:
    """The real excerpt as a TP=2 server with expert parallelism would log it: the engine line
    says 2, two workers log world_size=2, each logs its EP rank line."""
    text = REAL_LOG.read_text().replace("tensor_parallel_size=1", "tensor_parallel_size=2")
    worker = next(line for line in text.splitlines() if "world_size=1 rank=0" in line)
    text = text.replace(worker, worker.replace("world_size=1 rank=0", "world_size=2 rank=0"))
    text += worker.replace("world_size=1 rank=0 local_rank=0", "world_size=2 rank=1 local_rank=1")
    for rank in (0, 1):
        text += (
            f"\n(Worker_TP{rank} pid=1) INFO [expert_map_manager.py:250] [EP Rank {rank}/2] "
            "Expert parallelism is enabled. Expert placement strategy: linear."
        )
    return text + "\n"


def test_layout_is_read_from_the_real_vllm_log_and_follows_it():
    seen = moe_evidence.read_parallelism(REAL_LOG.read_text())
    assert seen["source"] == "server log"
    assert (seen["tp"], seen["pp"], seen["dp"], seen["ep"]) == (1, 1, 1, 1)
    assert (seen["world_size"], seen["device"]) == (1, "cpu")
    assert any("Initializing a V1 LLM engine (v0.32.0)" in line for line in seen["log_lines"])
    two = moe_evidence.read_parallelism(_two_rank_log())
    assert (two["tp"], two["ep"], two["world_size"]) == (2, 2, 2)
    # No EP line, but the server's parsed arguments turned expert parallelism on: tp x dp.
    args_on = (
        REAL_LOG.read_text()
        .replace("tensor_parallel_size=1", "tensor_parallel_size=4")
        .replace("'dtype': 'float16'", "'dtype': 'float16', 'enable_expert_parallel': True")
    )
    assert moe_evidence.read_parallelism(args_on)["ep"] == 4
    off = moe_evidence.read_parallelism(args_on.replace("'enable_expert_parallel': True", "'x': 1"))
    assert (off["tp"], off["ep"]) == (4, 1)
    # A log that states no layout (transformers serve): nulls, not a guess.
    quiet = moe_evidence.read_parallelism("INFO: Uvicorn running on http://127.0.0.1:8000\n")
    assert quiet["source"] is None and quiet["tp"] is None and quiet["world_size"] is None


def test_bench_tp_prefers_the_log_and_says_where_it_came_from(tmp_path):
    log = tmp_path / "server.log"
    vllm = ["python", "-m", "vllm.entrypoints.openai.api_server", "--tensor-parallel-size", "4"]
    log.write_text(_two_rank_log())
    got = observed_parallelism(vllm, log, one_process=False)
    # The log says 2 although the command asked for 4: the log is what ran.
    assert (got["tp"], got["ep"], got["tp_source"], got["world_size"]) == (2, 2, "server log", 2)
    log.write_text("")
    got = observed_parallelism(vllm, log, one_process=False)
    assert (got["tp"], got["ep"], got["tp_source"], got["world_size"]) == (4, 1, "command", None)
    tf = ["python", "-m", "cellbench.serve.tf_serve", "/models/m", "--device", "cpu"]
    got = observed_parallelism(tf, log, one_process=True)
    assert (got["tp"], got["ep"], got["tp_source"]) == (1, 1, "command")
    got = observed_parallelism(["./my-server"], log, one_process=False)
    assert (got["tp"], got["ep"], got["tp_source"]) == (None, None, None)


def test_model_origin_is_read_from_the_model_folder(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    assert server.observe_model_origin(str(model))["built_by"] is None
    # A recipe as assets wrote it before built_by/weights existed: the same builder's.
    (model / server.MODEL_RECIPE).write_text(json.dumps({"kind": "tiny-qwen3-moe", "seed": 3}))
    origin = server.observe_model_origin(str(model))
    assert (origin["built_by"], origin["weights"], origin["seed"]) == (
        "cellbench.assets",
        "random",
        3,
    )
    assert server.observe_model_origin("Qwen/Qwen3-30B-A3B")["read_from"] is None


NONE_SEEN = {"source": "none seen", "paths": [], "searched": [], "log_lines": [], "env": {}}


def _banner(tmp_path: Path, name: str, command: list[str], origin, device=None) -> str:
    """report.md's banner over one local cell whose two arms' bench.json record ``command``,
    ``origin`` and (when given) the device their log named."""
    res = tmp_path / name
    extra = {"server": {"launcher": "local", "model": "/m", "model_id": "m", "ready_s": 1.0}}
    if command:
        extra["server"]["command"] = command
    if origin is not None:
        extra["model_origin"] = origin
    if device:
        extra["parallel_observed"] = {"device": device}
    files = [
        fx.write_bench(
            res,
            "host-cpu/tiny/tp1-ep1",
            arm,
            [fx.point(seq=i)],
            runtime="local",
            moe_config=NONE_SEEN,
            **extra,
        )
        for i, arm in enumerate(("untuned", "tuned"))
    ]
    frames_ = report.cell_frames(report.load_inputs(files, res))
    return report.render(*frames_, runtime="local").split("## ")[0]


def test_banner_follows_the_recorded_server_and_model(tmp_path):
    built = {
        "read_from": "/m/cellbench_model.json",
        "built_by": "cellbench.assets",
        "weights": "random",
        "kind": "tiny-qwen3-moe",
    }
    unknown = {"read_from": None, "built_by": None, "weights": None}
    tf = ["py", "-m", "cellbench.serve.tf_serve", "/m", "--device", "cpu"]
    vllm = ["py", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"]

    text = _banner(tmp_path, "a", tf, built)
    assert "random-weight tiny-qwen3-moe model built by the workflow" in text
    assert "served by `transformers serve` on cpu" in text and "near zero by design" in text
    # The same run with a model the workflow did not build: no random-weight claim.
    other = _banner(tmp_path, "b", tf, unknown)
    assert "random-weight" not in other and "origin the results do not record" in other
    # vLLM's server whose log said device_config=cpu: the vLLM-on-the-CPU banner.
    assert "served by vLLM on the CPU" in _banner(tmp_path, "c", vllm, built, device="cpu")
    # The same vLLM command whose log named no device: not claimed.
    assert "served by vLLM on the CPU" not in _banner(tmp_path, "d", vllm, built)
    # Results that record no command and no origin (files from before): nothing is guessed.
    old = _banner(tmp_path, "e", [], None)
    assert "do not record" in old and "random-weight" not in old


def test_gpu_overlap_is_named_as_planned_and_old_files_still_load(tmp_path):
    """A bench.json written before the rename (gpus_shared_by_sides) loads into the same
    column as one written after (planned_gpu_overlap); the value follows the file."""
    res = tmp_path / "results"
    files = [
        fx.write_bench(res, "i/m/tp1-ep1", "tuned", [fx.point()], planned_gpu_overlap=True),
        fx.write_bench(res, "i/old/tp1-ep1", "tuned", [fx.point()], gpus_shared_by_sides=True),
        fx.write_bench(res, "i/no/tp1-ep1", "tuned", [fx.point()], planned_gpu_overlap=False),
    ]
    serve = report.cell_frames(report.load_inputs(files, res))[0]
    got = dict(zip(serve.model, serve.planned_gpu_overlap, strict=True))
    assert got == {"m": True, "old": True, "no": False}


def test_manifest_show_reads_tuner_and_server_packages_and_the_old_key(tmp_path):
    cell = "rocm7.2/m/tp1-ep1"
    tuner = {"read_from": f"{cell}/tune/summary.json", "torch": "2.9.0", "triton": "3.5.0"}
    run = Run("rocm7.2", "r1", tmp_path)
    base = {"cells": [cell], "files": {}}
    new = archive.format_manifest(
        run,
        {
            **base,
            "tuner_packages": {cell: tuner},
            "server_packages": {
                cell: {
                    "tuned": {
                        "read_from": None,
                        "vllm_said": "0.32.0",
                        "torch": "2.10.0",
                        "vllm": "0.32.0",
                    }
                }
            },
        },
    )
    assert f"{cell}: tuner: torch 2.9.0, triton 3.5.0" in new
    assert "tuned server's environment: torch 2.10.0, vllm 0.32.0" in new
    old = archive.format_manifest(run, {**base, "measured_packages": {cell: tuner}})
    assert f"{cell}: tuner: torch 2.9.0, triton 3.5.0" in old
