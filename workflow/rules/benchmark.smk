# The HumanEval benchmark, greedy: one job decodes every prompt plain and with each trained run's
# drafter, back to back, so that every speedup and every comparison of two checkpoints rests on
# decodes of the same moments (domino/bench.py). results/benchmark/{run}.json, baseline included.


def decoded(runs):
    """The benchmark jobs' inputs and params for `runs`: the weights, the run names, the checkpoints."""
    return {"weights": expand("results/train/{run}/checkpoint/model.safetensors", run=runs),
            "runs": list(runs), "checkpoint_dirs": [f"results/train/{run}/checkpoint" for run in runs]}


rule benchmark:
    input:
        VERIFIER_INPUT,
        weights=decoded(TRAINED)["weights"],
    output:
        baseline="results/benchmark/baseline.json",
        outs=expand("results/benchmark/{run}.json", run=TRAINED),
    params:
        config=stage_params("benchmark"),
        verifier=VERIFIER,
        runs=decoded(TRAINED)["runs"],
        checkpoint_dirs=decoded(TRAINED)["checkpoint_dirs"],
    log:
        "logs/benchmark.log",
    benchmark:
        "benchmarks/benchmark.tsv"
    shell:
        domino("benchmark")
