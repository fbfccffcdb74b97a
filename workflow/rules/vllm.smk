# Optional (vllm.benchmark: true): every suite's benchmark prompts served by vLLM, as a cross-check
# of the project's own loop. Plain greedy through vLLM, then vLLM's DFlash loop on every exported
# checkpoint, as trained through domino.vllm.plugin, and vLLM's ngram method for the n-gram lookup
# row (benchmark.ngram; its settings as the benchmark recorded them); each job decodes every prompt with the
# project's loop too, alternately in one process, for the speed ratio. The prompts are read from
# results/benchmark/{suite}/{row}.json, so both loops decode the very same token ids (a later
# turn's too: it follows the project's plain answer to the turn before, as the benchmark's did).


rule vllm_benchmark_baseline:
    input:
        verifier=VERIFIER_INPUT,
        ours="results/benchmark/{suite}/baseline.json",
    output:
        out="results/vllm_benchmark/{suite}/baseline.json",
    wildcard_constraints:
        suite="|".join(SUITES),
    params:
        **stage_params("vllm_benchmark_baseline"),
        verifier=verifier_path,
    resources:
        **SLURM_GPU,
    log:
        "logs/vllm_benchmark/{suite}/baseline.log",
    benchmark:
        "benchmarks/vllm_benchmark/{suite}/baseline.tsv"
    shell:
        domino("vllm_benchmark_baseline", VLLM_DOMINO)


rule vllm_benchmark:
    input:
        verifier=VERIFIER_INPUT,
        ours="results/benchmark/{suite}/{checkpoint}.json",
        baseline="results/vllm_benchmark/{suite}/baseline.json",
        export="results/export/{checkpoint}",
        weights="results/train/{checkpoint}/checkpoint/model.safetensors",
    output:
        out="results/vllm_benchmark/{suite}/{checkpoint}.json",
    wildcard_constraints:
        suite="|".join(SUITES),
        checkpoint="|".join(r for r in VLLM_ROWS[1:] if r in config["checkpoints"]),
    params:
        **stage_params("vllm_benchmark"),
        verifier=verifier_path,
        checkpoint_dir=parent("weights", "input"),
    resources:
        **SLURM_GPU,
    log:
        "logs/vllm_benchmark/{suite}/{checkpoint}.log",
    benchmark:
        "benchmarks/vllm_benchmark/{suite}/{checkpoint}.tsv"
    shell:
        domino("vllm_benchmark", VLLM_DOMINO)


rule vllm_benchmark_lookup:
    input:
        verifier=VERIFIER_INPUT,
        ours="results/benchmark/{suite}/ngram.json",
        baseline="results/vllm_benchmark/{suite}/baseline.json",
    output:
        out="results/vllm_benchmark/{suite}/ngram.json",
    wildcard_constraints:
        suite="|".join(SUITES),
    params:
        **stage_params("vllm_benchmark_lookup"),
        verifier=verifier_path,
    resources:
        **SLURM_GPU,
    log:
        "logs/vllm_benchmark/{suite}/ngram.log",
    benchmark:
        "benchmarks/vllm_benchmark/{suite}/ngram.tsv"
    shell:
        domino("vllm_benchmark_lookup", VLLM_DOMINO)
