"""The tuned configs, gathered (configs rule, `collect`): every cell's tuned vLLM files per device
into one folder usable as VLLM_TUNED_CONFIG_FOLDER, with a manifest and the AITER CSV.

Reads results/{cell}/tune/ through cellbench.results and the image lock; writes
results/configs/{label}/{device}/ and INDEX.json (last).
"""
