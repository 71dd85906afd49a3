"""The project's Triton fused-MoE kernel as a transformers experts implementation.

transformers 5.24 dispatches the forward of experts classes decorated with
``use_experts_implementation`` (Qwen3-MoE's ``Qwen3MoeExperts`` among them) to the function
registered under the model config's ``experts_implementation``. ``register()`` adds
``experts_forward`` under ``NAME``; a model loaded with ``experts_implementation=NAME`` (or
switched with ``model.set_experts_implementation(NAME)``) then runs every MoE layer through
``cellbench.tune.kernels.fused_moe``, with the launch config that vLLM would pick for the call's
token count (``cellbench.tune.kernels.config_lookup``: ``VLLM_TUNED_CONFIG_FOLDER`` first, the
nearest batch size, vLLM's default otherwise), and logs vLLM's line saying which.

Qwen3-MoE's experts hold ``gate_up_proj`` (E, 2N, K), gate rows first, and ``down_proj``
(E, K, N): exactly the kernel's (vLLM's) w1 and w2, used as they are, without copies.

Inference only: the Triton kernels have no backward. On a machine without a GPU they run under
Triton's interpreter (``cellbench.tune.kernels`` sets ``TRITON_INTERPRET=1`` before importing
triton, so import this module before anything else imports triton).
"""

from __future__ import annotations

import torch

from cellbench.tune import kernels  # noqa: F401 - first: decides TRITON_INTERPRET before triton loads
from cellbench.tune.kernels import config_lookup
from cellbench.tune.kernels.fused_moe import fused_moe
from cellbench.tune.kernels.launch_policy import DECODE_RULE_MAX_TOKENS

__all__ = ["NAME", "experts_forward", "launch_config", "register", "unsupported_reason"]

NAME = "cellbench_triton"

# Config keys vLLM may put in a default or a file that mean "no change" for this kernel.
_NEUTRAL_KEYS = {"SPLIT_K": 1}


def unsupported_reason(experts: torch.nn.Module) -> str | None:
    """Why this experts module cannot run on the kernel (None when it can)."""
    if not getattr(experts, "has_gate", True):
        return "experts without a gate projection (up_proj only)"
    if getattr(experts, "has_bias", False):
        return "experts with biases"
    if getattr(experts, "is_transposed", False):
        return "transposed expert weights"
    if not getattr(experts, "is_concatenated", True):
        return "interleaved gate/up rows"
    if getattr(experts, "has_post_expert_norm", False):
        return "a norm after each expert"
    act = getattr(getattr(experts, "config", None), "hidden_act", "silu")
    if act not in ("silu", "swish"):
        return f"activation {act!r} (the kernel applies SiLU-and-mul)"
    w1 = getattr(experts, "gate_up_proj", None)
    w2 = getattr(experts, "down_proj", None)
    if not isinstance(w1, torch.Tensor) or not isinstance(w2, torch.Tensor):
        return "no gate_up_proj/down_proj tensors"
    if w1.dim() != 3 or w2.dim() != 3:
        return f"weights of shapes {tuple(w1.shape)} / {tuple(w2.shape)} (want 3-D)"
    if w1.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return f"weights of dtype {w1.dtype} (quantised checkpoints are not wired here)"
    return None


def _dtype_part(act: torch.dtype) -> str | None:
    # vLLM names float32 activations in the file name and leaves bf16/fp16 out.
    return "float32" if act == torch.float32 else None


def launch_config(experts: torch.nn.Module, m: int, act_dtype: torch.dtype) -> dict[str, int]:
    """The launch config for a call of ``m`` tokens on ``experts``, as vLLM would choose it."""
    e, _, k = experts.gate_up_proj.shape
    n = experts.down_proj.shape[2]
    topk = int(getattr(experts.config, "num_experts_per_tok", 1) or 1)
    cfg = config_lookup.lookup(m, e, n, k, topk, _dtype_part(act_dtype), None)
    for key, neutral in _NEUTRAL_KEYS.items():
        if key in cfg and cfg[key] == neutral:
            del cfg[key]
    return cfg


def launch_path(experts: torch.nn.Module, m: int, act_dtype: torch.dtype) -> str:
    """The kernel path for a call of ``m`` tokens: "decode" where the tuner measured the
    few-token path faster with the config this call takes (the tuned file's nearest entry,
    recorded in its ``.paths.json``), else "auto" (the grouped path; nothing is assumed)."""
    if m > DECODE_RULE_MAX_TOKENS:
        return "auto"
    e, _, _ = experts.gate_up_proj.shape
    n = experts.down_proj.shape[2]
    res = config_lookup.resolve(e, n, _dtype_part(act_dtype), None)
    if res.table is None or not res.path_choices:
        return "auto"
    choice = res.path_choices.get(str(config_lookup.nearest_key(res.table, m)))
    return "decode" if choice and choice.get("path") == "decode" else "auto"


def experts_forward(
    self: torch.nn.Module,
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
) -> torch.Tensor:
    """(tokens, hidden) output of the experts for routed tokens, through the Triton kernel."""
    why = unsupported_reason(self)
    if why is not None:
        raise NotImplementedError(f"experts_implementation={NAME!r} does not support {why}")
    m = hidden_states.shape[0]
    if m == 0:
        return torch.zeros_like(hidden_states)
    w1, w2 = self.gate_up_proj, self.down_proj
    x = hidden_states.contiguous()
    if x.dtype != w1.dtype:
        x = x.to(w1.dtype)
    ids = top_k_index
    weights = top_k_weights.to(torch.float32)
    num_experts = w1.shape[0]
    if getattr(self, "_is_expert_parallel", False) or bool((ids >= num_experts).any()):
        # Expert parallel marks pairs routed to another rank's experts with ids >= E: they
        # contribute nothing here, so route them to expert 0 with weight 0.
        foreign = ids >= num_experts
        ids = ids.masked_fill(foreign, 0)
        weights = weights.masked_fill(foreign, 0.0)
    cfg = launch_config(self, m, x.dtype)
    path = launch_path(self, m, x.dtype)
    with torch.no_grad():
        out = fused_moe(
            x, w1.detach(), w2.detach(), weights.contiguous(), ids.contiguous(), cfg, path=path
        )
    return out.to(hidden_states.dtype)


def register(name: str = NAME) -> str:
    """Add ``experts_forward`` to transformers' experts registry under ``name``; returns it."""
    from transformers.integrations.moe import ExpertsInterface

    ExpertsInterface.register(name, experts_forward)
    return name
