"""The model-free decoders replayed over a benchmark job's answers at the job's measured costs: how
the n-gram lookup or the suffix cache would decode with other settings, or under the cost rule
(``domino.adaptive``), without running the verifier.

In greedy decoding every row's answer is plain greedy's, token for token (the job checks it in
float32), so what a model-free decoder drafts and how many of its drafts the verifier accepts
follow from the answers alone: the replay feeds each prompt and its answer to the decoder in the
job's order (every task's first turn, then every task's second; the suffix cache learning each
answer after its prompt, as in the job) and accepts the longest prefix of each draft that the
answer continues with. The rows the job decoded (``ngram``, ``suffix``) are replayed first with
their recorded settings, and their steps compared with the recorded ones: all equal, but for each
answer's last step, whose drafts past the token budget the job verified and the replay cannot.

Time is a model, not a measurement: a step costs the job's cost curve at its rows (a cost-aware
row's ``adaptive.costs``, measured before the timed decodes), plus its drafting (timed here, the
same code on this machine), plus the loop's seconds outside both, one constant per step fitted to
the n-gram row's measured seconds; plain decoding costs the job's measured plain seconds. The
speedups it prints are for choosing which settings to measure; the benchmark's are the figures
(the recorded rows' modelled and measured speedups are printed side by side). Its acceptance
length counts only the drafts inside each answer, so it runs a little below the job's, which also
counts drafts past the token budget that the verifier accepted. With a bf16 or fp16 verifier a
row's output may part from plain greedy's at a near tie (the job replays each in float32): from
there it drafted over its own answer, so its replay is approximate, and the tool says so.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ..adaptive import CostAwareDraft, CostCurve, SuffixSource
from ..decoders import ngram_draft, suffix_draft
from ..io import read_json
from . import tool_parser


def load_job(folder: Path, costs_from: Path | None = None) -> tuple[dict, CostCurve, list[tuple[list[int], list[int]]]]:
    """A suite's results folder -> its rows' results, the job's cost curve (or that of the
    cost-aware row's results file ``costs_from``) and its (prompt, answer) pairs in the order the
    job decoded them."""
    rows = {p.stem: read_json(p, "benchmark results", sealed=True) for p in sorted(folder.glob("*.json"))}
    sources = [read_json(costs_from, "benchmark results", sealed=True)] if costs_from else rows.values()
    curves = [r["adaptive"]["costs"] for r in sources if (r.get("adaptive") or {}).get("costs")]
    if not curves:
        raise SystemExit(f"replay_free: {costs_from or folder} holds no cost-aware row, so no cost curve "
                         "(benchmark.cost_aware.checkpoint null); decode one, or name another job's with --costs")
    if "ngram" not in rows:
        raise SystemExit(f"replay_free: {folder} holds no ngram row (benchmark.ngram.enabled false); the loop's "
                         "seconds outside its forwards are fitted to it")
    c = curves[0]
    costs = CostCurve(tuple(c["verify_seconds"]), c["drafter_seconds"], c["context_tokens"])
    pairs = [(r["prompt_token_ids"], r["new_token_ids"]) for r in in_job_order(rows["ngram"])]
    return rows, costs, pairs


def in_job_order(result: dict) -> list[dict]:
    """A row's prompt records as the job decoded them: a suite of several turns every task's first
    turn, then every task's second (``domino.bench.job``), each turn its own record."""
    records = result["prompts"]
    if "turns" not in records[0]:
        return records
    return [r["turns"][t] for t in range(len(records[0]["turns"])) for r in records]


def recorded_steps(result: dict) -> list[list[int]]:
    """A row's accepted drafts per recorded step, per prompt, in the replay's order."""
    return [r["accepted_per_step"] for r in in_job_order(result)]


def replay(draft, pairs, costs: CostCurve) -> dict:
    """``draft`` decoding every (prompt, answer) of ``pairs`` in order: its recorded steps (the
    drafts accepted, per prompt, as ``domino.decode`` records them), every step's rows and the
    seconds its drafting took here."""
    clock = [0.0]
    if isinstance(draft, CostAwareDraft):  # its measured steps: the model's seconds, not this replay's
        draft.costs, draft.clock = costs, (lambda: clock[0])
    per_prompt, rows, draft_seconds = [], [], 0.0
    for prompt, answer in pairs:
        if hasattr(draft, "plan"):
            draft.plan(list(prompt))
        draft.reset(list(prompt))
        anchor, pos, i, steps = answer[0], len(prompt), 0, []
        while i < len(answer) - 1:
            t0 = time.perf_counter()
            drafts = draft.propose(anchor, pos, draft.drafts_per_step)
            draft_seconds += time.perf_counter() - t0
            c = 0
            while c < len(drafts) and i + 1 + c < len(answer) and drafts[c] == answer[i + 1 + c]:
                c += 1
            clock[0] += costs.rows(len(drafts) + 1)
            rows.append(len(drafts) + 1)
            if drafts:
                steps.append(c)
            i += c + 1
            if i < len(answer):
                anchor, pos = answer[i], pos + c + 1
        if hasattr(draft, "finish"):
            draft.finish()
        if hasattr(draft, "learn"):
            draft.learn(list(answer))
        per_prompt.append(steps)
    return {"steps": per_prompt, "rows": rows, "draft_seconds": draft_seconds}


def modelled_seconds(r: dict, costs: CostCurve, overhead: float) -> float:
    return sum(costs.rows(k) for k in r["rows"]) + r["draft_seconds"] + overhead * len(r["rows"])


def acceptance_length(steps: list[list[int]]) -> float:
    n = sum(len(s) for s in steps)
    return (sum(map(sum, steps)) + n) / n if n else 1.0


def same_but_last(a: list[list[int]], b: list[list[int]]) -> bool:
    return len(a) == len(b) and all(x[:-1] == y[:-1] for x, y in zip(a, b))


def changed(settings: dict, text: str, what: str) -> dict:
    """``settings`` with the ``KEY=VALUE,...`` of ``text`` replaced (only keys it has, numbers only)."""
    out = dict(settings)
    for part in filter(None, text.split(",")):
        key, _, value = (x.strip() for x in part.partition("="))
        if key not in settings or isinstance(settings[key], bool) or not isinstance(settings[key], (int, float)):
            raise SystemExit(f"replay_free: --{what} {text}: {key!r} is not one of the {what} settings "
                             f"{', '.join(k for k, v in settings.items() if type(v) in (int, float))}")
        number = float if isinstance(settings[key], float) else int
        try:
            out[key] = number(value)
        except ValueError:
            raise SystemExit(f"replay_free: --{what} {text}: {key} takes {'a number' if number is float else 'an integer'}, "
                             f"not {value!r}") from None
    return out


def parser():
    p = tool_parser("replay_free", __doc__)
    p.add_argument("folder", type=Path, help="a suite's results folder, e.g. results/benchmark/humaneval")
    p.add_argument("--suffix", action="append", default=[], metavar="KEY=VALUE,...",
                   help="a suffix cache with these keys of the job's suffix settings replaced (one row each)")
    p.add_argument("--ngram", action="append", default=[], metavar="KEY=VALUE,...",
                   help="an n-gram lookup with these keys of the job's lookup settings replaced (one row each)")
    p.add_argument("--costs", type=Path, default=None,
                   help="a cost-aware row's results file whose cost curve to use (default: the folder's own)")
    p.add_argument("--cost-aware", action="store_true",
                   help="each suffix row also under the cost rule (domino.adaptive), alone: the hybrid row without its drafter")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    rows, costs, pairs = load_job(args.folder, args.costs)
    ng = rows["ngram"]
    ng_settings = dict(ng["decoder"]["settings"])
    suffix_settings = dict(rows["suffix"]["decoder"]["settings"]) if "suffix" in rows else None

    if suffix_settings is None and (args.suffix or args.cost_aware):
        raise SystemExit(f"replay_free: {args.folder} holds no suffix row, whose settings --suffix and --cost-aware replace")
    lookups = [(f"ngram {text}", changed(ng_settings, text, "ngram")) for text in args.ngram]
    variants = [(f"suffix {text}", changed(suffix_settings, text, "suffix"), True) for text in args.suffix]
    if args.cost_aware:  # the hybrid row's suffix source: under the cost rule only, as the hybrid uses it
        hybrid = (rows.get("hybrid") or {}).get("decoder", {}).get("settings", {}).get("suffix")
        variants.insert(0, ("suffix (the hybrid's settings)", suffix_settings | dict(hybrid or {}), False))
    width = max([24] + [len(name) + 11 for name, *_ in lookups + variants])

    base = replay(ngram_draft(ng_settings), pairs, costs)
    plain = ng["summary"]["plain_seconds"]
    free = ng["summary"]["seconds"] - modelled_seconds(base, costs, 0.0)
    overhead = free / len(base["rows"])
    print(f"{args.folder}: {len(pairs)} answers, {sum(len(a) for _, a in pairs)} tokens; one verify row "
          f"{costs.rows(1) * 1e3:.2f} ms, {len(costs.verify)} rows {costs.verify[-1] * 1e3:.2f} ms; the loop outside "
          f"forwards and drafting {overhead * 1e3:.2f} ms a step (fitted to the ngram row)")
    print(f"{'row':{width}s} {'steps':>6s} {'accept len':>10s} {'speedup (model)':>15s} {'measured':>9s}  replayed steps")
    differ = []

    def show(name, r, recorded=None):
        """One replayed row; ``recorded``: the name of the job's row it replays, checked against it."""
        speed = plain / modelled_seconds(r, costs, overhead)
        measured, check = "", ""
        if recorded is not None:
            same = same_but_last(r["steps"], recorded_steps(rows[recorded]))
            differ.extend([] if same else [recorded])
            measured = f"{rows[recorded]['summary']['speedup']:.3f}"
            check = "as recorded" if same else "DIFFER from the recorded"
        print(f"{name:{width}s} {sum(map(len, r['steps'])):6d} {acceptance_length(r['steps']):10.3f} {speed:15.3f} "
              f"{measured:>9s}  {check}")

    show("ngram (the job's)", base, "ngram")
    if suffix_settings is not None:
        show("suffix (the job's)", replay(suffix_draft(suffix_settings), pairs, costs), "suffix")
    for name, s in lookups:
        show(name, replay(ngram_draft(s), pairs, costs))
    for name, s, alone in variants:
        if alone:
            show(name, replay(suffix_draft(s), pairs, costs))
        if args.cost_aware:
            show(f"{name}, cost rule", replay(CostAwareDraft(None, {"suffix": SuffixSource(suffix_draft(s))}), pairs, costs))
    if differ:
        print(f"replay_free: {why_steps_differ(rows, differ)}", file=sys.stderr)
    return 1 if differ else 0


def why_steps_differ(rows: dict, differ: list[str]) -> str:
    """Why the recorded rows ``differ`` did not give their replay's steps: where a row's output
    parted from plain greedy's (a bf16 or fp16 verifier's near ties, which the job replays in
    float32) it drafted over its own answer from the parting on, and the suffix cache learnt it;
    otherwise the answers are not the job's."""
    parted = [name for name in differ if not rows[name]["summary"]["matches_baseline"]]
    if parted == differ:
        dtype = rows[parted[0]]["protocol"].get("verifier_dtype", "low-precision")
        whose = " and ".join(parted) + (" rows'" if len(parted) > 1 else " row's")
        return (f"the {whose} outputs parted from plain greedy's (a {dtype} verifier's near ties, each replayed "
                "in float32 by the job), so from each parting on it drafted over its own answers, not the ones "
                "replayed: its replayed figures are approximate")
    return "a recorded row's steps differ from its replay: the answers are not its own"


if __name__ == "__main__":
    sys.exit(main())
