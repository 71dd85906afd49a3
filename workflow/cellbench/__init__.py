"""cellbench: a reproducible benchmark pipeline for fused-MoE inference.

Import nothing heavy here: parts of this package (shapes, kernels, tuner) run
inside the vLLM image with only the standard library, torch and triton.
"""

__version__ = "0.1.0"
