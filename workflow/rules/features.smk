rule extract_hidden_states:
    input:
        VERIFIER_INPUT,
        data="results/prepare_data/{split}.jsonl",
        vocab="results/draft_vocab/vocab.safetensors",
    output:
        index="results/extract_hidden_states/{split}/index.json",
    wildcard_constraints:
        split="train|val",
    params:
        p=lambda wc: json.dumps({"seed": config["seed"], "threads": config["threads"], "device": config["device"],
                                 "verifier": {"dtype": config["verifier"]["dtype"]},
                                 "drafter": {"aux_layer_ids": config["drafter"]["aux_layer_ids"]},
                                 "features": config["features"],
                                 **({"vllm": {"memory_fraction": config["vllm"]["memory_fraction"]}}
                                    if config["features"]["backend"] == "vllm" else {})},
                                sort_keys=True),
        verifier=VERIFIER,
        python=VLLM_PYTHON if config["features"]["backend"] == "vllm" else "python",
    log:
        "logs/extract_hidden_states/{split}.log",
    benchmark:
        "benchmarks/extract_hidden_states/{split}.tsv"
    shell:
        "{params.python} -m domino extract --params {params.p:q} --verifier {params.verifier:q} --vocab {input.vocab}"
        " --data {input.data} --out-dir results/extract_hidden_states/{wildcards.split} > {log} 2>&1"
