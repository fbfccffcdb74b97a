# Speculative sampling at each temperature T > 0 of benchmark.temperatures (T = 0 is the greedy
# benchmark): plain sampling, then each checkpoint's speculative sampling beside plain sampling
# of the same prompts with the same seeds. results/sampling/T<T>/<run>.json, as the greedy files.

TEMPERATURES = [f"{t:g}" for t in config["benchmark"]["temperatures"] if t > 0]


def sampling_outputs(wc=None):
    return expand("results/sampling/T{temperature}/{run}.json", temperature=TEMPERATURES, run=RUNS)


rule sampling_baseline:
    input:
        VERIFIER_INPUT,
    output:
        out="results/sampling/T{temperature}/baseline.json",
    wildcard_constraints:
        temperature="[0-9.]+",
    params:
        config=stage_params("sampling_baseline"),
        verifier=VERIFIER,
    log:
        "logs/sampling/T{temperature}/baseline.log",
    benchmark:
        "benchmarks/sampling/T{temperature}/baseline.tsv"
    shell:
        domino("sampling_baseline")


rule sampling:
    input:
        VERIFIER_INPUT,
        baseline="results/sampling/T{temperature}/baseline.json",
        weights="results/train/{run}/checkpoint/model.safetensors",
    output:
        out="results/sampling/T{temperature}/{run}.json",
    wildcard_constraints:
        temperature="[0-9.]+",
        run="|".join(CHECKPOINTS),
    params:
        config=stage_params("sampling"),
        verifier=VERIFIER,
        checkpoint_dir=parent("weights", "input"),
    log:
        "logs/sampling/T{temperature}/{run}.log",
    benchmark:
        "benchmarks/sampling/T{temperature}/{run}.tsv"
    shell:
        domino("sampling")
