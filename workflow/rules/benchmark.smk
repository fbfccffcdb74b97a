rule benchmark_baseline:
    input:
        VERIFIER_INPUT,
    output:
        out="results/benchmark/baseline.json",
    params:
        config=stage_params("benchmark_baseline"),
        verifier=VERIFIER,
    log:
        "logs/benchmark/baseline.log",
    benchmark:
        "benchmarks/benchmark/baseline.tsv"
    shell:
        domino("benchmark_baseline")


rule benchmark:
    input:
        VERIFIER_INPUT,
        baseline="results/benchmark/baseline.json",
        weights="results/train/{run}/checkpoint/model.safetensors",
    output:
        out="results/benchmark/{run}.json",
    wildcard_constraints:
        run="|".join(CHECKPOINTS),
    params:
        config=stage_params("benchmark"),
        verifier=VERIFIER,
        checkpoint_dir=parent("weights", "input"),
    log:
        "logs/benchmark/{run}.log",
    benchmark:
        "benchmarks/benchmark/{run}.tsv"
    shell:
        domino("benchmark")
