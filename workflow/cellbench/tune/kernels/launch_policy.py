"""The builtin fused-MoE kernel's launch policy: what a launch config may hold
(`check_config`), the call's quantisation (`QuantArgs`), the facts about a device the rules
ask (`assume_device`, `device_facts`), the module-level switches a caller may set for a while
(`kernel_options`) with the measured rules behind their defaults (TMA weight tiles, chaining,
naive assignment, the operand swap, persistent GEMMs, the few-token path), and the recorded
path choices (`record_path_choice`, `load_path_choices`).

Split out of `fused_moe`: the launchers there read these switches here at
call time, so set them on this module (`kernel_options`, or `monkeypatch.setattr` on it).

In-container module: standard library, torch and triton only.
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass
from typing import Any

import torch

from cellbench.tune.kernels.triton_kernels import gdc_wait
from cellbench.tune.shapes import ROCM_CONFIG_KEYS, VLLM_CONFIG_KEYS

CONFIG_KEYS = VLLM_CONFIG_KEYS[:4]  # required; num_warps and num_stages are optional
_OPTIONAL_KEYS = VLLM_CONFIG_KEYS[4:]
_ROCM_KEYS = ROCM_CONFIG_KEYS

_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_DTYPE_ALIASES = {"float32": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16"}


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


# Which few-token kernel the few-token path runs: "ticket" (`_moe_decode_kernel`: GEMM 2
# tiles wait for the GEMM 1 tiles of their pair; bit-exact, the top-k sum a second kernel;
# measured in runs 8-11) or "slice" (`_moe_decode_slice_kernel`: each program owns a slice
# of intermediate columns through both GEMMs and adds its share of the output atomically; no
# waiting, the top-k sum included; results vary in the last bits). H200, run 11, best
# configs, whole call: slice 26.0 / 45.5 / 74.8 us at M=1/2/4, ticket 28.4 / 44.6 / 76.3;
# run 12 on another H200 gave the same order. The default stays "ticket": the slice kernel
# loses at M=2, and choosing it per M needs a rule in `m_dependent_choices`, not written.
DECODE_KERNEL = "ticket"


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
