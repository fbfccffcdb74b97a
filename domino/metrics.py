"""Acceptance metrics from per-step records, pooled over prompts.

A step verifies some drafts; ``accepted`` is how many of them the verifier kept. Every step
also commits one token of the verifier's own (the bonus), hence ``AL = 1 + accepted / steps``.
"""

from __future__ import annotations


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
    accepted = sum(counts)
    per_pos = [sum(c >= i + 1 for c in counts) / steps for i in range(drafts_per_step)]
    cond, prev = [], 1.0
    for a in per_pos:
        cond.append(a / prev if prev > 0 else 0.0)
        prev = a
    return {
        "acceptance_length": 1.0 + accepted / steps,
        "per_position_acceptance": per_pos,
        "conditional_acceptance": cond,
        "steps": steps,
        "accepted": accepted,
    }


def tokens_per_second(new_tokens: int, seconds: float) -> float:
    return new_tokens / seconds if seconds > 0 else 0.0


def repeated_ngram_share(tokens: list[int], n: int = 4) -> float:
    """Share of a sequence's n-grams that repeat an earlier one: 0 for no repetition, near 1 for a loop."""
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0
