"""Served validation: the drafter being trained decodes held-out prompts through the benchmark's
speculative loop (``domino.decode.decode``, greedy), and its served acceptance length picks the
checkpoint a training run keeps (``train.keep: best_served``).

Why served and not the loss: a drafter's loss can keep falling while its acceptance falls (an
EAGLE-3 drafter peaked near 4.6 epochs), so the steps a checkpoint gets are chosen by what serving
accepts. The prompts are the held-out split's, never a benchmark suite's: the benchmark stays a
test the choice never saw.

Conventions: an evaluation is recorded under the metrics row of the step just taken (``step``
from 0, so its weights have had ``step + 1`` updates); its ``acceptance_length`` is
``1 + accepted / steps`` pooled over every prompt's recorded steps, as the benchmark counts it
(``domino.decode``); its ``epochs`` are the epochs of training behind those weights,
``(step + 1) / steps per epoch``, a fraction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..decode import NeuralDraft, decode


def held_out_prompts(rows: list[dict], n: int, budget: int, context: int) -> list[list[int]]:
    """The prompts of the first ``n`` held-out conversations that have an answer (``loss_mask``
    set somewhere) and whose prompt leaves room for ``budget`` new tokens in ``context``
    positions; a prompt is the conversation's ``input_ids`` before its first loss-mask position
    (the chat template's generation prompt included), as ``domino.tools.served_gap`` reads one."""
    out = []
    for r in rows:
        if len(out) == n:
            break
        start = next((i for i, m in enumerate(r["loss_mask"]) if m), None)
        if start and start + budget <= context:
            out.append(list(r["input_ids"][:start]))
    return out


def evaluation_interval(every_epochs: float, steps_per_epoch: int) -> int:
    """Steps between evaluations: ``every_epochs`` epochs, rounded, at least one step."""
    return max(1, round(every_epochs * steps_per_epoch))


def evaluated_after(step: int, interval: int, total: int) -> bool:
    """Whether the weights after step ``step`` (from 0) are evaluated: every ``interval`` updates,
    and after the last step."""
    return (step + 1) % interval == 0 or step + 1 == total


def kept_step(curve: list[dict], keep: str) -> int | None:
    """The ``step`` of the evaluation whose weights a run keeps: ``last``, the latest; ``best_served``,
    the highest ``acceptance_length``, the earliest of equals (more steps must earn their place).
    None for no evaluation."""
    if not curve:
        return None
    if keep == "last":
        return curve[-1]["step"]
    best = max(e["acceptance_length"] for e in curve)
    return next(e["step"] for e in curve if e["acceptance_length"] == best)


def stops_early(curve: list[dict], patience: int) -> bool:
    """Whether the last ``patience`` evaluations all fell short of the best before them (``patience``
    0: never)."""
    if patience <= 0 or len(curve) <= patience:
        return False
    best_before = max(e["acceptance_length"] for e in curve[:-patience])
    return all(e["acceptance_length"] <= best_before for e in curve[-patience:])


@dataclass
class ServedValidation:
    """What a served evaluation decodes with: the verifier (frozen, in the benchmark's dtype and
    device), the held-out prompts, the token budget and the stop ids."""

    verifier: torch.nn.Module
    prompts: list[list[int]]
    max_new_tokens: int
    eos_ids: tuple[int, ...] = ()

    def acceptance(self, drafter) -> dict:
        """Decode every prompt with a copy of ``drafter`` built as the benchmark loads a checkpoint
        (a fresh drafter, its weights cast to the verifier's dtype, eval mode, exact float32 RoPE):
        ``{"acceptance_length", "steps", "accepted", "tokens"}``, pooled over the prompts."""
        copy = type(drafter)(drafter.cfg)
        copy.load_state_dict({k: v.detach().cpu() for k, v in drafter.state_dict().items()})
        copy = copy.to(self.verifier.device, dtype=self.verifier.dtype).eval()
        draft = NeuralDraft(copy)
        steps = accepted = tokens = 0
        for p in self.prompts:
            r = decode(self.verifier, p, self.max_new_tokens, self.eos_ids, draft=draft)
            steps, accepted, tokens = steps + r.steps, accepted + sum(r.accepted_per_step), tokens + len(r.new_token_ids)
        return {"acceptance_length": 1 + accepted / steps if steps else 1.0, "steps": steps, "accepted": accepted,
                "tokens": tokens}


def mean_loss(metrics: list[dict], since: int) -> float:
    """The mean curriculum ``loss`` of the metrics rows after step ``since`` (-1: all of them)."""
    losses = [m["loss"] for m in metrics if m["step"] > since]
    return sum(losses) / len(losses) if losses else math.nan
