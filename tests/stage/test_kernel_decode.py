"""The builtin kernel's few-token (decode) path against the reference, its scratch and sync
words, GPU replays, and the kernel path rules (which calls take which path). Same conventions
as test_kernel.py: the interpreter without a GPU, fresh seeds, NaN-poisoned outputs."""

from __future__ import annotations

import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from cellbench.tune.kernels import (  # noqa: E402
    QuantArgs,
    kernel_path,
    make_problem,
    run_fused,
    run_gemms,
)
from cellbench.tune.kernels.reference import (  # noqa: E402
    error_bound,
    problem_error_bound,
    relative_error,
    torch_moe_reference,
)
from cellbench.tune.shapes import MoEShape  # noqa: E402
from support.kernel_cases import (  # noqa: E402, F401
    CONFIGS,
    DEVICE,
    TINY,
    _check_fused,
    _fitting,
    _sm90,
    fresh_seed,
)

DECODE_KERNELS = ("slice", "ticket")


@pytest.mark.parametrize("kernel", DECODE_KERNELS)
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("m", [1, 2, 3])
@pytest.mark.parametrize(
    "shape",
    # The second shape has N % BLOCK_SIZE_N != 0 (wrapped columns) and K % BLOCK_SIZE_K != 0.
    [TINY, MoEShape(6, 24, 40, 3)],
    ids=["tiny", "ragged"],
)
def test_decode_path_matches_reference(
    monkeypatch, kernel: str, dtype: str, m: int, shape: MoEShape
) -> None:
    if DEVICE == "cpu" and dtype == "bf16":
        pytest.skip("needs a GPU: the Triton interpreter's bf16 tl.dot is unusable")
    monkeypatch.setattr(
        sys.modules["cellbench.tune.kernels.launch_policy"], "DECODE_KERNEL", kernel
    )
    seed = fresh_seed()
    p = make_problem(shape, m, dtype, DEVICE, seed)
    cfg = CONFIGS[0]
    out = torch.full_like(p.hidden_states, float("nan"))
    run_fused(p, cfg, out=out, path="decode")
    assert torch.isfinite(out).all(), f"seed {seed}"
    ref = torch_moe_reference(p)
    assert relative_error(out, ref) < problem_error_bound(p), f"seed {seed}"
    # The GEMM-only entry point: the ticket kernel's GEMM 2 rows per pair (routing weight
    # applied), summed by a kernel of their own; the slice kernel's whole call.
    rows = run_gemms(p, cfg, path="decode")
    summed = rows.float().reshape(m, -1, shape.hidden_size).sum(dim=1)
    assert rows.shape[0] == (m if kernel == "slice" else m * shape.topk)
    assert relative_error(summed, ref) < problem_error_bound(p), f"seed {seed}"


def test_decode_slice_kernel_leaves_its_scratch_zeroed(monkeypatch) -> None:
    """The slice kernel adds every slice's share of a token's output into an fp32 row and
    counts the slices in; the last one in writes the row out and zeroes row and count. So
    every call starts clean: calls in a row agree, and the scratch reads zero after."""
    fm = sys.modules["cellbench.tune.kernels.fused_moe"]
    policy = sys.modules["cellbench.tune.kernels.launch_policy"]
    monkeypatch.setattr(policy, "DECODE_KERNEL", "slice")
    seed = fresh_seed()
    p = make_problem(MoEShape(6, 24, 40, 3), 2, "fp32", DEVICE, seed)
    cfg = {**CONFIGS[0], "BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 16}
    first = run_fused(p, cfg, path="decode").clone()
    acc, count = fm._DECODE_SCRATCH[(p.hidden_states.device, 2, 40)]
    assert not acc.any() and not count.any(), f"seed {seed}"
    ref = torch_moe_reference(p)
    assert relative_error(first, ref) < problem_error_bound(p), f"seed {seed}"
    for _ in range(3):
        again = run_fused(p, cfg, path="decode")
        # fp32 atomics may add in another order on a GPU: equal to rounding, not bit for bit
        assert relative_error(again, first) < 1e-6, f"seed {seed}"
    assert not acc.any() and not count.any(), f"seed {seed}"


def test_decode_path_leaves_its_sync_words_zeroed(monkeypatch) -> None:
    """The ticket kernel hands out its tiles by a ticket counter and holds GEMM 2 back
    with per-pair counts of finished GEMM 1 tiles; its last program zeroes them. So every
    call starts clean: calls in a row give the same rows, and the words read zero after."""
    fm = sys.modules["cellbench.tune.kernels.fused_moe"]
    policy = sys.modules["cellbench.tune.kernels.launch_policy"]
    monkeypatch.setattr(policy, "DECODE_KERNEL", "ticket")
    seed = fresh_seed()
    p = make_problem(MoEShape(6, 24, 40, 3), 2, "fp32", DEVICE, seed)
    cfg = {**CONFIGS[0], "BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 16}
    first = run_gemms(p, cfg, path="decode").clone()
    sync = fm._DECODE_SYNC[(p.hidden_states.device, p.topk_ids.numel())]
    assert sync.tolist() == [0] * (2 + p.topk_ids.numel()), f"seed {seed}"
    for _ in range(3):
        assert torch.equal(run_gemms(p, cfg, path="decode"), first), f"seed {seed}"
    assert not sync.any(), f"seed {seed}"
    ref = torch_moe_reference(p)
    summed = first.reshape(2, 3, -1).sum(dim=1)
    assert relative_error(summed, ref) < problem_error_bound(p), f"seed {seed}"


@pytest.mark.skipif(DEVICE == "cpu", reason="needs a GPU: the interpreter runs programs in turn")
@pytest.mark.parametrize("bn", [16, 32, 64])
@pytest.mark.parametrize("m", [1, 4])
def test_decode_path_on_gpu_replays_exactly(monkeypatch, bn: int, m: int) -> None:
    """On a GPU the ticket kernel's GEMM 2 tiles run beside GEMM 1 tiles and wait for
    them: any ordering flaw shows as a wrong or varying result. Eager calls, chained and not,
    and 20 replays of a CUDA graph all give the first call's output bit for bit, and it
    matches the reference."""
    policy = sys.modules["cellbench.tune.kernels.launch_policy"]
    monkeypatch.setattr(policy, "DECODE_KERNEL", "ticket")
    seed = fresh_seed()
    p = make_problem(MoEShape(16, 512, 1024, 8), m, "bf16", DEVICE, seed)
    cfg = {**CONFIGS[0], "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": 128}
    monkeypatch.setattr(policy, "CHAIN_KERNELS", False)
    first = torch.full_like(p.hidden_states, float("nan"))
    run_fused(p, cfg, out=first, path="decode")
    torch.cuda.synchronize()
    assert relative_error(first, torch_moe_reference(p)) < problem_error_bound(p), f"seed {seed}"
    for chain in (False, True):
        monkeypatch.setattr(policy, "CHAIN_KERNELS", chain)
        out = torch.full_like(p.hidden_states, float("nan"))
        run_fused(p, cfg, out=out, path="decode")
        torch.cuda.synchronize()
        assert torch.equal(out, first), f"eager, chained={chain}, seed {seed}"
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run_fused(p, cfg, out=out, path="decode")
    for i in range(20):
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, first), f"graph replay {i}, seed {seed}"


@pytest.mark.skipif(DEVICE == "cpu", reason="needs a GPU: the interpreter runs programs in turn")
@pytest.mark.parametrize("bn", [32, 64, 128])
@pytest.mark.parametrize("m", [1, 4])
def test_decode_slice_kernel_on_gpu_replays(monkeypatch, bn: int, m: int) -> None:
    """On a GPU the slice kernel's programs add into the same rows at once and the last one
    in per token writes the row out: a lost add, an early read or a row left unzeroed shows
    as a wrong or drifting result. Eager calls and 20 replays of a CUDA graph agree with the
    first call to fp32 rounding (the adds' order varies), match the reference, and leave the
    scratch zeroed."""
    fm = sys.modules["cellbench.tune.kernels.fused_moe"]
    policy = sys.modules["cellbench.tune.kernels.launch_policy"]
    monkeypatch.setattr(policy, "DECODE_KERNEL", "slice")
    seed = fresh_seed()
    p = make_problem(MoEShape(16, 512, 1024, 8), m, "bf16", DEVICE, seed)
    cfg = {**CONFIGS[0], "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": 128}
    first = torch.full_like(p.hidden_states, float("nan"))
    run_fused(p, cfg, out=first, path="decode")
    torch.cuda.synchronize()
    bound = problem_error_bound(p)
    assert relative_error(first, torch_moe_reference(p)) < bound, f"seed {seed}"
    # bf16 outputs of fp32 sums that differ only in order: one bf16 ulp apart at most, and
    # near zero (cancelling terms) by the fp32 rounding of the terms' scale
    close = {"rtol": 2**-7, "atol": 1e-4 * first.abs().max().item()}
    out = torch.full_like(first, float("nan"))
    run_fused(p, cfg, out=out, path="decode")
    torch.cuda.synchronize()
    torch.testing.assert_close(out, first, **close, msg=f"eager, seed {seed}")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run_fused(p, cfg, out=out, path="decode")
    for i in range(20):
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, first, **close, msg=f"graph replay {i}, seed {seed}")
    acc, count = fm._DECODE_SCRATCH[(p.hidden_states.device, m, 1024)]
    assert not acc.any() and not count.any(), f"seed {seed}"


@pytest.mark.parametrize("limit", [0, 2])
def test_kernel_path_rules(limit: int, monkeypatch) -> None:
    monkeypatch.setattr(
        sys.modules["cellbench.tune.kernels.launch_policy"], "DECODE_MAX_TOKENS", limit
    )
    q = QuantArgs("fp8_w8a8", torch.ones(1), torch.ones(1))
    for m in range(1, limit + 1):
        assert kernel_path(m, None) == "decode"
    assert kernel_path(limit + 1, None) == "grouped"
    assert kernel_path(1, q) == "grouped"  # fp8 always takes the grouped GEMMs
    assert kernel_path(1, None, "decode") == "decode"
    assert kernel_path(1, None, "grouped") == "grouped"
    with pytest.raises(ValueError, match="unquantised"):
        kernel_path(1, q, "decode")
    with pytest.raises(ValueError, match="path='fast'"):
        kernel_path(1, None, "fast")


def test_kernel_path_default_rule() -> None:
    """Unforced, the few-token path is taken only where a measurement recorded for the config
    in hand says it wins, and only up to DECODE_RULE_MAX_TOKENS; else the grouped path."""
    policy = sys.modules["cellbench.tune.kernels.launch_policy"]
    assert policy.DECODE_MAX_TOKENS is None
    cut = policy.DECODE_RULE_MAX_TOKENS
    cfg, other = CONFIGS[0], CONFIGS[1]
    try:
        assert [kernel_path(m, None, "auto", cfg) for m in (1, cut, cut + 1)] == ["grouped"] * 3
        policy.record_path_choice(1, cfg, "decode")
        policy.load_path_choices({str(cut + 1): {"config": cfg, "path": "decode"}})
        policy.record_path_choice(cut, cfg, "grouped")
        assert kernel_path(1, None, "auto", cfg) == "decode"
        assert kernel_path(1, None, "auto", other) == "grouped"  # measured for cfg only
        assert kernel_path(1, None) == "grouped"  # no config: no measurement applies
        assert kernel_path(cut, None, "auto", cfg) == "grouped"
        assert kernel_path(cut + 1, None, "auto", cfg) == "grouped"  # beyond the cut
        q = QuantArgs("fp8_w8a8", torch.ones(1), torch.ones(1))
        assert kernel_path(1, q, "auto", cfg) == "grouped"
        with pytest.raises(ValueError, match="'decode' or 'grouped'"):
            policy.record_path_choice(1, cfg, "auto")
        with pytest.raises(ValueError, match="expected"):
            policy.load_path_choices({"1": {"path": "decode"}})
        seed = fresh_seed()  # the recorded choice reaches the call: same result either way
        p = make_problem(TINY, 1, "fp32", DEVICE, seed)
        assert relative_error(run_fused(p, cfg), torch_moe_reference(p)) < error_bound("fp32")
    finally:
        policy.clear_path_choices()
