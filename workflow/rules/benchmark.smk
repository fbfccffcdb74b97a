# The speculative-decoding benchmark, greedy: one job per suite of benchmark.suites decodes every
# task plain, with each trained checkpoint's drafter and with the rows that decode without training of
# their own (domino.decoders: benchmark.ngram, benchmark.suffix, benchmark.cost_aware),
# back to back, so that every speedup and every comparison of two rows rests on decodes of the
# same moments (domino/bench/job.py).
# results/benchmark/{suite}/{row}.json, baseline included.


rule benchmark:
    input:
        verifier=VERIFIER_INPUT,
        weights=expand("results/train/{checkpoint}/checkpoint/model.safetensors", checkpoint=TRAINED),
    output:
        baseline="results/benchmark/{suite}/baseline.json",
        outs=expand("results/benchmark/{{suite}}/{row}.json", row=TRAINED),
        lookups=expand("results/benchmark/{{suite}}/{row}.json", row=LOOKUPS),
    wildcard_constraints:
        suite="|".join(SUITES),
    params:
        **stage_params("benchmark"),
        verifier=verifier_path,
        rows=TRAINED,
        checkpoint_dirs=parents("weights"),
    resources:
        **SLURM_GPU,
    log:
        "logs/benchmark/{suite}.log",
    benchmark:
        "benchmarks/benchmark/{suite}.tsv"
    shell:
        domino("benchmark")
