def bench_params(wc=None, baseline=False):
    b = dict(config["benchmark"])
    if baseline:
        b.pop("tie_tolerance")  # only speculative runs compare against the baseline
    return json.dumps({"seed": config["seed"], "threads": config["threads"], "device": config["device"],
                       "verifier": {"name": config["verifier"]["name"], "dtype": config["verifier"]["dtype"]},
                       "data": {"enable_thinking": config["data"]["enable_thinking"]},
                       "benchmark": b}, sort_keys=True)


rule benchmark_baseline:
    input:
        VERIFIER_INPUT,
    output:
        "results/benchmark/baseline.json",
    params:
        p=lambda wc: bench_params(wc, baseline=True),
        verifier=VERIFIER,
    log:
        "logs/benchmark/baseline.log",
    benchmark:
        "benchmarks/benchmark/baseline.tsv"
    shell:
        "python -m domino benchmark --params {params.p:q} --run baseline --verifier {params.verifier:q}"
        " --out {output} > {log} 2>&1"


rule benchmark:
    input:
        VERIFIER_INPUT,
        baseline="results/benchmark/baseline.json",
        weights="results/train/{run}/checkpoint/model.safetensors",
    output:
        "results/benchmark/{run}.json",
    wildcard_constraints:
        run="|".join(CHECKPOINTS),
    params:
        p=bench_params,
        verifier=VERIFIER,
    log:
        "logs/benchmark/{run}.log",
    benchmark:
        "benchmarks/benchmark/{run}.tsv"
    shell:
        "python -m domino benchmark --params {params.p:q} --run {wildcards.run} --verifier {params.verifier:q}"
        " --checkpoint-dir results/train/{wildcards.run}/checkpoint --baseline {input.baseline}"
        " --out {output} > {log} 2>&1"
