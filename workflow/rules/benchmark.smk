# The HumanEval benchmark, greedy: one job decodes every prompt plain and with each trained run's
# drafter, back to back, so that every speedup and every comparison of two checkpoints rests on
# decodes of the same moments (domino/bench.py). results/benchmark/{run}.json, baseline included.


rule benchmark:
    input:
        verifier=VERIFIER_INPUT,
        weights=expand("results/train/{run}/checkpoint/model.safetensors", run=TRAINED),
    output:
        baseline="results/benchmark/baseline.json",
        outs=expand("results/benchmark/{run}.json", run=TRAINED),
    params:
        **stage_params("benchmark"),
        verifier=verifier_path,
        runs=TRAINED,
        checkpoint_dirs=parents("weights"),
    log:
        "logs/benchmark.log",
    benchmark:
        "benchmarks/benchmark.tsv"
    shell:
        domino("benchmark")
