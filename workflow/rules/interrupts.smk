# A SIGINT or SIGTERM sent to the Snakemake process alone stops the running jobs within
# seconds (cellbench/interrupts.py): Snakemake by itself would let them run to the end.
# This is the workflow's only `onstart` hook; a second one would silently replace it.


onstart:
    from cellbench import interrupts

    interrupts.install()
