rule extract_hidden_states:
    input:
        verifier=VERIFIER_INPUT,
        verifier_files=VERIFIER_DIGESTS,
        data=TRAINING_DATA,
        vocab="results/draft_vocab/vocab.safetensors",
    output:
        index="results/extract_hidden_states/{split}/index.json",
    wildcard_constraints:
        split="train|val",
    params:
        **stage_params("extract_hidden_states"),
        verifier=verifier_path,
    resources:
        **SLURM_GPU,
    log:
        "logs/extract_hidden_states/{split}.log",
    benchmark:
        "benchmarks/extract_hidden_states/{split}.tsv"
    shell:
        domino("extract_hidden_states", VLLM_DOMINO if config["features"]["backend"] == "vllm"
               else "python -m domino")


# the features of a checkpoint that trains on other answers than the run's (data.responses)
use rule extract_hidden_states as extract_hidden_states_responses with:
    input:
        verifier=VERIFIER_INPUT,
        verifier_files=VERIFIER_DIGESTS,
        data=lambda wc: CONVERSATIONS[wc.responses].format(split=wc.split),
        vocab="results/draft_vocab/responses-{responses}/vocab.safetensors",
    output:
        index="results/extract_hidden_states/responses-{responses}/{split}/index.json",
    wildcard_constraints:
        split="train|val",
        responses="corpus|verifier",
    log:
        "logs/extract_hidden_states/responses-{responses}/{split}.log",
    benchmark:
        "benchmarks/extract_hidden_states/responses-{responses}/{split}.tsv"
