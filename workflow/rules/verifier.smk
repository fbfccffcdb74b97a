# The embedded verifier: a tokenizer and a small Qwen3ForCausalLM trained here; or a GGUF
# verifier (verifier.source: gguf) converted once into a save_pretrained folder.
# Neither runs when verifier.source names a hub id or a local directory.


if not GGUF:

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

else:

    rule convert_verifier:
        output:
            out=directory("results/verifier/model"),
        params:
            **stage_params("convert_verifier"),
        log:
            "logs/convert_verifier.log",
        benchmark:
            "benchmarks/convert_verifier.tsv"
        shell:
            domino("convert_verifier")
