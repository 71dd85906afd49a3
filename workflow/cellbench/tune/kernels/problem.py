"""The benchmark problem of the builtin fused-MoE kernel: random inputs of one shape
(``MoEProblem``, ``make_problem``) and the calls the tuner times on them (``run_gemms``, the
two grouped GEMMs; ``run_fused``, the whole call).

In-container module: standard library, torch and triton only.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

import torch

from cellbench.tune.shapes import MoEShape

# The kernel module itself, not the function the package re-exports under its name: its
# launchers, and the launch policy's switches, are read at call time, where kernel_options and
# tests set them.
fm = importlib.import_module("cellbench.tune.kernels.fused_moe")
policy = importlib.import_module("cellbench.tune.kernels.launch_policy")


@dataclass
class MoEProblem:
    """Inputs of one fused-MoE call, ready to run (for tuning and benchmarking).

    dtype: the activation dtype name ("bf16", "fp16", "fp32"); weights are fp8 when
    `quant` is set (from shape.dtype == "fp8_w8a8").
    """

    shape: MoEShape
    m: int
    dtype: str
    hidden_states: torch.Tensor
    w1: torch.Tensor
    w2: torch.Tensor
    topk_weights: torch.Tensor
    topk_ids: torch.Tensor
    quant: policy.QuantArgs | None = None
    _prepared: dict[tuple[int, bool], dict[str, Any]] = field(default_factory=dict, repr=False)

    @property
    def device(self) -> torch.device:
        return self.hidden_states.device


def _quantise_weight(
    w: torch.Tensor, block: tuple[int, int] | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8 weights and float32 scales: per expert, or per (bn x bk) block."""
    f8 = policy.fp8_dtype()
    fmax = torch.finfo(f8).max
    e, r, c = w.shape
    if block is None:
        s = w.abs().amax(dim=(1, 2)).clamp_min(1e-10) / fmax
        q = (w / s[:, None, None]).clamp(-fmax, fmax).to(f8)
        return q, s.float()
    bn, bk = block
    blocks = w.reshape(e, r // bn, bn, c // bk, bk)
    s = blocks.abs().amax(dim=(2, 4)).clamp_min(1e-10) / fmax
    q = (blocks / s[:, :, None, :, None]).clamp(-fmax, fmax).to(f8).reshape(e, r, c)
    return q, s.float()


def make_problem(
    shape: MoEShape,
    m: int,
    dtype: str = "bf16",
    device: str | torch.device = "cpu",
    seed: int = 0,
    *,
    weights_from: MoEProblem | None = None,
) -> MoEProblem:
    """Random inputs for `shape` at M=m tokens: x ~ N(0,1), weights ~ N(0,1)/sqrt(fan_in)
    (quantised to fp8 when shape.dtype is "fp8_w8a8"), routing = renormalised softmax top-k
    of random logits. dtype is the activation dtype ("bf16", "fp16", "fp32"); passing the
    shape's quantised dtype means bf16 activations. `weights_from` reuses another problem's
    weights (same shape and dtype): new tokens and routing without regenerating weights.

    Tokens and routing come from a CPU generator, so a seed gives the same ones on every
    device; weights come from a generator on `device` (the same for a seed on one model of
    device): one layer of Qwen3-30B-A3B has 0.6 G weight values, which the CPU took seconds
    to draw at the start of every tuning run."""
    if m < 1:
        raise ValueError(f"m={m} must be >= 1")
    if shape.dtype is not None and dtype == shape.dtype:
        dtype = "bf16"
    name = policy._DTYPE_ALIASES.get(dtype, dtype)
    if name not in policy._DTYPES:
        raise ValueError(f"dtype={dtype!r} must be one of {', '.join(policy._DTYPES)}")
    if shape.dtype not in (None, "fp8_w8a8"):
        raise ValueError(f"shape dtype {shape.dtype!r} is not supported by the builtin kernel")
    act = policy._DTYPES[name]
    dev = torch.device(device)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    e, n, k, topk = shape.num_experts, shape.intermediate_size, shape.hidden_size, shape.topk

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=gen).to(dev)

    x = randn(m, k).to(act)
    logits = randn(m, e)
    probs = torch.softmax(logits.float(), dim=-1)
    tw, ids = torch.topk(probs, topk, dim=-1)
    tw = (tw / tw.sum(dim=-1, keepdim=True)).float()
    if weights_from is not None:
        if weights_from.shape != shape or weights_from.dtype != name:
            raise ValueError(
                f"weights_from has shape {weights_from.shape} / dtype {weights_from.dtype}, "
                f"not {shape} / {name}"
            )
        wf = weights_from
        return MoEProblem(shape, m, name, x, wf.w1, wf.w2, tw, ids.to(torch.int32), wf.quant)
    # drawn on the device; one generator for both (a fresh one each would repeat w1's stream)
    wgen = torch.Generator(device=dev).manual_seed(seed) if dev.type != "cpu" else gen
    w1f = torch.randn(e, 2 * n, k, generator=wgen, device=dev).mul_(k**-0.5)
    w2f = torch.randn(e, k, n, generator=wgen, device=dev).mul_(n**-0.5)
    quant = None
    if shape.dtype == "fp8_w8a8":
        w1, s1 = _quantise_weight(w1f, shape.block_shape)
        w2, s2 = _quantise_weight(w2f, shape.block_shape)
        quant = policy.QuantArgs("fp8_w8a8", s1, s2, shape.block_shape)
    else:
        w1, w2 = w1f.to(act), w2f.to(act)
    del w1f, w2f
    return MoEProblem(shape, m, name, x, w1, w2, tw, ids.to(torch.int32), quant)


def _prepare(problem: MoEProblem, config: dict[str, Any]) -> dict[str, Any]:
    """Align, activation quantisation and intermediate buffers for `run_gemms` (cached per
    BLOCK_SIZE_M, since that is all the alignment depends on)."""
    bm = config["BLOCK_SIZE_M"]
    p, q = problem, problem.quant
    naive = policy._naive(p.topk_ids.numel(), p.shape.num_experts)
    if (bm, naive) in problem._prepared:
        return problem._prepared[(bm, naive)]
    if naive:
        align = fm._naive_assignment(p.topk_ids)
    else:
        align = fm.moe_align_block_size(p.topk_ids, bm, p.shape.num_experts)
    a1, a1_scale = (p.hidden_states, None) if q is None else fm._quantise_rows(p.hidden_states, q)
    pairs = p.topk_ids.numel()
    dt = p.hidden_states.dtype
    c1 = torch.empty((pairs, p.w1.shape[1]), dtype=dt, device=p.device)
    fm._gemm(a1, a1_scale, p.w1, q.w1_scale if q else None, c1, p.topk_weights, align,
          p.shape.topk, False, config, q, naive=naive)  # fmt: skip
    c2, c2_scale = fm._silu_mul(c1, dt, q)
    c3 = torch.empty((pairs, p.w2.shape[1]), dtype=dt, device=p.device)
    prep = {"align": align, "a1": a1, "a1_scale": a1_scale, "c1": c1, "c2": c2,
            "c2_scale": c2_scale, "c3": c3, "naive": naive}  # fmt: skip
    problem._prepared[(bm, naive)] = prep
    return prep


def run_gemms(problem: MoEProblem, config: dict[str, Any], path: str = "auto") -> torch.Tensor:
    """Only the two GEMMs. Grouped path: on inputs aligned and quantised beforehand (once per
    BLOCK_SIZE_M); returns GEMM 2's (M*topk, K) output, routing weight applied. Few-token
    path (see `fused_moe`): the one launch that does both (and the activation), same output."""
    policy.check_config(config, problem.quant)
    p, q = problem, problem.quant
    ch = policy._chain(p.hidden_states, p.topk_ids.numel())  # as in fused_moe: the same kernels
    if policy.kernel_path(p.m, q, path, config) == "decode":
        if policy.DECODE_KERNEL == "slice":  # one launch does it all: the GEMMs are the whole call
            return fm._decode_slice(p.hidden_states, p.w1, p.w2, p.topk_weights, p.topk_ids, config)
        return fm._decode(p.hidden_states, p.w1, p.w2, p.topk_weights, p.topk_ids, config, ch)
    prep = _prepare(problem, config)
    fm._gemm(prep["a1"], prep["a1_scale"], p.w1, q.w1_scale if q else None, prep["c1"],
          p.topk_weights, prep["align"], p.shape.topk, False, config, q,
          launch_next=ch, naive=prep["naive"])  # fmt: skip
    fm._gemm(prep["c2"], prep["c2_scale"], p.w2, q.w2_scale if q else None, prep["c3"],
          p.topk_weights, prep["align"], 1, True, config, q, ch, ch, prep["naive"])  # fmt: skip
    return prep["c3"]


def run_fused(
    problem: MoEProblem,
    config: dict[str, Any],
    out: torch.Tensor | None = None,
    path: str = "auto",
) -> torch.Tensor:
    """The whole fused call on the problem's inputs; returns (M, K) (into `out` if given)."""
    p = problem
    return fm.fused_moe(p.hidden_states, p.w1, p.w2, p.topk_weights, p.topk_ids, config,
                     quant=p.quant, out=out, path=path)  # fmt: skip
