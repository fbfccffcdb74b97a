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
        p=lambda wc: json.dumps(config, sort_keys=True),
    log:
        "logs/report.log",
    shell:
        "python -m domino report --params {params.p:q} --results results --out-dir reports"
        " --stage-benchmarks benchmarks > {log} 2>&1"
