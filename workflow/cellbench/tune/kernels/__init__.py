"""Builtin Triton fused-MoE kernel (vLLM semantics and config keys).

In-container package: standard library, torch and triton only.

On a machine without a GPU the kernels run under Triton's interpreter. Triton decides this
when a kernel is decorated, so `TRITON_INTERPRET=1` is set here (unless the caller chose)
before the kernel modules are imported.
"""

from __future__ import annotations

import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from cellbench.tune.kernels.align import moe_align_block_size  # noqa: E402
from cellbench.tune.kernels.fused_moe import fused_moe  # noqa: E402
from cellbench.tune.kernels.launch_policy import (  # noqa: E402
    CONFIG_KEYS,
    DECODE_MAX_TOKENS,
    QuantArgs,
    decode_launch_key,
    interpreter_active,
    kernel_options,
    kernel_path,
    load_path_choices,
    m_dependent_choices,
    measured_path,
    record_path_choice,
)
from cellbench.tune.kernels.problem import MoEProblem, make_problem, run_fused, run_gemms  # noqa: E402
from cellbench.tune.kernels.warmup import warm_config, warm_shared  # noqa: E402

__all__ = [
    "CONFIG_KEYS",
    "DECODE_MAX_TOKENS",
    "MoEProblem",
    "QuantArgs",
    "decode_launch_key",
    "fused_moe",
    "interpreter_active",
    "kernel_options",
    "kernel_path",
    "load_path_choices",
    "m_dependent_choices",
    "make_problem",
    "measured_path",
    "record_path_choice",
    "moe_align_block_size",
    "run_fused",
    "run_gemms",
    "warm_config",
    "warm_shared",
]
