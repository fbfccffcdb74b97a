"""Two runs' drafters on the same prompts, paired: ``python -m domino.tools.compare_acceptance RUN_A RUN_B``.

A change to training (the answers, their mix, the steps) is a change of run directory, so its
effect is two runs, not two rows of one job. Acceptance does not depend on the machine's load, and
greedy decoding's tokens do not depend on the process that decoded them, so two runs' acceptance is
paired prompt by prompt, where their speed is not (a speed ratio is only ever taken within one job).

For each suite benchmarked in both runs, and each trained row both decoded (a checkpoint's row
name; the rows without training and the cost-aware rows are left out: their acceptance counts
other steps), it prints each run's acceptance length with its 95% BCa interval over prompts, and
B's over A's less one, paired over the prompts both decoded. The two runs' plain greedy answers
must be the same tokens (the same verifier and prompts); otherwise nothing is paired and the tool
says how many prompts part, in one line.

    python -m domino.tools.compare_acceptance runs/smollm2-quick-answers runs/smollm2-quick-mix
    python -m domino.tools.compare_acceptance RUN_A RUN_B --suite mt-bench --out pairs.json

A measurement script, not a test: it reads two finished runs and writes nothing into them.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..io import read_json, write_json
from ..stats import RESAMPLES, acceptance_length_pooled, paired_relative_difference
from . import tool_parser


def per_prompt(results: dict) -> dict[str, list[int]]:
    """A results file's accepted drafts per step, by the prompt's task id."""
    return {p["task_id"]: [int(a) for a in p["accepted_per_step"]] for p in results["prompts"]}


def answers_part(a: dict, b: dict) -> int:
    """How many prompts both plain greedy files hold whose answers differ (other tokens)."""
    ta = {p["task_id"]: p["new_token_ids"] for p in a["prompts"]}
    return sum(int(ta[p["task_id"]] != p["new_token_ids"]) for p in b["prompts"] if p["task_id"] in ta)


def pair(a: dict[str, list[int]], b: dict[str, list[int]]) -> dict:
    """Each run's acceptance length (1 + accepted drafts per step, pooled over the steps of the
    prompts both decoded) with its interval, and B's over A's less one, paired over those prompts."""
    tasks = [t for t in a if t in b and a[t] and b[t]]
    out = {"prompts": len(tasks)}
    for name, runs in (("a", a), ("b", b)):
        iv = acceptance_length_pooled([runs[t] for t in tasks], resamples=RESAMPLES)
        out[name] = {"estimate": iv.estimate, "ci": [iv.low, iv.high], "steps": sum(len(runs[t]) for t in tasks)}

    def sums(runs):
        return [float(sum(1 + x for x in runs[t])) for t in tasks], [float(len(runs[t])) for t in tasks]
    iv = paired_relative_difference(*sums(b), *sums(a))
    out["b_over_a"] = {"estimate": iv.estimate, "ci": [iv.low, iv.high]}
    return out


def trained_rows(folder: Path) -> list[str]:
    """The row names of a suite's results folder that a trained checkpoint decoded alone (a results
    file without a ``decoder`` record, the plain decodes aside)."""
    rows = []
    for f in sorted(folder.glob("*.json")):
        if f.stem != "baseline" and "decoder" not in read_json(f, "benchmark results", sealed=True):
            rows.append(f.stem)
    return rows


def parser():
    p = tool_parser("compare_acceptance", __doc__)
    p.add_argument("run_a", help="a finished run's directory (its results/)")
    p.add_argument("run_b", help="another, benchmarked on the same verifier and prompts")
    p.add_argument("--suite", action="append", default=None,
                   help="a benchmark suite both ran (repeat for more; default: every suite both ran)")
    p.add_argument("--out", default=None, help="also write the figures to this JSON file")
    return p


def main(argv=None) -> None:
    args = parser().parse_args(argv)
    bench_a, bench_b = (Path(r) / "results" / "benchmark" for r in (args.run_a, args.run_b))
    suites = args.suite or sorted({d.name for d in bench_a.iterdir() if d.is_dir()} &
                                  {d.name for d in bench_b.iterdir() if d.is_dir()})
    figures = {"run_a": args.run_a, "run_b": args.run_b, "suites": {}}
    for suite in suites:
        fa, fb = bench_a / suite, bench_b / suite
        parts = answers_part(read_json(fa / "baseline.json", "plain greedy's results", sealed=True),
                             read_json(fb / "baseline.json", "plain greedy's results", sealed=True))
        if parts:
            sys.exit(f"error: {suite}: plain greedy's answers differ on {parts} prompts between the two runs "
                     "(another verifier, dtype or prompts): their acceptance is not paired")
        in_b = set(trained_rows(fb))
        rows = [r for r in trained_rows(fa) if r in in_b]
        figures["suites"][suite] = {}
        print(f"{suite}: acceptance length, B over A paired over prompts (95% BCa)")
        for row in rows:
            f = pair(per_prompt(read_json(fa / f"{row}.json", "benchmark results", sealed=True)),
                     per_prompt(read_json(fb / f"{row}.json", "benchmark results", sealed=True)))
            figures["suites"][suite][row] = f
            print(f"  {row}: A {f['a']['estimate']:.3f} [{f['a']['ci'][0]:.3f}, {f['a']['ci'][1]:.3f}], "
                  f"B {f['b']['estimate']:.3f} [{f['b']['ci'][0]:.3f}, {f['b']['ci'][1]:.3f}], "
                  f"B/A - 1 {f['b_over_a']['estimate']:+.1%} [{f['b_over_a']['ci'][0]:+.1%}, "
                  f"{f['b_over_a']['ci'][1]:+.1%}] over {f['prompts']} prompts")
    if args.out:
        write_json(args.out, figures)


if __name__ == "__main__":
    main()
