"""Loss, weights, curriculum and acceptance metrics against cases worked out by hand."""

import math

import pytest
import torch

from domino import stats
from domino.acceptance import acceptance_from_counts, acceptance_summary
from domino.loss import (
    counted_acceptance,
    lambda_at,
    linear_warmup_lr,
    prefix_accuracy,
    slot_accuracy,
    slot_weights,
    weighted_ce,
    weighted_kl,
)


def test_slot_weights_by_hand():
    # gamma = 2, B = 4: classic [0, 1, e^-0.5, e^-1]; shifted [1, e^-0.5, e^-1, e^-1.5]
    torch.testing.assert_close(slot_weights(4, 2.0, "classic"),
                               torch.tensor([0.0, 1.0, 0.6065306597, 0.3678794412]))
    torch.testing.assert_close(slot_weights(4, 2.0, "shifted"),
                               torch.tensor([1.0, 0.6065306597, 0.3678794412, 0.2231301601]))
    with pytest.raises(ValueError, match="unknown weighting 'other'"):
        slot_weights(4, 2.0, "other")


def test_weighted_ce_by_hand():
    # two slots, vocab 2. Slot 0 logits [0, 0] -> CE ln 2; slot 1 logits [ln 3, 0] target 1 ->
    # p(1) = 1/4 -> CE ln 4. Weights [1, 0.5], both supervised:
    # (1 * ln 2 + 0.5 * ln 4) / 2 = ln 2.
    logits = torch.tensor([[[0.0, 0.0], [math.log(3.0), 0.0]]])
    targets = torch.tensor([[0, 1]])
    mask = torch.tensor([[True, True]])
    w = torch.tensor([1.0, 0.5])
    assert weighted_ce(logits, targets, mask, w).item() == pytest.approx(math.log(2))
    # masking slot 1 leaves ln 2 / 1; a zero weight is not counted as supervised
    assert weighted_ce(logits, targets, torch.tensor([[True, False]]), w).item() == pytest.approx(math.log(2))
    w0 = torch.tensor([0.0, 0.5])
    assert weighted_ce(logits, targets, mask, w0).item() == pytest.approx(0.5 * math.log(4))
    assert weighted_ce(logits, targets, torch.tensor([[False, False]]), w).item() == 0.0


def test_weighted_kl_by_hand():
    # vocab 2. Slot 0: drafter [0, 0] -> q = (1/2, 1/2), verifier [ln 3, 0] -> p = (3/4, 1/4):
    # KL(p || q) = 3/4 ln(3/2) + 1/4 ln(1/2). Slot 1: the same logits on both sides -> 0.
    # Weights [1, 0.5], both supervised: (KL_0 + 0.5 * 0) / 2.
    kl0 = 0.75 * math.log(1.5) + 0.25 * math.log(0.5)
    logits = torch.tensor([[[0.0, 0.0], [1.0, 2.0]]], requires_grad=True)
    verifier = torch.tensor([[[math.log(3.0), 0.0], [1.0, 2.0]]], requires_grad=True)
    mask = torch.tensor([[True, True]])
    w = torch.tensor([1.0, 0.5])
    loss = weighted_kl(logits, verifier, mask, w)
    assert loss.item() == pytest.approx(kl0 / 2)
    loss.backward()
    assert verifier.grad is None  # the verifier's side is a target, not trained
    # d KL / d logits = q - p on slot 0, weighted 1 / 2: (1/2 - 3/4, 1/2 - 1/4) / 2
    torch.testing.assert_close(logits.grad[0, 0], torch.tensor([-0.125, 0.125]))
    torch.testing.assert_close(logits.grad[0, 1], torch.zeros(2))
    # a one-hot verifier turns KL into the cross-entropy against its argmax
    sharp = torch.tensor([[[0.0, 60.0], [60.0, 0.0]]])
    ce = weighted_ce(logits.detach(), torch.tensor([[1, 0]]), mask, w)
    assert weighted_kl(logits.detach(), sharp, mask, w).item() == pytest.approx(ce.item(), abs=1e-6)
    assert weighted_kl(logits.detach(), verifier.detach(), torch.tensor([[False, False]]), w).item() == 0.0


def test_lambda_schedule_by_hand():
    # lambda0 1, ratio 0.5, 100 steps: 1 at 0, 0.5 at 25, 0 from 50 on
    assert lambda_at(0, 100, 1.0, 0.5) == 1.0
    assert lambda_at(25, 100, 1.0, 0.5) == pytest.approx(0.5)
    assert lambda_at(50, 100, 1.0, 0.5) == 0.0
    assert lambda_at(90, 100, 1.0, 0.5) == 0.0
    assert lambda_at(10, 100, 2.0, 0.5) == 1.0  # clipped
    assert lambda_at(10, 100, 1.0, 0.0) == 0.0


def test_lr_schedule_by_hand():
    assert linear_warmup_lr(0, 100, 10, 1.0) == pytest.approx(0.1)
    assert linear_warmup_lr(9, 100, 10, 1.0) == pytest.approx(1.0)
    assert linear_warmup_lr(55, 100, 10, 1.0) == pytest.approx(0.5)
    assert linear_warmup_lr(100, 100, 10, 1.0) == 0.0


def test_slot_accuracy_by_hand():
    logits = torch.tensor([[[[2.0, 1.0], [0.0, 1.0]], [[0.0, 1.0], [0.0, 1.0]]]])  # (1, 2 anchors, 2 slots, V 2)
    targets = torch.tensor([[[0, 0], [0, 1]]])
    mask = torch.tensor([[[True, True], [True, False]]])
    correct, counted = slot_accuracy(logits, targets, mask)
    assert correct.tolist() == [1, 0] and counted.tolist() == [2, 1]


def test_acceptance_summary_by_hand():
    # 4 steps over two prompts with 3 drafts each: accepted 0, 2, 3, 1
    s = acceptance_summary([[0, 2], [3, 1]], 3)
    assert s["steps"] == 4 and s["accepted"] == 6
    assert s["acceptance_length"] == pytest.approx(1 + 6 / 4)
    # a_0 = 3/4 (>= 1), a_1 = 2/4, a_2 = 1/4; AL = 1 + sum a_i
    assert s["per_position_acceptance"] == pytest.approx([0.75, 0.5, 0.25])
    assert s["acceptance_length"] == pytest.approx(1 + sum(s["per_position_acceptance"]))
    assert s["conditional_acceptance"] == pytest.approx([0.75, 2 / 3, 0.5])
    s = acceptance_summary([[0, 0]], 2)
    assert s["conditional_acceptance"] == [0.0, 0.0]
    with pytest.raises(ValueError, match=r"accepted counts must lie in 0\.\.3"):
        acceptance_summary([[4]], 3)
    with pytest.raises(ValueError, match="no speculative steps"):
        acceptance_summary([[]], 3)


def test_repeated_ngram_share_by_hand():
    from domino.bench.summary import repeated_ngram_share

    assert repeated_ngram_share([1, 2, 3, 4, 5, 6], 4) == 0.0  # 3 distinct 4-grams
    # [1,2,1,2,1,2]: 4-grams (1,2,1,2), (2,1,2,1), (1,2,1,2): 2 distinct of 3
    assert repeated_ngram_share([1, 2, 1, 2, 1, 2], 4) == pytest.approx(1 / 3)
    assert repeated_ngram_share([1, 2], 4) == 0.0


def test_acceptance_from_position_counters_by_hand():
    # vLLM's counters for the same 4 steps as above: positions accepted 3, 2 and 1 times
    s = acceptance_from_counts(4, [3, 2, 1], 3)
    assert s == acceptance_summary([[0, 2], [3, 1]], 3)
    assert s["acceptance_length"] == pytest.approx(2.5)
    for bad, why in (([3, 2], "2 position counters for 3 drafts"), ([1, 2, 0], "non-increasing"),
                     ([5, 1, 0], "within 0..steps")):  # wrong length, not a prefix count, more than the steps
        with pytest.raises(ValueError, match=why):
            acceptance_from_counts(4, bad, 3)
    with pytest.raises(ValueError, match="no speculative steps"):
        acceptance_from_counts(0, [0, 0, 0], 3)


def test_acceptance_intervals_by_hand(monkeypatch):
    from domino import stats
    from domino.stats import acceptance_intervals

    monkeypatch.setattr(stats, "METHOD", "percentile")  # the hand-worked percentile quantiles of tests/test_stats.py

    # the three prompts of tests/test_stats.py: pooled AL 2.4, per-prompt mean 7/3
    s = acceptance_intervals([[0, 2], [3, 1], [1]], 3, resamples=5, seed=0)
    assert s["acceptance_length_ci"] == pytest.approx([2.0, 2.8])
    assert s["acceptance_length_per_prompt_mean"] == pytest.approx(7 / 3)
    assert s["acceptance_length_per_prompt_mean_ci"] == pytest.approx([2.0, 8 / 3])
    assert s["per_position_acceptance_ci"] == [pytest.approx(b) for b in ([0.5, 1.0], [0.265, 0.5], [0.0, 0.4])]
    # every interval holds the pooled figure of acceptance_summary
    full = acceptance_summary([[0, 2], [3, 1], [1]], 3)
    lo, hi = s["acceptance_length_ci"]
    assert lo <= full["acceptance_length"] <= hi
    assert all(lo <= a <= hi for a, (lo, hi) in zip(full["per_position_acceptance"], s["per_position_acceptance_ci"]))


def test_prefix_accuracy_counts_acceptance_per_anchor_by_hand():
    """Three anchors, three slots, every slot supervised: A right at slots 0 and 1, B at 0 and 2,
    C at 1 and 2. Marginally each slot is right 2 of 3 times, and a product of marginals implies
    1 + 2/3 + 4/9 + 8/27 = 2.407; counted per anchor, slot 0 is right 2 of 3, slot 1 right 1 of
    the 2 anchors right at slot 0 (A), slot 2 right 0 of the 1 anchor right at 0 and 1 (A):
    P(all right up to k) = 2/3, 1/3, 0, so the acceptance length is 1 + 2/3 + 1/3 + 0 = 2."""
    hits = torch.tensor([[1, 1, 0], [1, 0, 1], [0, 1, 1]], dtype=torch.bool)
    targets = torch.zeros(3, 3, dtype=torch.long)
    logits = torch.stack([torch.where(hits, 1, 0), torch.where(hits, 0, 1)], -1).float()  # argmax 0 where right
    mask = torch.ones(3, 3, dtype=torch.bool)
    hit, counted = slot_accuracy(logits, targets, mask)
    assert hit.tolist() == [2, 2, 2] and counted.tolist() == [3, 3, 3]
    assert stats.implied_acceptance_length([2 / 3] * 3) == pytest.approx(1 + 2 / 3 + 4 / 9 + 8 / 27)
    right, reached = prefix_accuracy(logits, targets, mask)
    assert right.tolist() == [2, 1, 0] and reached.tolist() == [3, 2, 1]
    c = counted_acceptance(right, reached)
    assert c["conditional"] == pytest.approx([2 / 3, 1 / 2, 0.0])
    assert c["all_right"] == pytest.approx([2 / 3, 1 / 3, 0.0])
    assert c["acceptance_length"] == pytest.approx(2.0)
    assert c["acceptance_length"] == pytest.approx(stats.implied_acceptance_length(c["conditional"]))
    # noshift: slot 0 is the anchor itself, no draft. Slots 1, 2: A right, wrong; B wrong, right;
    # C right, right -> slot 1 right 2 of 3, slot 2 right 1 (C) of the 2 right at slot 1 (A, C)
    right, reached = prefix_accuracy(logits, targets, mask, first_slot=1)
    assert right.tolist() == [0, 2, 1] and reached.tolist() == [0, 3, 2]
    c = counted_acceptance(right[1:], reached[1:])
    assert c["conditional"] == pytest.approx([2 / 3, 1 / 2]) and c["acceptance_length"] == pytest.approx(2.0)
    # an unsupervised slot leaves the count: C's slot 1 masked, so C reaches neither slot 1 nor 2
    mask[2, 1] = False
    right, reached = prefix_accuracy(logits, targets, mask, first_slot=1)
    assert right.tolist() == [0, 1, 0] and reached.tolist() == [0, 2, 1]
    # no anchor reaches a slot: its conditional accuracy is undefined, and nothing is counted beyond
    c = counted_acceptance([0, 0], [2, 0])
    assert c["conditional"] == [0.0, None] and c["all_right"] == [0.0, 0.0] and c["acceptance_length"] == 1.0


@pytest.mark.parametrize("shift,right,conditional,counts,length", [
    (True, {0}, [1.0, 0.0, None], [10, 7, 0], 2.0),     # right at a+1 only: nothing reaches a+3
    (True, {0, 2}, [1.0, 0.0, None], [10, 7, 0], 2.0),  # a+3 is marginally right, never reached
    (False, {1, 2}, [None, 1.0, 1.0], [None, 10, 7], 3.0),  # noshift: slot 0 is the anchor, no draft
])
def test_validate_counts_teacher_forced_acceptance(shift, right, conditional, counts, length):
    """validate writes, per drafting slot, the conditional accuracy over the anchors whose earlier
    drafting slots were all right, and the acceptance length counted from them, beside the
    marginal accuracies (the hand-counted anchors of test_train's two documents: 10 valid anchors,
    7 with a supervised a+2)."""
    from conftest import SlotOracle, two_doc_features
    from domino.train.loop import TrainConfig, validate

    cfg = TrainConfig.schema_defaults(pack_len=16, rows_per_step=1, anchors_per_row=64, gamma=7.0,
                                      weighting="shifted" if shift else "classic")
    res = validate(SlotOracle(shift, right), two_doc_features(), cfg)
    assert [s["final_conditional_acc"] for s in res["per_slot"]] == conditional
    assert [s["final_conditional_count"] for s in res["per_slot"]] == counts
    assert [s["final_acc"] for s in res["per_slot"]] == [float(k in right) for k in range(3)]  # marginal
    assert res["acceptance_length"]["final"] == pytest.approx(length)
    assert res["acceptance_length"]["base"] == 1.0  # the base logits are never right
    assert res["per_slot"][0 if shift else 1]["final_all_right"] == 1.0


def test_cut_after_first_wrong_by_hand():
    """Spec-AUF's cut: the first wrong drafting slot keeps its loss, every later one leaves it; a
    masked slot never cuts, nor does a slot before the first drafting one."""
    from domino.loss import cut_after_first_wrong

    correct = torch.tensor([[1, 1, 0, 1, 0], [0, 1, 1, 1, 1], [1, 0, 1, 1, 1]], dtype=torch.bool)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 0, 1, 1, 1]], dtype=torch.bool)
    assert cut_after_first_wrong(correct, mask).int().tolist() == [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 0, 1, 1, 1]]
    # noshift: slot 0 is the anchor itself, not a draft
    assert cut_after_first_wrong(correct, mask, first_slot=1).int().tolist() == \
        [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 0, 1, 1, 1]]


def test_loss_cut_first_wrong_supervises_fewer_slots_in_training_only():
    from dataclasses import replace

    from conftest import tiny_drafter, tiny_verifier
    from domino.train.loop import TrainConfig, compute_losses

    torch.manual_seed(0)
    drafter = tiny_drafter(tiny_verifier(), projector="domino", block_size=4).float()
    T = 24
    batch = {"input_ids": torch.randint(0, 90, (1, T)), "position_ids": torch.arange(T)[None],
             "doc_ids": torch.zeros(1, T, dtype=torch.long), "loss_mask": torch.ones(1, T, dtype=torch.bool),
             "target": torch.randint(0, 50, (1, T)), "aux": torch.randn(1, T, 3 * 64), "row_ids": [0]}
    cfg = TrainConfig.schema_defaults(anchors_per_row=16)
    *_, final, tgt, full = compute_losses(drafter, batch, cfg, (0, 3, 0), torch.device("cpu"))
    *_, cut = compute_losses(drafter, batch, replace(cfg, loss_cut="first_wrong"), (0, 3, 0), torch.device("cpu"))
    from domino.loss import cut_after_first_wrong

    assert torch.equal(cut, cut_after_first_wrong(final.argmax(-1) == tgt, full))
    assert 0 < int(cut.sum()) < int(full.sum())  # a random drafter is wrong somewhere early
