"""Search spaces for the fused-MoE Triton kernel and pruning by hardware limits.

In-container module: standard library only (torch/triton are imported lazily where a device
property is read).

A config is a plain dict with vLLM's keys (BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K,
GROUP_SIZE_M, num_warps, num_stages, and on ROCm waves_per_eu / matrix_instr_nonkdim / kpack),
so it can be written to vLLM's JSON unchanged.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from dataclasses import dataclass

from cellbench.tune.shapes import ROCM_CONFIG_KEYS, VLLM_CONFIG_KEYS

__all__ = [
    "Config",
    "HardwareLimits",
    "CUDA_SPACE",
    "ROCM_SPACE",
    "TINY_SPACE",
    "config_key",
    "expand",
    "cuda_space",
    "rocm_space",
    "tiny_space",
    "space_for",
    "smem_lower_bound",
    "prune_reason",
    "prune",
    "H200_SMEM_BYTES",
]

Config = dict[str, int]

# Opt-in shared memory per block on an H200 (sm_90), used when the device cannot be asked.
H200_SMEM_BYTES = 232_448

# vLLM benchmark_moe.py's CUDA space: 5*4*3*2*4*4 = 1,920 configs.
CUDA_SPACE: dict[str, list[int]] = {
    "BLOCK_SIZE_M": [16, 32, 64, 128, 256],
    "BLOCK_SIZE_N": [32, 64, 128, 256],
    "BLOCK_SIZE_K": [64, 128, 256],
    "GROUP_SIZE_M": [1, 16, 32, 64],
    "num_warps": [4, 8],
    "num_stages": [2, 3, 4, 5],
}

# vLLM benchmark_moe.py's ROCm space (before the fp16-only MFMA keys).
ROCM_SPACE: dict[str, list[int]] = {
    "BLOCK_SIZE_M": [16, 32, 64, 128, 256],
    "BLOCK_SIZE_N": [16, 32, 64, 128, 256],
    "BLOCK_SIZE_K": [16, 32, 64, 128, 256],
    "GROUP_SIZE_M": [1, 4, 8, 16, 32],
    "num_warps": [1, 2, 4, 8],
    "num_stages": [2],
    "waves_per_eu": [0, 1, 2, 4],
}
ROCM_MFMA_FP16_EXTRA: dict[str, list[int]] = {"matrix_instr_nonkdim": [16, 32], "kpack": [1, 2]}

# A small space for the CPU interpreter (embedded default): enough choice to make tuning
# meaningful on tiny shapes, small enough to time in seconds.
TINY_SPACE: dict[str, list[int]] = {
    "BLOCK_SIZE_M": [16, 32],
    "BLOCK_SIZE_N": [32, 64],
    "BLOCK_SIZE_K": [32, 64],
    "GROUP_SIZE_M": [1, 8],
    "num_warps": [4],
    "num_stages": [2],
}

_KEY_ORDER = VLLM_CONFIG_KEYS + ROCM_CONFIG_KEYS


def config_key(cfg: Config) -> str:
    """Canonical, order-independent text form of a config (used as its identity in logs)."""
    ordered = {k: int(cfg[k]) for k in _KEY_ORDER if k in cfg}
    ordered.update({k: int(v) for k, v in sorted(cfg.items()) if k not in ordered})
    return json.dumps(ordered, separators=(",", ":"))


def expand(space: dict[str, list[int]]) -> list[Config]:
    """Cartesian product of a space, in a fixed order."""
    keys = list(space)
    return [dict(zip(keys, vals, strict=True)) for vals in itertools.product(*space.values())]


def cuda_space(block_shape: tuple[int, int] | None = None) -> list[Config]:
    """vLLM's CUDA space (1,920), filtered for block quantisation (640 for [128,128]).

    With block-quantised fp8 each K step of the kernel must read exactly one weight-scale
    group, so BLOCK_SIZE_K has to equal block_k; this is the divisibility filter that turns
    1,920 into 640 for [128,128].
    """
    configs = expand(CUDA_SPACE)
    if block_shape is not None:
        bk = block_shape[1]
        configs = [c for c in configs if c["BLOCK_SIZE_K"] == bk]
    return configs


def rocm_space(
    fp16: bool, has_mfma: bool = True, block_shape: tuple[int, int] | None = None
) -> list[Config]:
    """vLLM's ROCm space; MFMA keys (matrix_instr_nonkdim, kpack) only for fp16 on MFMA GPUs.

    Sizes before per-batch pruning: 40,000 for fp16 with MFMA; 8,000 for 8-bit operands (whose
    MFMA instructions reduce over at least 32, so BLOCK_SIZE_K=16 is dropped); block
    quantisation then applies the same BLOCK_SIZE_K == block_k filter as `cuda_space`.
    """
    space = dict(ROCM_SPACE)
    if fp16 and has_mfma:
        space.update(ROCM_MFMA_FP16_EXTRA)
    if not fp16:
        space["BLOCK_SIZE_K"] = [v for v in space["BLOCK_SIZE_K"] if v >= 32]
    configs = expand(space)
    if block_shape is not None:
        configs = [c for c in configs if c["BLOCK_SIZE_K"] == block_shape[1]]
    return configs


def tiny_space(block_shape: tuple[int, int] | None = None) -> list[Config]:
    """The CPU/interpreter space (16 configs; block quantisation keeps BLOCK_SIZE_K dividing
    block_k, which the kernel requires)."""
    configs = expand(TINY_SPACE)
    if block_shape is not None:
        configs = [c for c in configs if block_shape[1] % c["BLOCK_SIZE_K"] == 0]
    return configs


def space_for(kind: str, *, fp16: bool = False, block_shape: tuple[int, int] | None = None):
    """Space by name: 'cuda', 'rocm' or 'tiny'."""
    if kind == "cuda":
        return cuda_space(block_shape)
    if kind == "rocm":
        return rocm_space(fp16, True, block_shape)
    if kind == "tiny":
        return tiny_space(block_shape)
    raise ValueError(f"space kind={kind!r}: expected 'cuda', 'rocm' or 'tiny'")


@dataclass(frozen=True)
class HardwareLimits:
    """What the pruning rules need to know about the target.

    smem_bytes: shared memory a block may use (None: no limit, e.g. the interpreter).
    platform: 'cuda', 'rocm' or 'cpu'.
    triton_version: e.g. '3.6.0'; selects known compiler failures.
    max_regs_per_thread: register file limit per thread (255 on NVIDIA and AMD VGPRs 512).
    """

    smem_bytes: int | None
    platform: str
    triton_version: str
    max_regs_per_thread: int = 255

    @classmethod
    def detect(cls) -> HardwareLimits:
        """Read the limits of GPU 0 from torch/triton; CPU -> no limits."""
        import torch
        import triton

        tv = triton.__version__
        if not torch.cuda.is_available():
            return cls(None, "cpu", tv)
        platform = "rocm" if getattr(torch.version, "hip", None) else "cuda"
        smem = None
        try:  # triton's driver reports the opt-in limit (what a kernel may actually use)
            from triton.runtime import driver

            props = driver.active.utils.get_device_properties(torch.cuda.current_device())
            smem = int(props["max_shared_mem"])
        except Exception:  # noqa: BLE001 - older/newer triton: fall back to torch
            p = torch.cuda.get_device_properties(0)
            smem = int(
                getattr(p, "shared_memory_per_block_optin", 0)
                or getattr(p, "max_shared_memory_per_block_optin", 0)
                or H200_SMEM_BYTES
            )
        return cls(smem, platform, tv, 512 if platform == "rocm" else 255)


def smem_lower_bound(cfg: Config, operand_bytes: int) -> int:
    """Shared memory the pipelined A/B tiles need at least.

    Triton keeps num_stages-1 tiles of A (BM x BK) and B (BK x BN) in flight while computing
    on one; that is a lower bound (the compiler may add staging and layout-conversion
    scratch). Configs over it cannot compile; configs under it that still do not fit are
    caught at compile time and logged as failures.
    """
    bm, bn, bk = cfg["BLOCK_SIZE_M"], cfg["BLOCK_SIZE_N"], cfg["BLOCK_SIZE_K"]
    stages = max(cfg.get("num_stages", 2) - 1, 1)
    return stages * (bm * bk + bk * bn) * operand_bytes


def _next_pow2(x: int) -> int:
    return 1 << max(x - 1, 0).bit_length()


def _version_tuple(v: str) -> tuple[int, int]:
    parts = v.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (0, 0)


def prune_reason(
    cfg: Config,
    *,
    m: int,
    n: int,
    k: int,
    operand_bytes: int,
    limits: HardwareLimits,
) -> str | None:
    """Why `cfg` should not be compiled for batch size `m` on this shape, or None to keep it.

    n: per-rank intermediate size N (GEMM1 has 2N outputs, GEMM2 reduces over N).
    k: hidden size K (GEMM1 reduces over K, GEMM2 has K outputs).
    operand_bytes: bytes per element of the GEMM operands (2 for bf16, 1 for fp8).
    """
    bm, bn, bk = cfg["BLOCK_SIZE_M"], cfg["BLOCK_SIZE_N"], cfg["BLOCK_SIZE_K"]
    warps = cfg["num_warps"]
    # An expert receives at most m rows (a token picks an expert once), so bigger row blocks
    # are padding only.
    if bm > max(16, _next_pow2(m)):
        return f"BLOCK_SIZE_M={bm} > rows per expert (at most M={m}, padded to 16)"
    if bn > max(16, _next_pow2(max(2 * n, k))):
        return f"BLOCK_SIZE_N={bn} > largest output dim max(2N={2 * n}, K={k})"
    if bk > max(16, _next_pow2(max(n, k))):
        return f"BLOCK_SIZE_K={bk} > largest reduction dim max(K={k}, N={n})"
    if limits.smem_bytes is not None:
        need = smem_lower_bound(cfg, operand_bytes)
        if need > limits.smem_bytes:
            return f"shared memory >= {need} bytes > device limit {limits.smem_bytes}"
    if limits.platform != "cpu":
        lanes = (64 if limits.platform == "rocm" else 32) * warps
        acc_regs = bm * bn // lanes
        if acc_regs > limits.max_regs_per_thread:
            return (
                f"registers: fp32 accumulator alone needs {acc_regs}/thread "
                f"> {limits.max_regs_per_thread}"
            )
    if (
        limits.platform == "cuda"
        and _version_tuple(limits.triton_version) == (3, 6)
        and bm == 256
        and warps == 4
        and bn == bk
    ):
        return "known compile failure (Triton 3.6): BLOCK_SIZE_M=256, num_warps=4, BLOCK_N==BLOCK_K"
    return None


def prune(
    configs: Iterable[Config],
    *,
    m: int,
    n: int,
    k: int,
    operand_bytes: int,
    limits: HardwareLimits,
) -> tuple[list[Config], list[tuple[Config, str]]]:
    """Split configs into (kept, [(pruned config, reason)])."""
    kept: list[Config] = []
    dropped: list[tuple[Config, str]] = []
    for c in configs:
        why = prune_reason(c, m=m, n=n, k=k, operand_bytes=operand_bytes, limits=limits)
        if why is None:
            kept.append(c)
        else:
            dropped.append((c, why))
    return kept, dropped


def describe(cfg: Config) -> str:
    """Short human name of a config, e.g. 'M64_N128_K128_G16_w4_s3'."""
    s = (
        f"M{cfg['BLOCK_SIZE_M']}_N{cfg['BLOCK_SIZE_N']}_K{cfg['BLOCK_SIZE_K']}"
        f"_G{cfg['GROUP_SIZE_M']}_w{cfg['num_warps']}_s{cfg['num_stages']}"
    )
    for key, tag in (("waves_per_eu", "wpe"), ("matrix_instr_nonkdim", "mi"), ("kpack", "kp")):
        if key in cfg:
            s += f"_{tag}{cfg[key]}"
    return s
