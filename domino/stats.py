"""Intervals for benchmark figures: BCa bootstrap over prompts.

Conventions, stated once:

* The unit of resampling is the prompt. A resample draws ``n`` prompt indices with
  replacement from ``numpy.random.default_rng(seed)`` as one ``(resamples, n)`` array; every
  statistic of one call sees the same draws, so figures compared on the same prompts (plain
  vs speculative seconds, checkpoint A vs checkpoint B) are paired.
* The interval is the BCa (bias-corrected and accelerated) interval: the quantiles of the
  resampled statistic at ``Phi(z0 + (z0 + z) / (1 - a (z0 + z)))`` for ``z`` the normal
  quantiles of ``(1 -+ level) / 2``, with ``z0`` the bias (the normal quantile of the share of
  resamples below the estimate) and ``a`` the acceleration from the leave-one-prompt-out
  jackknife. Ratios of sums and relative differences are skewed near 0 and 1, where the plain
  percentile interval is off; BCa corrects to second order. Where the correction is undefined
  (every resample on one side of the estimate, or a zero-width spread) the percentile interval
  is used. The estimate is the statistic on the prompts as they are.
* A proportion of zero (no step accepted a draft at some position) has no spread to resample:
  its interval is ``[0, zero_upper_bound(P)]``, the exact binomial upper bound with the P
  prompts as the trials, since steps of one prompt are not independent.
* Acceptance counts come as one list per prompt of accepted drafts per speculative step
  (``DecodeResult.accepted_per_step``). Two acceptance-length definitions are in use:
  *pooled* ``1 + sum(accepted) / sum(steps)`` over all steps of all prompts (the seed card,
  vLLM, speculators and this project's headline) and *per-prompt mean*, the average over
  prompts of ``1 + accepted / steps`` (z-lab's DFlash benchmark). A prompt with no
  speculative step has no acceptance of its own: it adds nothing to the pooled sums and is
  left out of the per-prompt mean.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Callable, NamedTuple

import numpy as np

from .acceptance import position_counts

# Bootstrap resamples. On the default run's 164 prompts the 95% bounds of the pooled AL move by
# about 0.0015 (standard deviation over bootstrap seeds) at 2000 and 0.0025 at 500: well under
# the interval's own width (about 0.08), for a cost of about 0.2 s per results file.
RESAMPLES = 2000
LEVEL = 0.95
# "bca" (every results file), or "percentile": the plain quantiles, which BCa falls back to where
# its correction is undefined and which tests/test_stats.py's hand-worked cases read
METHOD = "bca"


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float
    level: float
    resamples: int
    seed: int

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def excludes_zero(self) -> bool:
        return not self.contains(0.0)

    def bounds(self) -> list[float]:
        """``[low, high]``: the form the results files store beside each estimate."""
        return [self.low, self.high]

    def to_dict(self) -> dict:
        return asdict(self)


def resample_indices(n: int, resamples: int = RESAMPLES, seed: int = 0) -> np.ndarray:
    """(resamples, n) prompt indices drawn with replacement."""
    if n < 1:
        raise ValueError("a bootstrap needs at least one prompt")
    if resamples < 1:
        raise ValueError("a bootstrap needs at least one resample")
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def _bootstrap_draws(statistic: Callable[[np.ndarray], np.ndarray], n: int, resamples: int, seed: int):
    """``statistic`` maps an (R, m) index array to (R,) or (R, D) values. Returns (estimate, draws, jackknife):
    the statistic of the sample, of each resample and of each leave-one-prompt-out sample."""
    estimate = np.asarray(statistic(np.arange(n)[None]), dtype=float)[0]
    draws = np.asarray(statistic(resample_indices(n, resamples, seed)), dtype=float)
    if n > 1:
        leave_out = np.array([np.delete(np.arange(n), i) for i in range(n)])  # (n, n-1)
        jackknife = np.asarray(statistic(leave_out), dtype=float)
    else:
        jackknife = np.full((1, *np.shape(estimate)), np.nan)
    return estimate, draws, jackknife


def _check_level(level: float) -> None:
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level}")


def _bca_bounds(estimate: float, draws: np.ndarray, jackknife: np.ndarray, level: float) -> tuple[float, float]:
    """BCa bounds of one scalar statistic (module docstring); the percentile bounds where the
    correction is undefined. NaN draws (an undefined statistic) are left out."""
    _check_level(level)
    tails = [(1 - level) / 2, (1 + level) / 2]
    d = draws[~np.isnan(draws)]
    if d.size == 0:
        return float("nan"), float("nan")
    normal = NormalDist()
    below = (np.sum(d < estimate) + 0.5 * np.sum(d == estimate)) / d.size
    jk = jackknife[~np.isnan(jackknife)]
    if METHOD == "percentile" or not 0.0 < below < 1.0 or np.ptp(d) == 0 or jk.size < 2:
        low, high = np.quantile(d, tails)
        return float(low), float(high)
    z0 = normal.inv_cdf(float(below))
    dev = jk.mean() - jk
    spread = float(np.sum(dev ** 2))
    a = float(np.sum(dev ** 3)) / (6.0 * spread ** 1.5) if spread > 0 else 0.0
    adjusted = []
    for t in tails:
        z = normal.inv_cdf(t)
        adjusted.append(normal.cdf(z0 + (z0 + z) / (1.0 - a * (z0 + z))))
    low, high = np.quantile(d, adjusted)
    return float(low), float(high)


def bootstrap(statistic: Callable[[np.ndarray], np.ndarray], n: int, resamples: int = RESAMPLES, seed: int = 0,
              level: float = LEVEL) -> Interval:
    """BCa interval of a scalar statistic of ``n`` prompts.

    statistic: (R, m) prompt indices -> (R,) values (any m: the jackknife passes m = n - 1); row
    0 of ``np.arange(n)[None]`` is the sample itself. Resamples whose statistic is undefined
    (NaN, e.g. no step at all) are left out of the quantiles."""
    estimate, draws, jackknife = _bootstrap_draws(statistic, n, resamples, seed)
    low, high = _bca_bounds(float(estimate), draws, jackknife, level)
    return Interval(float(estimate), low, high, level, resamples, seed)


def bootstrap_each(statistic: Callable[[np.ndarray], np.ndarray], n: int, resamples: int = RESAMPLES,
                   seed: int = 0, level: float = LEVEL) -> list[Interval]:
    """``bootstrap`` for a vector statistic, (R, m) -> (R, D): one interval per component."""
    estimate, draws, jackknife = _bootstrap_draws(statistic, n, resamples, seed)
    out = []
    for j, e in enumerate(estimate):
        low, high = _bca_bounds(float(e), draws[:, j], jackknife[:, j], level)
        out.append(Interval(float(e), low, high, level, resamples, seed))
    return out


def zero_upper_bound(trials: int, level: float = LEVEL) -> float:
    """The exact (Clopper-Pearson) upper bound of a proportion seen 0 times in ``trials``:
    ``1 - ((1 - level) / 2) ** (1 / trials)``, the two-sided interval's upper end (about
    3.7 / trials at 95%). 1.0 for no trials."""
    _check_level(level)
    return 1.0 if trials <= 0 else float(1.0 - ((1 - level) / 2) ** (1.0 / trials))


def mean_interval(values, resamples: int = RESAMPLES, seed: int = 0, level: float = LEVEL) -> Interval:
    """The mean of per-prompt values with its BCa bootstrap interval."""
    x = np.asarray(values, dtype=float)
    return bootstrap(lambda idx: x[idx].mean(axis=-1), len(x), resamples, seed, level)


def _ratio_of_sums(numerator: np.ndarray, denominator: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """idx (R, n) -> sum(numerator[idx]) / sum(denominator[idx]) per row; NaN where the denominator is 0.

    numerator: (n,) or (n, D); denominator: (n,)."""
    def statistic(idx):
        num, den = numerator[idx].sum(axis=1), denominator[idx].sum(axis=1)  # (R,) or (R, D); (R,)
        if num.ndim == 2:
            den = den[:, None]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)
    return statistic


def ratio_of_sums(numerator, denominator, resamples: int = RESAMPLES, seed: int = 0,
                  level: float = LEVEL) -> Interval:
    """``sum(numerator) / sum(denominator)`` over prompts, both resampled with the same indices."""
    num, den = np.asarray(numerator, dtype=float), np.asarray(denominator, dtype=float)
    if num.shape != den.shape:
        raise ValueError(f"numerator {num.shape} and denominator {den.shape} must cover the same prompts")
    if den.sum() <= 0:
        raise ValueError("the denominator sums to zero")
    return bootstrap(_ratio_of_sums(num, den), len(num), resamples, seed, level)


def _steps_and_accepted(accepted_per_step: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Per prompt: number of speculative steps and accepted drafts, each (n,)."""
    steps = np.array([len(p) for p in accepted_per_step], dtype=float)
    accepted = np.array([sum(p) for p in accepted_per_step], dtype=float)
    if steps.sum() == 0:
        raise ValueError("no speculative steps to summarise")
    return steps, accepted


def acceptance_length_pooled(accepted_per_step: list[list[int]], resamples: int = RESAMPLES, seed: int = 0,
                             level: float = LEVEL) -> Interval:
    """Pooled AL ``1 + sum(accepted) / sum(steps)``: committed tokens per verifier step."""
    steps, accepted = _steps_and_accepted(accepted_per_step)
    return ratio_of_sums(steps + accepted, steps, resamples, seed, level)


def acceptance_length_per_prompt_mean(accepted_per_step: list[list[int]], resamples: int = RESAMPLES,
                                      seed: int = 0, level: float = LEVEL) -> Interval:
    """Per-prompt-mean AL: the average over prompts (with a step) of ``1 + accepted / steps``."""
    steps, accepted = _steps_and_accepted(accepted_per_step)
    kept = steps > 0
    return mean_interval(1.0 + accepted[kept] / steps[kept], resamples, seed, level)


def per_position_acceptance(accepted_per_step: list[list[int]], drafts_per_step: int, resamples: int = RESAMPLES,
                            seed: int = 0, level: float = LEVEL) -> list[Interval]:
    """a_i, the share of all steps with at least i+1 accepted drafts (pooled, as
    ``domino.acceptance.acceptance_summary``), i = 0..drafts_per_step-1, with one interval each:
    BCa, or ``[0, zero_upper_bound(prompts with a step)]`` where no step accepted position i."""
    steps, _ = _steps_and_accepted(accepted_per_step)
    at_least = np.array([position_counts(p, drafts_per_step) for p in accepted_per_step],
                        dtype=float).reshape(len(accepted_per_step), drafts_per_step)  # (n, D)
    out = bootstrap_each(_ratio_of_sums(at_least, steps), len(steps), resamples, seed, level)
    upper = zero_upper_bound(int((steps > 0).sum()), level)
    return [Interval(iv.estimate, 0.0, upper, level, resamples, seed) if at_least[:, i].sum() == 0 else iv
            for i, iv in enumerate(out)]


def paired_speedup(plain_seconds, speculative_seconds, resamples: int = RESAMPLES, seed: int = 0,
                   level: float = LEVEL) -> Interval:
    """``sum(plain) / sum(speculative)`` over prompts decoded both ways; one set of indices for both."""
    return ratio_of_sums(plain_seconds, speculative_seconds, resamples, seed, level)


def paired_rate_ratio(tokens, seconds, plain_tokens, plain_seconds, resamples: int = RESAMPLES, seed: int = 0,
                      level: float = LEVEL) -> Interval:
    """The speedup of sampled decoding, whose plain and speculative outputs differ in length:
    ``(sum(tokens) / sum(seconds)) / (sum(plain_tokens) / sum(plain_seconds))``, speculative
    tokens per second over plain tokens per second, both decodes of a prompt resampled together.
    Equals ``paired_speedup`` when the outputs have the same lengths."""
    ratio = paired_relative_difference(tokens, seconds, plain_tokens, plain_seconds, resamples, seed, level)
    return Interval(ratio.estimate + 1.0, ratio.low + 1.0, ratio.high + 1.0, level, resamples, seed)


def paired_relative_difference(numerator_a, denominator_a, numerator_b, denominator_b, resamples: int = RESAMPLES,
                               seed: int = 0, level: float = LEVEL) -> Interval:
    """``(sum(num_a) / sum(den_a)) / (sum(num_b) / sum(den_b)) - 1`` over the same prompts, A and B
    resampled with the same indices. 0 means no difference; see ``Interval.excludes_zero``."""
    arrays = [np.asarray(x, dtype=float) for x in (numerator_a, denominator_a, numerator_b, denominator_b)]
    if len({a.shape for a in arrays}) != 1:
        raise ValueError("A and B must cover the same prompts")
    ratio_a, ratio_b = _ratio_of_sums(arrays[0], arrays[1]), _ratio_of_sums(arrays[2], arrays[3])

    def statistic(idx):
        with np.errstate(invalid="ignore", divide="ignore"):
            return ratio_a(idx) / ratio_b(idx) - 1.0
    return bootstrap(statistic, len(arrays[0]), resamples, seed, level)


def acceptance_length_difference(accepted_a: list[list[int]], accepted_b: list[list[int]],
                                 resamples: int = RESAMPLES, seed: int = 0, level: float = LEVEL) -> Interval:
    """Relative difference of pooled AL, ``AL_a / AL_b - 1``, of two checkpoints on the same prompts."""
    if len(accepted_a) != len(accepted_b):
        raise ValueError(f"{len(accepted_a)} and {len(accepted_b)} prompts: a paired comparison needs the same")
    steps_a, acc_a = _steps_and_accepted(accepted_a)
    steps_b, acc_b = _steps_and_accepted(accepted_b)
    return paired_relative_difference(steps_a + acc_a, steps_a, steps_b + acc_b, steps_b, resamples, seed, level)


def implied_acceptance_length(conditional_accuracies) -> float:
    """AL implied by per-slot conditional accuracies acc_k (slot k right given slots < k right):
    ``1 + sum_k prod_{j<=k} acc_j``, the expected committed tokens per step if each slot's
    acceptance were independent of everything but the slots before it."""
    acc = np.asarray(conditional_accuracies, dtype=float)
    if np.any((acc < 0) | (acc > 1)):
        raise ValueError("accuracies must lie in [0, 1]")
    return float(1.0 + np.cumprod(acc).sum())


class CheckpointComparison(NamedTuple):
    """A vs B on the same prompts, each a relative difference ``A / B - 1`` with a paired interval."""
    acceptance_length: Interval | None  # pooled AL; None where either row sent no draft
    speedup: Interval  # paired speedups (ratios of token rates), each against the plain decodes beside it


def compare_checkpoints(result_a: dict, result_b: dict, seed: int = 0,
                        resamples: int = RESAMPLES) -> CheckpointComparison:
    """Paired comparison of two speculative results files of the same prompts (e.g. Domino vs
    DFlash noshift). Speedups are compared, each a ratio of token rates (speculative tokens per
    second over the plain tokens per second beside them): a ratio of seconds would set times of
    other token counts against each other wherever a decode's output has another length (a
    low-precision parting at a near tie). Rows of one benchmark job share their plain decodes, so
    the plain rates cancel and ``speedup_a / speedup_b - 1`` is A's speculative token rate over
    B's, both timed in the same minutes; rows timed beside other plain decodes are refused (their
    records do not hold the plain decodes' token counts)."""
    pa, pb = result_a["prompts"], result_b["prompts"]
    if [(r["task_id"], r["prompt_token_ids"]) for r in pa] != [(r["task_id"], r["prompt_token_ids"]) for r in pb]:
        raise ValueError(f"rows {result_a.get('row')!r} and {result_b.get('row')!r} decoded other prompts")
    if [r["plain_seconds"] for r in pa] != [r["plain_seconds"] for r in pb]:
        raise ValueError(f"rows {result_a.get('row')!r} and {result_b.get('row')!r} were timed beside other plain "
                         "decodes: their speedups compare only within one benchmark job")
    steps_a, steps_b = ([r["accepted_per_step"] for r in p] for p in (pa, pb))
    # no acceptance length to compare where a row sent no draft (a cost-aware row that decoded plainly)
    al = acceptance_length_difference(steps_a, steps_b, resamples, seed) if any(steps_a) and any(steps_b) else None
    speed = paired_relative_difference([len(r["new_token_ids"]) for r in pa], [r["seconds"] for r in pa],
                                       [len(r["new_token_ids"]) for r in pb], [r["seconds"] for r in pb],
                                       resamples, seed)
    return CheckpointComparison(al, speed)


def acceptance_intervals(accepted_per_step: list[list[int]], drafts_per_step: int, resamples: int = RESAMPLES,
                         seed: int = 0) -> dict:
    """95% bootstrap intervals over prompts for ``acceptance_summary``'s figures,
    and the second acceptance-length definition.

    Returns ``acceptance_length_ci`` ([low, high] of the pooled AL), ``acceptance_length_per_prompt_mean``
    (the mean over prompts with a step of ``1 + accepted / steps``, z-lab's DFlash definition)
    with ``acceptance_length_per_prompt_mean_ci``, and ``per_position_acceptance_ci`` (one
    [low, high] per position)."""
    pooled = acceptance_length_pooled(accepted_per_step, resamples, seed)
    per_prompt = acceptance_length_per_prompt_mean(accepted_per_step, resamples, seed)
    positions = per_position_acceptance(accepted_per_step, drafts_per_step, resamples, seed)
    return {"acceptance_length_ci": pooled.bounds(), "acceptance_length_per_prompt_mean": per_prompt.estimate,
            "acceptance_length_per_prompt_mean_ci": per_prompt.bounds(),
            "per_position_acceptance_ci": [i.bounds() for i in positions]}
