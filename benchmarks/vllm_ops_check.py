#!/usr/bin/env python3
"""Load vLLM's compiled MoE ops (unpacked by vllm_ops_pack.py --unpack) on this GPU and check
each against the project's op or a float reference, in a process of its own (a library that
crashes the process takes only this check down, not the benchmark after it).

Prints the verdict per part as JSON and writes it to --out. Exit 0 when every part is vLLM's,
1 when some part falls back to the project's (the JSON says why), 2 for bad input.
Then times each op, vLLM's against the project's, at a few batch sizes of Qwen3-30B-A3B
(E=128, N=768, K=2048, top-8): interleaved CUDA-graph replays, medians in us.

Usage: python3 benchmarks/vllm_ops_check.py DIR [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow"))


def _pairs(ops, m, device, q, align, _quantise_rows, _silu_mul, _sum_topk) -> dict:
    """Per part, (vLLM's op, the project's op) on the same inputs at batch size m."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(m)
    ids = torch.stack([torch.randperm(128, generator=g)[:8] for _ in range(m)])
    ids = ids.to(torch.int32).to(device)
    c1 = torch.randn(m * 8, 1536, device=device, dtype=torch.bfloat16)
    c2 = torch.randn(m * 8, 768, device=device, dtype=torch.bfloat16)
    c3 = torch.randn(m, 8, 2048, device=device, dtype=torch.bfloat16)
    return {
        "moe_align_block_size": (lambda: ops.align(ids, 64, 128),
                                 lambda: align.moe_align_block_size(ids, 64, 128)),
        "silu_and_mul": (lambda: ops.silu_and_mul(c1),
                         lambda: _silu_mul(c1, torch.bfloat16, None)),
        "activation_quant": (lambda: ops.group_quant(c2, 128), lambda: _quantise_rows(c2, q)),
        "moe_sum": (lambda: ops.topk_sum(c3),
                    lambda: _sum_topk(c3.view(m * 8, 2048), m, 8, torch.bfloat16)),
    }  # fmt: skip


def _op_times(ops, device) -> dict:
    """vLLM's op against the project's, per batch size (graph replays, interleaved)."""
    from cellbench.tune.kernels import align
    from cellbench.tune.kernels.fused_moe import _quantise_rows, _silu_mul, _sum_topk
    from cellbench.tune.kernels.launch_policy import QuantArgs
    from cellbench.tune.timing import time_side_by_side

    q = QuantArgs("fp8_w8a8", None, None, (128, 128))  # only the block shape is read
    out: dict = {}
    for m in (1, 16, 256, 4096):
        pairs = _pairs(ops, m, device, q, align, _quantise_rows, _silu_mul, _sum_topk)
        row = {}
        for part, (v, p) in pairs.items():
            if not ops.has(part):
                continue
            try:
                tv, tp = time_side_by_side([[v], [p]], on_gpu=True, repeats=20)
                row[part] = {"vllm_us": tv.median_us, "project_us": tp.median_us}
            except Exception as e:  # noqa: BLE001 - reported, the check verdict stands
                row[part] = {"failed": f"{type(e).__name__}: {str(e)[:200]}"}
        out[str(m)] = row
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-times", action="store_true")
    a = ap.parse_args()
    import torch
    from cellbench.tune.vllm_source import VllmSourceError, load_vllm_ops

    if not torch.cuda.is_available():
        print("vllm_ops_check: no CUDA GPU here; vLLM's compiled ops need one", file=sys.stderr)
        return 2
    try:
        ops = load_vllm_ops(a.folder, torch.device("cuda", 0))
    except VllmSourceError as e:
        print(f"vllm_ops_check: {e}", file=sys.stderr)
        return 2
    res = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "used": ops.used, "project": ops.project, "checks": ops.checks,
           "source": ops.source}  # fmt: skip
    print(json.dumps({k: v for k, v in res.items() if k != "source"}, indent=1), flush=True)
    if not a.no_times:
        res["op_times_us"] = _op_times(ops, torch.device("cuda", 0))
        print(json.dumps(res["op_times_us"], indent=1), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    return 0 if not ops.project else 1


if __name__ == "__main__":
    sys.exit(main())
