"""Plain-torch fused-MoE reference in float64, and the error bounds the kernel must meet.

In-container module: standard library and torch only.
"""

from __future__ import annotations

import torch

from cellbench.tune.kernels.problem import MoEProblem

# Relative error bounds ||out - ref|| / ||ref|| (Frobenius) against the float64 reference.
# Each bound leaves roughly 3-5x headroom over what the rounding alone should cost:
# - fp32: GEMMs use IEEE fp32 dot products (never TF32); errors ~1e-6 from accumulation order.
# - fp16: unit roundoff 2^-11; x, w and three intermediates are rounded -> ~1e-3.
# - bf16: unit roundoff 2^-8; the same five roundings -> ~4e-3.
# - fp8_w8a8 (e4m3, 3 mantissa bits): weights are compared after dequantisation, so the
#   error is the two dynamic activation quantisations (x, and the SiLU output), each
#   ~2.5% RMS relative, plus bf16 rounding -> ~3.5%.
_BOUNDS = {"fp32": 1e-4, "fp16": 5e-3, "bf16": 1.5e-2, "fp8_w8a8": 6e-2}


def error_bound(dtype: str) -> float:
    """Relative-error bound for a kernel output of this dtype (activation dtype, or
    "fp8_w8a8" for quantised weights)."""
    try:
        return _BOUNDS[dtype]
    except KeyError:
        raise ValueError(
            f"no error bound for dtype={dtype!r}; known: {', '.join(_BOUNDS)}"
        ) from None


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64."""
    out64, ref64 = out.double(), ref.double()
    return float(torch.linalg.vector_norm(out64 - ref64) / torch.linalg.vector_norm(ref64))


def problem_error_bound(problem: MoEProblem) -> float:
    """The bound for this problem: fp8 when its weights are quantised, else its dtype's."""
    return error_bound("fp8_w8a8" if problem.quant is not None else problem.dtype)


def _dequantise(
    w: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None
) -> torch.Tensor:
    """One expert's fp8 weight (rows, cols) back to float64."""
    w64 = w.double()
    if block is None:
        return w64 * scale.double()
    bn, bk = block
    s = scale.double().repeat_interleave(bn, 0).repeat_interleave(bk, 1)
    return w64 * s[: w.shape[0], : w.shape[1]]


def torch_moe_reference(problem: MoEProblem) -> torch.Tensor:
    """The MoE forward in float64, expert by expert (fp8 weights dequantised with their
    scales; activations not quantised). Returns (M, K) float64 on the problem's device."""
    p, q = problem, problem.quant
    x = p.hidden_states.double()
    n = p.w2.shape[2]
    out = torch.zeros_like(x)
    ids = p.topk_ids.long()
    for e in torch.unique(ids).tolist():
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        if q is None:
            w1, w2 = p.w1[e].double(), p.w2[e].double()
        else:
            w1 = _dequantise(p.w1[e], q.w1_scale[e], q.block_shape)
            w2 = _dequantise(p.w2[e], q.w2_scale[e], q.block_shape)
        h = x[tok] @ w1.T
        act = torch.nn.functional.silu(h[:, :n]) * h[:, n:]
        y = (act @ w2.T) * p.topk_weights[tok, slot].double()[:, None]
        out.index_add_(0, tok, y)
    return out
