"""Acceptance counting: the one home of the rule every acceptance figure is built on.

A recorded step verified a block of drafts; ``accepted`` is how many of them the verifier
kept, counted as vLLM counts (``domino.decode``: before the output is cut at EOS or at the
token budget; a step with no drafts is not recorded). Acceptance is a prefix, so **the steps
accepting draft position i are the steps with at least i+1 accepted drafts**
(``steps_accepting``); vLLM's per-position counters, the per-position rates ``a_i``, the
conditional rates ``a_i / a_(i-1)``, their intervals (``domino.stats``), the card's tables and
plots and the vLLM counter check all count with it. ``AL = 1 + accepted / steps``.
"""

from __future__ import annotations

from collections.abc import Iterable


def steps_accepting(accepted_counts: Iterable[int], k: int) -> int:
    """Steps with at least ``k`` accepted drafts (``k = 0``: every step); the steps that accepted
    draft position ``k - 1``."""
    return sum(c >= k for c in accepted_counts)


def position_counts(accepted_counts: list[int], drafts_per_step: int) -> list[int]:
    """Per draft position i = 0..drafts_per_step-1, the steps that accepted it: vLLM's
    ``accepted_per_position`` counters."""
    return [steps_accepting(accepted_counts, i + 1) for i in range(drafts_per_step)]


def acceptance_summary(accepted_per_step: list[list[int]], drafts_per_step: int) -> dict:
    """Aggregate metrics over prompts.

    accepted_per_step: one list per prompt, one count per speculative step.
    Returns ``acceptance_length``, ``per_position_acceptance`` (a_i: share of steps with at
    least i+1 accepted drafts, i = 0..drafts_per_step-1), ``conditional_acceptance``
    (a_i / a_{i-1}, a_{-1} = 1; 0 where a_{i-1} is 0), ``steps`` and ``accepted``.
    """
    counts = [c for prompt in accepted_per_step for c in prompt]
    steps = len(counts)
    if steps == 0:
        raise ValueError("no speculative steps to summarise")
    if any(c < 0 or c > drafts_per_step for c in counts):
        raise ValueError(f"accepted counts must lie in 0..{drafts_per_step}")
    return acceptance_from_counts(steps, position_counts(counts, drafts_per_step), drafts_per_step)


def acceptance_from_counts(steps: int, accepted_per_position: list[int], drafts_per_step: int) -> dict:
    """The same summary as ``acceptance_summary`` from position counters (what vLLM reports).

    ``accepted_per_position[i]`` is the number of steps whose draft at position i was accepted;
    acceptance is a prefix, so that is the number of steps with at least i+1 accepted drafts.
    """
    if steps <= 0:
        raise ValueError("no speculative steps to summarise")
    if len(accepted_per_position) != drafts_per_step:
        raise ValueError(f"{len(accepted_per_position)} position counters for {drafts_per_step} drafts per step")
    if any(b > a for a, b in zip(accepted_per_position, accepted_per_position[1:])) or \
            any(c < 0 or c > steps for c in accepted_per_position):
        raise ValueError("position counters must be non-increasing and within 0..steps")
    accepted = sum(accepted_per_position)
    per_pos = [c / steps for c in accepted_per_position]
    cond, prev = [], 1.0
    for a in per_pos:
        cond.append(a / prev if prev > 0 else 0.0)
        prev = a
    return {"acceptance_length": 1.0 + accepted / steps, "per_position_acceptance": per_pos,
            "conditional_acceptance": cond, "steps": steps, "accepted": accepted}
