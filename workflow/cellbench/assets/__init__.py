"""The embedded default's inputs (assets rule): a tiny Qwen3-MoE-architecture model with random
weights and a locally trained tokenizer, and a generated GSM8K-format set (`build`).

Reads nothing but its arguments; writes results/assets/... .
"""
