"""GPU telemetry (cellbench.serve.telemetry, NVML) under a real GPU load: power samples and energy
per
unit of work, the serving stage's J/token figure with matmuls as the unit.

Three phases on one GPU, each under its own ``GpuSampler`` at ``--interval`` seconds: idle
(``--idle`` s), a bf16 matmul loop (``--seconds`` s of back-to-back ``--n``-cube matmuls, the
work counted as FLOPs), idle again. Per phase: the samples (power, SM and memory clocks,
temperature, memory used), energy from NVML's counter and, beside it, the trapezoid of the
power samples (the fallback where a GPU has no counter: the two should agree within a few %),
mean and peak power. For the load: joules per TFLOP and per matmul, and the same energy less
the idle power's share (the load's own energy). Also checks the NVML path's errors: an index
past the GPU count is refused with a reason, not raised.

Usage (from the repository root, on an NVIDIA GPU machine with torch and nvidia-ml-py):
    PYTHONPATH=workflow python3 benchmarks/telemetry_energy_per_work.py \
        --out $OUT/telemetry_h200.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow"))

from cellbench.serve import telemetry  # noqa: E402


def _phase(gpu: int, interval: float, seconds: float, work=None) -> dict:
    sampler = telemetry.GpuSampler("nvidia", [gpu], interval)
    sampler.begin()
    done = work(seconds) if work else time.sleep(seconds)
    record = sampler.end()
    if not record["available"]:
        raise SystemExit(f"telemetry unavailable: {record['reason']}")
    g = record["gpus"][0]
    g["power_integral_j"] = telemetry._integral(g["samples"]["t_s"], g["samples"]["power_w"])
    return {"record": record, "work": done}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gpu", type=int, default=0, help="NVML index of the GPU")
    p.add_argument("--seconds", type=float, default=30.0, help="length of the load phase")
    p.add_argument("--idle", type=float, default=5.0, help="length of each idle phase")
    p.add_argument("--interval", type=float, default=0.1, help="seconds between samples")
    p.add_argument("--n", type=int, default=8192, help="matmul size (n x n x n, bf16)")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()

    import torch

    dev = torch.device("cuda", 0)
    x = torch.randn(a.n, a.n, device=dev, dtype=torch.bfloat16)
    y = torch.randn(a.n, a.n, device=dev, dtype=torch.bfloat16)
    torch.cuda.synchronize()

    def matmuls(seconds: float) -> dict:
        count = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for _ in range(20):  # queue a few before checking the clock
                torch.mm(x, y)
            count += 20
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        tflop = 2.0 * a.n**3 * count / 1e12
        return {"matmuls": count, "tflop": tflop, "wall_s": wall, "tflops": tflop / wall}

    matmuls(2.0)  # warm-up: clocks up, cuBLAS chose its kernel
    before = _phase(a.gpu, a.interval, a.idle)
    load = _phase(a.gpu, a.interval, a.seconds, matmuls)
    after = _phase(a.gpu, a.interval, a.idle)

    rec, work = load["record"], load["work"]
    idle_w = (before["record"]["mean_power_w"] + after["record"]["mean_power_w"]) / 2.0
    own_j = rec["energy_j"] - idle_w * rec["duration_s"]
    g = rec["gpus"][0]
    bad = telemetry.GpuSampler("nvidia", [10_000], a.interval)
    bad.begin()
    out = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "gpu_name": g["name"],
        "torch": torch.__version__,
        "settings": vars(a) | {"out": str(a.out)},
        "load": {
            **work,
            "energy_j": rec["energy_j"],
            "energy_source": g["energy_source"],
            "power_integral_j": g["power_integral_j"],
            "counter_vs_integral_pct": 100.0 * (g["power_integral_j"] / rec["energy_j"] - 1.0)
            if rec["energy_j"]
            else None,
            "mean_power_w": rec["mean_power_w"],
            "max_power_w": g["max_power_w"],
            "samples": rec["samples"],
            "joules_per_tflop": rec["energy_j"] / work["tflop"],
            "joules_per_matmul": rec["energy_j"] / work["matmuls"],
            "idle_power_w": idle_w,
            "load_own_joules_per_tflop": own_j / work["tflop"],
        },
        "phases": {"idle_before": before, "load": load, "idle_after": after},
        "bad_index_record": bad.end(),
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    summary = {k: v for k, v in out["load"].items() if not isinstance(v, dict)}
    print(json.dumps({"gpu": g["name"], **summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
