# Optional (vllm.benchmark: true): the benchmark prompts served by vLLM, as a cross-check of the
# project's own loop. Plain greedy through vLLM, then vLLM's DFlash loop on each exported DFlash
# checkpoint. The prompts are read from results/benchmark/{run}.json, so both loops decode the
# very same token ids.


def vllm_params(wc=None):
    return json.dumps({"seed": config["seed"], "threads": config["threads"], "device": config["device"],
                       "verifier": {"dtype": config["verifier"]["dtype"]}, "vllm": config["vllm"]},
                      sort_keys=True)


rule vllm_benchmark_baseline:
    input:
        VERIFIER_INPUT,
        ours="results/benchmark/baseline.json",
    output:
        "results/vllm_benchmark/baseline.json",
    params:
        p=vllm_params,
        verifier=VERIFIER,
        python=VLLM_PYTHON,
    log:
        "logs/vllm_benchmark/baseline.log",
    benchmark:
        "benchmarks/vllm_benchmark/baseline.tsv"
    shell:
        "{params.python} -m domino vllm-benchmark --params {params.p:q} --run baseline"
        " --verifier {params.verifier:q} --ours {input.ours} --out {output} > {log} 2>&1"


rule vllm_benchmark:
    input:
        VERIFIER_INPUT,
        ours="results/benchmark/{run}.json",
        baseline="results/vllm_benchmark/baseline.json",
        export="results/export/{run}/config.json",
    output:
        "results/vllm_benchmark/{run}.json",
    wildcard_constraints:
        run="|".join(VLLM_RUNS[1:]) or "no-dflash-checkpoint",
    params:
        p=vllm_params,
        verifier=VERIFIER,
        python=VLLM_PYTHON,
    log:
        "logs/vllm_benchmark/{run}.log",
    benchmark:
        "benchmarks/vllm_benchmark/{run}.tsv"
    shell:
        "{params.python} -m domino vllm-benchmark --params {params.p:q} --run {wildcards.run}"
        " --verifier {params.verifier:q} --export-dir results/export/{wildcards.run} --baseline {input.baseline}"
        " --ours {input.ours} --out {output} > {log} 2>&1"
