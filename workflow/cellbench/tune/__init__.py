"""The tune stage (tune rule): the model's MoE shapes (`shapes`), the builtin Triton fused-MoE
kernel (`kernels/`), and the tuner: search spaces, timing, search modes, compile workers,
baseline, roofline, vLLM's kernel from a wheel, artifacts (`cli` is the job).

Reads the model's config.json (shape), the image's shipped vLLM config (baseline) and, on a
resume, its own tuning_log.jsonl; writes results/{cell}/tune/: configs/<vLLM name>.json,
tuned_fmoe.csv, tuning_log.jsonl and summary.json last (tune.schema.json, checksummed).

In-container package: the vLLM image mounts the workflow folder read-only and runs
`python -m cellbench.tune ...` (== `cellbench tune ...`), so everything here imports only the
standard library, torch, triton (vLLM for --backend vllm) and cellbench.common.
"""
