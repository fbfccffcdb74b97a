from domino.card.plots import PLOTS  # the plots' file names: the card links to them


rule report:
    input:
        summary="results/prepare_data/summary.json",
        regenerated=expand("results/regenerate/{split}.json", split=["train", "val"]) if REGENERATED else [],
        validate=expand("results/validate/{checkpoint}.json", checkpoint=CHECKPOINTS),
        benchmark=expand("results/benchmark/{run}.json", run=RUNS),
        metrics=expand("results/train/{checkpoint}/metrics.jsonl", checkpoint=CHECKPOINTS),
        summaries=expand("results/train/{checkpoint}/summary.json", checkpoint=CHECKPOINTS),
        # the checkpoints themselves: the card describes them
        weights=expand("results/train/{checkpoint}/checkpoint/model.safetensors", checkpoint=CHECKPOINTS),
        drafter_configs=expand("results/train/{checkpoint}/checkpoint/drafter_config.json", checkpoint=CHECKPOINTS),
        vllm=vllm_outputs,
        sampling=sampling_outputs,
    output:
        card="reports/model_card.md",
        reproduction="reports/reproduction.md",
        # written beside the card by the same job (domino.card.render.CardPaths): the appendix, and an
        # HTML page of each Markdown file, which Snakemake's HTML report shows rendered
        appendix="reports/model_card_appendix.md",
        **{f"{Path(name).stem}_html": report(f"reports/{Path(name).stem}.html",
                                             caption=f"../report/{Path(name).stem}.rst", category="Model card")
           for name in ("model_card.md", "model_card_appendix.md", "reproduction.md")},
        # the plots; declared so that Snakemake's HTML report shows them
        **{key: report(f"reports/{name}", caption=f"../report/{Path(name).stem}.rst", category="Plots")
           for key, name in PLOTS.items()},
    params:
        **stage_params("report"),
        results="results",
        stage_benchmarks="benchmarks",
    log:
        "logs/report.log",
    shell:
        domino("report")
