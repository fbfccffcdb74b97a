# The embedded verifier: a tokenizer and a small Qwen3ForCausalLM trained here; or a GGUF
# verifier (verifier.source: gguf) converted once into a save_pretrained folder.
# Neither runs when verifier.source names a hub id or a local directory.


if not GGUF:

    rule tokenizer:
        output:
            out=directory("results/verifier/tokenizer"),
        params:
            **stage_params("tokenizer"),
        resources:
            **SLURM,
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
        resources:
            **SLURM,
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
        resources:
            **SLURM,
        log:
            "logs/convert_verifier.log",
        benchmark:
            "benchmarks/convert_verifier.tsv"
        shell:
            domino("convert_verifier")


# A local verifier folder's files, by their sha256 (VERIFIER_DIGESTS in common.smk): one param per
# file, so that the dry run's reason names the file that changed; the output is an input of every
# job that reads the folder.
if LOCAL_VERIFIER:
    DIGEST_PARAMS = {"sha256_{}".format(re.sub(r"\W", "_", rel)): f"{rel} sha256 {digest}"
                     for rel, digest in VERIFIER_FILES.items()}
    assert len(DIGEST_PARAMS) == len(VERIFIER_FILES), "two files of the verifier folder share a param name"

    rule verifier_digests:
        output:
            digests="results/verifier/source.sha256.json",
        params:
            **DIGEST_PARAMS,
        localrule: True
        run:
            from domino.io import write_text

            write_text(output.digests, f"{json.dumps(VERIFIER_FILES, indent=1, sort_keys=True)}\n")
