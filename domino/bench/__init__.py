"""The benchmark: its suites, the paired-timing harness and the benchmark itself
(workflow/rules/benchmark.smk, workflow/rules/sampling.smk)."""
