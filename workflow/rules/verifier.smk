# The embedded verifier: a tokenizer and a small Qwen3ForCausalLM trained here.
# Skipped when verifier.source names a hub id or a local directory.


rule tokenizer:
    output:
        directory("results/verifier/tokenizer"),
    params:
        p=json.dumps({"seed": config["seed"], "threads": config["threads"],
                      "data": {k: config["data"][k] for k in ("corpus", "samples", "hub_dataset", "hub_split")},
                      "verifier": {"embedded": {"vocab_size": config["verifier"].get("embedded", {}).get("vocab_size")}}},
                     sort_keys=True),
    log:
        "logs/tokenizer.log",
    benchmark:
        "benchmarks/tokenizer.tsv"
    shell:
        "python -m domino tokenizer --params {params.p:q} --out {output} > {log} 2>&1"


rule verifier:
    input:
        tokenizer="results/verifier/tokenizer",
        train="results/prepare_data/train.jsonl",
    output:
        directory("results/verifier/model"),
    params:
        p=json.dumps({"seed": config["seed"], "threads": config["threads"],
                      "verifier": {"embedded": config["verifier"].get("embedded")}}, sort_keys=True),
    log:
        "logs/verifier.log",
    benchmark:
        "benchmarks/verifier.tsv"
    shell:
        "python -m domino verifier --params {params.p:q} --tokenizer {input.tokenizer}"
        " --train {input.train} --out {output} > {log} 2>&1"
