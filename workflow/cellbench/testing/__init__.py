"""Real test servers used by cellbench's tests and benchmarks (not test doubles of cellbench)."""
