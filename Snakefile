# cellbench: tune -> serve (untuned, tuned) -> GSM8K -> report -> archive, per cell.
# The rules live in workflow/rules/, one file per stage; their logic in workflow/cellbench/.
from snakemake.utils import min_version

min_version("9.27")  # pyproject.toml pins 9.27.1


include: "workflow/rules/common.smk"
include: "workflow/rules/onstart.smk"
include: "workflow/rules/assets.smk"
include: "workflow/rules/tune.smk"
include: "workflow/rules/serve.smk"
include: "workflow/rules/compare.smk"
include: "workflow/rules/gsm8k.smk"
include: "workflow/rules/gates.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/archive.smk"
include: "workflow/rules/configs.smk"
include: "workflow/rules/history.smk"


rule all:
    default_target: True
    input:
        all_targets(),
