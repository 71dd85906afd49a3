"""The one tiny MoE shape the tuner tests share."""

from __future__ import annotations

TINY = {
    "model_type": "qwen3_moe",
    "num_experts": 8,
    "moe_intermediate_size": 32,
    "hidden_size": 64,
    "num_experts_per_tok": 2,
}
