"""Builtin fused-MoE forward in Triton, with vLLM's semantics and launch-config keys.

out[t] = sum_k topk_weights[t, k] * W2[e] @ (silu(W1g[e] @ x[t]) * (W1u[e] @ x[t])),
e = topk_ids[t, k], with w1: (E, 2N, K) (gate rows first, then up rows) and w2: (E, K, N).

Steps (all Triton): align pairs to expert blocks (align.py), [quantise x], grouped GEMM 1 into
(M*topk, 2N), SiLU-and-mul [+ quantise], grouped GEMM 2 into (M*topk, K) scaled by the routing
weight, sum over top-k. A launch config is a dict with vLLM's keys: BLOCK_SIZE_M, BLOCK_SIZE_N,
BLOCK_SIZE_K, GROUP_SIZE_M, num_warps, num_stages (ROCm: waves_per_eu, matrix_instr_nonkdim,
kpack, passed to Triton only on ROCm). The same config drives both GEMMs, as in vLLM.

Quantisation (vLLM names): "fp8_w8a8" with per-expert weight scales and a dynamic per-tensor
activation scale, or with block_shape (bn, bk): weight scales per (bn x bk) block and activation
scales per token and group of bk along the reduction dim (dynamic).

Here: the launchers, `fused_moe` last. The launch policy (the switches, `kernel_options`,
the path rule and the recorded path choices) is in `launch_policy`, read at call time; the
Triton bodies are in `triton_kernels` (grouped path) and `triton_decode` (few-token path),
the compile-only warm-ups in `warmup`, the benchmark problem the tuner times in `problem`.

In-container module: standard library, torch and triton only.
"""

from __future__ import annotations

from typing import Any

import torch
import triton

import cellbench.tune.kernels.launch_policy as policy
from cellbench.tune.kernels.align import moe_align_block_size
from cellbench.tune.kernels.launch_policy import (
    _DTYPES,
    QuantArgs,
    _chain,
    _launch_options,
    _naive,
    _persistent,
    _programs_per_wave,
    _swap_ab,
    _use_b_descriptor,
    check_config,
    fp8_dtype,
    kernel_path,
)
from cellbench.tune.kernels.placeholders import Placeholder as _Placeholder
from cellbench.tune.kernels.placeholders import empty as _empty
from cellbench.tune.kernels.placeholders import launch as _launch
from cellbench.tune.kernels.placeholders import zeros as _zeros
from cellbench.tune.kernels.triton_decode import _moe_decode_kernel, _moe_decode_slice_kernel
from cellbench.tune.kernels.triton_kernels import (
    _amax_kernel,
    _group_quant_kernel,
    _moe_gemm_kernel,
    _silu_mul_kernel,
    _sum_topk_kernel,
    _tensor_quant_kernel,
)

# Quantisation modes, as a constexpr for the kernels.
_Q_NONE, _Q_TENSOR, _Q_BLOCK = 0, 1, 2


def _b_descriptor(w: torch.Tensor, config: dict[str, Any]) -> Any:
    from triton.tools.tensor_descriptor import TensorDescriptor

    e, n, k = w.shape
    return TensorDescriptor(w, [e * n, k], [k, 1], [config["BLOCK_SIZE_N"], config["BLOCK_SIZE_K"]])


def _check_inputs(
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    quant: QuantArgs | None,
) -> None:
    if x.dim() != 2 or w1.dim() != 3 or w2.dim() != 3:
        raise ValueError(
            f"expected hidden_states (M, K), w1 (E, 2N, K), w2 (E, K, N); got "
            f"{tuple(x.shape)}, {tuple(w1.shape)}, {tuple(w2.shape)}"
        )
    m, k = x.shape
    e, n2, k1 = w1.shape
    if k1 != k or n2 % 2 or tuple(w2.shape) != (e, k, n2 // 2):
        raise ValueError(
            f"shape mismatch: hidden_states {tuple(x.shape)}, w1 {tuple(w1.shape)}, "
            f"w2 {tuple(w2.shape)} (want w1 (E, 2N, K), w2 (E, K, N))"
        )
    if topk_ids.shape != topk_weights.shape or topk_ids.dim() != 2 or topk_ids.shape[0] != m:
        raise ValueError(
            f"topk_ids {tuple(topk_ids.shape)} and topk_weights {tuple(topk_weights.shape)} "
            f"must both be (M={m}, topk)"
        )
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"topk_ids dtype {topk_ids.dtype} must be int32 or int64")
    if x.dtype not in _DTYPES.values():
        raise ValueError(f"hidden_states dtype {x.dtype} must be float32, float16 or bfloat16")
    if quant is None:
        if w1.dtype != x.dtype or w2.dtype != x.dtype:
            raise ValueError(
                f"unquantised weights must match hidden_states dtype {x.dtype}; got "
                f"w1 {w1.dtype}, w2 {w2.dtype} (pass quant= for fp8)"
            )
        return
    if quant.dtype != "fp8_w8a8":
        raise ValueError(f"quant dtype {quant.dtype!r} is not supported (only 'fp8_w8a8')")
    if w1.dtype != w2.dtype or w1.element_size() != 1:
        raise ValueError(f"fp8_w8a8 weights must be fp8, got w1 {w1.dtype}, w2 {w2.dtype}")
    n = n2 // 2
    if quant.block_shape is None:
        want1 = want2 = (e,)
    else:
        bn, bk = quant.block_shape
        for dim, size, b in (("2N", n2, bn), ("K", k, bk), ("K", k, bn), ("N", n, bk)):
            if size % b:
                raise ValueError(
                    f"block_shape {quant.block_shape}: {dim}={size} not divisible by {b}"
                )
        want1, want2 = (e, n2 // bn, k // bk), (e, k // bn, n // bk)
    if tuple(quant.w1_scale.shape) != want1 or tuple(quant.w2_scale.shape) != want2:
        raise ValueError(
            f"w1_scale {tuple(quant.w1_scale.shape)} / w2_scale {tuple(quant.w2_scale.shape)} "
            f"must be {want1} / {want2}"
        )


def _gemm(
    a: torch.Tensor,
    a_scale: torch.Tensor | None,
    w: torch.Tensor,
    w_scale: torch.Tensor | None,
    out: torch.Tensor,
    topk_weights: torch.Tensor,
    align: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    a_div: int,
    mul_routed_weight: bool,
    config: dict[str, Any],
    quant: QuantArgs | None,
    wait_prev: bool = False,
    launch_next: bool = False,
    naive: bool = False,
) -> None:
    """One grouped GEMM (see `_moe_gemm_kernel`); wait_prev/launch_next chain it to the
    kernel before/after it (programmatic dependent launch, see `_chain`). naive: `align` is
    `_naive_assignment`'s (one row block per pair, no alignment)."""
    sorted_ids, expert_ids, total = align
    n_out, k_in = w.shape[1], w.shape[2]
    bm, bn_, bk_ = config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"], config["BLOCK_SIZE_K"]
    em = topk_weights.numel() * bm if naive else sorted_ids.shape[0]
    grid = (triton.cdiv(em, bm) * triton.cdiv(n_out, bn_),)
    if quant is None:
        mode, group_n, group_k = _Q_NONE, 1, 1
        a_scale = w_scale = a  # unused pointers
        sa, sw = (0, 0), (0, 0, 0)
    elif quant.block_shape is None:
        mode, group_n, group_k = _Q_TENSOR, 1, 1
        sa, sw = (0, 0), (w_scale.stride(0), 0, 0)
    else:
        mode, (group_n, group_k) = _Q_BLOCK, quant.block_shape
        sa, sw = a_scale.stride(), w_scale.stride()
    use_desc = _use_b_descriptor(w, config, topk_weights.numel())
    # GEMM 2 is the one that applies the routing weight
    persistent = _persistent(2 if mul_routed_weight else 1, topk_weights.numel(), quant is not None)
    persistent = persistent and not naive
    swap = _swap_ab(config, quant, w)
    b_scalar = mode == _Q_BLOCK and policy.FP8_SCALE_SCALAR and group_n % bn_ == 0
    if persistent:
        if wait_prev or launch_next:
            raise ValueError("persistent GEMMs are never chained (see PERSISTENT_GEMMS)")
        grid = (min(grid[0], _programs_per_wave(w.device)),)
    chain_opts = {"launch_pdl": True} if wait_prev else {}
    _launch(
        _moe_gemm_kernel,
        grid,
        a,
        w,
        _b_descriptor(w, config) if use_desc else w,
        out,
        a_scale,
        w_scale,
        topk_weights,
        sorted_ids,
        expert_ids,
        total,
        n_out,
        k_in,
        em,
        topk_weights.numel(),
        a.stride(0),
        a.stride(1),
        w.stride(0),
        w.stride(1),
        w.stride(2),
        out.stride(0),
        out.stride(1),
        sa[0],
        sa[1],
        sw[0],
        sw[1],
        sw[2],
        GROUP_N=group_n,
        GROUP_K=group_k,
        A_DIV=a_div,
        MUL_ROUTED_WEIGHT=mul_routed_weight,
        QUANT=mode,
        EVEN_K=k_in % bk_ == 0,
        IEEE=a.dtype == torch.float32,
        B_DESC=use_desc,
        LAUNCH_NEXT=launch_next,
        WAIT_PREV=wait_prev,
        BLOCK_SIZE_M=bm,
        BLOCK_SIZE_N=bn_,
        BLOCK_SIZE_K=bk_,
        GROUP_SIZE_M=config["GROUP_SIZE_M"],
        **_launch_options(config),
        PERSISTENT=persistent,
        FLATTEN=persistent and policy.PERSISTENT_FLATTEN,
        NAIVE=naive,
        SWAP_AB=swap,
        B_SCALE_SCALAR=b_scalar,
        **chain_opts,
    )


def _naive_assignment(topk_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`_gemm`'s `align` for naive assignment: the flat expert ids stand where the expert id
    of each row block goes (row block i is pair i); the other two are never read."""
    ids = topk_ids.reshape(-1)
    if not ids.is_contiguous():
        ids = ids.contiguous()
    return ids, ids, ids


# Sync words of the few-token kernel (ticket, finished programs, per-pair GEMM 1 counts), per
# device and pair count. Zero between calls: each call's last program zeroes them. Shared by
# every call of that size on the device, so calls of one size must not run concurrently on
# two streams; one stream (and the graphs replayed on it) is what serving and tuning use.
_DECODE_SYNC: dict[tuple[torch.device, int], torch.Tensor] = {}


def _decode_sync(device: torch.device, pairs: int) -> torch.Tensor:
    key = (device, pairs)
    buf = _DECODE_SYNC.get(key)
    if buf is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"the few-token kernel's sync words for {pairs} pairs are made on first use: "
                "run the call once before capturing it into a CUDA graph"
            )
        buf = _DECODE_SYNC[key] = torch.zeros(2 + pairs, dtype=torch.int32, device=device)
    return buf


# The slice kernel's fp32 accumulator rows and per-token counts, per (device, tokens, K);
# zero between calls (each token's last program swaps its row out and resets its count).
# Shared like the ticket kernel's sync words: one stream at a time.
_DECODE_SCRATCH: dict[tuple[torch.device, int, int], tuple[torch.Tensor, torch.Tensor]] = {}


def _decode_scratch(device: torch.device, m: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    key = (device, m, k)
    bufs = _DECODE_SCRATCH.get(key)
    if bufs is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"the few-token kernel's accumulator for {m} tokens is made on first use: "
                "run the call once before capturing it into a CUDA graph"
            )
        bufs = _DECODE_SCRATCH[key] = (
            torch.zeros((m, k), dtype=torch.float32, device=device),
            torch.zeros(m, dtype=torch.int32, device=device),
        )
    return bufs


def _check_decode_config(config: dict[str, Any]) -> tuple[int, int]:
    bn, bk = config["BLOCK_SIZE_N"], config["BLOCK_SIZE_K"]
    if bn < 16 or bk < 16:
        raise ValueError(
            f"the few-token path needs BLOCK_SIZE_N and BLOCK_SIZE_K >= 16 (tensor-core "
            f"tiles); got {bn} and {bk}"
        )
    return bn, bk


def _decode_slice(
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    config: dict[str, Any],
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Few-token path, slice kernel: the whole call (both GEMMs, activation, routing weight,
    sum over top-k) in one launch. Returns (M, K) in x's dtype (into `out` if given)."""
    m, topk = topk_ids.shape
    n, k = w2.shape[2], x.shape[1]
    bn, bk = _check_decode_config(config)
    if isinstance(x, _Placeholder):
        out = _Placeholder((m, k), x.dtype, x.device)  # type: ignore[assignment]
        acc = _Placeholder((m, k), torch.float32, x.device)
        count = _Placeholder((m,), torch.int32, x.device)
    else:
        x, w1, w2 = (t if t.stride(-1) == 1 else t.contiguous() for t in (x, w1, w2))
        if out is None:
            out = torch.empty((m, k), dtype=x.dtype, device=x.device)
        acc, count = _decode_scratch(x.device, m, k)
    # BLOCK_SIZE_N weight rows of W1 per program, gate and up halves: as many W1 bytes per
    # program as a grouped GEMM 1 tile of the same config reads.
    gate_n = max(16, bn // 2)
    grid = (m * topk * triton.cdiv(n, gate_n),)
    _launch(
        _moe_decode_slice_kernel, grid, x, w1, w2, acc, count, out, topk_ids.contiguous(),
        topk_weights.contiguous(), n, k,
        x.stride(0), w1.stride(0), w1.stride(1), w2.stride(0), w2.stride(1), out.stride(0),
        TOPK=topk, EVEN_K=k % bk == 0, IEEE=x.dtype == torch.float32, GATE_N=gate_n,
        BLOCK_SIZE_K=bk, **_launch_options(config),
    )  # fmt: skip
    return out


def _decode(
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    config: dict[str, Any],
    launch_next: bool = False,
) -> torch.Tensor:
    """Few-token path: both GEMMs and the activation in one launch (`_moe_decode_kernel`).
    Returns GEMM 2's (pairs, K) output, routing weight applied, in x's dtype."""
    m, topk = topk_ids.shape
    pairs = m * topk
    n, k = w2.shape[2], x.shape[1]
    bn, bk = _check_decode_config(config)
    if isinstance(x, _Placeholder):
        h = _Placeholder((pairs, n), x.dtype, x.device)
        out = _Placeholder((pairs, k), x.dtype, x.device)
        sync = _Placeholder((2 + pairs,), torch.int32, x.device)
    else:
        x, w1, w2 = (t if t.stride(-1) == 1 else t.contiguous() for t in (x, w1, w2))
        h = torch.empty((pairs, n), dtype=x.dtype, device=x.device)
        out = torch.empty((pairs, k), dtype=x.dtype, device=x.device)
        sync = _decode_sync(x.device, pairs)
    # A GEMM 1 tile reads gate and up rows: half as many columns as BLOCK_SIZE_N move as many
    # weight bytes per program as the grouped GEMM 1 does with the same config.
    gate_n = max(16, bn // 2)
    grid = (pairs * (triton.cdiv(n, gate_n) + triton.cdiv(k, bn)),)
    _launch(
        _moe_decode_kernel, grid, x, w1, w2, h, out, sync, topk_ids.contiguous(),
        topk_weights.contiguous(), n, k, pairs,
        x.stride(0), w1.stride(0), w1.stride(1), w2.stride(0), w2.stride(1), h.stride(0),
        out.stride(0),
        TOPK=topk, EVEN_K=k % bk == 0, EVEN_N=n % bk == 0, IEEE=x.dtype == torch.float32,
        LAUNCH_NEXT=launch_next, BACKOFF=x.is_cuda and not torch.version.hip, GATE_N=gate_n,
        BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, **_launch_options(config),
    )  # fmt: skip
    return out


def _group_quant(
    x: torch.Tensor,
    n_cols: int,
    group: int,
    silu_mul: bool,
    launch_next: bool = False,
    wait_prev: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row, per-group fp8 quantisation of x[:, :n_cols] (or of silu(gate) * up);
    launch_next / wait_prev chain it (see `_chain`)."""
    f8 = fp8_dtype()
    rows = x.shape[0]
    ngroups = n_cols // group
    q = _empty(x, (rows, n_cols), f8)
    s = _empty(x, (rows, ngroups), torch.float32)
    # Up to 1024 columns per program: one program per row at the usual sizes.
    per_prog = max(1, min(triton.next_power_of_2(ngroups), max(1, 1024 // group)))
    _launch(
        _group_quant_kernel, (rows, triton.cdiv(ngroups, per_prog)),
        x, q, s, n_cols, x.stride(0), q.stride(0), s.stride(0),
        SILU_MUL=silu_mul, FP8_MAX=float(torch.finfo(f8).max), GROUP=group, GROUPS=per_prog,
        LAUNCH_NEXT=launch_next, WAIT_PREV=wait_prev,
        **({"launch_pdl": True} if wait_prev else {}),
    )  # fmt: skip
    return q, s


def _tensor_quant(x: torch.Tensor, amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise a contiguous tensor to fp8 with the scale amax / fp8 max."""
    f8 = fp8_dtype()
    q = _empty(x, tuple(x.shape), f8)
    s = _empty(x, (1,), torch.float32)
    blk = 1024
    _launch(_tensor_quant_kernel, (triton.cdiv(x.numel(), blk),),
            x, q, amax, s, x.numel(), FP8_MAX=float(torch.finfo(f8).max), BLOCK=blk)  # fmt: skip
    return q, s


def _quantise_rows(
    x: torch.Tensor, quant: QuantArgs, launch_next: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic fp8 quantisation of a (rows, K) activation: per token-group or per tensor.
    launch_next (per-group only): the next kernel (GEMM 1) may start before this ends."""
    if quant.block_shape is not None:
        return _group_quant(x, x.shape[1], quant.block_shape[1], False, launch_next=launch_next)
    x = x.contiguous()
    amax = _zeros(x, (1,), torch.float32)
    blk = 1024
    _launch(_amax_kernel, (triton.cdiv(x.numel(), blk),), x, amax, x.numel(), BLOCK=blk)
    return _tensor_quant(x, amax)


def _silu_mul(
    c1: torch.Tensor, out_dtype: torch.dtype, quant: QuantArgs | None, chained: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """SiLU-and-mul of the GEMM 1 output (pairs, 2N) -> (pairs, N), fp8 when quantised.
    chained: launched early after GEMM 1 (per-group fp8: only with CHAIN_QUANT)."""
    pairs, n2 = c1.shape
    n = n2 // 2
    if quant is not None and quant.block_shape is not None:
        ch = chained and policy.CHAIN_QUANT
        return _group_quant(c1, n, quant.block_shape[1], True, launch_next=ch, wait_prev=ch)
    blk = min(1024, triton.next_power_of_2(n))
    grid = (pairs, triton.cdiv(n, blk))
    y = _empty(c1, (pairs, n), out_dtype)
    track = quant is not None
    amax = _zeros(c1, (1,), torch.float32) if track else y
    _launch(
        _silu_mul_kernel, grid,
        c1, y, amax, n, c1.stride(0), y.stride(0), TRACK_AMAX=track, CHAINED=chained, BLOCK=blk,
        **({"launch_pdl": True} if chained else {}),
    )  # fmt: skip
    if not track:
        return y, None
    # Per-tensor: the scale needs the whole tensor's amax, hence a second pass.
    return _tensor_quant(y, amax)


def _sum_topk(
    c3: torch.Tensor,
    m: int,
    topk: int,
    out_dtype: torch.dtype,
    out: torch.Tensor | None = None,
    chained: bool = False,
) -> torch.Tensor:
    k = c3.shape[1]
    if out is None:
        out = _empty(c3, (m, k), out_dtype)
    blk = min(1024, triton.next_power_of_2(k))
    _launch(
        _sum_topk_kernel, (m, triton.cdiv(k, blk)),
        c3, out, k, c3.stride(0), out.stride(0),
        TOPK=topk, TOPK_P=triton.next_power_of_2(topk), CHAINED=chained, BLOCK=blk,
        **({"launch_pdl": True} if chained else {}),
    )  # fmt: skip
    return out


def fused_moe(
    hidden_states: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    config: dict[str, Any],
    *,
    quant: QuantArgs | None = None,
    out: torch.Tensor | None = None,
    path: str = "auto",
) -> torch.Tensor:
    """The whole fused-MoE forward: align, GEMM 1, SiLU-and-mul, GEMM 2 (x routing weight),
    sum over top-k. Returns (M, K) in hidden_states' dtype (written into `out` if given).

    hidden_states (M, K) fp32/fp16/bf16; w1 (E, 2N, K) and w2 (E, K, N) in the same dtype, or
    fp8 with `quant`; topk_weights (M, topk) float; topk_ids (M, topk) int32/int64 in [0, E).
    path: "auto" takes the few-token path (GEMMs and activation in one launch, configured by
    BLOCK_SIZE_N, BLOCK_SIZE_K, num_warps and num_stages) for unquantised calls of few
    tokens where a recorded measurement chose it for this config (``record_path_choice``,
    ``load_path_choices``) or DECODE_MAX_TOKENS forces it, else the grouped GEMMs;
    "grouped" or "decode" forces one.
    """
    _check_inputs(hidden_states, w1, w2, topk_weights, topk_ids, quant)
    check_config(config, quant)
    if out is not None and (
        tuple(out.shape) != tuple(hidden_states.shape) or out.dtype != hidden_states.dtype
    ):
        raise ValueError(
            f"out {tuple(out.shape)} {out.dtype} must match hidden_states "
            f"{tuple(hidden_states.shape)} {hidden_states.dtype}"
        )
    m, topk = topk_ids.shape
    num_experts = w1.shape[0]
    dtype = hidden_states.dtype
    tw = topk_weights.contiguous()
    pairs = m * topk
    ch = _chain(hidden_states, pairs)
    if kernel_path(m, quant, path, config) == "decode":
        if policy.DECODE_KERNEL == "slice":
            return _decode_slice(hidden_states, w1, w2, tw, topk_ids, config, out)
        c3 = _decode(hidden_states, w1, w2, tw, topk_ids, config, launch_next=ch)
        return _sum_topk(c3, m, topk, dtype, out, chained=ch)
    naive = _naive(pairs, num_experts)
    if naive:
        align = _naive_assignment(topk_ids)
    else:
        align = moe_align_block_size(topk_ids, config["BLOCK_SIZE_M"], num_experts)
    # GEMM 1 chains to a per-group activation quantisation before it (it reads the alignment,
    # two launches back, before it waits)
    ch_x = ch and policy.CHAIN_QUANT and quant is not None and quant.block_shape is not None
    if quant is None:
        a1, a1_scale = hidden_states, None
    else:
        a1, a1_scale = _quantise_rows(hidden_states, quant, launch_next=ch_x)
    c1 = torch.empty((pairs, w1.shape[1]), dtype=dtype, device=hidden_states.device)
    w1s = quant.w1_scale if quant else None
    w2s = quant.w2_scale if quant else None
    _gemm(a1, a1_scale, w1, w1s, c1, tw, align, topk, False, config, quant, ch_x, ch, naive)
    c2, c2_scale = _silu_mul(c1, dtype, quant, chained=ch)
    c3 = torch.empty((pairs, w2.shape[1]), dtype=dtype, device=hidden_states.device)
    _gemm(c2, c2_scale, w2, w2s, c3, tw, align, 1, True, config, quant, ch, ch, naive)
    return _sum_topk(c3, m, topk, dtype, out, chained=ch)
