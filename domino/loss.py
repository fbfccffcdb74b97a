"""Slot weights, the position-weighted losses (cross-entropy or KL), the lambda curriculum and
accuracies.

All functions are pure: tensors in, tensors (or floats) out.

``train.loss`` picks the per-slot loss (``LOSSES``): ``ce``, cross-entropy against the verifier's
greedy token (the card's "position-weighted cross-entropy"); ``kl_div``, KL(p || q) from the
verifier's distribution p over the draft vocabulary to the drafter's q, speculators PR 685's
default. Both are weighted and normalised alike (``weighted_terms``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def slot_weights(block_size: int, gamma: float, weighting: str) -> torch.Tensor:
    """Per-slot loss weights.

    ``classic`` (DFlash): ``w_0 = 0``, ``w_k = exp(-(k-1)/gamma)`` for k >= 1.
    ``shifted`` (Domino): ``w_k = exp(-k/gamma)``, so ``w_0 = 1``.
    """
    k = torch.arange(block_size, dtype=torch.float64)
    if weighting == "classic":
        w = torch.exp(-(k - 1) / gamma)
        w[0] = 0.0
    elif weighting == "shifted":
        w = torch.exp(-k / gamma)
    else:
        raise ValueError(f"unknown weighting {weighting!r} (the config schema lists the allowed values)")
    return w.float()


LOSSES = ("ce", "kl_div")


def slot_ce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy per slot: logits (..., B, V), targets (..., B) draft ids -> (..., B) float32."""
    ce = F.cross_entropy(logits.float().flatten(0, -2), targets.flatten(), reduction="none")
    return ce.view(targets.shape)


def slot_kl(logits: torch.Tensor, verifier_logits: torch.Tensor) -> torch.Tensor:
    """KL(p || q) per slot, p = softmax(verifier_logits), q = softmax(logits), both over the
    draft vocabulary: (..., B, V) each -> (..., B) float32. As PR 685's ``kl_div_loss``; the
    verifier's side carries no gradient."""
    log_q = F.log_softmax(logits.float(), dim=-1)
    log_p = F.log_softmax(verifier_logits.detach().float(), dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def weighted_terms(per_slot: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor):
    """Numerator and denominator of a position-weighted loss: (sum of w * loss over masked
    slots, supervised slots), per_slot and mask (..., B), weights (B,).

    Normalisation (as in speculators PR 685): the weighted sum divided by the number of
    supervised slots, i.e. slots with mask set and a non-zero weight. Data-parallel training
    sums both over ranks before dividing, so that the loss of a global batch does not depend
    on how its rows are split.
    """
    w = weights.to(per_slot.device) * mask.float()
    return (per_slot * w).sum(), (w > 0).sum()


def weighted_ce_terms(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor):
    """``weighted_terms`` of the cross-entropy against draft ids ``targets``."""
    return weighted_terms(slot_ce(logits, targets), mask, weights)


def weighted_ce(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor):
    """Position-weighted cross-entropy: logits (..., B, V), targets (..., B) long, mask (..., B)
    bool, weights (B,); normalised as ``weighted_terms`` says."""
    total, supervised = weighted_ce_terms(logits, targets, mask, weights)
    return total / supervised.clamp(min=1)


def weighted_kl(logits: torch.Tensor, verifier_logits: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor):
    """Position-weighted KL from the verifier's distribution: logits and verifier_logits
    (..., B, V), mask (..., B) bool, weights (B,); normalised as ``weighted_terms`` says."""
    total, supervised = weighted_terms(slot_kl(logits, verifier_logits), mask, weights)
    return total / supervised.clamp(min=1)


def lambda_at(step: int, total_steps: int, lambda0: float, ratio: float) -> float:
    """Base-anchored curriculum weight: ``clip(lambda0 * (1 - step / (ratio * total)), 0, 1)``."""
    if ratio <= 0 or total_steps <= 0:
        return 0.0
    return float(min(1.0, max(0.0, lambda0 * (1.0 - step / (ratio * total_steps)))))


def curriculum_loss(l_final: torch.Tensor, l_base: torch.Tensor, lam: float) -> torch.Tensor:
    """``(1 - lambda) L_final + lambda L_base``."""
    return (1.0 - lam) * l_final + lam * l_base


def slot_accuracy(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor):
    """Greedy accuracy per slot: (correct (B,), counted (B,)) summed over everything but the slot."""
    hit = (logits.argmax(-1) == targets) & mask
    dims = tuple(range(hit.dim() - 1))
    return hit.sum(dims), mask.sum(dims)


def linear_warmup_lr(step: int, total_steps: int, warmup_steps: int, lr: float) -> float:
    """Linear warmup to ``lr`` over ``warmup_steps``, then linear decay to 0 at ``total_steps``."""
    if warmup_steps > 0 and step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    span = max(1, total_steps - warmup_steps)
    return lr * max(0.0, 1.0 - (step - warmup_steps) / span)


def prefix_accuracy(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, first_slot: int = 0):
    """Teacher-forced acceptance counted per anchor: (right (B,), reached (B,)), summed over
    everything but the slot, for logits (..., B, V), targets (..., B) and mask (..., B) bool.

    Only the drafting slots ``first_slot .. B-1`` count (the noshift anchor slot, slot 0, is not
    a draft: its entries are 0). An anchor *reaches* slot k when every drafting slot before k is
    supervised and right and slot k is supervised; it is *right* at k when it reaches k and slot k
    is right too. ``right[k] / reached[k]`` is the conditional accuracy of slot k (right given
    every earlier draft right), what a served step's conditional acceptance estimates; the
    marginal accuracy (``slot_accuracy``) ignores the earlier slots, and a product of marginals
    treats the slots as independent, which they are not.
    """
    hit = (logits.argmax(-1) == targets) & mask
    right = torch.zeros(hit.shape, dtype=torch.bool, device=hit.device)
    reached = torch.zeros_like(right)
    if first_slot < hit.shape[-1]:
        run = hit[..., first_slot:].long().cumprod(-1).bool()  # every drafting slot up to k right
        before = torch.cat([torch.ones_like(run[..., :1]), run[..., :-1]], -1)  # every one before k
        right[..., first_slot:] = run
        reached[..., first_slot:] = before & mask[..., first_slot:]
    dims = tuple(range(hit.dim() - 1))
    return right.sum(dims), reached.sum(dims)


def counted_acceptance(right, reached) -> dict:
    """From ``prefix_accuracy``'s counts (summed over batches, drafting slots only, in slot order):
    ``conditional``, right / reached per slot (None where no anchor reached it);
    ``all_right``, P(every drafting slot up to k right), the running product of the conditional
    accuracies (an anchor leaving the supervised text leaves the count without counting as
    wrong; with every slot supervised it is the share of anchors right up to k); and
    ``acceptance_length``, ``1 + sum_k all_right[k]``, the acceptance length teacher forcing
    counts, as a served step's ``1 + sum_i a_i``."""
    right, reached = [int(x) for x in right], [int(x) for x in reached]
    conditional = [r / n if n > 0 else None for r, n in zip(right, reached, strict=True)]
    all_right, p = [], 1.0
    for c in conditional:
        p = p * c if c is not None else 0.0
        all_right.append(p)
    return {"conditional": conditional, "all_right": all_right, "acceptance_length": 1.0 + sum(all_right)}


LOSS_CUTS = ("none", "first_wrong")


def cut_after_first_wrong(correct: torch.Tensor, mask: torch.Tensor, first_slot: int = 0) -> torch.Tensor:
    """``train.loss_cut`` first_wrong (Spec-AUF): the slot mask with every slot after a block's
    first wrong drafting slot removed, since serving accepts nothing past it. correct, mask
    (..., B) bool; ``first_slot``: the first drafting slot (noshift's slot 0, the anchor itself,
    never cuts). A slot the mask leaves out never cuts either; the first wrong slot keeps its loss."""
    wrong = mask & ~correct
    wrong[..., :first_slot] = False
    before = wrong.long().cumsum(-1) - wrong.long()  # wrong drafting slots strictly before each slot
    return mask & (before == 0)


__all__ = [
    "LOSSES", "slot_weights", "slot_ce", "slot_kl", "weighted_terms", "weighted_ce", "weighted_ce_terms",
    "weighted_kl", "lambda_at", "curriculum_loss",
    "slot_accuracy", "linear_warmup_lr", "prefix_accuracy", "counted_acceptance", "LOSS_CUTS", "cut_after_first_wrong",
]
