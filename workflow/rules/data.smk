rule prepare_data:
    input:
        TOKENIZER_INPUT,
    output:
        train="results/prepare_data/train.jsonl",
        val="results/prepare_data/val.jsonl",
        summary="results/prepare_data/summary.json",
    params:
        p=stage_params("data"),
        tokenizer=TOKENIZER,
    log:
        "logs/prepare_data.log",
    benchmark:
        "benchmarks/prepare_data.tsv"
    shell:
        "python -m domino prepare-data --params {params.p:q} --tokenizer {params.tokenizer:q}"
        " --out-dir results/prepare_data > {log} 2>&1"


rule draft_vocab:
    input:
        VERIFIER_INPUT,
        train="results/prepare_data/train.jsonl",
    output:
        vocab="results/draft_vocab/vocab.safetensors",
        summary="results/draft_vocab/vocab.json",
    params:
        p=lambda wc: json.dumps({"seed": config["seed"], "threads": config["threads"],
                                 "drafter": {"draft_vocab_size": config["drafter"]["draft_vocab_size"]}}),
        verifier=VERIFIER,
    log:
        "logs/draft_vocab.log",
    shell:
        "python -m domino draft-vocab --params {params.p:q} --verifier {params.verifier:q}"
        " --train {input.train} --out {output.vocab} > {log} 2>&1"
