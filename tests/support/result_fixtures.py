"""Stage results written by hand, whole and schema-valid, with chosen values.

Tests that feed the report, the archive or the loaders build their inputs here, so that every
figure is known and every file passes ``cellbench.results.loaders`` unless a test breaks it on
purpose. They are written the way the stages write them (``atomicio`` with a checksum).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cellbench.common import atomicio

DIGEST = "sha256:" + "c" * 64
CONFIG = {
    "BLOCK_SIZE_M": 16,
    "BLOCK_SIZE_N": 64,
    "BLOCK_SIZE_K": 64,
    "GROUP_SIZE_M": 1,
    "num_warps": 4,
    "num_stages": 2,
}
CONFIG_FILE = "E=8,N=32,device_name=CPU_TRITON_INTERPRET.json"


def point(
    isl: int = 512,
    osl: int = 512,
    repeat: int = 0,
    seq: int = 0,
    ttft: float = 100.0,
    tpot: float = 30.0,
    e2el: float | None = None,
    throughput: float = 33.3,
    concurrency: int = 16,
    prompts: int = 160,
    **extra: Any,
) -> dict[str, Any]:
    """One grid point as serve_stage records it; latencies' medians are the means, p99 twice."""
    e2el = ttft + osl * tpot if e2el is None else e2el
    row: dict[str, Any] = {
        "isl": isl,
        "osl": osl,
        "max_concurrency": concurrency,
        "repeat": repeat,
        "seq": seq,
        "started_at": f"2026-12-04T10:00:{seq:02d}.000+00:00",
        "num_prompts": prompts,
        "request_rate": "inf",
        "duration": 10.0,
        "completed": prompts,
        "failed": 0,
        "total_input_tokens": prompts * isl,
        "total_output_tokens": prompts * osl,
        "request_throughput": prompts / 10.0,
        "output_throughput": throughput,
        "total_token_throughput": throughput * 2,
    }
    for name, v in (("ttft", ttft), ("tpot", tpot), ("itl", tpot), ("e2el", e2el)):
        row |= {f"mean_{name}_ms": v, f"median_{name}_ms": v, f"std_{name}_ms": 0.0}
        row[f"p99_{name}_ms"] = 2 * v
    return row | extra


def bench(cell: str, arm: str, points: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "cell": cell,
        "arm": arm,
        "runtime": "docker",
        "image_digest": DIGEST,
        "cold": False,
        "ignore_eos": True,
        "server": {"launcher": "docker", "model": "m", "model_id": "m", "ready_s": 1.0},
        "points": points,
        **extra,
    }


def write_bench(results: Path, cell: str, arm: str, points: list[dict], **extra: Any) -> Path:
    path = results / cell / "serve" / arm / "bench.json"
    atomicio.write_json(path, bench(cell, arm, points, **extra), checksum=True)
    return path


def gsm8k(cell: str, arm: str, correct: list[bool], **extra: Any) -> dict[str, Any]:
    acc = sum(correct) / len(correct)
    return {
        "cell": cell,
        "arm": arm,
        "num_fewshot": 5,
        "n_samples": len(correct),
        "strict_match": acc,
        "strict_match_stderr": 0.01,
        "flexible_extract": acc,
        "flexible_extract_stderr": 0.01,
        "per_sample": [{"doc_id": i, "strict": c, "flexible": c} for i, c in enumerate(correct)],
        **extra,
    }


def write_gsm8k(results: Path, cell: str, arm: str, correct: list[bool], **extra: Any) -> Path:
    path = results / cell / "gsm8k" / f"{arm}.json"
    atomicio.write_json(path, gsm8k(cell, arm, correct, **extra), checksum=True)
    return path


def tune_summary(batch_sizes: tuple[int, ...] = (1, 4)) -> dict[str, Any]:
    return {
        "shape": {"num_experts": 8, "intermediate_size": 32, "hidden_size": 64, "topk": 2},
        "device_name": "CPU_TRITON_INTERPRET",
        "config_file": CONFIG_FILE,
        "backend": "builtin",
        "mode": "default",
        "dtype": "fp16",
        "interpreter": True,
        "platform": "cpu",
        "triton_version": "3.9.0",
        "torch_version": "2.13.0+cpu",
        "batch_sizes": list(batch_sizes),
        "complete": True,
        "skipped_batch_sizes": [],
        "entries": {str(m): {"config": dict(CONFIG), "time_us": 50.0 * m} for m in batch_sizes},
        "seconds": {"wall": 3.0},
        "argv": ["--tp", "1"],
    }


def write_tune(results: Path, cell: str, batch_sizes: tuple[int, ...] = (1, 4)) -> Path:
    """A tune job's summary.json and the vLLM config it names, both with checksums."""
    tune = results / cell / "tune"
    summary = tune_summary(batch_sizes)
    vllm = {"triton_version": "3.9.0", **{str(m): dict(CONFIG) for m in batch_sizes}}
    atomicio.write_json(tune / "configs" / CONFIG_FILE, vllm, checksum=True)
    atomicio.write_json(tune / "summary.json", summary, checksum=True)
    return tune / "summary.json"


def write_requests(bench_path: Path, ttft_s: float = 0.05, itl_s: float = 0.01) -> Path:
    """The per-request file beside a bench.json written here, as the serve stage writes it: per
    point, its num_prompts requests, every one successful with ``ttft_s`` to the first token
    and ``itl_s`` between the later ones of its OSL."""
    import json

    from cellbench.contracts import request_detail

    records = []
    for p in json.loads(Path(bench_path).read_text())["points"]:
        n, osl = p["num_prompts"], p["osl"]
        detail = {
            "input_lens": [p["isl"]] * n,
            "output_lens": [osl] * n,
            "ttfts": [ttft_s] * n,
            "itls": [[itl_s] * (osl - 1)] * n,
            "latencies": [ttft_s + itl_s * (osl - 1)] * n,
            "start_times": [0.001 * i for i in range(n)],
            "errors": [""] * n,
        }
        records.append(request_detail.record(p, detail))
    path = Path(bench_path).with_name(request_detail.file_name())
    request_detail.write(path, records)
    return path
