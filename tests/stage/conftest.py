"""Fixtures shared by this folder's test modules."""

from support.gsm8k_run import lm_eval_run  # noqa: F401  (a module-scoped fixture)
