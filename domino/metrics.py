"""Acceptance metrics from per-step records, pooled over prompts.

A recorded step verified a block of drafts; ``accepted`` is how many of them the verifier
kept, counted as vLLM counts (``domino.decode``: before the output is cut at EOS or at the
token budget; a step with no drafts is not recorded). ``AL = 1 + accepted / steps``.
"""

from __future__ import annotations

from .stats import RESAMPLES, acceptance_length_per_prompt_mean, acceptance_length_pooled, per_position_acceptance


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
    return acceptance_from_counts(steps, [sum(c >= i + 1 for c in counts) for i in range(drafts_per_step)],
                                  drafts_per_step)


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


def acceptance_intervals(accepted_per_step: list[list[int]], drafts_per_step: int, resamples: int = RESAMPLES,
                         seed: int = 0) -> dict:
    """95% bootstrap intervals over prompts (``domino.stats``) for ``acceptance_summary``'s figures,
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


def tokens_per_second(new_tokens: int, seconds: float) -> float:
    return new_tokens / seconds if seconds > 0 else 0.0


def repeated_ngram_share(tokens: list[int], n: int = 4) -> float:
    """Share of a sequence's n-grams that repeat an earlier one: 0 for no repetition, near 1 for a loop."""
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0
