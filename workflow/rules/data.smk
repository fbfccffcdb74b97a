rule prepare_data:
    input:
        tokenizer=TOKENIZER_INPUT,
        verifier_files=VERIFIER_DIGESTS,
    output:
        train="results/prepare_data/train.jsonl",
        val="results/prepare_data/val.jsonl",
        summary="results/prepare_data/summary.json",
    params:
        **stage_params("prepare_data"),
        tokenizer=tokenizer_path,
    resources:
        **SLURM,
    log:
        "logs/prepare_data.log",
    benchmark:
        "benchmarks/prepare_data.tsv"
    shell:
        domino("prepare_data")


rule regenerate:
    input:
        verifier=VERIFIER_INPUT,
        verifier_files=VERIFIER_DIGESTS,
        data="results/prepare_data/{split}.jsonl",
        # answers kept from an earlier run (data.kept_answers): replacing them reruns the job
        kept=[f"{config['data']['kept_answers']}/{name}" for name in ("manifest.json", "answers.jsonl.gz")]
        if config["data"]["kept_answers"] else [],
    output:
        out="results/regenerate/{split}.jsonl",
        summary="results/regenerate/{split}.json",
    wildcard_constraints:
        split="train|val",
    params:
        **stage_params("regenerate"),
        verifier=verifier_path,
    resources:
        **SLURM_GPU,  # the verifier answers every training conversation
    log:
        "logs/regenerate/{split}.log",
    benchmark:
        "benchmarks/regenerate/{split}.tsv"
    shell:
        domino("regenerate", VLLM_DOMINO if config["data"]["generation_backend"] == "vllm" else "python -m domino")


rule draft_vocab:
    input:
        verifier=VERIFIER_INPUT,
        verifier_files=VERIFIER_DIGESTS,
        train=TRAINING_DATA.format(split="train"),
    output:
        vocab="results/draft_vocab/vocab.safetensors",
        summary="results/draft_vocab/vocab.json",
    params:
        **stage_params("draft_vocab"),
        verifier=verifier_path,
    resources:
        **SLURM,
    log:
        "logs/draft_vocab.log",
    shell:
        domino("draft_vocab")


# the draft vocabulary of a checkpoint that trains on other answers than the run's (data.responses)
use rule draft_vocab as draft_vocab_responses with:
    input:
        verifier=VERIFIER_INPUT,
        verifier_files=VERIFIER_DIGESTS,
        train=lambda wc: CONVERSATIONS[wc.responses].format(split="train"),
    output:
        vocab="results/draft_vocab/responses-{responses}/vocab.safetensors",
        summary="results/draft_vocab/responses-{responses}/vocab.json",
    wildcard_constraints:
        responses="corpus|verifier",
    log:
        "logs/draft_vocab/responses-{responses}.log",
