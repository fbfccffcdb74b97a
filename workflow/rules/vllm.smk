# Optional (vllm.benchmark: true): the HumanEval benchmark prompts served by vLLM, as a cross-check
# of the project's own loop. Plain greedy through vLLM, then vLLM's DFlash loop on every exported
# checkpoint, as trained through domino.vllm_plugin; each job decodes every prompt with the
# project's loop too, alternately in one process, for the speed ratio. The prompts are read from
# results/benchmark/humaneval/{run}.json, so both loops decode the very same token ids.


rule vllm_benchmark_baseline:
    input:
        verifier=VERIFIER_INPUT,
        ours="results/benchmark/humaneval/baseline.json",
    output:
        out="results/vllm_benchmark/baseline.json",
    params:
        **stage_params("vllm_benchmark_baseline"),
        verifier=verifier_path,
    log:
        "logs/vllm_benchmark/baseline.log",
    benchmark:
        "benchmarks/vllm_benchmark/baseline.tsv"
    shell:
        domino("vllm_benchmark_baseline", VLLM_DOMINO)


rule vllm_benchmark:
    input:
        verifier=VERIFIER_INPUT,
        ours="results/benchmark/humaneval/{run}.json",
        baseline="results/vllm_benchmark/baseline.json",
        export="results/export/{run}",
        weights="results/train/{run}/checkpoint/model.safetensors",
    output:
        out="results/vllm_benchmark/{run}.json",
    wildcard_constraints:
        run="|".join(VLLM_RUNS[1:]),
    params:
        **stage_params("vllm_benchmark"),
        verifier=verifier_path,
        checkpoint_dir=parent("weights", "input"),
    log:
        "logs/vllm_benchmark/{run}.log",
    benchmark:
        "benchmarks/vllm_benchmark/{run}.tsv"
    shell:
        domino("vllm_benchmark", VLLM_DOMINO)
