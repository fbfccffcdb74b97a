rule export:
    input:
        verifier=VERIFIER_INPUT,  # the export names it as its verifier (name_or_path)
        weights="results/train/{checkpoint}/checkpoint/model.safetensors",
        drafter_config="results/train/{checkpoint}/checkpoint/drafter_config.json",
        summary="results/train/{checkpoint}/summary.json",  # the training's settings, recorded in the export
    output:
        out=directory("results/export/{checkpoint}"),
    wildcard_constraints:
        checkpoint="|".join(CHECKPOINTS),
    params:
        **stage_params("export"),
        verifier=verifier_path,
        checkpoint_dir=parent("weights", "input"),
    resources:
        **SLURM,
    log:
        "logs/export/{checkpoint}.log",
    benchmark:
        "benchmarks/export/{checkpoint}.tsv"
    shell:
        domino("export")
