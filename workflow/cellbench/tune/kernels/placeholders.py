"""Placeholder tensors: compile a kernel as a real call would, without memory or a GPU.

In-container module: standard library, torch and triton only.

A host function of the kernels that allocates its outputs with `empty`/`zeros` and launches
with `launch` runs for real on real tensors, and on placeholders only compiles (Triton's
warm-up: the same specialisation, nothing launched), so one code path serves the call and
the tuner's compile-only workers (`kernels.warm_config`, `kernels.warm_shared`).
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["Placeholder", "empty", "launch", "zeros"]


class Placeholder:
    """A contiguous tensor's shape, dtype and device, no memory: what Triton needs to
    specialise and compile a kernel (its address reads as 0, i.e. 16-byte aligned, as the
    caching allocator's tensors are)."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device):
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype
        self.device = device
        self.is_cuda = device.type == "cuda"

    def stride(self, dim: int | None = None) -> Any:
        st, acc = [], 1
        for d in reversed(self.shape):
            st.append(acc)
            acc *= d
        st = tuple(reversed(st))
        return st if dim is None else st[dim]

    def data_ptr(self) -> int:
        return 0

    def element_size(self) -> int:
        return self.dtype.itemsize

    def is_contiguous(self) -> bool:
        return True

    def contiguous(self) -> Placeholder:
        return self

    def numel(self) -> int:
        return math.prod(self.shape)

    def dim(self) -> int:
        return len(self.shape)


def empty(like: Any, shape: tuple[int, ...], dtype: torch.dtype) -> Any:
    """torch.empty on like's device, or a placeholder when `like` is one."""
    if isinstance(like, Placeholder):
        return Placeholder(shape, dtype, like.device)
    return torch.empty(shape, dtype=dtype, device=like.device)


def zeros(like: Any, shape: tuple[int, ...], dtype: torch.dtype) -> Any:
    """torch.zeros on like's device, or a placeholder when `like` is one."""
    if isinstance(like, Placeholder):
        return Placeholder(shape, dtype, like.device)
    return torch.zeros(shape, dtype=dtype, device=like.device)


def launch(kernel: Any, grid: tuple[int, ...], *args: Any, **kwargs: Any) -> None:
    """Launch, or only compile when the first argument is a placeholder."""
    if isinstance(args[0], Placeholder):
        kernel.warmup(*args, grid=grid, **kwargs)
    else:
        kernel[grid](*args, **kwargs)
