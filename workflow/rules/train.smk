rule train:
    input:
        verifier=VERIFIER_INPUT,
        vocab=vocab_of,
        features=features_of("train"),
        held_out=held_out_of,  # served validation's prompts (train.served_prompts), else none
    output:
        weights="results/train/{checkpoint}/checkpoint/model.safetensors",
        drafter_config="results/train/{checkpoint}/checkpoint/drafter_config.json",
        metrics="results/train/{checkpoint}/metrics.jsonl",
        summary="results/train/{checkpoint}/summary.json",
    wildcard_constraints:
        checkpoint="|".join(TRAINED),  # a seed replicate (domino-seed1) trains as its checkpoint, seed + r
    params:
        **stage_params("train"),
        verifier=verifier_path,
        checkpoint_dir=parent("weights"),
        state_dir="results/train/{checkpoint}/state",  # resumable state: kept when a job is interrupted
    resources:
        **SLURM_GPU,
    log:
        "logs/train/{checkpoint}.log",
    benchmark:
        "benchmarks/train/{checkpoint}.tsv"
    shell:
        domino("train", train_launcher())


rule validate:
    input:
        weights="results/train/{checkpoint}/checkpoint/model.safetensors",
        features=features_of("val"),
    output:
        out="results/validate/{checkpoint}.json",
    wildcard_constraints:
        checkpoint="|".join(TRAINED),  # seed replicates too: their teacher-forced spread
    params:
        **stage_params("validate"),
        checkpoint_dir=parent("weights", "input"),
    resources:
        **SLURM_GPU,
    log:
        "logs/validate/{checkpoint}.log",
    benchmark:
        "benchmarks/validate/{checkpoint}.tsv"
    shell:
        domino("validate")
