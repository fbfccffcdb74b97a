"""The benchmark: its suites, the paired-timing harness, the lossless check, the results' summary
and the benchmark job itself (workflow/rules/benchmark.smk, workflow/rules/sampling.smk)."""


class BenchmarkError(RuntimeError):
    """A benchmark job that cannot go on, in one line: a continuation that parts from plain greedy,
    or a prompt, row or budget it cannot decode."""
