"""Compile-only warm-ups of the builtin fused-MoE kernel: every kernel a call of a shape and
config would launch, compiled (not run) on placeholder tensors, so that the tuner's compile
workers and a server's start do the compiling before anything is timed or served.

In-container module: standard library, torch and triton only.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from cellbench.tune.kernels.placeholders import Placeholder as _Placeholder
from cellbench.tune.shapes import MoEShape

# The kernel module itself, not the function the package re-exports under its name: its
# launchers, and the launch policy's switches, are read at call time, where kernel_options and
# tests set them.
fm = importlib.import_module("cellbench.tune.kernels.fused_moe")
policy = importlib.import_module("cellbench.tune.kernels.launch_policy")


def _placeholder_call(
    shape: MoEShape, act_dtype: str, device: Any
) -> tuple[torch.device, torch.dtype, policy.QuantArgs | None]:
    """What the warm-ups share: the device, the activation dtype, and the call's
    quantisation with its weight scales as placeholders (None unquantised)."""
    dev = torch.device(device)
    act = policy._DTYPES[policy._DTYPE_ALIASES.get(act_dtype, act_dtype)]
    if shape.dtype != "fp8_w8a8":
        return dev, act, None
    e, n, k, bs = shape.num_experts, shape.intermediate_size, shape.hidden_size, shape.block_shape
    if bs is None:
        s1 = s2 = _Placeholder((e,), torch.float32, dev)
    else:
        s1 = _Placeholder((e, 2 * n // bs[0], k // bs[1]), torch.float32, dev)
        s2 = _Placeholder((e, k // bs[0], n // bs[1]), torch.float32, dev)
    return dev, act, policy.QuantArgs("fp8_w8a8", s1, s2, bs)  # type: ignore[arg-type]


def warm_config(
    shape: MoEShape, m: int, act_dtype: str, config: dict[str, Any], device: Any
) -> None:
    """Compile, without running anything or touching GPU memory, the kernels whose code
    depends on `config` for a call of m tokens (the GEMMs, or the few-token kernel), with
    the same specialisation as the real call: Triton's cache then serves the real call.

    The config-independent kernels (alignment per BLOCK_SIZE_M, activation, quantisation,
    sums) are `warm_shared`'s, or compile on first use in the caller.
    """
    policy.check_config(config, None)
    if policy.interpreter_active():
        return  # the interpreter compiles nothing
    dev, act, quant = _placeholder_call(shape, act_dtype, device)
    e, n, k, topk = shape.num_experts, shape.intermediate_size, shape.hidden_size, shape.topk
    wdt = act
    if quant is not None:
        wdt = policy.fp8_dtype()
        policy.check_config(config, quant)
    pairs = m * topk

    def ph(*size: int, dtype: torch.dtype = act) -> Any:
        return _Placeholder(size, dtype, dev)

    w1, w2 = ph(e, 2 * n, k, dtype=wdt), ph(e, k, n, dtype=wdt)
    tw = ph(m, topk, dtype=torch.float32)
    if policy.kernel_path(m, quant, "auto", config) == "decode":
        if policy.DECODE_KERNEL == "slice":
            fm._decode_slice(ph(m, k), w1, w2, tw, ph(m, topk, dtype=torch.int32), config)  # type: ignore[arg-type]
        else:
            fm._decode(ph(m, k), w1, w2, tw, ph(m, topk, dtype=torch.int32), config,  # type: ignore[arg-type]
                    launch_next=policy._chain(w1, pairs))  # fmt: skip
        return
    from cellbench.tune.kernels.align import max_padded_tokens

    bm = config["BLOCK_SIZE_M"]
    naive = policy._naive(pairs, e)
    if naive:  # as `_naive_assignment` gives it
        ids = ph(pairs, dtype=torch.int32)
        align = (ids, ids, ids)
    else:
        em = max_padded_tokens(pairs, e, bm)
        align = (ph(em, dtype=torch.int32), ph(fm.triton.cdiv(em, bm), dtype=torch.int32),
                 ph(1, dtype=torch.int32))  # fmt: skip

    def activation(rows: int, cols: int) -> tuple[Any, Any]:
        if quant is None:
            return ph(rows, cols), None
        if quant.block_shape is None:
            return ph(rows, cols, dtype=wdt), ph(1, dtype=torch.float32)
        return ph(rows, cols, dtype=wdt), ph(rows, cols // quant.block_shape[1],
                                             dtype=torch.float32)  # fmt: skip

    a1, a1s = activation(m, k)
    ch = policy._chain(w1, pairs)
    # as in `fused_moe` (the whole call, which the tuner times)
    ch_x = ch and policy.CHAIN_QUANT and quant is not None and quant.block_shape is not None
    fm._gemm(a1, a1s, w1, quant.w1_scale if quant else None, ph(pairs, 2 * n), tw, align, topk,
          False, config, quant, ch_x, ch, naive)  # type: ignore[arg-type]  # fmt: skip
    a2, a2s = activation(pairs, n)
    fm._gemm(a2, a2s, w2, quant.w2_scale if quant else None, ph(pairs, k), tw, align, 1, True,
          config, quant, ch, ch, naive)  # type: ignore[arg-type]  # fmt: skip


def warm_shared(
    shape: MoEShape, m: int, act_dtype: str, device: Any, block_m: int | None = None
) -> None:
    """Compile, as `warm_config` does, the kernels of a call of m tokens that no config key
    changes: with block_m, the alignment for that BLOCK_SIZE_M only; without, the rest
    (activation quantisation, SiLU-and-mul, top-k sum). The same host functions as the real
    call, on placeholders (see `placeholders`), so the specialisations are the same."""
    if policy.interpreter_active():
        return
    dev, act, quant = _placeholder_call(shape, act_dtype, device)
    e, n, k, topk = shape.num_experts, shape.intermediate_size, shape.hidden_size, shape.topk
    pairs = m * topk
    x = _Placeholder((m, k), act, dev)
    ch = policy._chain(x, pairs)
    if policy.kernel_path(m, quant) == "decode":
        if block_m is None and policy.DECODE_KERNEL != "slice":  # the slice kernel sums itself
            fm._sum_topk(_Placeholder((pairs, k), act, dev), m, topk, act, None, chained=ch)
        return
    if block_m is not None:
        if not policy._naive(pairs, e):
            fm.moe_align_block_size(_Placeholder((m, topk), torch.int32, dev), block_m, e)
        return
    if quant is not None:
        fm._quantise_rows(x, quant, launch_next=ch and policy.CHAIN_QUANT)
    fm._silu_mul(_Placeholder((pairs, 2 * n), act, dev), act, quant, chained=ch)
    fm._sum_topk(_Placeholder((pairs, k), act, dev), m, topk, act, None, chained=ch)
