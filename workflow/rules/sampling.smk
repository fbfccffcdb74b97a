# Speculative sampling at each temperature T > 0 of benchmark.temperatures (T = 0 is the greedy
# benchmark): one job per T decodes every prompt by plain sampling and by each checkpoint's
# speculative sampling, with the same seeds. results/sampling/T<T>/<run>.json, as the greedy files.

# (TEMPERATURES and sampling_outputs: common.smk)

rule sampling:
    input:
        verifier=VERIFIER_INPUT,
        weights=expand("results/train/{run}/checkpoint/model.safetensors", run=CHECKPOINTS),
    output:
        baseline="results/sampling/T{temperature}/baseline.json",
        outs=expand("results/sampling/T{{temperature}}/{run}.json", run=CHECKPOINTS),
    wildcard_constraints:
        temperature="[0-9.]+",
    params:
        **stage_params("sampling"),
        verifier=verifier_path,
        runs=CHECKPOINTS,
        checkpoint_dirs=parents("weights"),
    log:
        "logs/sampling/T{temperature}.log",
    benchmark:
        "benchmarks/sampling/T{temperature}.tsv"
    shell:
        domino("sampling")
