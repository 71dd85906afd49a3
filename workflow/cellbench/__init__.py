"""cellbench: a reproducible benchmark pipeline for fused-MoE inference.

Import nothing heavy here: parts of this package (tune/, with its kernels and shapes, and
common/) run inside the vLLM image with only the standard library, torch and triton.
"""

__version__ = "0.1.0"
