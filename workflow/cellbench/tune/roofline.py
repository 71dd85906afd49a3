"""Roofline of a fused-MoE call: the bytes that must move, the FLOPs, and measured ceilings.

In-container module: stdlib + torch.

Minimal traffic of the fused call at batch size M: the weights of the experts the routing
actually touches (w1 is (E, 2N, K), w2 is (E, K, N); block scales included), the activations
read once (M x K) and the output written once (M x K). The two GEMMs separately also move
their intermediate: GEMM1 writes M*topk x 2N, GEMM2 reads M*topk x N (after the activation)
and writes M*topk x K.

FLOPs: 2 * M * topk * (2N * K + N * K) (GEMM1 then GEMM2).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Ceilings", "Work", "fused_work", "gemm_works", "fractions", "measure_ceilings"]


@dataclass(frozen=True)
class Work:
    """FLOPs and minimal bytes of one kernel call."""

    flops: float
    bytes: float

    def floor_us(self, ceil: Ceilings) -> float | None:
        """Roofline time: the larger of bytes/bandwidth and FLOPs/matmul rate (us)."""
        if ceil.copy_bytes_per_s is None or ceil.matmul_flops_per_s is None:
            return None
        return max(self.bytes / ceil.copy_bytes_per_s, self.flops / ceil.matmul_flops_per_s) * 1e6


@dataclass(frozen=True)
class Ceilings:
    """Measured device ceilings (None on CPU: no meaningful roofline under the interpreter)."""

    copy_bytes_per_s: float | None
    matmul_flops_per_s: float | None
    matmul_dtype: str | None = None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _scale_bytes(rows: int, cols: int, block: tuple[int, int] | None) -> int:
    if block is None:
        return 0
    bn, bk = block
    return -(-rows // bn) * -(-cols // bk) * 4  # fp32 scale per block


def gemm_works(
    *,
    m: int,
    n: int,
    k: int,
    topk: int,
    experts_touched: int,
    weight_bytes: float,
    act_bytes: float,
    out_bytes: float,
    block_shape: tuple[int, int] | None = None,
) -> tuple[Work, Work]:
    """(GEMM1, GEMM2) work at batch size m.

    weight_bytes/act_bytes: bytes per element of weights and of GEMM inputs (1 for fp8);
    out_bytes: bytes per element of GEMM outputs (2 for bf16).
    """
    rows = m * topk
    w1 = experts_touched * (2 * n * k * weight_bytes + _scale_bytes(2 * n, k, block_shape))
    w2 = experts_touched * (k * n * weight_bytes + _scale_bytes(k, n, block_shape))
    g1 = Work(2.0 * rows * 2 * n * k, w1 + m * k * act_bytes + rows * 2 * n * out_bytes)
    g2 = Work(2.0 * rows * n * k, w2 + rows * n * act_bytes + rows * k * out_bytes)
    return g1, g2


def fused_work(
    *,
    m: int,
    n: int,
    k: int,
    topk: int,
    experts_touched: int,
    weight_bytes: float,
    act_bytes: float,
    out_bytes: float,
    block_shape: tuple[int, int] | None = None,
) -> Work:
    """Work of the whole fused call: weights touched + input read once + output written once."""
    w = experts_touched * (
        3 * n * k * weight_bytes
        + _scale_bytes(2 * n, k, block_shape)
        + _scale_bytes(k, n, block_shape)
    )
    # The input is read in the model's activation dtype (out_bytes), quantised in-kernel.
    return Work(2.0 * m * topk * 3 * n * k, w + m * k * out_bytes + m * k * out_bytes)


def fractions(work: Work, time_us: float, ceil: Ceilings) -> dict[str, float | None]:
    """Achieved rates and their fractions of the ceilings for a measured time."""
    if time_us <= 0:
        raise ValueError(f"time_us={time_us} must be > 0")
    bw = work.bytes / (time_us * 1e-6)
    rate = work.flops / (time_us * 1e-6)
    floor = work.floor_us(ceil)
    return {
        "flops": work.flops,
        "bytes": work.bytes,
        "achieved_bytes_per_s": bw,
        "achieved_flops_per_s": rate,
        "bw_fraction": bw / ceil.copy_bytes_per_s if ceil.copy_bytes_per_s else None,
        "flops_fraction": rate / ceil.matmul_flops_per_s if ceil.matmul_flops_per_s else None,
        "roofline_us": floor,
        "roofline_fraction": floor / time_us if floor is not None else None,
    }


def measure_ceilings(device: Any = None, matmul_dtype: Any = None) -> Ceilings:
    """Measure copy bandwidth and matmul rate once on the GPU; CPU -> Ceilings(None, None).

    Copy: a 2 GiB device-to-device copy, bytes read + written. Matmul: an 8192^3 product of
    random (not zero) inputs in `matmul_dtype` (default bf16). Median of 10 after warm-up.
    """
    import torch

    if not torch.cuda.is_available():
        return Ceilings(None, None, None, "n/a: no GPU (interpreter timings)")
    dt = matmul_dtype or torch.bfloat16
    dev = device if device is not None else torch.device("cuda", torch.cuda.current_device())

    def median_ms(fn, reps: int = 10) -> float:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            s = torch.cuda.Event(enable_timing=True)
            e = torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e))
        times.sort()
        return times[len(times) // 2]

    n_bytes = 2 << 30
    bufs = [torch.empty(n_bytes, dtype=torch.uint8, device=dev).random_(0, 255)]
    bufs.append(torch.empty_like(bufs[0]))
    ms = median_ms(lambda: bufs[1].copy_(bufs[0]))
    bw = 2 * n_bytes / (ms * 1e-3)
    bufs.clear()
    size = 8192
    a = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
    note = ""
    fn = None
    if dt == torch.bfloat16 or dt == torch.float16:
        a, b = a.to(dt), b.to(dt)

        def fn():
            return a @ b
    else:  # fp8: torch's scaled matmul when it runs here, else the bf16 rate (noted)
        try:
            a8 = a.to(dt)
            b8 = b.t().contiguous().to(dt).t()
            one = torch.ones((), device=dev, dtype=torch.float32)
            torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

            def fn():
                return torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        except Exception as e:  # noqa: BLE001
            note = f"fp8 matmul unavailable ({type(e).__name__}); bf16 rate used"
            dt = torch.bfloat16

            def fn():
                return a @ b

    ms = median_ms(fn)
    rate = 2 * size**3 / (ms * 1e-3)
    torch.cuda.empty_cache()
    return Ceilings(bw, rate, str(dt).replace("torch.", ""), note)
