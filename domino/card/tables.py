"""Figures with intervals for the card, from the benchmark and validate results files.

Conventions, stated once:

* An ``Estimate`` is a figure with its 95% interval ``[low, high]``.
* Intervals recorded in a results file (``*_ci``, docs/results.md) are used as they are. The
  card derives a few more from the per-prompt records with ``domino.stats``, with the file's
  own bootstrap settings (``summary.bootstrap``: resamples, seed, level): the sum of the
  per-position acceptances from position 4 on, the conditional acceptances, and paired
  comparisons between checkpoints (``domino.stats.compare_checkpoints``).
* Draft position i is the i-th drafted token of a step, the token ``a+i+1`` after the anchor
  ``a``; validate's block slot with that target is the same token teacher-forced.
* Seed replicates (``train.replicates``) are compared by their point estimates only: replicate r
  of a checkpoint is the row ``<checkpoint>-seed<r>`` (r = 0: the checkpoint itself), trained with
  seed + r and benchmarked on the same prompts; their spread is across seeds, not an interval.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..acceptance import steps_accepting
from ..checkpoints import split_replicate, trained_checkpoints
from ..stats import (
    LEVEL,
    acceptance_length_difference,
    acceptance_length_pooled,
    compare_checkpoints,
    ratio_of_sums,
    zero_upper_bound,
)


class Estimate(NamedTuple):
    value: float
    low: float
    high: float
    successes: int | None = None  # for a rate: the steps counted (0: nothing accepted, printed as a count)
    trials: int | None = None     # the steps it rests on (0: no step reached the position)
    prompts: int | None = None    # with nothing counted: the prompts the upper bound is taken over

    def excludes(self, x: float) -> bool:
        """Whether the interval leaves out ``x``."""
        return not (self.low <= x <= self.high)


def estimate(summary: dict, key: str) -> Estimate:
    """``summary[key]`` with its recorded interval ``summary[key + "_ci"]``; the acceptance length
    of a drafter that accepted nothing is ``unaccepted_length`` (its recorded interval is the point
    [1, 1])."""
    if key == "acceptance_length" and summary.get("drafts_per_step") and summary.get("accepted") == 0 \
            and summary.get("steps"):
        level = float(summary.get("bootstrap", {}).get("level", LEVEL))
        return unaccepted_length(summary["steps"], summary["prompts"], summary["drafts_per_step"], level)
    return Estimate(summary[key], *summary[f"{key}_ci"])


def zero_estimate(trials: int, prompts: int, level: float) -> Estimate:
    """A rate with nothing counted: 0 of ``trials`` steps, up to the exact binomial bound over the
    ``prompts`` it came from (``domino.stats.zero_upper_bound``: steps of a prompt are not independent)."""
    return Estimate(0.0, 0.0, zero_upper_bound(prompts, level), 0, trials, prompts)


def unaccepted_length(steps: int, prompts: int, drafts_per_step: int, level: float) -> Estimate:
    """The acceptance length of steps that accepted no draft: 1, up to ``1 + D * b`` with ``b`` the
    exact upper bound of the share of steps accepting a draft over the ``prompts`` (a step accepts
    at most D drafts), not the point interval [1, 1] a bootstrap of nothing gives."""
    return Estimate(1.0, 1.0, 1.0 + drafts_per_step * zero_upper_bound(prompts, level), 0, steps, prompts)


def position_estimates(summary: dict, prompts_with_steps: int | None = None) -> list[Estimate]:
    """Per-position acceptance a_i with its recorded interval; a position no step accepted is
    "0 of N steps" with an upper bound: the recorded one, the exact bound over the prompts with a
    step (``prompts_with_steps``, default every prompt of the summary)."""
    values, bounds = summary["per_position_acceptance"], summary["per_position_acceptance_ci"]
    level = float(summary.get("bootstrap", {}).get("level", LEVEL))
    prompts = summary["prompts"] if prompts_with_steps is None else prompts_with_steps
    out = []
    for v, (low, high) in zip(values, bounds, strict=True):
        if v == 0:
            zero = zero_estimate(summary["steps"], prompts, level)
            out.append(zero._replace(high=high) if high > 0 else zero)
        else:
            out.append(Estimate(v, low, high))
    return out


class Bootstrap(NamedTuple):
    resamples: int
    seed: int
    level: float


def bootstrap_settings(bench: dict) -> Bootstrap:
    b = bench["summary"]["bootstrap"]
    return Bootstrap(int(b["resamples"]), int(b["seed"]), float(b["level"]))


def _accepted(bench: dict) -> list[list[int]]:
    """Accepted drafts per step, one list per prompt."""
    return [p["accepted_per_step"] for p in bench["prompts"]]


def _at_least(accepted: list[list[int]], k: int) -> np.ndarray:
    """(n,) per prompt: steps with at least k accepted drafts (k = 0: all steps)."""
    return np.array([steps_accepting(p, k) for p in accepted], dtype=float)


def tail_estimate(bench: dict, start: int = 4) -> Estimate | None:
    """sum_{i >= start} a_i (the card's pos_4+): accepted drafts beyond ``start`` per step, with a
    bootstrap interval from the per-prompt records (a point interval when no prompt took a step);
    None for a drafter with no draft position ``start``."""
    per_position = bench["summary"]["per_position_acceptance"]
    if len(per_position) <= start:
        return None
    value = float(sum(per_position[start:]))
    accepted, boot = _accepted(bench), bootstrap_settings(bench)
    if not any(accepted):  # no prompt took a step: nothing to bound
        return zero_estimate(0, 0, boot.level)
    if value == 0:
        return zero_estimate(int(_at_least(accepted, 0).sum()), sum(1 for p in accepted if p), boot.level)
    beyond = np.array([sum(max(0, c - start) for c in p) for p in accepted], dtype=float)
    iv = ratio_of_sums(beyond, _at_least(accepted, 0), boot.resamples, boot.seed, boot.level)
    return Estimate(value, iv.low, iv.high)


def conditional_estimates(bench: dict) -> list[Estimate | None]:
    """Conditional acceptance a_i / a_(i-1) per position, None where a_(i-1) is 0 (no step reached
    position i: the card prints "0 of 0 steps"); the interval resamples prompts (numerator and
    denominator step counts together), BCa; a rate with nothing accepted is "0 of N steps" with
    the exact bound over the prompts that reached the position."""
    s = bench["summary"]
    per_pos, cond = s["per_position_acceptance"], s["conditional_acceptance"]
    accepted, boot = _accepted(bench), bootstrap_settings(bench)
    out = []
    for i, c in enumerate(cond):
        if i > 0 and per_pos[i - 1] <= 0:
            out.append(None)
        else:
            hits, reached = _at_least(accepted, i + 1), _at_least(accepted, i)
            if hits.sum() == 0:
                out.append(zero_estimate(int(reached.sum()), int((reached > 0).sum()), boot.level))
                continue
            iv = ratio_of_sums(hits, reached, boot.resamples, boot.seed, boot.level)
            out.append(Estimate(c, iv.low, iv.high, int(hits.sum()), int(reached.sum())))
    return out


class Comparison(NamedTuple):
    """A vs B as relative differences ``A / B - 1`` with paired intervals."""
    acceptance_length: Estimate | None  # None where either row sent no draft
    speedup: Estimate


def compare(bench_a: dict, bench_b: dict) -> Comparison:
    """Paired bootstrap (``domino.stats.compare_checkpoints``) over the prompts both rows decoded, with
    A's bootstrap settings."""
    boot = bootstrap_settings(bench_a)
    c = compare_checkpoints(bench_a, bench_b, boot.seed, boot.resamples)
    al = c.acceptance_length
    return Comparison(None if al is None else Estimate(al.estimate, al.low, al.high),
                      Estimate(c.speedup.estimate, c.speedup.low, c.speedup.high))


@dataclass(frozen=True)
class CategoryRow:
    """One category of a suite: its tasks' pooled acceptance length per row, with intervals over
    those tasks, and one row's paired relative difference against another on them."""
    category: str
    tasks: int
    acceptance_length: dict[str, Estimate]  # row -> AL over the category's tasks
    difference: Estimate  # AL_a / AL_b - 1, paired over the category's tasks


def category_rows(benches: dict[str, dict], a: str, b: str) -> list[CategoryRow]:
    """Per category of the tasks (their records' ``category``, in first-seen order), the pooled
    acceptance length of each row of ``benches`` (row -> results, the same tasks) and ``a`` against
    ``b``, with ``a``'s bootstrap settings; [] when the tasks carry no category."""
    first = next(iter(benches.values()))["prompts"]
    categories = list(dict.fromkeys(p.get("category") for p in first))
    if categories == [None]:
        return []
    boot = bootstrap_settings(benches[a])
    rows = []
    for cat in categories:
        idx = [i for i, p in enumerate(first) if p.get("category") == cat]
        acc = {row: [bench["prompts"][i]["accepted_per_step"] for i in idx] for row, bench in benches.items()}
        als = {}
        for row, lists in acc.items():
            if not any(c for p in lists for c in p):  # nothing accepted: an upper bound, not [1, 1]
                als[row] = unaccepted_length(sum(map(len, lists)), sum(1 for p in lists if p),
                                             benches[row]["summary"]["drafts_per_step"], boot.level)
                continue
            iv = acceptance_length_pooled(lists, boot.resamples, boot.seed, boot.level)
            als[row] = Estimate(iv.estimate, iv.low, iv.high)
        d = acceptance_length_difference(acc[a], acc[b], boot.resamples, boot.seed, boot.level)
        rows.append(CategoryRow(cat, len(idx), als, Estimate(d.estimate, d.low, d.high)))
    return rows


# ---------------------------------------------------------------- teacher-forced vs served

@dataclass(frozen=True)
class PositionPair:
    position: int
    target: str                  # "a+1" for position 0
    marginal: float              # validate's final (served-branch) accuracy of the slot, on its own
    teacher_forced: float | None  # its conditional accuracy: right given every earlier drafting slot
                                  # right, counted per anchor; None where no anchor reached the slot
    served: Estimate | None      # conditional acceptance; None where undefined

    @property
    def gap(self) -> float | None:
        """served - teacher-forced conditional, as a fraction; None where either is undefined."""
        return None if self.served is None or self.teacher_forced is None else \
            self.served.value - self.teacher_forced


@dataclass(frozen=True)
class TeacherForcedVsServed:
    positions: list[PositionPair]
    counted_al: float            # validate's acceptance_length.final: 1 + sum_k P(slots up to k all right)
    served_al: Estimate          # pooled acceptance length
    first_apart: PositionPair | None  # first position whose served interval leaves out the teacher-forced value
    widest: PositionPair | None  # of those positions, the largest |gap|

    @property
    def al_gap(self) -> float:
        return self.served_al.value - self.counted_al

    @property
    def al_relative(self) -> float:
        return self.served_al.value / self.counted_al - 1


def teacher_forced_vs_served(validate: dict, bench: dict, served: list[Estimate | None]) -> TeacherForcedVsServed:
    """Per drafted position, the teacher-forced accuracy (conditional, counted per anchor, and
    marginal) beside the served conditional acceptance, and the acceptance length teacher forcing
    counts beside the served one. ``served``: the run's ``conditional_estimates(bench)``."""
    by_target = {s["target"]: s for s in validate["per_slot"]}
    pairs = []
    for i, est in enumerate(served):
        slot = by_target.get(f"a+{i + 1}")
        if slot is None:
            raise ValueError(f"validate file of {validate.get('checkpoint')!r} has no slot predicting a+{i + 1}")
        pairs.append(PositionPair(i, f"a+{i + 1}", slot["final_acc"], slot["final_conditional_acc"], est))
    defined = [p for p in pairs if p.gap is not None]
    apart = [p for p in defined if p.served.excludes(p.teacher_forced)]
    return TeacherForcedVsServed(
        positions=pairs,
        counted_al=float(validate["acceptance_length"]["final"]),
        served_al=estimate(bench["summary"], "acceptance_length"),
        first_apart=apart[0] if apart else None,
        widest=max(apart, key=lambda p: abs(p.gap), default=None),
    )


# ---------------------------------------------------------------- seed replicates

REPLICATE_METRICS = ("acceptance_length", "speedup")  # summary keys the replicate table reads
# each replicate's validate file: acceptance_length.final, counted per anchor on the validation split
TEACHER_FORCED = "teacher_forced_acceptance_length"


class Spread(NamedTuple):
    """One figure over the seed replicates of a checkpoint, on the same prompts."""
    values: tuple[float, ...]  # (N,) replicate 0 first
    mean: float
    sd: float                  # sample standard deviation (divisor N - 1)
    low: float                 # smallest replicate
    high: float                # largest replicate


def spread(values: list[float]) -> Spread:
    if len(values) < 2:
        raise ValueError(f"a spread across seeds needs at least two replicates, got {len(values)}")
    return Spread(tuple(values), statistics.mean(values), statistics.stdev(values), min(values), max(values))


class ReplicateRow(NamedTuple):
    checkpoint: str
    acceptance_length: Spread  # pooled acceptance length of each replicate
    speedup: Spread            # paired speedup over plain decoding of each replicate
    teacher_forced: Spread | None = None  # counted teacher-forced acceptance length of each replicate


@dataclass(frozen=True)
class Ordering:
    """``higher`` > ``lower`` in ``metric``, the direction replicate 0 shows (the list order on a tie),
    checked replicate by replicate (replicate r of one against replicate r of the other)."""
    higher: str
    lower: str
    metric: str                # a REPLICATE_METRICS key, or TEACHER_FORCED
    replicates: int
    fails: tuple[int, ...]     # replicates where higher <= lower

    @property
    def holds(self) -> int:
        return self.replicates - len(self.fails)

    @property
    def in_every_replicate(self) -> bool:
        return not self.fails


class ReplicateSummary(NamedTuple):
    replicates: int
    rows: list[ReplicateRow]
    orderings: list[Ordering]  # per pair, acceptance length, speedup, then teacher-forced where given


def _replicate_values(benches: dict[str, dict], checkpoints: list[str], replicates: int,
                      validates: dict[str, dict] | None = None) -> dict:
    """{checkpoint: {metric: [value of replicate 0, 1, ...]}} from the rows ``trained_checkpoints`` names."""
    rows = trained_checkpoints(checkpoints, replicates)
    metrics = REPLICATE_METRICS + ((TEACHER_FORCED,) if validates is not None else ())
    out = {c: {m: [None] * replicates for m in metrics} for c in checkpoints}
    for row in rows:
        if row not in benches:
            raise ValueError(f"seed replicates: no benchmark results for row {row!r}")
        ckpt, r = split_replicate(row)
        for m in REPLICATE_METRICS:
            out[ckpt][m][r] = float(benches[row]["summary"][m])
        if validates is not None:
            if row not in validates:
                raise ValueError(f"seed replicates: no validation results for row {row!r}")
            out[ckpt][TEACHER_FORCED][r] = float(validates[row]["acceptance_length"]["final"])
    return out


def replicate_summary(benches: dict[str, dict], checkpoints: list[str], replicates: int,
                      pairs: list[tuple[str, str]] | None = None,
                      validates: dict[str, dict] | None = None) -> ReplicateSummary:
    """Mean and spread across seed replicates of each checkpoint's acceptance length and speedup
    (and, given ``validates``, its teacher-forced acceptance length), and which orderings between
    checkpoints hold in every replicate.

    ``benches``: benchmark results by row name (replicate r >= 1 of checkpoint c is ``c-seed<r>``,
    ``domino.checkpoints.trained_checkpoints``); ``validates``: validate results by the same row names;
    ``pairs``: the checkpoint pairs to order (default: every pair of ``checkpoints``, in list order)."""
    values = _replicate_values(benches, checkpoints, replicates, validates)
    metrics = list(values[checkpoints[0]]) if checkpoints else list(REPLICATE_METRICS)
    rows = [ReplicateRow(c, *(spread(values[c][m]) for m in metrics)) for c in checkpoints]
    if pairs is None:
        pairs = [(a, b) for i, a in enumerate(checkpoints) for b in checkpoints[i + 1:]]
    orderings = []
    for a, b in pairs:
        for m in metrics:
            hi, lo = (b, a) if values[b][m][0] > values[a][m][0] else (a, b)
            fails = tuple(r for r in range(replicates) if not values[hi][m][r] > values[lo][m][r])
            orderings.append(Ordering(hi, lo, m, replicates, fails))
    return ReplicateSummary(replicates, rows, orderings)


def vllm_row(summary: dict) -> dict:
    """One row of the vLLM table: vLLM's figures (with the paired intervals where the run has
    them) beside the project's loop on the same prompts."""
    def est(key):
        return estimate(summary, key) if f"{key}_ci" in summary else Estimate(summary[key], summary[key],
                                                                                summary[key])
    per_pos = summary.get("per_position_acceptance") or []
    ours_pos = summary.get("ours_per_position_acceptance") or []
    return {**summary, "speedup_est": est("speedup"),
            "tps_ratio": est("tps_ratio_to_ours") if "tps_ratio_to_ours" in summary else None,
            "pos": [per_pos[i] if i < len(per_pos) else None for i in range(4)],
            "ours_pos": [ours_pos[i] if i < len(ours_pos) else None for i in range(4)]}
