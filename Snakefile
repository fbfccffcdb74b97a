# Domino reproduction workflow: `snakemake --cores 1 reports/model_card.md`.
# Stages live in workflow/rules/; every rule calls `python -m domino <stage>`, whose config keys
# and paths are declared once in domino/stages.py.
import os

# config.yaml beside this Snakefile is the base; `--configfile FILE...` overlays are merged over it.
# With `--directory DIR` every output (results/, reports/, logs/, benchmarks/) goes under DIR.
configfile: os.path.join(workflow.basedir, "config.yaml")

# `snakemake --report reports/report.html`: the card, the reproduction report and the plots
report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/verifier.smk"
include: "workflow/rules/features.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/benchmark.smk"
include: "workflow/rules/sampling.smk"
include: "workflow/rules/export.smk"
include: "workflow/rules/vllm.smk"
include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        "reports/model_card.md",
        expand("results/export/{checkpoint}", checkpoint=CHECKPOINTS),
