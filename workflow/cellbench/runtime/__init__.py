"""Where a step runs: images pinned by digest (`images`, `pins`), containers with GPUs passed
through (`container`), GPU leases (`leases`) and one job step in the image or on the host
(`steps`, what the tune rule runs); a signal to Snakemake alone stops its running jobs
(`interrupts`, installed by workflow/rules/onstart.smk).

Reads the image lock (config/images.lock.yaml) and writes it (`cellbench images`, through
`cellbench.config.images_command`); the lease files under the lease folder; a step's log.
"""
