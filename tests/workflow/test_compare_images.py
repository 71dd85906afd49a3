"""Two images' tuned arms in one job (``--arm images``, serve.compare_images), with real timed
servers as the two images' servers, plus the config checks, the planned jobs and the report.

In the local runtime there are no images: each side here is a timed server of its own (side B
answers more slowly), which is enough to tell the two sides apart in the results.
"""

from __future__ import annotations

import json
import shutil
import socket
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from cellbench.config import loader as cbconfig
from cellbench.contracts import result_file
from cellbench.report import build as report
from cellbench.serve import stage as serve_stage
from support import result_fixtures as fx
from support.stage_jobs import serve_argv
from support.workflow_runs import fresh_copy, planned_jobs

ROOT = Path(__file__).resolve().parents[2]
TIMED = [sys.executable, "-m", "cellbench.serve.timed_server", "--port", "{port}"]
DIGESTS = {"imgA": "sha256:" + "a" * 64, "imgB": "sha256:" + "b" * 64}
COMPARISON = "imgA-vs-imgB/timed/tp1-ep1"


def _port_closed(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def _server_port(log: Path) -> int:
    return int(log.read_text().split("starting on 127.0.0.1:")[1].split()[0])


def _images_job(tmp_path: Path, flags: dict[str, list[str]], **fields) -> tuple[dict, dict]:
    """An images job on two timed servers (its tracked fields, as compare_job builds them)
    and this host's part; ``fields`` set or override the job's."""
    sides = []
    for name in ("imgA", "imgB"):
        tuned = tmp_path / name / "tune" / "configs"
        tuned.mkdir(parents=True, exist_ok=True)
        (tuned / "E=8,N=32,device_name=X.json").write_text("{}")
        sides.append(
            {
                "name": name,
                "cell": f"{name}/timed/tp1-ep1",
                "image_digest": DIGESTS[name],
                "tuned_config_dir": str(tuned),
                "server_command": TIMED + flags[name],
            }
        )
    job = {
        "runtime": "local",
        "cell_id": COMPARISON,
        "arm": "images",
        "model": "timed-model",
        "images": sides,
        "grid": [{"isl": 8, "osl": 4}],
        "concurrency": [1],
        "prompts_per_concurrency": 2,
        "warmups_per_concurrency": 1,
        "gsm8k": False,
        **fields,
    }
    return job, {"lease_dir": str(tmp_path / "leases"), "cache_dir": str(tmp_path / "cache")}


def _images_args(tmp_path: Path, flags: dict[str, list[str]], **fields) -> list[str]:
    return serve_argv(*_images_job(tmp_path, flags, **fields), tmp_path / "compare")


def test_images_alternate_repeat_by_repeat_and_both_digests_are_kept(tmp_path):
    args = _images_args(
        tmp_path,
        {"imgA": ["--ttft-ms", "2", "--itl-ms", "1"], "imgB": ["--ttft-ms", "40", "--itl-ms", "1"]},
        grid=[{"isl": 8, "osl": 4}, {"isl": 16, "osl": 3}],
        repeats=3,
    )
    assert serve_stage.main(args) == 0
    out = tmp_path / "compare"
    data = json.loads((out / "bench.json").read_text())
    result_file.check_comparison(data, out / "bench.json")
    assert data["images"] == ["imgA", "imgB"] and data["arm"] == "tuned"
    assert data["side_order"] == [["imgA", "imgB"], ["imgB", "imgA"], ["imgA", "imgB"]]
    # same_environment compares the two sides' digests (here two different ones), and the
    # note names them: it is not inferred from the runtime.
    assert data["same_environment"] is False
    note = data["environment_note"]
    assert DIGESTS["imgA"] in note and DIGESTS["imgB"] in note
    assert all(side["cold"] is None for side in data["sides"].values())  # no cache folder
    assert "TUNED arm" in data["arm_note"]
    for name, side in data["sides"].items():
        assert side["image_digest"] == DIGESTS[name]
        assert side["cell"] == f"{name}/timed/tp1-ep1"
        assert side["tuned_config_dir"] == str(tmp_path / name / "tune" / "configs")
        assert side["server_log"] == f"server-{name}.log"
    # The interleaving, audited from the recorded points alone: A A B B, B B A A, A A B B.
    points = data["points"]
    assert [p["seq"] for p in points] == list(range(12))
    assert [p["image"][-1] for p in points] == list("AABBBBAAAABB")
    assert [p["repeat"] for p in points] == [r for r in range(3) for _ in range(4)]
    starts = [p["started_at"] for p in points]
    assert starts == sorted(starts)
    assert all(p["failed"] == 0 for p in points)
    # The same prompts for both images within a repeat.
    for name in DIGESTS:
        assert [p["seed"] for p in points if p["image"] == name] == [0, 0, 1, 1, 2, 2]
    # Each image's points came from its own server (B was set 20x slower to first token).
    ttft = {n: [p["mean_ttft_ms"] for p in points if p["image"] == n] for n in DIGESTS}
    assert max(ttft["imgA"]) < min(ttft["imgB"])
    ports = {name: _server_port(out / f"server-{name}.log") for name in DIGESTS}
    assert ports["imgA"] != ports["imgB"]
    assert all(_port_closed(p) for p in ports.values())
    # Each image has a cache folder of its own (by digest); no marker claims it warm.
    assert len([d for d in (tmp_path / "cache").iterdir() if d.is_dir()]) == 2
    assert not list((tmp_path / "cache").rglob(".cellbench-warm"))

    # The report's image-vs-image section for the tuned arm comes from this file.
    res = tmp_path / "results"
    target = res / "compare" / COMPARISON / "bench.json"
    target.parent.mkdir(parents=True)
    target.write_text((out / "bench.json").read_text())
    # With its checksum, as the job wrote it: a result without one is refused.
    shutil.copy(out / "bench.json.sha256", target.parent / "bench.json.sha256")
    cells = [_cell_bench(res, image, arm) for image in DIGESTS for arm in ("untuned", "tuned")]
    text = report.write_report([*cells, target], tmp_path / "report", results=res).read_text()
    assert "## imgA (A) vs imgB (B): timed tp1-ep1, tuned (interleaved on one host)" in text
    assert "## imgA (A) vs imgB (B): timed tp1-ep1, untuned (separate runs)" in text
    assert DIGESTS["imgA"] in text and DIGESTS["imgB"] in text
    # Two different digests: the report does not call them one environment.
    assert "Both sides ran the same local environment" not in text
    rows = (tmp_path / "report" / "compare.csv").read_text().splitlines()
    assert len(rows) == 1 + 12 and rows[0].startswith("comparison,image_a,image_b")
    # Without the comparison, the tuned arm falls back to the separate runs.
    text = report.write_report(cells, tmp_path / "report2", results=res).read_text()
    assert "timed tp1-ep1, tuned (separate runs)" in text and "interleaved on one host" not in text


def _cell_bench(results: Path, image: str, arm: str) -> Path:
    """A cell's bench.json with chosen values, whole and schema-valid (result_fixtures)."""
    points = [
        fx.point(8, 4, repeat=r, seq=r, concurrency=1, ttft=10.0 + r, tpot=1.0, e2el=20.0)
        for r in range(2)
    ]
    cell = f"{image}/timed/tp1-ep1"
    return fx.write_bench(results, cell, arm, points, image_digest=DIGESTS[image])


def test_either_image_server_dying_fails_the_job_and_stops_both(tmp_path, capsys):
    # Per side: 2 start-up completions (readiness, ignore_eos probe), then 1 warm-up + 2
    # measured requests per repeat; B goes first in repeat 1 and its server exits there.
    args = _images_args(
        tmp_path,
        {"imgA": ["--ttft-ms", "1"], "imgB": ["--ttft-ms", "1", "--exit-after", "5"]},
        repeats=2,
        max_failed_share=1.0,
    )
    assert serve_stage.main(args) == 1
    err = capsys.readouterr().err
    assert "images failed: imgB server exited mid-run at imgB" in err, err
    assert "exiting on purpose" in err
    out = tmp_path / "compare"
    assert "exiting on purpose" in (out / "server-imgB.log").read_text()
    assert not (out / "bench.json").exists()
    for name in DIGESTS:
        assert _port_closed(_server_port(out / f"server-{name}.log"))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda j, h: j["images"].pop(), "exactly 2 images, got 1"),
        (lambda j, h: j["images"][1].update(name="imgA"), "both images are named 'imgA'"),
        (
            lambda j, h: j["images"][0].update(tuned_config_dir="/nonexistent"),
            "--images-json[0].tuned_config_dir '/nonexistent' is not a directory",
        ),
        (lambda j, h: j["images"][1].update(colour=1), "images[1]: unknown key"),
        (lambda j, h: j["images"][0].pop("cell"), "images[0].cell must be"),
        (lambda j, h: j.pop("gsm8k"), "pass --no-gsm8k"),
        (lambda j, h: h.update(tuned_config_dir="."), "--tuned-config-dir is per image"),
        (
            lambda j, h: (j.update(runtime="docker", gpus=2), h.update(total_gpus=8)),
            "--images-json[0].image_ref None: a docker run serves a pinned digest",
        ),
    ],
)
def test_bad_images_input_rejected_before_any_server(tmp_path, capsys, change, message):
    job, host = _images_job(tmp_path, {"imgA": [], "imgB": []})
    change(job, host)
    assert serve_stage.main(serve_argv(job, host, tmp_path / "compare")) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "compare").exists() and not (tmp_path / "leases").exists()


def test_images_json_only_with_arm_images(tmp_path, capsys):
    args = _images_args(tmp_path, {"imgA": [], "imgB": []}, arm="untuned")
    assert serve_stage.main(args) == 2
    assert "--images-json is only for --arm images" in capsys.readouterr().err


def _config(name: str, **serve) -> dict:
    config = yaml.safe_load((ROOT / "config" / name).read_text())
    config["serve"].update(serve)
    return config


def test_config_checks_for_compare_images():
    # One image only: nothing to compare.
    with pytest.raises(cbconfig.ConfigError, match=r"serve.compare_images = true needs at least 2"):
        cbconfig.validate(_config("local.yaml", compare_images=True))
    # Two images, but no (model, tp, ep) in common.
    config = _config("config.yaml", compare_images=True)
    config["cells"] = [
        {"images": ["rocm7.0"], "models": ["qwen3-30b-a3b-fp8"], "tp": 2, "ep": True},
        {"images": ["rocm7.2"], "models": ["qwen3-30b-a3b-fp8"], "tp": 4, "ep": True},
    ]
    with pytest.raises(cbconfig.ConfigError, match=r"no two configured images do"):
        cbconfig.validate(config)
    # Both servers at once: 2 x tp GPUs (the arms may still run one after the other).
    config = _config("config.yaml", compare_images=True, interleave_arms=False)
    config["cells"][0]["tp"] = 8
    with pytest.raises(
        cbconfig.ConfigError,
        match=r"rocm7.0-vs-rocm7.2/qwen3-30b-a3b-fp8/tp8-ep8 runs two servers of tp = 8 GPUs at "
        r"once and needs 16 GPUs, but gpus = 8",
    ):
        cbconfig.validate(config)
    config = _config("config.yaml", compare_images=True)
    config["images"]["compare"] = config["images"].pop("rocm7.2")
    config["cells"][0]["images"] = ["rocm7.0", "compare"]
    with pytest.raises(cbconfig.ConfigError, match=r"images.compare: .* the name 'compare' is"):
        cbconfig.validate(config)
    with pytest.raises(cbconfig.ConfigError, match=r"serve.compare_images = \"yes\""):
        cbconfig.validate(_config("config.yaml", compare_images="yes"))
    # The default is off, and a valid config lists its comparisons in config order.
    assert cbconfig.validate(_config("config.yaml"))["serve"]["compare_images"] is False
    pairs = cbconfig.comparisons(cbconfig.validate(_config("config.yaml", compare_images=True)))
    assert [p.comparison_id for p in pairs] == [
        "rocm7.0-vs-rocm7.2/qwen3-30b-a3b-fp8/tp2-ep2",
        "rocm7.0-vs-rocm7.2/qwen3.5-35b-a3b-fp8/tp2-ep2",
    ]


def _write(tmp_path: Path, config: dict, name: str) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_dry_run_plans_one_compare_job_per_image_pair_and_cell(tmp_path):
    baseline = planned_jobs("all", "--configfile", str(ROOT / "config/config.yaml"))
    off = planned_jobs(
        "all",
        "--configfile",
        _write(tmp_path, _config("config.yaml", compare_images=False), "off.yaml"),
    )
    assert off == baseline and "compare_images" not in off
    on = planned_jobs(
        "all",
        "--configfile",
        _write(tmp_path, _config("config.yaml", compare_images=True), "on.yaml"),
    )
    # Two models at tp2-ep2 on both images: one comparison each; the per-cell jobs unchanged.
    assert on == baseline + Counter({"compare_images": 2})
    # A comparison needs only the two cells' tuned configs, not their serve jobs.
    target = "results/compare/rocm7.0-vs-rocm7.2/qwen3-30b-a3b-fp8/tp2-ep2/bench.json"
    jobs = planned_jobs(target, "--configfile", str(tmp_path / "on.yaml"))
    assert jobs == Counter({"tune": 2, "compare_images": 1})


def test_dry_run_local_runtime_with_two_images(tmp_path):
    config = _config("local.yaml", compare_images=True)
    config["images"]["host-cpu-b"] = {"ref": "local/host-cpu-b:none"}
    for group in config["cells"]:
        group["images"].append("host-cpu-b")
    jobs = planned_jobs(
        "all", "--configfile", _write(tmp_path, config, "local2.yaml"), cwd=fresh_copy(tmp_path)
    )
    assert jobs["compare_images"] == 2  # the tp1-ep1 and tp2-ep2 cells
    assert jobs["serve_pair"] == 4 and jobs["tune"] == 4 and jobs["report"] == 1


@pytest.mark.slow
def test_compare_rule_runs_on_the_embedded_default(tmp_path):
    # The real rule end to end on the local runtime: two "images" (the same host environment),
    # each cell tuned under the Triton interpreter, then one job serving both tuned arms with
    # `transformers serve` and alternating them per repeat.
    import subprocess

    work = fresh_copy(tmp_path)
    config = _config("local.yaml", compare_images=True, grid=[{"isl": 32, "osl": 16}])
    del config["serve"]["sla"]  # its point is the default grid's; a comparison does not search
    config["images"]["host-cpu-b"] = {"ref": "local/host-cpu-b:none"}
    config["cells"] = [
        {"images": ["host-cpu", "host-cpu-b"], "models": ["tiny-qwen3-moe"], "tp": 1}
    ]
    configfile = _write(tmp_path, config, "two-images.yaml")
    target = "results/compare/host-cpu-vs-host-cpu-b/tiny-qwen3-moe/tp1-ep1/bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "2", target, "--configfile", configfile],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((work / target).read_text())
    result_file.check_comparison(data, work / target)
    # Both sides' digests are the host Python's stand-in: equal, so the same environment.
    assert data["sides"]["host-cpu"]["image_digest"] == data["sides"]["host-cpu-b"]["image_digest"]
    assert data["same_environment"] is True and data["runtime"] == "local"
    a, b = "host-cpu", "host-cpu-b"
    # serve.repeats 1, starts {min: 2, cap: 3} (the embedded default's): 2 or 3 rounds of
    # server starts, A B / B A / A B, as many as the point records, and why it stopped
    (used,) = {p["starts_used"] for p in data["points"]}
    assert used in (2, 3) and all(p["starts_cap"] == 3 for p in data["points"])
    assert [p["start"] for p in data["points"]] == [k for k in range(used) for _ in (a, b)]
    assert all(p["stop_reason"] in ("settled", "cap reached") for p in data["points"])
    assert [p["image"] for p in data["points"]] == [a, b, b, a, a, b][: 2 * used]
    assert [p["seq"] for p in data["points"]] == list(range(2 * used))
    assert all(p["completed"] > 0 and p["failed"] == 0 for p in data["points"])
    for name in ("host-cpu", "host-cpu-b"):
        side = data["sides"][name]
        assert side["tuned_config_dir"] == f"results/{name}/tiny-qwen3-moe/tp1-ep1/tune/configs"
        assert side["image_digest"].startswith("local:python")
        assert (work / target).with_name(f"server-{name}.log").stat().st_size > 0
    # No per-cell serve job was needed, and the comparison is now up to date.
    assert not (work / "results/host-cpu/tiny-qwen3-moe/tp1-ep1/serve").exists()
    assert "Nothing to be done" in planned_text(work, target, configfile)


def planned_text(work: Path, target: str, configfile: str) -> str:
    import subprocess

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "-n",
            "--cores",
            "2",
            target,
            "--configfile",
            configfile,
        ],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout + proc.stderr
