"""Nightlies watched: ``cellbench watch`` (follow moved tags and run what they affect), the
history of every archived run per ROCm version with its change points, and ``cellbench
bisect`` (the first bad image between a good and a bad one)."""
