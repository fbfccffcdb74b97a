def export_params(wc=None):
    # the verifier's name goes into speculators_config.verifier.name_or_path; its dtype is the
    # dtype of the exported weights (the card serves a bf16 drafter beside a bf16 verifier)
    return json.dumps({"seed": config["seed"], "threads": config["threads"], "device": config["device"],
                       "verifier": {"name": config["verifier"]["name"], "dtype": config["verifier"]["dtype"]}},
                      sort_keys=True)


rule export:
    input:
        weights="results/train/{checkpoint}/checkpoint/model.safetensors",
        config="results/train/{checkpoint}/checkpoint/drafter_config.json",
    output:
        config="results/export/{checkpoint}/config.json",
        weights="results/export/{checkpoint}/model.safetensors",
    wildcard_constraints:
        checkpoint="|".join(CHECKPOINTS),
    params:
        p=export_params,
    log:
        "logs/export/{checkpoint}.log",
    benchmark:
        "benchmarks/export/{checkpoint}.tsv"
    shell:
        "python -m domino export --params {params.p:q}"
        " --checkpoint-dir results/train/{wildcards.checkpoint}/checkpoint"
        " --out-dir results/export/{wildcards.checkpoint} > {log} 2>&1"
