"""What the kernel tests share: the device, the tiny shape, three launch configs, fresh seeds,
the fused call checked against its reference. Importing this first sets TRITON_INTERPRET on a
host without a GPU, as the kernel test modules do, before the kernels import Triton."""

from __future__ import annotations

import os
import random

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from cellbench.tune.kernels import (  # noqa: E402
    MoEProblem,
    run_fused,
)
from cellbench.tune.kernels.reference import (  # noqa: E402
    problem_error_bound,
    relative_error,
    torch_moe_reference,
)
from cellbench.tune.shapes import MoEShape  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


TINY = MoEShape(num_experts=8, intermediate_size=32, hidden_size=64, topk=2)


CONFIGS = [
    {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 1,
     "num_warps": 4, "num_stages": 2},
    {"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 4,
     "num_warps": 4, "num_stages": 3},
    # BLOCK_SIZE_K > K exercises the masked-K path; BLOCK_SIZE_N > N the wrapped columns.
    {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 16,
     "num_warps": 8, "num_stages": 4},
]  # fmt: skip


def fresh_seed() -> int:
    return random.SystemRandom().randrange(2**31)


def _check_fused(problem: MoEProblem, config: dict, seed: int, path: str = "auto") -> None:
    out = torch.full_like(problem.hidden_states, float("nan"))
    run_fused(problem, config, out=out, path=path)
    assert torch.isfinite(out).all(), f"unwritten or non-finite output (seed {seed})"
    err = relative_error(out, torch_moe_reference(problem))
    assert err < problem_error_bound(problem), f"rel err {err:.3g} (seed {seed}, {config})"


def _fitting(config: dict, dtype: str) -> dict:
    """On a GPU, fp32 operands take twice the shared memory of bf16's: the BM=64 config's
    four stages need 294,912 bytes there, over the H200's 232,448 (run 28), so it drops
    stages until its pipelined tiles fit. The tuner prunes such configs; this test is about
    the results."""
    if DEVICE != "cuda" or dtype != "fp32":
        return config
    from cellbench.tune.spaces import H200_SMEM_BYTES, smem_lower_bound

    props = torch.cuda.get_device_properties(0)
    limit = getattr(props, "shared_memory_per_block_optin", H200_SMEM_BYTES)
    cfg = dict(config)
    while cfg["num_stages"] > 2 and smem_lower_bound(cfg, 4) > limit:
        cfg["num_stages"] -= 1
    return cfg


def _sm90() -> bool:
    return DEVICE == "cuda" and torch.cuda.get_device_capability()[0] >= 9
