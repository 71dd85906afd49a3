"""The H200 run kit (benchmarks/gpu_local/, config/gpu-local.yaml), checked without a GPU: the
script's arguments, its environment check and a real `snakemake -n` of the GPU config through
it, and the wheel list against the project's pins."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KIT = ROOT / "benchmarks" / "gpu_local"
RUN = ["bash", str(KIT / "run.sh")]


def _run(args: list[str], out: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, OUT=str(out))
    return subprocess.run(
        RUN + args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_bad_arguments_are_refused_before_anything_runs(tmp_path):
    out = tmp_path / "out"
    proc = _run(["--deadline", "soon"], out)
    assert proc.returncode == 2
    assert "--deadline and --cores take whole numbers, got 'soon'" in proc.stderr
    proc = _run(["--config", "config/nope.yaml"], out)
    assert proc.returncode == 2 and "--config config/nope.yaml: no such file" in proc.stderr
    proc = _run(["--wheels", str(tmp_path / "none")], out)
    assert proc.returncode == 2 and f"no wheels in {tmp_path / 'none'}" in proc.stderr
    proc = _run(["--frobnicate"], out)
    assert proc.returncode == 2 and "unknown argument '--frobnicate'" in proc.stderr
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.slow
def test_dry_run_checks_the_environment_and_plans_the_gpu_config(tmp_path):
    out = tmp_path / "out"
    proc = _run(["--no-wheels", "--dry-run", "--python", sys.executable], out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    env = (out / "env.txt").read_text()
    assert "0 failed imports" in env and "versions: torch " in env
    plan = (out / "snakemake.txt").read_text()
    # The GPU config's one cell: the small model built, tuned for its 12 batch sizes, both arms
    # served by transformers on cuda with the tuned folder given, then GSM8K, report, archive.
    assert "cellbench.assets model --kind small-qwen3-moe" in plan
    # The tune and serve jobs go to their stages as canonical JSON objects (issue 31 item 3).
    assert '"batch_sizes":[1,2,4,8,16,32,64,128,256,512,1024,2048]' in plan
    for part in (
        '"server":"transformers"',
        '"model_dtype":"bf16"',
        '"device":"cuda"',
        '"tuned_config_dir":"results/host-cuda/small-qwen3-moe/tp1-ep1/tune/configs"',
    ):
        assert part in plan, part  # fmt: skip
    assert "--no-cb-use-cuda-graph" in plan
    for job in ("tune", "serve_pair", "gsm8k", "report", "archive"):
        assert re.search(rf"^{job}\s+\d+$", plan, re.M), job
    assert "This was a dry-run" in plan
    # What comes back from the device: at most 8 plain files, named as the tool accepts.
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and all(re.fullmatch(r"[A-Za-z0-9._-]+", f) for f in files)
    assert "env.txt" in files and "snakemake.txt" in files


def test_wheel_list_matches_the_project_pins():
    pins = {}
    for dep in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?==(\S+)", dep)
        if m:
            pins[m.group(1).lower().replace("_", "-")] = m.group(3)
    carried: dict[str, str] = {}
    for line in (KIT / "wheels.txt").read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        req, *how = line.split()
        name, version = req.split("==")
        assert how in ([], ["sdist"], ["alt"]), line
        if how == ["alt"]:
            continue
        key = name.lower().replace("_", "-")
        assert key not in carried, f"two versions of {name}: the install would stop"
        carried[key] = version
    # The host side's pinned packages travel at exactly the pinned version.
    for name in ("snakemake", "lm-eval", "transformers"):
        assert carried[name] == pins[name], name
    # pulp (16 MB of solver binaries) stays behind: run.sh schedules greedily.
    assert "pulp" not in carried
    assert "--scheduler greedy" in (KIT / "run.sh").read_text()


def test_report_of_a_gpu_local_run_is_not_labelled_cpu():
    """A local run whose tuning was compiled (no interpreter) gets the GPU banner, naming the
    device; the embedded default's interpreter run keeps its own."""
    import pandas as pd
    from cellbench.report import build as report

    def tune(interpreter: bool, device: str) -> pd.DataFrame:
        return pd.DataFrame(
            [
                {
                    "image": "host-cuda",
                    "model": "small-qwen3-moe",
                    "tp": 1,
                    "ep": 1,
                    "cell": "host-cuda/small-qwen3-moe/tp1-ep1",
                    "batch_size": 16,
                    "device_name": device,
                    "backend": "builtin",
                    "mode": "default",
                    "interpreter": interpreter,
                    "config_file": f"E=128,N=768,device_name={device}.json",
                    "config.BLOCK_SIZE_M": 16,
                    "time_us": 42.0,
                }
            ]
        )

    gpu = report.render(pd.DataFrame(), pd.DataFrame(), tune(False, "NVIDIA_H200"), "local")
    assert "**Local runtime on a GPU (NVIDIA_H200).**" in gpu
    assert "Embedded default" not in gpu and "interpreter" not in gpu.split("## ")[0]
    cpu = report.render(pd.DataFrame(), pd.DataFrame(), tune(True, "CPU_TRITON_INTERPRET"), "local")
    assert "**Embedded default.**" in cpu and "Local runtime on a GPU" not in cpu
