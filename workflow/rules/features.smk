rule extract_hidden_states:
    input:
        verifier=VERIFIER_INPUT,
        data=TRAINING_DATA,
        vocab="results/draft_vocab/vocab.safetensors",
    output:
        index="results/extract_hidden_states/{split}/index.json",
    wildcard_constraints:
        split="train|val",
    params:
        **stage_params("extract_hidden_states"),
        verifier=verifier_path,
    log:
        "logs/extract_hidden_states/{split}.log",
    benchmark:
        "benchmarks/extract_hidden_states/{split}.tsv"
    shell:
        domino("extract_hidden_states", VLLM_DOMINO if config["features"]["backend"] == "vllm"
               else "python -m domino")
