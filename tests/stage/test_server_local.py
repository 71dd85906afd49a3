"""Server lifecycle and the serve stage, with real servers.
Stand-in, why: the timed server plays the failing server because a real one cannot be made to
die at start-up, never get ready or answer 500s at a chosen moment.

* The full stage on a real ``transformers serve`` of the tiny Qwen3-MoE model built by
  ``cellbench.assets.build``: a 1-point grid, then lm-eval GSM8K on 5 questions.
* Failures caused for real with the timed server run as the stage's server command: exit during
  start-up, never ready, many HTTP 500s, exit mid-run.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

import jsonschema
import pytest
from cellbench.assets import build as assets
from cellbench.common import paths
from cellbench.contracts import result_file
from cellbench.gsm8k import evaluate as gsm8k
from cellbench.results import loaders
from cellbench.serve import job as serve_job
from cellbench.serve import measure as serve_measure
from cellbench.serve import stage as serve_stage
from cellbench.serve.server import ServerError, ServerSpec, serve
from cellbench.serve.timed_server import free_port

SCHEMA = json.loads((paths.SCHEMA_DIR / "bench.schema.json").read_text())
TIMED = [sys.executable, "-m", "cellbench.serve.timed_server", "--port", "{port}"]


def _port_closed(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def _stage_args(out: Path, lease: Path, *extra: str) -> list[str]:
    return [
        "--runtime",
        "local",
        "--cell-id",
        "host-cpu/tiny/tp1-ep1",
        "--arm",
        "untuned",
        "--tp",
        "1",
        "--ep",
        "1",
        "--lease-dir",
        str(lease),
        "--cache-dir",
        str(lease.parent / "cache"),
        "--out-dir",
        str(out),
        *extra,
    ]


def _timed_stage(tmp_path: Path, server_flags: list[str], *extra: str) -> list[str]:
    return _stage_args(
        tmp_path / "out",
        tmp_path / "leases",
        "--model",
        "timed-model",
        "--server-command-json",
        json.dumps(TIMED + server_flags),
        "--grid-json",
        '[{"isl": 8, "osl": 4}]',
        "--concurrency",
        "2",
        "--prompts-per-concurrency",
        "5",
        "--warmups-per-concurrency",
        "1",
        "--no-gsm8k",
        *extra,
    )


def _assert_failed_cleanly(tmp_path: Path, capsys, *needles: str) -> None:
    err = capsys.readouterr().err
    for n in needles:
        assert n in err, f"{n!r} not in:\n{err}"
    out = tmp_path / "out"
    assert not (out / "bench.json").exists()
    assert not (out / "lm_eval").exists()
    # The server's port (from its own log line) no longer answers.
    log = (out / "server.log").read_text()
    port = int(log.split("starting on 127.0.0.1:")[1].split()[0])
    assert _port_closed(port)


def test_exit_during_startup(tmp_path, capsys):
    rc = serve_stage.main(_timed_stage(tmp_path, ["--exit-at-start"]))
    assert rc == 1
    _assert_failed_cleanly(
        tmp_path, capsys, "exited during start-up", "status 3", "failing start-up on purpose"
    )


def test_never_ready(tmp_path, capsys):
    t0 = time.monotonic()
    rc = serve_stage.main(_timed_stage(tmp_path, ["--never-ready"], "--ready-timeout", "2"))
    assert rc == 1 and time.monotonic() - t0 < 30
    _assert_failed_cleanly(tmp_path, capsys, "not ready within 2 s", "/health 503")


def test_too_many_failed_requests(tmp_path, capsys):
    rc = serve_stage.main(
        _timed_stage(tmp_path, ["--fail-share", "0.5"], "--max-failed-share", "0.05")
    )
    assert rc == 1
    _assert_failed_cleanly(tmp_path, capsys, "requests failed", "HTTP 500", "starting on")


def test_exit_mid_run(tmp_path, capsys):
    rc = serve_stage.main(
        _timed_stage(tmp_path, ["--exit-after", "4"], "--max-failed-share", "1.0")
    )
    assert rc == 1
    _assert_failed_cleanly(tmp_path, capsys, "exited mid-run", "exiting on purpose")


def test_bad_input_rejected_before_any_server(tmp_path, capsys):
    # A grid point's limits (osl >= 1 ...) are the config schema's, checked where the config
    # enters (tests/workflow/test_bad_input.py); the stage checks what the job's own shape
    # can break.
    args = _timed_stage(tmp_path, [])
    args[args.index("--arm") + 1] = "tuned"  # tuned without --tuned-config-dir
    assert serve_stage.main(args) == 2
    assert "--tuned-config-dir" in capsys.readouterr().err


def test_repeat_order_and_what_the_local_server_ran(tmp_path):
    args = _timed_stage(
        tmp_path, ["--ttft-ms", "5", "--itl-ms", "2"], "--repeats", "2", "--concurrency", "1,2"
    )
    args[args.index("--grid-json") + 1] = '[{"isl": 8, "osl": 4}, {"isl": 16, "osl": 3}]'
    assert serve_stage.main(args) == 0
    first = json.loads((tmp_path / "out" / "bench.json").read_text())
    jsonschema.validate(first, SCHEMA)
    # The local server is given no cache folder: nothing to observe, so no claim either way.
    assert first["cold"] is None and first["cache_at_start"] is None
    # A bring-your-own command that names no TP size: the applied layout is not known.
    assert (first["tp"], first["ep"], first["tp_source"]) == (None, None, None)
    # Nor is its environment asked, nor does its model name a folder with a recipe.
    assert first["server_packages"] == {"read_from": None}
    assert first["model_origin"]["built_by"] is None
    assert (first["tp_requested"], first["ep_requested"]) == (1, 1)
    order = [(p["repeat"], p["isl"], p["max_concurrency"]) for p in first["points"]]
    assert order == [(r, isl, c) for r in (0, 1) for isl in (8, 16) for c in (1, 2)]
    assert all(p["failed"] == 0 and p["completed"] == p["num_prompts"] for p in first["points"])
    assert first["ignore_eos"] is True and first["points"][0]["total_output_tokens"] == 5 * 4
    # Repeats use fresh prompts (a prefix cache must not serve them).
    assert first["points"][0]["seed"] != first["points"][4]["seed"]
    assert not list((tmp_path / "cache").rglob("*.cellbench-warm"))  # no marker stands in


def test_one_arm_runs_its_minimum_of_server_starts(tmp_path):
    """A one-arm job (serve.interleave_arms false) runs serve.starts.min rounds: a fresh
    server each, the repeats of each round recorded with their start; no stopping rule."""
    args = _timed_stage(
        tmp_path, ["--ttft-ms", "2", "--itl-ms", "1"], "--repeats", "1", "--starts-min", "2",
        "--starts-cap", "2",
    )  # fmt: skip
    assert serve_stage.main(args) == 0
    bench = json.loads((tmp_path / "out" / "bench.json").read_text())
    jsonschema.validate(bench, SCHEMA)
    assert [(p["start"], p["repeat"]) for p in bench["points"]] == [(0, 0), (1, 1)]
    assert "starts_cap" not in bench["points"][0]  # fixed starts: nothing stopped
    assert len(bench["server"]["starts_ready_s"]) == 2
    log = (tmp_path / "out" / "server.log").read_text()
    assert log.count("starting on") == 2
    assert _port_closed(int(log.rsplit("starting on 127.0.0.1:")[1].split()[0]))


def test_cache_contents_counts_files_and_bytes(tmp_path):
    cache = tmp_path / "cache"
    assert serve_measure.cache_contents(cache) == {"dir": str(cache), "files": 0, "bytes": 0}
    (cache / "aiter-jit").mkdir(parents=True)  # empty folders the launcher makes hold nothing
    (cache / serve_job.WARM_MARKER).write_text("left by an older version\n")
    assert serve_measure.cache_contents(cache)["files"] == 0
    (cache / "torch_compile_cache" / "abc").mkdir(parents=True)
    (cache / "torch_compile_cache" / "abc" / "graph.py").write_bytes(b"x" * 1000)
    (cache / "aiter-jit" / "mod.so").write_bytes(b"y" * 24)
    assert serve_measure.cache_contents(cache) == {"dir": str(cache), "files": 2, "bytes": 1024}


def test_applied_parallelism_is_read_from_the_server_command():
    from cellbench.serve.server import docker_command, local_command

    spec = ServerSpec(runtime="docker", model="m", port=8000, log_path=Path("x"), tp=2, ep=2)
    spec.image_ref = "r@sha256:" + "0" * 64
    assert serve_stage.applied_parallelism(docker_command(spec, "m"), one_process=False) == {
        "tp": 2,
        "ep": 2,
    }
    spec.ep = 1
    assert serve_stage.applied_parallelism(docker_command(spec, "m"), one_process=False) == {
        "tp": 2,
        "ep": 1,
    }
    # transformers serve on the local runtime: one process, whatever the cell asked for.
    local = ServerSpec(runtime="local", model="m", port=8000, log_path=Path("x"), tp=2, ep=2)
    assert serve_stage.applied_parallelism(local_command(local), one_process=True) == {
        "tp": 1,
        "ep": 1,
    }
    assert serve_stage.applied_parallelism(["my-server", "-tp", "4"], one_process=False) == {
        "tp": 4,
        "ep": 1,
    }


def test_serve_stops_process_group_on_interrupt(tmp_path):
    port = free_port()
    spec = ServerSpec(
        runtime="local",
        model="timed-model",
        port=port,
        log_path=tmp_path / "server.log",
        ready_timeout_s=20,
        command=TIMED,
    )
    with pytest.raises(KeyboardInterrupt):
        with serve(spec) as server:
            pid = server.describe["pid"]
            assert server.alive() and server.model_id == "timed-model"
            raise KeyboardInterrupt
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert _port_closed(port)


def test_serve_rejects_bad_spec(tmp_path):
    spec = ServerSpec(runtime="podman", model="m", port=1, log_path=tmp_path / "l")
    with pytest.raises(ValueError, match="runtime"):
        with serve(spec):
            pass
    assert not (tmp_path / "l").exists()


def test_sigterm_stops_server(tmp_path):
    # Snakemake cancels jobs with SIGTERM: the stage must still stop its server.
    import subprocess

    args = _timed_stage(tmp_path, ["--ttft-ms", "2000"], "--prompts-per-concurrency", "50")
    proc = subprocess.Popen(
        [sys.executable, "-m", "cellbench.serve", *args],
        stderr=subprocess.PIPE,
        text=True,
    )
    log = tmp_path / "out" / "server.log"
    deadline = time.monotonic() + 30
    while "starting on" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    assert proc.returncode != 0
    port = int(log.read_text().split("starting on 127.0.0.1:")[1].split()[0])
    assert _port_closed(port)
    assert not (tmp_path / "out" / "bench.json").exists()


@pytest.mark.slow
def test_lm_eval_failure_fails_the_job(tmp_path, capsys):
    # A question file that is not JSON: lm-eval itself fails, for real.
    task = assets.make_gsm8k_set(tmp_path / "gsm8k", 4, seed=0, n_train=2)
    (task / assets.GSM8K_TEST_FILE).write_text("this is not JSON\n")
    args = _timed_stage(tmp_path, ["--ttft-ms", "1", "--itl-ms", "1"])
    args.remove("--no-gsm8k")
    args += ["--gsm8k-dataset", str(task / assets.GSM8K_TEST_FILE)]
    args += ["--gsm8k-fewshot", "1", "--gsm8k-limit", "2"]
    assert serve_stage.main(args) == 1
    assert "lm-eval exited with status" in capsys.readouterr().err
    out = tmp_path / "out"
    assert not (out / "bench.json").exists()
    assert not (out / "lm_eval").exists() and not (out / "lm_eval.partial").exists()
    assert (out / "lm_eval.log").exists()


@pytest.fixture(scope="module")
def tiny_assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("assets")
    model = assets.make_tiny_model(root / "tiny-qwen3-moe", seed=0)
    task = assets.make_gsm8k_set(root / "gsm8k", 10, seed=0, n_train=4)
    return model, task


@pytest.mark.slow
def test_stage_on_transformers_serve(tiny_assets, tmp_path):
    model, task = tiny_assets
    out = tmp_path / "out"
    args = _stage_args(
        out,
        tmp_path / "leases",
        "--model",
        str(model),
        "--served-model-name",
        "tiny-qwen3-moe",
        "--grid-json",
        '[{"isl": 32, "osl": 8}]',
        "--concurrency",
        "2",
        "--prompts-per-concurrency",
        "2",
        "--warmups-per-concurrency",
        "1",
        "--ignore-eos",
        "--ready-timeout",
        "120",
        "--max-failed-share",
        "0",
        "--gsm8k-dataset",
        str(task / assets.GSM8K_TEST_FILE),
        "--gsm8k-fewshot",
        "1",
        "--gsm8k-limit",
        "5",
        "--gsm8k-max-gen-toks",
        "24",
        "--tp",  # later flags win: a TP 2 request, which transformers serve cannot honour
        "2",
        "--ep",
        "2",
    )
    assert serve_stage.main(args) == 0
    bench = json.loads((out / "bench.json").read_text())
    jsonschema.validate(bench, SCHEMA)
    assert bench["runtime"] == "local" and bench["cold"] is None
    # The cell asked for TP 2 with expert parallel (the config refuses this for a transformers
    # does); transformers serve ran one process, and the file says so.
    assert (bench["tp_requested"], bench["ep_requested"]) == (2, 2)
    assert (bench["tp"], bench["ep"]) == (1, 1)
    # Its log states no layout, so the 1 and 1 come from its command, and the file says so.
    assert (bench["tp_source"], bench["world_size"]) == ("command", None)
    # Its packages as its own interpreter (this one, in-process transformers serve) has them;
    # its model as the assets stage's recipe in the model folder says.
    assert bench["server_packages"]["read_from"].startswith(sys.executable)
    assert bench["server_packages"]["transformers"] == importlib.metadata.version("transformers")
    assert bench["model_origin"]["built_by"] == "cellbench.assets"
    # transformers serve refuses ignore_eos: recorded as not applied, lengths measured.
    assert bench["ignore_eos"] is False and bench["ignore_eos_requested"] is True
    (pt,) = bench["points"]
    assert pt["completed"] == 4 and pt["failed"] == 0
    assert pt["total_input_tokens"] == 4 * 32
    assert 4 <= pt["total_output_tokens"] <= 4 * 8
    assert pt["mean_ttft_ms"] > 0 and pt["mean_e2el_ms"] >= pt["mean_ttft_ms"]
    # transformers serve exports no Prometheus /metrics; the local CPU cell has no GPU: the
    # point says so (issue 24), and its requests are kept all the same.
    assert pt["server_metrics"]["available"] is False
    assert "/metrics" in pt["server_metrics"]["reason"]
    assert pt["telemetry"]["available"] is False
    (kept,) = loaders.load_requests(out / "requests.jsonl.gz")
    assert len(kept["ttfts"]) == 4 and kept["seq"] == pt["seq"]
    assert "Uvicorn running" in (out / "server.log").read_text()
    port = int(bench["server"]["command"][bench["server"]["command"].index("--port") + 1])
    assert _port_closed(port)
    summary = gsm8k.parse_results(out / "lm_eval", cell=bench["cell"], arm="untuned")
    result_file.check_gsm8k(summary, out / "untuned.json")
    assert summary["n_samples"] == 5 and summary["num_fewshot"] == 1
    # The tiny model ships a ChatML template: gsm8k.api auto asked transformers serve for chat.
    assert summary["api"] == "chat" and summary["lm_eval_model"] == "local-chat-completions"
    assert summary["chat_template_source"].endswith("chat_template.jinja")


def test_server_error_carries_log_tail(tmp_path):
    spec = ServerSpec(
        runtime="local",
        model="timed-model",
        port=free_port(),
        log_path=tmp_path / "server.log",
        ready_timeout_s=20,
        command=[*TIMED, "--exit-at-start"],
    )
    with pytest.raises(ServerError, match="failing start-up on purpose"):
        with serve(spec):
            pass


def test_docker_command_line():
    from cellbench.serve.server import docker_command

    spec = ServerSpec(
        runtime="docker",
        model="Qwen/Qwen3-30B-A3B-Instruct-2507-FP8",
        port=8123,
        log_path=Path("x"),
        served_model_name="qwen3-30b-a3b-fp8",
        serve_args=["--max-model-len", "65536"],
        image_ref="r@sha256:" + "0" * 64,
        tp=2,
        ep=2,
    )
    cmd = docker_command(spec, spec.model)
    assert cmd[:3] == ["vllm", "serve", spec.model]
    assert cmd[cmd.index("--port") + 1] == "8123"
    assert cmd[cmd.index("--tensor-parallel-size") + 1] == "2"
    assert "--enable-expert-parallel" in cmd
    assert cmd[cmd.index("--served-model-name") + 1] == "qwen3-30b-a3b-fp8"
    assert cmd[-2:] == ["--max-model-len", "65536"]
    spec.ep = 1
    assert "--enable-expert-parallel" not in docker_command(spec, spec.model)


def test_vllm_commands_serve_the_configured_dtype():
    """vLLM chooses a dtype from the checkpoint when told none (bf16 for a float32 one on its
    CPU backend): both vLLM launchers pass the config's model dtype, unless serve_args set one."""
    from cellbench.serve.server import docker_command, local_command

    for runtime in ("docker", "local"):
        spec = ServerSpec(
            runtime=runtime, model="m", port=8123, log_path=Path("x"), server="vllm", dtype="fp16"
        )
        cmd = docker_command(spec, "m") if runtime == "docker" else local_command(spec)
        assert cmd[cmd.index("--dtype") + 1] == "float16", cmd
        spec.serve_args = ["--dtype=bfloat16"]
        cmd = docker_command(spec, "m") if runtime == "docker" else local_command(spec)
        assert "--dtype" not in cmd and cmd[-1] == "--dtype=bfloat16", cmd
        spec.serve_args, spec.dtype = [], "fp8"
        cmd = docker_command(spec, "m") if runtime == "docker" else local_command(spec)
        assert not any(a.startswith("--dtype") for a in cmd), cmd


# --- the docker launcher, with the Docker engine and the local registry's test image ----------
# The image has python3 and torch but neither vLLM nor aiohttp, so the server run inside it is
# the timed server, with the workflow and the host venv's packages mounted read-only.

from support.docker_env import TEST_TAGS, docker_client, labelled, pinned, registry  # noqa: E402, F401


def _docker_spec(image: str, tmp_path: Path, run_id: str, *flags: str, **kw) -> ServerSpec:
    import site

    return ServerSpec(
        runtime="docker",
        model="timed-model",
        port=free_port(),
        log_path=tmp_path / "server.log",
        image_ref=image,
        ready_timeout_s=60,
        command=["python3", "-m", "cellbench.serve.timed_server", "--port", "{port}", *flags],
        env={"PYTHONPATH": "/cellbench/workflow:/cellbench/site"},
        extra_mounts=[
            (str(paths.WORKFLOW_DIR), "/cellbench/workflow"),
            (site.getsitepackages()[0], "/cellbench/site"),
        ],
        labels={"cellbench.test": run_id},
        **kw,
    )


@pytest.fixture(scope="module")
def test_image(docker_client, registry):  # noqa: F811
    ref = pinned(docker_client, TEST_TAGS["7.2"])
    docker_client.images.pull(ref)
    return ref


@pytest.mark.docker
def test_docker_launcher_tuned_arm(docker_client, test_image, tmp_path):  # noqa: F811
    import uuid

    from cellbench.serve import loadgen, random_prompts

    run_id = uuid.uuid4().hex
    tuned = tmp_path / "configs"
    tuned.mkdir()
    (tuned / "E=8,N=32,device_name=X.json").write_text("{}")
    spec = _docker_spec(
        test_image, tmp_path, run_id, "--ttft-ms", "5", "--itl-ms", "1", tuned_config_dir=tuned
    )
    with serve(spec) as server:
        (c,) = labelled(docker_client, "cellbench.test", run_id)
        env = dict(e.split("=", 1) for e in c.attrs["Config"]["Env"])
        assert env["VLLM_TUNED_CONFIG_FOLDER"] == "/cellbench/tuned-configs"
        mounts = {m["Destination"]: m for m in c.attrs["Mounts"]}
        assert mounts["/cellbench/tuned-configs"]["Source"] == str(tuned.resolve())
        assert mounts["/cellbench/tuned-configs"]["RW"] is False
        tok = random_prompts.ServerTokenizer(server.base_url, server.model_id)
        pt = loadgen.run_point(
            server.base_url,
            server.model_id,
            tok,
            loadgen.PointSpec(isl=8, osl=4, max_concurrency=2, num_prompts=4, num_warmups=2),
            ignore_eos=True,
        )
        assert pt["completed"] == 4 and pt["total_output_tokens"] == 16
    assert labelled(docker_client, "cellbench.test", run_id) == []
    assert "starting on" in (tmp_path / "server.log").read_text()


@pytest.mark.docker
def test_docker_launcher_untuned_arm_and_startup_exit(docker_client, test_image, tmp_path):  # noqa: F811
    import uuid

    run_id = uuid.uuid4().hex
    spec = _docker_spec(test_image, tmp_path, run_id, "--exit-at-start")
    with pytest.raises(ServerError, match="failing start-up on purpose"):
        with serve(spec):
            pass
    assert labelled(docker_client, "cellbench.test", run_id) == []
    # The untuned arm never sees the tuned folder.
    run_id = uuid.uuid4().hex
    spec = _docker_spec(test_image, tmp_path, run_id)
    with serve(spec):
        (c,) = labelled(docker_client, "cellbench.test", run_id)
        env = dict(e.split("=", 1) for e in c.attrs["Config"]["Env"])
        assert "VLLM_TUNED_CONFIG_FOLDER" not in env
    assert labelled(docker_client, "cellbench.test", run_id) == []
