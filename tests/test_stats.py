"""Bootstrap intervals and acceptance-length definitions against cases worked out by hand.

Seed 0 draws these prompt indices (numpy's default_rng(0).integers(0, 3, size=(5, 3))), pinned
here so every hand computation below can be followed row by row:

    [2, 1, 1], [0, 0, 0], [0, 0, 0], [2, 1, 2], [1, 1, 2]

With 5 resamples the 95% percentile interval is read at sorted positions 0.025 * 4 = 0.1 and
0.975 * 4 = 3.9 (linear interpolation): low = s0 + 0.1 (s1 - s0), high = s3 + 0.9 (s4 - s3).
"""

import numpy as np
import pytest

from domino import stats

ROWS = [[2, 1, 1], [0, 0, 0], [0, 0, 0], [2, 1, 2], [1, 1, 2]]


@pytest.fixture(autouse=True)
def percentile(request, monkeypatch):
    """The hand-worked cases read plain percentile quantiles; the tests named ``test_bca_*`` read BCa."""
    if not request.node.name.startswith("test_bca"):
        monkeypatch.setattr(stats, "METHOD", "percentile")
# three prompts: accepted drafts per step; steps (2, 2, 1), accepted (2, 4, 1)
ACCEPTED = [[0, 2], [3, 1], [1]]


def test_seed_zero_draws_the_pinned_indices():
    assert stats.resample_indices(3, 5, seed=0).tolist() == ROWS
    with pytest.raises(ValueError, match="at least one prompt"):
        stats.resample_indices(0, 5)


def test_mean_interval_by_hand():
    # values (1, 2, 6): resample means 10/3, 1, 1, 14/3, 10/3 -> sorted 1, 1, 10/3, 10/3, 14/3
    iv = stats.mean_interval([1.0, 2.0, 6.0], resamples=5, seed=0)
    assert iv.estimate == pytest.approx(3.0)
    assert iv.low == pytest.approx(1.0)
    assert iv.high == pytest.approx(10 / 3 + 0.9 * (14 / 3 - 10 / 3))  # 4.5333
    assert (iv.level, iv.resamples, iv.seed) == (0.95, 5, 0)
    # level 0.5: positions 1 and 3 exactly
    half = stats.mean_interval([1.0, 2.0, 6.0], resamples=5, seed=0, level=0.5)
    assert (half.low, half.high) == pytest.approx((1.0, 10 / 3))
    with pytest.raises(ValueError, match="level must lie in"):
        stats.mean_interval([1.0, 2.0], level=1.0)


def test_two_point_bootstrap_covers_both_ends():
    # mean of two resampled values from {0, 1}: 0, 1/2, 1 with probabilities 1/4, 1/2, 1/4, so the
    # 2.5% and 97.5% quantiles of many resamples are 0 and 1 whatever the seed
    for seed in (0, 1, 2):
        iv = stats.mean_interval([0.0, 1.0], resamples=2000, seed=seed)
        assert (iv.estimate, iv.low, iv.high) == (0.5, 0.0, 1.0)
    # a constant sample has a zero-width interval
    assert stats.mean_interval([2.0, 2.0, 2.0], resamples=50).bounds() == [2.0, 2.0]


def test_same_seed_same_interval_and_the_seed_matters():
    x = np.random.default_rng(7).normal(size=40)
    a, b = stats.mean_interval(x, resamples=200, seed=3), stats.mean_interval(x, resamples=200, seed=3)
    assert a == b
    assert stats.mean_interval(x, resamples=200, seed=4).bounds() != a.bounds()
    assert a.contains(a.estimate) and a.to_dict()["resamples"] == 200


def test_paired_speedup_by_hand():
    # plain (2, 4, 6), speculative (1, 4, 2): estimate 12 / 7
    # rows: 14/10, 6/3, 6/3, 16/8, 14/10 -> sorted 1.4, 1.4, 2, 2, 2
    iv = stats.paired_speedup([2.0, 4.0, 6.0], [1.0, 4.0, 2.0], resamples=5, seed=0)
    assert iv.estimate == pytest.approx(12 / 7)
    assert (iv.low, iv.high) == pytest.approx((1.4, 2.0))
    # pairing: speculative exactly half the plain time on every prompt gives 2 in every resample,
    # however different the prompts' lengths
    iv = stats.paired_speedup([1.0, 5.0, 9.0, 0.5], [0.5, 2.5, 4.5, 0.25], resamples=300, seed=1)
    assert (iv.estimate, iv.low, iv.high) == (2.0, 2.0, 2.0)
    with pytest.raises(ValueError, match="same prompts"):
        stats.paired_speedup([1.0, 2.0], [1.0])


def test_pooled_acceptance_length_by_hand():
    # pooled: 1 + 7 / 5 = 2.4. Per prompt (steps + accepted, steps) = (4, 2), (6, 2), (2, 1)
    # rows: 14/5, 12/6, 12/6, 10/4, 14/5 -> sorted 2, 2, 2.5, 2.8, 2.8
    iv = stats.acceptance_length_pooled(ACCEPTED, resamples=5, seed=0)
    assert iv.estimate == pytest.approx(2.4)
    assert (iv.low, iv.high) == pytest.approx((2.0, 2.8))


def test_per_prompt_mean_acceptance_length_by_hand():
    # per prompt 1 + accepted / steps = 2, 3, 2 -> mean 7/3 (pooled gives 2.4: the definitions differ)
    # rows: 8/3, 2, 2, 7/3, 8/3 -> sorted 2, 2, 7/3, 8/3, 8/3
    iv = stats.acceptance_length_per_prompt_mean(ACCEPTED, resamples=5, seed=0)
    assert iv.estimate == pytest.approx(7 / 3)
    assert (iv.low, iv.high) == pytest.approx((2.0, 8 / 3))
    # a prompt without a speculative step is left out of the mean and adds nothing to the pooled sums
    assert stats.acceptance_length_per_prompt_mean(ACCEPTED + [[]], resamples=5).estimate == pytest.approx(7 / 3)
    assert stats.acceptance_length_pooled(ACCEPTED + [[]], resamples=5).estimate == pytest.approx(2.4)
    with pytest.raises(ValueError, match="no speculative steps"):
        stats.acceptance_length_pooled([[], []])


def test_per_position_acceptance_by_hand():
    # steps with >= 1, 2, 3 accepted per prompt: (1, 1, 0), (2, 1, 1), (1, 0, 0); steps (2, 2, 1)
    # pooled: (4, 2, 1) / 5. Rows (sums / steps):
    #   [2,1,1] (5, 2, 2)/5   [0,0,0] (3, 3, 0)/6 twice   [2,1,2] (4, 1, 1)/4   [1,1,2] (5, 2, 2)/5
    ivs = stats.per_position_acceptance(ACCEPTED, 3, resamples=5, seed=0)
    assert [i.estimate for i in ivs] == pytest.approx([0.8, 0.4, 0.2])
    # position 0: 0.5, 0.5, 1, 1, 1; position 1: 0.25, 0.4, 0.4, 0.5, 0.5; position 2: 0, 0, 0.25, 0.4, 0.4
    assert [(i.low, i.high) for i in ivs] == [pytest.approx(b) for b in [(0.5, 1.0), (0.265, 0.5), (0.0, 0.4)]]


def test_paired_relative_difference_by_hand():
    # B accepts nothing in the same steps: AL_B = 1 in every resample, so AL_A / AL_B - 1 = AL_A - 1
    none = [[0, 0], [0, 0], [0]]
    iv = stats.acceptance_length_difference(ACCEPTED, none, resamples=5, seed=0)
    assert (iv.estimate, iv.low, iv.high) == pytest.approx((1.4, 1.0, 1.8))
    assert iv.excludes_zero()
    same = stats.acceptance_length_difference(ACCEPTED, ACCEPTED, resamples=5, seed=0)
    assert (same.estimate, same.low, same.high) == (0.0, 0.0, 0.0) and not same.excludes_zero()
    with pytest.raises(ValueError, match="same"):
        stats.acceptance_length_difference(ACCEPTED, none[:2])
    # two paired speedups: A (12/7 as above) against B = 1 on every prompt
    iv = stats.paired_relative_difference([2, 4, 6], [1, 4, 2], [1, 1, 1], [1, 1, 1], resamples=5, seed=0)
    assert (iv.estimate, iv.low, iv.high) == pytest.approx((12 / 7 - 1, 0.4, 1.0))


def test_implied_acceptance_length_by_hand():
    # 1 + 0.5 + 0.5*0.5 + 0.5*0.5*0 = 1.75; 1 + 0.4 + 0.4*0.5 + 0.4*0.5*1 = 1.8
    assert stats.implied_acceptance_length([0.5, 0.5, 0.0]) == pytest.approx(1.75)
    assert stats.implied_acceptance_length([0.4, 0.5, 1.0]) == pytest.approx(1.8)
    assert stats.implied_acceptance_length([]) == 1.0
    with pytest.raises(ValueError, match="must lie in"):
        stats.implied_acceptance_length([0.5, 1.2])


def test_interval_coverage_of_a_known_mean():
    """About 95% of intervals from fresh samples hold the true mean (a loose band: 100 trials)."""
    rng = np.random.default_rng(11)
    hits = sum(stats.mean_interval(rng.exponential(size=60), resamples=400, seed=t).contains(1.0)
               for t in range(100))
    assert 85 <= hits <= 100


def test_bca_moves_a_skewed_interval_and_keeps_a_symmetric_one():
    # a skewed sample (exponential): BCa shifts both bounds up against the percentile interval
    x = np.random.default_rng(1).exponential(size=60)
    bca = stats.mean_interval(x, resamples=4000, seed=0)
    stats.METHOD = "percentile"
    try:
        pct = stats.mean_interval(x, resamples=4000, seed=0)
    finally:
        stats.METHOD = "bca"
    assert bca.estimate == pct.estimate and bca.low > pct.low and bca.high > pct.high
    # a constant sample still has a zero-width interval
    assert stats.mean_interval([2.0, 2.0, 2.0], resamples=50).bounds() == [2.0, 2.0]


def test_bca_a_position_nothing_accepted_has_an_upper_bound_over_prompts():
    # drafts per step 3; no step accepts 3 drafts: [0, 0] would claim certainty
    accepted = [[0, 1, 2], [1, 0], [2, 2, 0, 1]]
    ivs = stats.per_position_acceptance(accepted, 3, resamples=200, seed=0)
    assert ivs[2].estimate == 0 and ivs[2].low == 0
    # exact binomial bound with the 3 prompts as trials: 1 - 0.025 ** (1 / 3)
    assert ivs[2].high == pytest.approx(1 - 0.025 ** (1 / 3)) == stats.zero_upper_bound(3)
    assert ivs[0].high < 1 and ivs[0].low > 0
    assert stats.zero_upper_bound(0) == 1.0


def test_bca_sampled_speedup_is_the_ratio_of_token_rates():
    # spec: 30 tokens in 1 s + 10 in 1 s = 20 tok/s; plain: 20 in 2 s + 20 in 2 s = 10 tok/s
    iv = stats.paired_rate_ratio([30, 10], [1.0, 1.0], [20, 20], [2.0, 2.0], resamples=200, seed=0)
    assert iv.estimate == pytest.approx(2.0)
    # the seconds ratio would say 4 / 2 = 2 too only by chance; with other lengths they part
    iv = stats.paired_rate_ratio([40, 40], [1.0, 1.0], [20, 20], [1.0, 1.0], resamples=200, seed=0)
    assert iv.estimate == pytest.approx(2.0) and stats.paired_speedup([1.0, 1.0], [1.0, 1.0]).estimate == 1.0


def _records(tokens, seconds, plain_seconds):
    return [{"task_id": f"t/{i}", "prompt_token_ids": [i], "accepted_per_step": [1] * (n // 2),
             "new_token_ids": list(range(n)), "seconds": s, "plain_seconds": p}
            for i, (n, s, p) in enumerate(zip(tokens, seconds, plain_seconds))]


def test_checkpoints_compare_speed_by_token_rates_not_seconds():
    """A and B share their plain decodes (one benchmark job). A writes 30 + 10 tokens in 1 + 1 s,
    20 tok/s, B 20 + 20 in 1 + 1 s: the same speed. Where A writes 10 tokens more in the same
    seconds (an output that parted at a near tie) it is faster, 25 tok/s against 20, +25%, where
    a ratio of seconds would say 0."""
    plain = [2.0, 2.0]
    a = {"row": "a", "prompts": _records([30, 10], [1.0, 1.0], plain)}
    b = {"row": "b", "prompts": _records([20, 20], [1.0, 1.0], plain)}
    assert stats.compare_checkpoints(a, b, resamples=200).speedup.estimate == pytest.approx(0.0)
    a = {"row": "a", "prompts": _records([30, 20], [1.0, 1.0], plain)}
    b = {"row": "b", "prompts": _records([20, 20], [1.0, 1.0], plain)}
    assert stats.compare_checkpoints(a, b, resamples=200).speedup.estimate == pytest.approx(0.25)
    # speculative seconds 1 and 2 against B's 1 and 1: the seconds ratio says -33%; the rates 40 / 3 against 20 say -33% too
    a = {"row": "a", "prompts": _records([20, 20], [1.0, 2.0], plain)}
    assert stats.compare_checkpoints(a, b, resamples=200).speedup.estimate == pytest.approx(40 / 3 / 20 - 1)
    # rows timed beside other plain decodes are refused: their records hold no plain token counts
    c = {"row": "c", "prompts": _records([20, 20], [1.0, 1.0], [2.0, 2.5])}
    with pytest.raises(ValueError, match="'a' and 'c' were timed beside other plain decodes"):
        stats.compare_checkpoints(a, c)
