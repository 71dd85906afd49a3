"""Where the config enters (top of the stages): `loader` validates a config file (schema, then
what a schema cannot say) and lists the cells, reading YAML strictly (`strict_yaml`, with
`ConfigError`), checking environment variables (`env`) and what a model's config.json says at
plan time (`model_plan`) and report.latency_bounds' per-point entries and plan warnings
(`latency_bounds`); `jobargs` turns a cell into each job's command line (tracked
settings and untracked host part); `images_command` is `cellbench images`.

Reads config/*.yaml and the model configs it names; writes nothing (the images command writes
the lock through cellbench.runtime.images).
"""

from cellbench.config.loader import ConfigError, load  # noqa: F401 - the config's entry points
