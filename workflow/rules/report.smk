rule report:
    input:
        summary="results/prepare_data/summary.json",
        validate=expand("results/validate/{checkpoint}.json", checkpoint=CHECKPOINTS),
        benchmark=expand("results/benchmark/{run}.json", run=RUNS),
        metrics=expand("results/train/{checkpoint}/metrics.jsonl", checkpoint=CHECKPOINTS),
        vllm=vllm_outputs,
    output:
        card="reports/model_card.md",
        reproduction="reports/reproduction.md",
    params:
        config=stage_params("report"),
        results="results",
        stage_benchmarks="benchmarks",
    log:
        "logs/report.log",
    shell:
        domino("report")
