from domino.card.paths import report_plots, template_digest  # the plots' file names and the card's templates


rule report:
    input:
        summary="results/prepare_data/summary.json",
        regenerated=expand("results/regenerate/{split}.json", split=["train", "val"]) if RESPONSES == "verifier" else [],
        validate=expand("results/validate/{checkpoint}.json", checkpoint=TRAINED),
        benchmark=expand("results/benchmark/{suite}/{row}.json", suite=SUITES, row=ROWS),
        metrics=expand("results/train/{checkpoint}/metrics.jsonl", checkpoint=CHECKPOINTS),
        summaries=expand("results/train/{checkpoint}/summary.json", checkpoint=CHECKPOINTS),
        # the checkpoints themselves: the card describes them
        weights=expand("results/train/{checkpoint}/checkpoint/model.safetensors", checkpoint=CHECKPOINTS),
        drafter_configs=expand("results/train/{checkpoint}/checkpoint/drafter_config.json", checkpoint=CHECKPOINTS),
        vllm=vllm_outputs,
        sampling=sampling_outputs,
    # every output is update(): Snakemake keeps the last version and restores it when the job
    # fails, so a report that does not render leaves the last card in place
    output:
        card=update("reports/model_card.md"),
        reproduction=update("reports/reproduction.md"),
        # written beside the card by the same job (domino.card.paths.CardPaths): the appendix, and an
        # HTML page of each Markdown file, which Snakemake's HTML report shows rendered
        appendix=update("reports/model_card_appendix.md"),
        **{f"{Path(name).stem}_html": update(report(f"reports/{Path(name).stem}.html",
                                                    caption=f"../report/{Path(name).stem}.rst", category="Model card"))
           for name in ("model_card.md", "model_card_appendix.md", "reproduction.md")},
        # the plots; declared so that Snakemake's HTML report shows them
        **{key: update(report(f"reports/{name}", caption=f"../report/{Path(name).stem}.rst", category="Plots"))
           for key, name in report_plots(config["checkpoints"],
                                         served=any(served_validated(config, c) for c in CHECKPOINTS)).items()},
    params:
        **stage_params("report"),
        # the card's Jinja2 templates (domino/card/templates) by their digest: editing one reruns the
        # report, and a run that moves with its checkout does not (inputs would be absolute paths)
        templates=template_digest(),
        results=results_dir,
        stage_benchmarks="benchmarks",
    resources:
        **SLURM,
    log:
        "logs/report.log",
    shell:
        domino("report")
