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

Here: the launch policy (the module's switches, `kernel_options`, the path rule and the
recorded path choices) and the launchers, `fused_moe` last. The Triton bodies are in
`triton_kernels` (grouped path) and `triton_decode` (few-token path), the compile-only
warm-ups in `warmup`, the benchmark problem the tuner times in `problem`.

In-container module: standard library, torch and triton only.
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass
from typing import Any

import torch
import triton

from cellbench.tune.kernels.align import moe_align_block_size
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
    gdc_wait,
)
from cellbench.tune.shapes import ROCM_CONFIG_KEYS, VLLM_CONFIG_KEYS

CONFIG_KEYS = VLLM_CONFIG_KEYS[:4]  # required; num_warps and num_stages are optional
_OPTIONAL_KEYS = VLLM_CONFIG_KEYS[4:]
_ROCM_KEYS = ROCM_CONFIG_KEYS

_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_DTYPE_ALIASES = {"float32": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16"}

# Quantisation modes, as a constexpr for the kernels.
_Q_NONE, _Q_TENSOR, _Q_BLOCK = 0, 1, 2


def interpreter_active() -> bool:
    """True when the kernels run under Triton's CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def fp8_dtype() -> torch.dtype:
    """The fp8 e4m3 flavour this device uses (fnuz on MI300-class gfx94x, else OCP e4m3fn)."""
    if getattr(torch.version, "hip", None) and torch.cuda.is_available():
        arch = getattr(torch.cuda.get_device_properties(0), "gcnArchName", "")
        if arch.startswith("gfx94"):
            return torch.float8_e4m3fnuz
    return torch.float8_e4m3fn


@dataclass
class QuantArgs:
    """Weight quantisation of a fused-MoE call.

    dtype: "fp8_w8a8" (the only one the builtin kernel runs).
    w1_scale, w2_scale: float32 per-expert scales (E,) for per-tensor quantisation, or block
        scales (E, 2N/bn, K/bk) and (E, K/bn, N/bk) when block_shape is set.
    block_shape: (bn, bk) or None. Activations are quantised dynamically inside the call.
    """

    dtype: str
    w1_scale: torch.Tensor
    w2_scale: torch.Tensor
    block_shape: tuple[int, int] | None = None


# ----------------------------------------------------------------------------- host side


# Grouped GEMMs load weight tiles through TMA descriptors: None = by the rule below, where
# the GPU has TMA (CUDA capability >= 9); True/False = always/never (True also under the
# interpreter, which emulates descriptors).
B_OPERAND_TMA: bool | None = None
# The rule, from side-by-side timings on the H200 (benchmarks/NOTES-kernel.md, run 3): with
# bf16 weights TMA was 0.1-1.6% faster from 128 (token, expert) pairs up (M >= 16 at top-8)
# and up to 4% slower at 32 and fewer; 64-127 pairs (M=8) were not measured and take TMA.
# fp8: within 1.6% either way. fp32 tiles can exceed shared memory with TMA's buffering.
# fp8 weights take TMA at every pair count: with the operand swap and naive assignment, the
# whole call at M=1/2/4 (8-32 pairs) took 0.849/0.898/0.933 of vLLM's time with TMA against
# 0.924/0.919/0.947 without (results/builtin_vs_vllm_h200_2026-12-04, `tma` variant).
TMA_MIN_PAIRS = 64


# Facts about a GPU stated by the process that owns it, for processes that only compile
# kernels for it and never open it (see `assume_device`): device -> (capability, SM count).
_ASSUMED_DEVICES: dict[torch.device, tuple[tuple[int, int], int]] = {}


def assume_device(device: Any, capability: tuple[int, int], sm_count: int) -> None:
    """Answer the kernels' questions about `device` (compute capability, SM count) from the
    given facts instead of asking the driver: a compile-only process that takes them from
    the owning process compiles the same kernels without creating a CUDA context."""
    _ASSUMED_DEVICES[torch.device(device)] = ((int(capability[0]), int(capability[1])),
                                              int(sm_count))  # fmt: skip
    _cuda_sm90.cache_clear()
    _programs_per_wave.cache_clear()


def device_facts(device: Any) -> tuple[tuple[int, int], int]:
    """(compute capability, SM count) of a CUDA device: what `assume_device` takes."""
    dev = torch.device(device)
    if dev in _ASSUMED_DEVICES:
        return _ASSUMED_DEVICES[dev]
    props = torch.cuda.get_device_properties(dev)
    return (props.major, props.minor), props.multi_processor_count


@functools.cache
def _cuda_sm90(device: torch.device) -> bool:
    """CUDA capability >= 9: TMA and programmatic dependent launch (asked once per device:
    this sits on every GEMM launch)."""
    return not getattr(torch.version, "hip", None) and device_facts(device)[0][0] >= 9


def _use_b_descriptor(w: torch.Tensor, config: dict[str, Any], pairs: int) -> bool:
    """Whether this GEMM's weight tiles can and should come through a tensor descriptor."""
    want = B_OPERAND_TMA
    if want is None:
        want = (
            _tma_pairs(pairs, w.element_size() == 1)
            and w.element_size() <= 2
            and w.is_cuda
            and _cuda_sm90(w.device)
        )
    if not want:
        return False
    e, n, k = w.shape
    elt = w.element_size()
    # Descriptor rules: unit inner stride, 16-byte aligned base and row stride, and an inner
    # block of at least 16 bytes.
    return (
        w.is_contiguous()
        and w.data_ptr() % 16 == 0
        and (k * elt) % 16 == 0
        and config["BLOCK_SIZE_K"] * elt >= 16
    )


# Small calls chain their kernels with programmatic dependent launch: GEMM 1 lets the
# activation kernel, and that one GEMM 2 (and GEMM 2 the top-k sum), start once all its
# programs have started; the early kernel waits for its input inside, so launch and ramp-up
# overlap the previous kernel's tail. None = by the rule below, where the GPU and Triton
# support it (CUDA capability >= 9); True/False = always/never there.
CHAIN_KERNELS: bool | None = None
# Rule, from side-by-side timings on the H200 (benchmarks/NOTES-kernel.md, run 5): chained,
# the two GEMMs took 0.95x (M=1) to 0.99x (M=16) the unchained time, bf16; fp8 block 0.93x
# to 0.99x (1.01x at M=2, within noise). Larger M was not measured then.
CHAIN_MAX_PAIRS = 128


def _tma_pairs(pairs: int, quantised: bool = False) -> bool:
    """The TMA rule's pair-count part (one place for it and `m_dependent_choices`): fp8
    weights at any count, others from TMA_MIN_PAIRS up."""
    return quantised or pairs >= TMA_MIN_PAIRS


def _chain_pairs(pairs: int) -> bool:
    """The chaining rule's pair-count part, or the forced setting."""
    return pairs <= CHAIN_MAX_PAIRS if CHAIN_KERNELS is None else bool(CHAIN_KERNELS)


def _chain(x: Any, pairs: int) -> bool:
    """Whether a call with `pairs` (token, expert) pairs on x's device chains its kernels."""
    return (
        _chain_pairs(pairs)
        and gdc_wait is not None
        and not interpreter_active()
        and x.is_cuda
        and _cuda_sm90(x.device)
    )


# Few-token calls skip the alignment ("naive" assignment, as vLLM does for few tokens): row
# block i of each GEMM is pair i alone, its expert read straight from topk_ids, so the call
# saves the alignment launch (a one-program kernel every other kernel waits for) and the GEMMs
# run exactly pairs x column-block programs. Costs: a row block holds one real row, and an
# expert two pairs share is read twice. None = by the rule below; True/False = always/never.
NAIVE_ASSIGNMENT: bool | None = None
# Rule: naive when pairs * NAIVE_SPARSITY <= experts, vLLM 0.34's margin (its
# _prepare_expert_assignment), so that shared experts stay rare: with uniform routing the
# expected number of pairs sharing an expert is about pairs^2 / (2 E), under 1/8 of the
# pairs at this margin. Qwen3-30B-A3B (E=128, top-8): M <= 4.
NAIVE_SPARSITY = 4


def _naive(pairs: int, num_experts: int) -> bool:
    """Whether a call with `pairs` pairs over `num_experts` experts skips the alignment."""
    if NAIVE_ASSIGNMENT is not None:
        return bool(NAIVE_ASSIGNMENT)
    return pairs * NAIVE_SPARSITY <= num_experts


# fp8 GEMMs with few rows per tile compute the transposed tile (weights as the MMA's M side):
# Hopper's warp-group MMA needs 64 rows on its M side, so a BLOCK_SIZE_M of 16 wastes most of
# it, while BLOCK_SIZE_N (64 or more) fills it. None = the rule of `_swap_ab`; True/False =
# always/never (quantised calls only).
FP8_SWAP_AB: bool | None = None
# The same swap for unquantised weights where BLOCK_SIZE_M < 64 <= BLOCK_SIZE_N: not measured,
# so off (a switch for side-by-side timing: bf16 at BLOCK_SIZE_M 16 also runs on the older
# warp-level MMA, but those GEMMs are memory-bound and already at vLLM's time or below).
SWAP_AB_UNQUANTISED = False


def _swap_ab(config: dict[str, Any], quant: QuantArgs | None, w: torch.Tensor) -> bool:
    """Operand swap for this GEMM: fp8 weights, BLOCK_SIZE_M < 64 <= BLOCK_SIZE_N, on a
    capability 9.0 GPU (vLLM 0.34's rule, `enable_swap_ab`)."""
    if quant is None:
        return SWAP_AB_UNQUANTISED and config["BLOCK_SIZE_M"] < 64 <= config["BLOCK_SIZE_N"]
    if FP8_SWAP_AB is not None:
        return bool(FP8_SWAP_AB)
    return (
        config["BLOCK_SIZE_M"] < 64 <= config["BLOCK_SIZE_N"]
        and w.is_cuda
        and not interpreter_active()
        and not getattr(torch.version, "hip", None)
        and device_facts(w.device)[0] == (9, 0)
    )


# Block-quantised GEMMs whose column tile lies inside one weight-scale block (block n a
# multiple of BLOCK_SIZE_N) load that block's scale as one number per K group and fold it into
# the rows' activation scale: one multiply-add per accumulator element per K group instead of
# two multiplies and an add, and one load instead of BLOCK_SIZE_N. False: the vector form.
FP8_SCALE_SCALAR = True
# Chained calls (see `_chain`) also chain the per-group fp8 quantisation kernels: the
# activation quantisation lets GEMM 1 start early, and the SiLU-and-mul quantisation waits for
# GEMM 1 and lets GEMM 2 start early, as the unquantised activation kernel does.
CHAIN_QUANT = True


# Grouped GEMMs that run persistent (`_moe_gemm_kernel` with PERSISTENT: one program per SM
# looping over the tiles, the tile loop flattened into the pipeline) in calls of at least
# PERSISTENT_MIN_PAIRS (token, expert) pairs: 1 and/or 2. Adopted for both GEMMs from 8192
# pairs (M >= 1024 at top-8) by run 18 on the H200, side by side with one tile per program:
# M=4096 two GEMMs 718.8 / 706.8 us against 768.6 / 772.7 (two configs; 55-56 % of the
# matmul ceiling against 51 %), M=1024 even or better; run 20's table with the rule in place:
# 699.9 us, 56.4 % (benchmarks/NOTES-kernel.md). Unquantised calls only until fp8 is
# measured the same way (benchmarks/kernel_vs_roofline.py --persistent-ms). Never with chaining,
# which is for small calls.
PERSISTENT_GEMMS: tuple[int, ...] = (1, 2)
PERSISTENT_MIN_PAIRS = 8192
PERSISTENT_FLATTEN = True  # let Triton pipeline across the tile loop
PERSISTENT_QUANTISED = False  # fp8 calls too


def _persistent(gemm: int, pairs: int, quantised: bool) -> bool:
    """Whether GEMM `gemm` (1 or 2) of a call with `pairs` pairs runs persistent."""
    return (
        gemm in PERSISTENT_GEMMS
        and pairs >= PERSISTENT_MIN_PAIRS
        and (PERSISTENT_QUANTISED or not quantised)
        and not _chain_pairs(pairs)
    )


@functools.cache
def _programs_per_wave(device: torch.device) -> int:
    """Programs of a persistent GEMM: one per SM (4 under the interpreter and on devices
    that cannot be asked, so that each program still loops over several tiles)."""
    if interpreter_active() or device.type != "cuda":
        return 4
    return device_facts(device)[1]


def _b_descriptor(w: torch.Tensor, config: dict[str, Any]) -> Any:
    from triton.tools.tensor_descriptor import TensorDescriptor

    e, n, k = w.shape
    return TensorDescriptor(w, [e * n, k], [k, 1], [config["BLOCK_SIZE_N"], config["BLOCK_SIZE_K"]])


def _launch_options(config: dict[str, Any]) -> dict[str, Any]:
    """Triton launch options from a vLLM config; ROCm-only keys only reach Triton on ROCm."""
    opts = {k: int(config[k]) for k in _OPTIONAL_KEYS if k in config}
    if getattr(torch.version, "hip", None) and not interpreter_active():
        opts.update({k: int(config[k]) for k in _ROCM_KEYS if k in config})
    return opts


def check_config(config: dict[str, Any], quant: QuantArgs | None = None) -> None:
    """Raise ValueError naming the key when `config` is not a usable vLLM fused-MoE config."""
    if not isinstance(config, dict):
        raise ValueError(f"config must be a dict, got {type(config).__name__}")
    for k in CONFIG_KEYS:
        if k not in config:
            raise ValueError(f"config lacks {k} (needs {', '.join(CONFIG_KEYS)})")
    allowed = set(CONFIG_KEYS) | set(_OPTIONAL_KEYS) | set(_ROCM_KEYS)
    for k, v in config.items():
        if k not in allowed:
            raise ValueError(f"config key {k!r} is not a fused-MoE launch key")
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"config {k}={v!r} must be a non-negative integer")
    for k in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"):
        v = config[k]
        if v < 1 or v & (v - 1):
            raise ValueError(f"config {k}={v} must be a power of two")
    if config["GROUP_SIZE_M"] < 1:
        raise ValueError(f"config GROUP_SIZE_M={config['GROUP_SIZE_M']} must be >= 1")
    if config.get("num_warps", 4) not in (1, 2, 4, 8, 16):
        raise ValueError(f"config num_warps={config['num_warps']} must be 1, 2, 4, 8 or 16")
    if quant is not None and quant.block_shape is not None:
        bk = quant.block_shape[1]
        if bk % config["BLOCK_SIZE_K"]:
            raise ValueError(
                f"config BLOCK_SIZE_K={config['BLOCK_SIZE_K']} must divide the quantisation "
                f"block k={bk}"
            )


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
    b_scalar = mode == _Q_BLOCK and FP8_SCALE_SCALAR and group_n % bn_ == 0
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
        FLATTEN=persistent and PERSISTENT_FLATTEN,
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


# Unquantised calls of at most this many tokens may take the few-token path
# (_moe_decode_kernel: both GEMMs and the activation in one launch, no alignment) when the
# path is "auto". An int forces the cut (0: never; M <= the int: always). None: the few-token
# path is taken only where a measurement says it wins for the config in hand
# (`record_path_choice`, which the tuner's side-by-side timing of both paths feeds), and only
# up to DECODE_RULE_MAX_TOKENS; without one, the grouped path.
DECODE_MAX_TOKENS: int | None = None
# Rule, from side-by-side timings on the H200 (benchmarks/NOTES-kernel.md, runs 8-10): with
# its best config the whole call at M=1/2/4 took 27.3 / 44.4 / 75.8 us on the few-token path
# against 33.6 / 50.5 / 80.8 on the grouped one with vLLM's shipped config (run 10), and lost
# at M=8 (131.3 vs 126.8, run 9). (Its GEMM part is slower than the two grouped GEMMs alone,
# 26.4 vs 23.4 us at M=1; the call wins by dropping the alignment, the activation kernel and
# two launches.) With vLLM's shipped configs, made for the grouped kernel, it wins only at
# M=1 (31.9 us) and loses at M=2/4 (55.5 / 83.7): configs for it come from the tuner, whose
# picks beat the shipped ones by 11-20% there (tuner run 11). Measured on CUDA only:
# elsewhere, and under the interpreter, the grouped path stays the default. Since the grouped
# path skips the alignment for few tokens (NAIVE_ASSIGNMENT), the whole-call gap that made
# the few-token path win is smaller, so no config is assumed to win: see DECODE_MAX_TOKENS.
DECODE_RULE_MAX_TOKENS = 4

# Measured path choices: (tokens, launch identity of the config) -> "decode" | "grouped".
_PATH_CHOICES: dict[tuple[int, str], str] = {}


def _path_choice_key(m: int, config: dict[str, Any]) -> tuple[int, str]:
    return int(m), ",".join(f"{k}={int(config[k])}" for k in sorted(config))


def record_path_choice(m: int, config: dict[str, Any], path: str) -> None:
    """Say which path ("decode" or "grouped") a measurement found faster for the whole call
    of m tokens with this config; "auto" calls then take it (within DECODE_RULE_MAX_TOKENS)."""
    if path not in ("decode", "grouped"):
        raise ValueError(f"path={path!r} must be 'decode' or 'grouped'")
    check_config(config)
    _PATH_CHOICES[_path_choice_key(m, config)] = path


def clear_path_choices() -> None:
    """Forget every recorded path choice."""
    _PATH_CHOICES.clear()


def load_path_choices(table: dict[Any, Any]) -> int:
    """Record the choices of a path-choices table ({"<m>": {"config": {...}, "path": ...}},
    as `tuner.artifacts.write_path_choices` writes it); returns how many."""
    n = 0
    for key, entry in table.items():
        if not isinstance(entry, dict) or "config" not in entry or "path" not in entry:
            raise ValueError(f"path choice {key!r}: expected {{'config': ..., 'path': ...}}")
        record_path_choice(int(key), entry["config"], entry["path"])
        n += 1
    return n


def measured_path(m: int, config: dict[str, Any] | None) -> str | None:
    """The recorded choice for m tokens with this config, or None."""
    if config is None:
        return None
    return _PATH_CHOICES.get(_path_choice_key(m, config))


PATHS = ("auto", "grouped", "decode")

# The module-level switches a caller may set for a while (`kernel_options`): each changes
# which kernels a call runs, never its result beyond rounding.
OPTION_NAMES = (
    "B_OPERAND_TMA",
    "CHAIN_KERNELS",
    "CHAIN_QUANT",
    "DECODE_KERNEL",
    "DECODE_MAX_TOKENS",
    "FP8_SCALE_SCALAR",
    "FP8_SWAP_AB",
    "NAIVE_ASSIGNMENT",
    "PERSISTENT_QUANTISED",
    "SWAP_AB_UNQUANTISED",
)


@contextlib.contextmanager
def kernel_options(**options: Any):
    """Set some of OPTION_NAMES for the calls made inside the block, then restore them (a
    benchmark captures one variant's calls into a CUDA graph inside it). Not thread-safe."""
    bad = sorted(set(options) - set(OPTION_NAMES))
    if bad:
        raise ValueError(f"unknown kernel option(s) {', '.join(bad)}; known: {OPTION_NAMES}")
    g = globals()
    before = {k: g[k] for k in options}
    g.update(options)
    try:
        yield
    finally:
        g.update(before)


def kernel_path(
    m: int, quant: QuantArgs | None, path: str = "auto", config: dict[str, Any] | None = None
) -> str:
    """Which kernels a call of m tokens runs: "decode" (few-token path) or "grouped". "auto"
    with DECODE_MAX_TOKENS unset: the recorded measurement for `config` (see
    `record_path_choice`), else grouped."""
    if path not in PATHS:
        raise ValueError(f"path={path!r} must be one of {', '.join(PATHS)}")
    if path == "decode" and quant is not None:
        raise ValueError("the few-token path runs unquantised weights only")
    if path == "auto":
        if quant is not None:
            return "grouped"
        if DECODE_MAX_TOKENS is not None:
            return "decode" if m <= DECODE_MAX_TOKENS else "grouped"
        if m <= DECODE_RULE_MAX_TOKENS and measured_path(m, config) == "decode":
            return "decode"
        return "grouped"
    return path


def m_dependent_choices(
    m: int, topk: int, quant: QuantArgs | None, num_experts: int | None = None
) -> tuple[Any, ...]:
    """The kernel choices that change with the token count, beyond Triton's own integer
    specialisation: the path, weight tiles through TMA (by pair count), chaining, which
    GEMMs run persistent and (given num_experts) naive assignment. Calls whose choices differ
    run differently compiled kernels (the tuner counts compiles by it)."""
    pairs = m * topk
    q = quant is not None
    persistent = (_persistent(1, pairs, q), _persistent(2, pairs, q))
    out: tuple[Any, ...] = (kernel_path(m, quant), _tma_pairs(pairs, q), _chain_pairs(pairs),
                            persistent)  # fmt: skip
    if num_experts is not None:
        out += (_naive(pairs, num_experts),)
    return out


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


# Which few-token kernel the few-token path runs: "ticket" (`_moe_decode_kernel`: GEMM 2
# tiles wait for the GEMM 1 tiles of their pair; bit-exact, the top-k sum a second kernel;
# measured in runs 8-11) or "slice" (`_moe_decode_slice_kernel`: each program owns a slice
# of intermediate columns through both GEMMs and adds its share of the output atomically; no
# waiting, the top-k sum included; results vary in the last bits). H200, run 11, best
# configs, whole call: slice 26.0 / 45.5 / 74.8 us at M=1/2/4, ticket 28.4 / 44.6 / 76.3;
# run 12 on another H200 gave the same order. The default stays "ticket": the slice kernel
# loses at M=2, and choosing it per M needs a rule in `m_dependent_choices`, not written.
DECODE_KERNEL = "ticket"

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


def decode_launch_key(config: dict[str, Any]) -> str:
    """What makes two configs launch the same few-token kernel the same way: configs with
    equal keys are one kernel (BLOCK_SIZE_M and GROUP_SIZE_M play no part; the slice kernel
    reads BLOCK_SIZE_N only through its slice width, max(16, BLOCK_SIZE_N / 2))."""
    gate_n = max(16, config["BLOCK_SIZE_N"] // 2)
    parts = {"kernel": DECODE_KERNEL, "GATE_N": gate_n, "BLOCK_SIZE_K": config["BLOCK_SIZE_K"]}
    if DECODE_KERNEL == "ticket":
        parts["BLOCK_SIZE_N"] = config["BLOCK_SIZE_N"]
    parts |= _launch_options(config)
    return ",".join(f"{k}={v}" for k, v in sorted(parts.items()))


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
        ch = chained and CHAIN_QUANT
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
        if DECODE_KERNEL == "slice":
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
    ch_x = ch and CHAIN_QUANT and quant is not None and quant.block_shape is not None
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
