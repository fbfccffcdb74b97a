def train_params(wc):
    return json.dumps({"seed": config["seed"], "threads": config["threads"], "device": config["device"],
                       "verifier": {"name": config["verifier"]["name"]}, "drafter": config["drafter"],
                       "checkpoints": {wc.checkpoint: config["checkpoints"][wc.checkpoint]},
                       "train": config["train"]}, sort_keys=True)


def train_launcher(wc=None):
    """One process, or torchrun data parallelism when train.nproc_per_node > 1."""
    n = config["train"]["nproc_per_node"]
    return "python -m domino" if n == 1 else f"torchrun --standalone --nproc_per_node {n} -m domino"


rule train:
    input:
        VERIFIER_INPUT,
        vocab="results/draft_vocab/vocab.safetensors",
        features="results/extract_hidden_states/train/index.json",
    output:
        weights="results/train/{checkpoint}/checkpoint/model.safetensors",
        config="results/train/{checkpoint}/checkpoint/drafter_config.json",
        metrics="results/train/{checkpoint}/metrics.jsonl",
        summary="results/train/{checkpoint}/summary.json",
    wildcard_constraints:
        checkpoint="|".join(CHECKPOINTS),
    params:
        p=train_params,
        verifier=VERIFIER,
        launcher=train_launcher,
    log:
        "logs/train/{checkpoint}.log",
    benchmark:
        "benchmarks/train/{checkpoint}.tsv"
    shell:
        "{params.launcher} train --params {params.p:q} --checkpoint {wildcards.checkpoint}"
        " --verifier {params.verifier:q} --vocab {input.vocab} --features {input.features}"
        " --out-dir results/train/{wildcards.checkpoint} > {log} 2>&1"


rule validate:
    input:
        weights="results/train/{checkpoint}/checkpoint/model.safetensors",
        features="results/extract_hidden_states/val/index.json",
    output:
        "results/validate/{checkpoint}.json",
    wildcard_constraints:
        checkpoint="|".join(CHECKPOINTS),
    params:
        p=train_params,
    log:
        "logs/validate/{checkpoint}.log",
    benchmark:
        "benchmarks/validate/{checkpoint}.tsv"
    shell:
        "python -m domino validate --params {params.p:q} --checkpoint {wildcards.checkpoint}"
        " --checkpoint-dir results/train/{wildcards.checkpoint}/checkpoint --features {input.features}"
        " --out {output} > {log} 2>&1"
