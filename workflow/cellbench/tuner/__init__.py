"""Fused-MoE config tuner: search spaces, timing, search modes, artifacts, roofline.

In-container package: standard library, torch and triton (vLLM only for --backend vllm).
Entry point: `python -m cellbench.tuner ...` == `cellbench tune ...` (`cli.main`).
"""
