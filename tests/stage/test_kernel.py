"""The builtin Triton fused-MoE kernel against plain references.

Without a GPU the kernels run under Triton's interpreter (set before triton is imported by
the kernels package). There only fp16/fp32 are checked end to end: the interpreter's bf16
`tl.dot` is unusable, and its fp8 conversion mis-rounds (see test_fp8_quant_kernels).
Every check draws fresh random inputs (the seed is in the failure message) and poisons the
outputs with NaN first, so an element the kernel fails to write cannot pass.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from cellbench.tune.kernels import (  # noqa: E402
    QuantArgs,
    fused_moe,
    interpreter_active,
    make_problem,
    moe_align_block_size,
    run_fused,
    run_gemms,
)
from cellbench.tune.kernels.fused_moe import _gemm, _quantise_rows  # noqa: E402
from cellbench.tune.kernels.launch_policy import _use_b_descriptor, fp8_dtype  # noqa: E402
from cellbench.tune.kernels.reference import (  # noqa: E402
    error_bound,
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


def align_reference(ids: list[int], block_m: int, num_experts: int) -> tuple[list[int], list[int]]:
    """moe_align_block_size in plain Python: pairs grouped by expert in flat order, padded."""
    sentinel = len(ids)
    sorted_ids: list[int] = []
    expert_ids: list[int] = []
    for e in range(num_experts):
        pairs = [i for i, x in enumerate(ids) if x == e]
        if not pairs:
            continue
        pad = -len(pairs) % block_m
        sorted_ids += pairs + [sentinel] * pad
        expert_ids += [e] * ((len(pairs) + pad) // block_m)
    return sorted_ids, expert_ids


@pytest.mark.parametrize(
    "m, num_experts, topk, block_m, id_dtype",
    [
        (1, 8, 2, 16, torch.int32),  # fewer pairs than experts
        (5, 8, 2, 16, torch.int64),
        (33, 8, 2, 4, torch.int32),
        (100, 16, 4, 32, torch.int32),  # several histogram chunks
        (70, 64, 8, 16, torch.int64),
        (9, 3, 3, 1, torch.int32),  # every expert used, block of one
        (16, 128, 8, 16, torch.int32),  # 128 pairs: the largest single-program case
        (43, 16, 3, 64, torch.int32),  # 129 pairs: the smallest multi-program case
    ],
)
def test_align_matches_python_reference(m, num_experts, topk, block_m, id_dtype) -> None:
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(num_experts, generator=g)[:topk] for _ in range(m)])
    ids = ids.to(id_dtype).to(DEVICE)
    sorted_ids, expert_ids, total = moe_align_block_size(ids, block_m, num_experts)
    want_sorted, want_experts = align_reference(ids.flatten().tolist(), block_m, num_experts)
    t = int(total.item())
    assert t == len(want_sorted), f"seed {seed}"
    assert sorted_ids[:t].tolist() == want_sorted, f"seed {seed}"
    assert expert_ids[: t // block_m].tolist() == want_experts, f"seed {seed}"
    assert all(x == -1 for x in expert_ids[t // block_m :].tolist()), f"seed {seed}"
    assert sorted_ids.numel() >= t and sorted_ids.dtype == torch.int32


def test_align_rejects_bad_block() -> None:
    ids = torch.zeros((2, 2), dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="BLOCK_SIZE_M=24"):
        moe_align_block_size(ids, 24, 4)
    with pytest.raises(ValueError, match="2-D"):
        moe_align_block_size(ids.flatten(), 16, 4)


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("m", [1, 5, 33])
@pytest.mark.parametrize("config", CONFIGS, ids=["bm16", "bm32", "bm64"])
def test_fused_matches_reference(dtype: str, m: int, config: dict) -> None:
    seed = fresh_seed()
    _check_fused(make_problem(TINY, m, dtype, DEVICE, seed), _fitting(config, dtype), seed)


@pytest.fixture
def weights_through_descriptors(monkeypatch):
    """Grouped GEMMs load weight tiles through tensor descriptors (TMA on a GPU that has it;
    the interpreter emulates them)."""
    monkeypatch.setattr(sys.modules["cellbench.tune.kernels.launch_policy"], "B_OPERAND_TMA", True)


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("m", [5, 33])
@pytest.mark.parametrize("config", CONFIGS, ids=["bm16", "bm32", "bm64"])
@pytest.mark.parametrize("shape", [TINY, MoEShape(6, 24, 40, 3)], ids=["tiny", "ragged"])
def test_grouped_gemms_with_weight_descriptors(
    weights_through_descriptors, dtype: str, m: int, config: dict, shape: MoEShape
) -> None:
    big_tile = config["BLOCK_SIZE_K"] * config["BLOCK_SIZE_N"] > 4096
    if DEVICE == "cuda" and dtype == "fp32" and big_tile:
        pytest.skip("needs no GPU: fp32 tiles this large overflow shared memory with TMA's "
                    "buffering on a GPU (the automatic rule never gives fp32 weights to "
                    "TMA)")  # fmt: skip
    seed = fresh_seed()
    p = make_problem(shape, m, dtype, DEVICE, seed)
    pairs = p.topk_ids.numel()
    assert _use_b_descriptor(p.w1, config, pairs) and _use_b_descriptor(p.w2, config, pairs)
    _check_fused(p, config, seed, path="grouped")


@pytest.mark.parametrize("gemms", [(1,), (2,), (1, 2)], ids=["gemm1", "gemm2", "both"])
@pytest.mark.parametrize("config", CONFIGS[:2], ids=["bm16", "bm32"])
@pytest.mark.parametrize("flatten", [True, False], ids=["flat", "nested"])
def test_persistent_gemms_give_the_one_tile_result(
    monkeypatch, gemms: tuple[int, ...], config: dict, flatten: bool
) -> None:
    """Persistent GEMMs (a few programs looping over every tile) write what the one-tile-per-
    program kernel writes, bit for bit: same tiles, same reduction order. m=33 gives several
    row blocks per expert and more tiles than programs."""
    policy = sys.modules["cellbench.tune.kernels.launch_policy"]
    seed = fresh_seed()
    p = make_problem(MoEShape(6, 24, 40, 3), 33, "fp16", DEVICE, seed)
    monkeypatch.setattr(policy, "CHAIN_KERNELS", False)
    plain = run_fused(p, config, path="grouped").clone()
    monkeypatch.setattr(policy, "PERSISTENT_GEMMS", gemms)
    monkeypatch.setattr(policy, "PERSISTENT_MIN_PAIRS", 1)
    monkeypatch.setattr(policy, "PERSISTENT_FLATTEN", flatten)
    assert policy.m_dependent_choices(33, 3, None)[3] == (1 in gemms, 2 in gemms)
    _check_fused(p, config, seed, path="grouped")
    assert torch.equal(run_fused(p, config, path="grouped"), plain), f"seed {seed}"


def test_persistence_rule(monkeypatch) -> None:
    """Both GEMMs run persistent from 8192 pairs (M=1024 at top-8, what run 18 measured),
    unquantised only, and never where kernels are chained."""
    policy = sys.modules["cellbench.tune.kernels.launch_policy"]
    q = QuantArgs("fp8_w8a8", torch.ones(1), torch.ones(1))
    assert policy.m_dependent_choices(1024, 8, None)[3] == (True, True)
    assert policy.m_dependent_choices(512, 8, None)[3] == (False, False)
    assert policy.m_dependent_choices(4096, 8, q)[3] == (False, False)
    monkeypatch.setattr(policy, "PERSISTENT_QUANTISED", True)
    assert policy.m_dependent_choices(4096, 8, q)[3] == (True, True)
    monkeypatch.setattr(policy, "CHAIN_KERNELS", True)  # forced chaining wins
    assert policy.m_dependent_choices(4096, 8, None)[3] == (False, False)


@pytest.mark.skipif(
    DEVICE == "cpu", reason="needs a GPU: the Triton interpreter's bf16 tl.dot is unusable"
)
@pytest.mark.parametrize("m", [1, 5, 33])
def test_fused_bf16_on_gpu(m: int) -> None:
    seed = fresh_seed()
    _check_fused(make_problem(TINY, m, "bf16", DEVICE, seed), CONFIGS[0], seed)


def test_run_gemms_is_the_fused_call_without_the_sum() -> None:
    seed = fresh_seed()
    p = make_problem(MoEShape(8, 64, 64, 3), 7, "fp32", DEVICE, seed)
    cfg = CONFIGS[0]
    c3 = run_gemms(p, cfg)  # first call also prepares (aligns, fills the SiLU output)
    (prep,) = p._prepared.values()  # one preparation: one BLOCK_SIZE_M, one assignment
    prep["c1"].fill_(float("nan"))
    c3.fill_(float("nan"))
    c3 = run_gemms(p, cfg)
    assert torch.isfinite(prep["c1"]).all() and torch.isfinite(c3).all(), f"seed {seed}"
    summed = c3.reshape(7, 3, -1).sum(dim=1)
    ref = torch_moe_reference(p)
    assert relative_error(summed, ref) < error_bound("fp32"), f"seed {seed}"
    assert relative_error(run_fused(p, cfg), summed) < 1e-6, f"seed {seed}"


def test_non_power_of_two_shape() -> None:
    # K not a multiple of BLOCK_SIZE_K and N not a multiple of BLOCK_SIZE_N.
    seed = fresh_seed()
    p = make_problem(MoEShape(6, 24, 40, 3), 9, "fp32", DEVICE, seed)
    _check_fused(p, CONFIGS[0], seed)


def _torch_quant(x: torch.Tensor, group: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic fp8 quantisation in torch (the kernel's scheme), for feeding the GEMM."""
    f8 = fp8_dtype()
    fmax = torch.finfo(f8).max
    if group is None:
        s = (x.abs().amax().float() / fmax).reshape(1)
        return (x / s).clamp(-fmax, fmax).to(f8), s
    r, c = x.shape
    s = x.reshape(r, c // group, group).abs().amax(-1).float() / fmax
    q = (x.reshape(r, c // group, group) / s[..., None]).clamp(-fmax, fmax).to(f8)
    return q.reshape(r, c), s


@pytest.mark.parametrize("b_tma", [False, True], ids=["pointers", "descriptors"])
@pytest.mark.parametrize("block", [None, (32, 32)], ids=["per-tensor", "block32"])
def test_fp8_gemm_with_torch_quantised_activations(block, b_tma: bool, monkeypatch) -> None:
    """The fp8 grouped GEMM (scales per expert or per block) on activations quantised by
    torch: compared with float64 on the same dequantised values, so only accumulation
    order differs. Weight tiles through pointers or through tensor descriptors."""
    from cellbench.tune.kernels.reference import _dequantise

    monkeypatch.setattr(sys.modules["cellbench.tune.kernels.launch_policy"], "B_OPERAND_TMA", b_tma)
    seed = fresh_seed()
    shape = MoEShape(8, 64, 128, 2, "fp8_w8a8", block)
    p = make_problem(shape, 5, "fp32", DEVICE, seed)
    q = p.quant
    xq, xs = _torch_quant(p.hidden_states, block[1] if block else None)
    x64 = xq.double() * (xs.double() if block is None else xs.double().repeat_interleave(32, 1))
    cfg = CONFIGS[0]
    align = moe_align_block_size(p.topk_ids, cfg["BLOCK_SIZE_M"], 8)
    c1 = torch.full((10, 128), float("nan"), device=DEVICE)
    _gemm(xq, xs, p.w1, q.w1_scale, c1, p.topk_weights, align, 2, False, cfg, q)
    pairs = p.topk_ids.flatten().tolist()
    ref = torch.stack(
        [x64[i // 2] @ _dequantise(p.w1[e], q.w1_scale[e], block).T for i, e in enumerate(pairs)]
    )
    assert relative_error(c1, ref) < 1e-5, f"seed {seed}"


@pytest.mark.parametrize("block", [None, (32, 32)], ids=["per-tensor", "block32"])
def test_fp8_gemm_persistent_gives_the_one_tile_result(block, monkeypatch) -> None:
    """The fp8 grouped GEMM run persistent (off by default for fp8: PERSISTENT_QUANTISED)
    writes what one tile per program writes, bit for bit: what turning it on would rest on."""
    policy = sys.modules["cellbench.tune.kernels.launch_policy"]
    monkeypatch.setattr(policy, "CHAIN_KERNELS", False)
    seed = fresh_seed()
    p = make_problem(MoEShape(8, 64, 128, 2, "fp8_w8a8", block), 5, "fp32", DEVICE, seed)
    xq, xs = _torch_quant(p.hidden_states, block[1] if block else None)
    cfg = CONFIGS[0]
    align = moe_align_block_size(p.topk_ids, cfg["BLOCK_SIZE_M"], 8)
    outs = []
    for gemms in ((), (1,)):
        monkeypatch.setattr(policy, "PERSISTENT_GEMMS", gemms)
        monkeypatch.setattr(policy, "PERSISTENT_MIN_PAIRS", 1)
        monkeypatch.setattr(policy, "PERSISTENT_QUANTISED", True)
        c1 = torch.full((10, 128), float("nan"), device=DEVICE)
        _gemm(xq, xs, p.w1, p.quant.w1_scale, c1, p.topk_weights, align, 2, False, cfg, p.quant)
        outs.append(c1)
    assert policy.m_dependent_choices(5, 2, p.quant)[3] == (True, False)
    assert torch.isfinite(outs[0]).all() and torch.equal(outs[0], outs[1]), f"seed {seed}"


@pytest.mark.parametrize("block", [None, (32, 32)], ids=["per-tensor", "block32"])
def test_fp8_quant_kernels(block) -> None:
    seed = fresh_seed()
    # 96 columns: three groups of 32, so a program's group tile is partly masked.
    x = torch.randn(6, 96, generator=torch.Generator().manual_seed(seed)).to(DEVICE)
    q, s = _quantise_rows(x, QuantArgs("fp8_w8a8", x, x, block))
    _, want_s = _torch_quant(x, block[1] if block else None)
    # The scales involve no fp8 rounding: they must agree to float32 precision everywhere.
    torch.testing.assert_close(s.reshape(want_s.shape), want_s, rtol=1e-6, atol=0)
    if interpreter_active():
        pytest.skip(
            "needs a GPU: Triton's interpreter rounds float->fp8 wrongly when the mantissa "
            "carries into the next binade (e.g. 126.2 -> 64 instead of 128); fp8 values checked "
            "on GPU"
        )
    s_full = s if block is None else s.repeat_interleave(block[1], 1)
    torch.testing.assert_close(q.float(), (x / s_full).to(fp8_dtype()).float(), rtol=0, atol=0)


def test_silu_mul_group_quant_scales() -> None:
    """The fused SiLU-and-mul + per-group quantisation: scales are exact fp32 arithmetic."""
    from cellbench.tune.kernels.fused_moe import _silu_mul

    seed = fresh_seed()
    c1 = torch.randn(5, 2 * 96, generator=torch.Generator().manual_seed(seed)).to(DEVICE)
    q, s = _silu_mul(c1, torch.float32, QuantArgs("fp8_w8a8", c1, c1, (32, 32)))
    y = torch.nn.functional.silu(c1[:, :96]) * c1[:, 96:]
    want = y.reshape(5, 3, 32).abs().amax(-1) / torch.finfo(fp8_dtype()).max
    assert q.shape == (5, 96) and q.dtype == fp8_dtype()
    torch.testing.assert_close(s, want, rtol=1e-5, atol=0)


@pytest.mark.skipif(
    interpreter_active(), reason="needs a GPU: fp8 conversion is wrong under the interpreter"
)
@pytest.mark.parametrize("block", [None, (128, 128)], ids=["per-tensor", "block128"])
@pytest.mark.parametrize("m", [1, 33])
def test_fused_fp8_on_gpu(block, m: int) -> None:
    seed = fresh_seed()
    p = make_problem(MoEShape(8, 256, 256, 2, "fp8_w8a8", block), m, "bf16", DEVICE, seed)
    _check_fused(p, {**CONFIGS[0], "BLOCK_SIZE_K": 64}, seed)


def test_chaining_rule_stays_off_where_it_cannot_run(monkeypatch) -> None:
    policy = sys.modules["cellbench.tune.kernels.launch_policy"]
    p = make_problem(TINY, 1, "fp32", DEVICE, seed=0)
    monkeypatch.setattr(policy, "CHAIN_KERNELS", True)
    assert policy._chain(p.hidden_states, 2) == _sm90()  # forced: still only where it can run
    monkeypatch.setattr(policy, "CHAIN_KERNELS", None)
    assert policy._chain(p.hidden_states, policy.CHAIN_MAX_PAIRS) == _sm90()
    assert not policy._chain(p.hidden_states, policy.CHAIN_MAX_PAIRS + 1)
    monkeypatch.setattr(policy, "CHAIN_KERNELS", False)
    assert not policy._chain(p.hidden_states, 1)


@pytest.mark.skipif(
    not _sm90(), reason="needs a GPU: programmatic dependent launch needs CUDA sm90+"
)
@pytest.mark.parametrize(
    "quant", [None, (128, 128), "tensor"], ids=["bf16", "fp8-block", "fp8-tensor"]
)
@pytest.mark.parametrize("m", [1, 3, 40])
def test_chained_kernels_give_the_unchained_result(monkeypatch, quant, m: int) -> None:
    """Chaining changes when kernels start, not what they compute: chained launches (forced
    at every M here), eager and inside a CUDA graph (where they become programmatic graph
    edges), give exactly the unchained output, which matches the reference. Outputs are
    poisoned with NaN before each run."""
    policy = sys.modules["cellbench.tune.kernels.launch_policy"]
    seed = fresh_seed()
    if quant is None:
        shape = MoEShape(16, 256, 512, 4)
    else:
        shape = MoEShape(8, 256, 256, 2, "fp8_w8a8", None if quant == "tensor" else quant)
    p = make_problem(shape, m, "bf16", DEVICE, seed)
    cfg = {**CONFIGS[0], "BLOCK_SIZE_K": 64}
    monkeypatch.setattr(policy, "CHAIN_KERNELS", False)
    _check_fused(p, cfg, seed)
    plain = run_fused(p, cfg)
    monkeypatch.setattr(policy, "CHAIN_KERNELS", True)
    out = torch.full_like(p.hidden_states, float("nan"))
    run_fused(p, cfg, out=out)
    torch.cuda.synchronize()
    assert torch.equal(out, plain), f"eager, seed {seed}"
    out.fill_(float("nan"))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run_fused(p, cfg, out=out)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, plain), f"graph, seed {seed}"


def test_make_problem_routing_and_determinism() -> None:
    a = make_problem(TINY, 6, "fp32", DEVICE, seed=3)
    b = make_problem(TINY, 6, "float32", DEVICE, seed=3)
    assert torch.equal(a.hidden_states, b.hidden_states) and torch.equal(a.topk_ids, b.topk_ids)
    assert torch.equal(a.w1, b.w1) and torch.equal(a.w2, b.w2)
    torch.testing.assert_close(a.topk_weights.sum(-1), torch.ones(6, device=DEVICE))
    # weights ~ N(0, 1/fan_in)
    assert 0.8 < float(a.w1.float().std() * 64**0.5) < 1.2
    assert 0.8 < float(a.w2.float().std() * 32**0.5) < 1.2
    # w2 continues w1's random stream, it does not repeat it (undo the 1/sqrt(fan_in) scales)
    head = 256
    w1_head = a.w1.flatten()[:head].float() * 64**0.5
    assert not torch.allclose(a.w2.flatten()[:head].float() * 32**0.5, w1_head)
    assert all(len(set(row)) == 2 for row in a.topk_ids.tolist())
    assert (
        a.topk_ids.dtype == torch.int32 and a.w1.shape == (8, 64, 64) and a.w2.shape == (8, 64, 32)
    )
    c = make_problem(TINY, 6, "fp32", DEVICE, seed=4)
    assert not torch.equal(a.hidden_states, c.hidden_states) and not torch.equal(a.w1, c.w1)
    f = make_problem(MoEShape(8, 128, 128, 2, "fp8_w8a8", (128, 128)), 2, "fp8_w8a8", DEVICE)
    assert f.dtype == "bf16" and f.w1.dtype == fp8_dtype() and f.quant.w1_scale.shape == (8, 2, 1)
    with pytest.raises(ValueError, match="dtype='int4'"):
        make_problem(TINY, 2, "int4", DEVICE)
    with pytest.raises(ValueError, match="m=0"):
        make_problem(TINY, 0, "fp32", DEVICE)


def test_bad_configs_and_inputs_are_named() -> None:
    p = make_problem(TINY, 3, "fp32", DEVICE, seed=1)
    base = CONFIGS[0]
    cases = [
        ({k: v for k, v in base.items() if k != "BLOCK_SIZE_N"}, "BLOCK_SIZE_N"),
        ({**base, "BLOCK_SIZE_K": 48}, "BLOCK_SIZE_K=48"),
        ({**base, "BLOCK_SIZE_MM": 16}, "'BLOCK_SIZE_MM'"),
        ({**base, "num_warps": 3}, "num_warps=3"),
        ({**base, "GROUP_SIZE_M": 0}, "GROUP_SIZE_M=0"),
        ({**base, "num_stages": "2"}, "num_stages='2'"),
    ]
    for cfg, needle in cases:
        with pytest.raises(ValueError, match=None) as ei:
            run_fused(p, cfg)
        assert needle in str(ei.value)
    x, w1, w2, tw, ids = p.hidden_states, p.w1, p.w2, p.topk_weights, p.topk_ids
    with pytest.raises(ValueError, match="shape mismatch"):
        fused_moe(x[:, :32], w1, w2, tw, ids, base)
    with pytest.raises(ValueError, match="must match hidden_states dtype"):
        fused_moe(x.half(), w1, w2, tw, ids, base)
    with pytest.raises(ValueError, match="topk_ids"):
        fused_moe(x, w1, w2, tw[:2], ids[:2], base)
    with pytest.raises(ValueError, match="int32 or int64"):
        fused_moe(x, w1, w2, tw, ids.float(), base)
    with pytest.raises(ValueError, match="out"):
        fused_moe(x, w1, w2, tw, ids, base, out=torch.empty(3, 8, device=DEVICE))
    bad_q = QuantArgs("int8_w8a16", w1, w2)
    with pytest.raises(ValueError, match="'int8_w8a16'"):
        fused_moe(x, w1.to(fp8_dtype()), w2.to(fp8_dtype()), tw, ids, base, quant=bad_q)
    f = make_problem(MoEShape(8, 128, 128, 2, "fp8_w8a8", (128, 128)), 2, "fp16", DEVICE)
    with pytest.raises(ValueError, match="BLOCK_SIZE_K=256"):
        run_fused(f, {**base, "BLOCK_SIZE_K": 256})
    with pytest.raises(ValueError, match="w1_scale"):
        q = QuantArgs("fp8_w8a8", f.quant.w1_scale[:, :1], f.quant.w2_scale, (128, 128))
        fused_moe(f.hidden_states, f.w1, f.w2, f.topk_weights, f.topk_ids, base, quant=q)
    with pytest.raises(ValueError, match="no error bound"):
        error_bound("int4")


# The shape and config of the compile-only tests' scripts; argv[1:3]: m, "block" or "bf16".
_SCRIPT_CASE = """
import sys
from cellbench.tune.shapes import MoEShape
m, block = int(sys.argv[1]), sys.argv[2] == "block"
shape = MoEShape(16, 256, 512, 4, "fp8_w8a8", (128, 128)) if block else MoEShape(16, 256, 512, 4)
cfg = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
       "num_warps": 4, "num_stages": 3}
"""

# argv[3]: "warm" (compile only) or "run" (a real call)
_WARM_SCRIPT = (
    _SCRIPT_CASE
    + """
import torch
from cellbench.tune.kernels import make_problem, run_fused, warm_config
what = sys.argv[3]
if what == "warm":
    warm_config(shape, m, "bf16", cfg, "cuda")
else:
    run_fused(make_problem(shape, m, "bf16", "cuda", seed=0), cfg)
    torch.cuda.synchronize()
"""
)


# A compile-only pool of one worker, started (forked) by a fresh process that has opened no
# GPU and run no kernel, as the tuner's is; argv[3:6]: capability major, minor, SM count.
_POOL_SCRIPT = (
    _SCRIPT_CASE
    + """
import json
from cellbench.tune import compilepool
cap, sms = (int(sys.argv[3]), int(sys.argv[4])), int(sys.argv[5])
compilepool.SHARED_WARMUPS = True
pool = compilepool.CompilePool(1, "builtin", shape.to_dict(), "bf16", 0, compile_only=True)
try:
    assert pool.compile_only
    pool.assume_device(cap, sms)
    pool.prefetch(m, [cfg])
    pool.wait(m, cfg)
    results = [f.result()[:2] for f in pool._futures.values()]
finally:
    pool.close()
bad = [msg for ok, msg in results if not ok]
print(json.dumps([not bad, "; ".join(bad)]))
"""
)


def _compiled(cache: Path) -> set[str]:
    """Names of the config-dependent kernels compiled into a Triton cache directory."""
    names = ("_moe_gemm_kernel", "_moe_decode_kernel")
    return {str(p.relative_to(cache)) for p in cache.rglob("*.json") if p.stem in names}


@pytest.mark.skipif(DEVICE == "cpu", reason="needs a GPU: the interpreter compiles nothing")
@pytest.mark.parametrize(
    "m, block", [(1, False), (64, False), (64, True)], ids=["decode", "grouped", "fp8-block"]
)
def test_warm_config_compiles_what_the_real_call_uses(tmp_path: Path, m: int, block: bool) -> None:
    """warm_config compiles without running; a later real call in another process (as the
    tuner's compile workers and main process are) then finds every config-dependent kernel
    in the cache and compiles none of them again."""
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "workflow")}  # fmt: skip
    kind = "block" if block else "bf16"
    for what in ("warm", "run"):
        subprocess.run([sys.executable, "-c", _WARM_SCRIPT, str(m), kind, what], env=env,
                       check=True, timeout=300)  # fmt: skip
        if what == "warm":
            warmed = _compiled(tmp_path / "cache")
            assert warmed, "warm_config compiled nothing"
    assert _compiled(tmp_path / "cache") == warmed, "the real call compiled its kernel again"


@pytest.mark.skipif(DEVICE == "cpu", reason="needs a GPU: the real call must load the binary")
@pytest.mark.parametrize(
    "m, block",
    [(1, False), (64, False), (2048, False), (64, True)],
    ids=["decode", "grouped", "persistent", "fp8-block"],
)
def test_compile_only_worker_compiles_what_the_real_call_uses(
    tmp_path: Path, m: int, block: bool
) -> None:
    """The tuner's compile-only workers never open the GPU (told its capability and SM count
    by this process); they compile the config's kernels and the batch size's
    config-independent ones (alignment, activation, quantisation, sums), and the real call
    in another process then compiles nothing at all: every kernel it launches is in the
    cache. M=2048 at top-4 is 8192 pairs: the persistent GEMMs, whose grid depends on the SM
    count."""
    from cellbench.tune.kernels.launch_policy import device_facts

    cache = tmp_path / "cache"
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache),
           "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "workflow")}  # fmt: skip
    kind = "block" if block else "bf16"
    (major, minor), sms = device_facts("cuda:0")
    # The pool runs in a fresh process, as in the tuner. Forked from this one, its workers
    # would inherit Triton's in-memory kernels from earlier tests, find the shared kernels
    # there and write nothing to this test's cache (run 28, the whole file on the H200).
    out = subprocess.run([sys.executable, "-c", _POOL_SCRIPT, str(m), kind, str(major),
                          str(minor), str(sms)], env=env, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    ok, msg = json.loads(out.stdout.strip().splitlines()[-1])
    assert ok, msg
    warmed = _compiled(cache)
    assert warmed, "the compile-only worker compiled nothing"
    everything = {str(p.relative_to(cache)) for p in cache.rglob("*.json")}
    subprocess.run([sys.executable, "-c", _WARM_SCRIPT, str(m), kind, "run"], env=env,
                   check=True, timeout=300)  # fmt: skip
    assert _compiled(cache) == warmed, "the real call compiled its kernel again"
    added = {str(p.relative_to(cache)) for p in cache.rglob("*.json")} - everything
    assert not added, f"the real call compiled kernels the workers did not: {sorted(added)}"


def test_decode_launch_key_names_what_the_kernel_reads(monkeypatch) -> None:
    """The tuner screens one config per distinct few-token launch: BLOCK_SIZE_M and
    GROUP_SIZE_M never matter there; BLOCK_SIZE_N below 32 gives the slice kernel the same
    16-column slices, while the ticket kernel tiles GEMM 2 by it."""
    policy = sys.modules["cellbench.tune.kernels.launch_policy"]
    base = {**CONFIGS[0], "BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 64, "num_warps": 4}
    wide = {**base, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_M": 64, "GROUP_SIZE_M": 8}
    monkeypatch.setattr(policy, "DECODE_KERNEL", "slice")
    assert policy.decode_launch_key(base) == policy.decode_launch_key(wide)
    assert policy.decode_launch_key(base) != policy.decode_launch_key({**base, "num_warps": 8})
    assert policy.decode_launch_key(base) != policy.decode_launch_key({**base, "BLOCK_SIZE_N": 64})
    monkeypatch.setattr(policy, "DECODE_KERNEL", "ticket")
    assert policy.decode_launch_key(base) != policy.decode_launch_key(wide)
    assert policy.decode_launch_key(base) == policy.decode_launch_key({**base, "BLOCK_SIZE_M": 64})


@pytest.mark.parametrize("naive", [False, True], ids=["aligned", "naive"])
@pytest.mark.parametrize("m", [1, 5])
@pytest.mark.parametrize("config", CONFIGS[:2], ids=["bm16", "bm32"])
def test_naive_assignment_matches_reference(naive: bool, m: int, config: dict, monkeypatch) -> None:
    """Naive assignment (no alignment, one row block per pair) gives the reference result, also
    where pairs share an expert (M=5 over 8 experts at top-2 always has shared experts), for
    the whole call and for the GEMMs alone."""
    policy = sys.modules["cellbench.tune.kernels.launch_policy"]
    monkeypatch.setattr(policy, "NAIVE_ASSIGNMENT", naive)
    seed = fresh_seed()
    p = make_problem(TINY, m, "fp32", DEVICE, seed)
    _check_fused(p, config, seed)
    with policy.kernel_options(SWAP_AB_UNQUANTISED=True):  # the unquantised swap (BM 16/32 < 64)
        _check_fused(p, dict(config, BLOCK_SIZE_N=64), seed)
    c3 = run_gemms(p, config)
    (prep,) = p._prepared.values()
    assert prep["naive"] is naive
    summed = c3.reshape(m, TINY.topk, -1).sum(dim=1)
    assert relative_error(summed, torch_moe_reference(p)) < error_bound("fp32"), f"seed {seed}"


def test_naive_assignment_rule(monkeypatch) -> None:
    """By default naive assignment is taken while pairs * NAIVE_SPARSITY <= experts."""
    policy = sys.modules["cellbench.tune.kernels.launch_policy"]
    assert policy.NAIVE_ASSIGNMENT is None
    assert policy._naive(32, 128) and not policy._naive(33, 128)  # Qwen3-30B-A3B: M <= 4 at top-8
    assert policy.m_dependent_choices(4, 8, None, 128)[4] is True
    assert policy.m_dependent_choices(5, 8, None, 128)[4] is False
    monkeypatch.setattr(policy, "NAIVE_ASSIGNMENT", False)
    assert not policy._naive(1, 128)


@pytest.mark.parametrize("naive", [False, True], ids=["aligned", "naive"])
@pytest.mark.parametrize("scalar", [False, True], ids=["vector-scale", "scalar-scale"])
@pytest.mark.parametrize("swap", [False, True], ids=["ab", "swapped"])
@pytest.mark.parametrize("b_tma", [False, True], ids=["pointers", "descriptors"])
def test_fp8_block_gemm_variants(naive, scalar, swap, b_tma, monkeypatch) -> None:
    """The block-quantised fp8 GEMM with operands swapped or not, the weight scale as a scalar
    or a vector, naive or aligned rows, weights through pointers or descriptors: each against
    float64 on the same dequantised values (torch-quantised activations, as above)."""
    from cellbench.tune.kernels.reference import _dequantise

    fm = sys.modules["cellbench.tune.kernels.fused_moe"]
    policy = sys.modules["cellbench.tune.kernels.launch_policy"]
    for name, v in (("B_OPERAND_TMA", b_tma), ("FP8_SWAP_AB", swap),
                    ("FP8_SCALE_SCALAR", scalar)):  # fmt: skip
        monkeypatch.setattr(policy, name, v)
    seed = fresh_seed()
    block = (32, 32)
    shape = MoEShape(8, 64, 128, 2, "fp8_w8a8", block)
    p = make_problem(shape, 5, "fp32", DEVICE, seed)
    q = p.quant
    xq, xs = _torch_quant(p.hidden_states, block[1])
    x64 = xq.double() * xs.double().repeat_interleave(32, 1)
    # BLOCK_SIZE_N 32 = the scale block (a scalar scale is possible); 16-row tiles
    cfg = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 1}
    if naive:
        align = fm._naive_assignment(p.topk_ids)
    else:
        align = moe_align_block_size(p.topk_ids, cfg["BLOCK_SIZE_M"], 8)
    assert policy._swap_ab(cfg, q, p.w1) is swap
    c1 = torch.full((10, 128), float("nan"), device=DEVICE)
    _gemm(xq, xs, p.w1, q.w1_scale, c1, p.topk_weights, align, 2, False, cfg, q, naive=naive)
    pairs = p.topk_ids.flatten().tolist()
    ref = torch.stack(
        [x64[i // 2] @ _dequantise(p.w1[e], q.w1_scale[e], block).T for i, e in enumerate(pairs)]
    )
    assert relative_error(c1, ref) < 1e-5, f"seed {seed}"


def test_swap_rule_and_kernel_options() -> None:
    """The operand swap is for fp8 only and, by rule, only on a capability 9.0 GPU;
    kernel_options sets switches for a block and puts them back, refusing unknown names."""
    policy = sys.modules["cellbench.tune.kernels.launch_policy"]
    p = make_problem(MoEShape(8, 64, 128, 2, "fp8_w8a8", (32, 32)), 1, "fp32", DEVICE, 1)
    small = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 1}
    big = dict(small, BLOCK_SIZE_M=64)
    sm90 = (
        DEVICE == "cuda" and not torch.version.hip and policy.device_facts(p.w1.device)[0] == (9, 0)
    )
    assert policy._swap_ab(small, p.quant, p.w1) is (sm90 and not interpreter_active())
    assert policy._swap_ab(big, p.quant, p.w1) is False
    assert policy._swap_ab(small, None, p.w1) is False
    with policy.kernel_options(FP8_SWAP_AB=True, NAIVE_ASSIGNMENT=False):
        assert policy._swap_ab(big, p.quant, p.w1) and not policy._naive(1, 128)
        assert policy._swap_ab(big, None, p.w1) is False  # unquantised: its own switch
    with policy.kernel_options(SWAP_AB_UNQUANTISED=True):
        assert policy._swap_ab(small, None, p.w1) and not policy._swap_ab(big, None, p.w1)
    assert policy.FP8_SWAP_AB is None and policy.NAIVE_ASSIGNMENT is None
    assert policy.SWAP_AB_UNQUANTISED is False
    with pytest.raises(ValueError, match="unknown kernel option"):
        with policy.kernel_options(FAST=True):
            pass
