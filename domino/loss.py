"""Slot weights, the position-weighted cross-entropy, the lambda curriculum and accuracies.

All functions are pure: tensors in, tensors (or floats) out.
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


def weighted_ce_terms(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor):
    """Numerator and denominator of ``weighted_ce``: (sum of w * CE over masked slots, supervised slots).

    Data-parallel training sums both over ranks before dividing, so that the loss of a global
    batch does not depend on how its rows are split.
    """
    ce = F.cross_entropy(logits.float().flatten(0, -2), targets.flatten(), reduction="none")
    ce = ce.view(targets.shape)
    w = weights.to(ce.device) * mask.float()
    return (ce * w).sum(), (w > 0).sum()


def weighted_ce(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor):
    """Position-weighted cross-entropy.

    logits (..., B, V), targets (..., B) long, mask (..., B) bool, weights (B,).
    Normalisation (as in speculators PR 685): the weighted sum of per-slot CE divided by the
    number of supervised slots, i.e. slots with mask set and a non-zero weight.
    """
    total, supervised = weighted_ce_terms(logits, targets, mask, weights)
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


__all__ = [
    "slot_weights", "weighted_ce", "weighted_ce_terms", "lambda_at", "curriculum_loss",
    "slot_accuracy", "linear_warmup_lr",
]
