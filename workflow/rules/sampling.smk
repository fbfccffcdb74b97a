# Speculative sampling at each temperature T > 0 of benchmark.temperatures (T = 0 is the greedy
# benchmark): one job per T and suite decodes every task by plain sampling and by each
# checkpoint's speculative sampling, with the same seeds. results/sampling/T<T>/<suite>/<row>.json,
# as the greedy files.

# (TEMPERATURES and sampling_outputs: common.smk)

rule sampling:
    input:
        verifier=VERIFIER_INPUT,
        weights=expand("results/train/{checkpoint}/checkpoint/model.safetensors", checkpoint=CHECKPOINTS),
    output:
        baseline="results/sampling/T{temperature}/{suite}/baseline.json",
        outs=expand("results/sampling/T{{temperature}}/{{suite}}/{row}.json", row=CHECKPOINTS),
    wildcard_constraints:
        temperature="[0-9.]+",
        suite="|".join(SUITES),
    params:
        **stage_params("sampling"),
        verifier=verifier_path,
        rows=CHECKPOINTS,
        checkpoint_dirs=parents("weights"),
    resources:
        **SLURM_GPU,
    log:
        "logs/sampling/T{temperature}/{suite}.log",
    benchmark:
        "benchmarks/sampling/T{temperature}/{suite}.tsv"
    shell:
        domino("sampling")
