# The embedded verifier: a tokenizer and a small Qwen3ForCausalLM trained here.
# Skipped when verifier.source names a hub id or a local directory.


rule tokenizer:
    output:
        out=directory("results/verifier/tokenizer"),
    params:
        **stage_params("tokenizer"),
    log:
        "logs/tokenizer.log",
    benchmark:
        "benchmarks/tokenizer.tsv"
    shell:
        domino("tokenizer")


rule verifier:
    input:
        tokenizer="results/verifier/tokenizer",
        train="results/prepare_data/train.jsonl",
    output:
        out=directory("results/verifier/model"),
    params:
        **stage_params("verifier"),
    log:
        "logs/verifier.log",
    benchmark:
        "benchmarks/verifier.tsv"
    shell:
        domino("verifier")
