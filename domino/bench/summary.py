"""What a benchmark results file says of each row (docs/results.md): its ``summary`` (speed with
the paired speedup, acceptance, the verifier's own behaviour, the lossless verdict and the
bootstrap's settings; ``summarise``), one record per task (``prompt_records``), and what it says of
a row without training of its own (``decoder_records``). Intervals are BCa bootstraps over prompts
(``domino.stats``).
"""

from __future__ import annotations

from ..acceptance import acceptance_summary
from ..decoders import DecoderSpec
from ..stats import LEVEL, RESAMPLES, acceptance_intervals, paired_rate_ratio, ratio_of_sums
from .timing import PromptTiming, tokens_per_second


def repeated_ngram_share(tokens: list[int], n: int = 4) -> float:
    """Share of a sequence's n-grams that repeat an earlier one: 0 for no repetition, near 1 for a loop."""
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def speed_summary(timings: list[PromptTiming], seed: int) -> dict:
    """Totals, both TPS and the paired speedup with intervals.

    The speedup is the ratio of token rates, ``(sum(spec tokens) / sum(spec s)) / (sum(plain
    tokens) / sum(plain s))``, prompts resampled in pairs (``domino.stats.paired_rate_ratio``),
    greedy or sampled alike: sampled decodes give outputs of other lengths, and so does a greedy
    decode in low precision that parts from plain greedy at a near tie, where a ratio of seconds
    would set times of other token counts against each other. Where every output has its plain
    decode's length it equals ``sum(plain s) / sum(speculative s)``."""
    tokens = [len(t.main.new_token_ids) for t in timings]
    plain_tokens = [len(t.plain.new_token_ids) for t in timings]
    seconds = [t.main.seconds for t in timings]
    plain_seconds = [t.plain.seconds for t in timings]
    tps = ratio_of_sums(tokens, seconds, RESAMPLES, seed)
    plain_tps = ratio_of_sums(plain_tokens, plain_seconds, RESAMPLES, seed)
    speedup = paired_rate_ratio(tokens, seconds, plain_tokens, plain_seconds, RESAMPLES, seed)
    return {"prompts": len(timings), "new_tokens": sum(tokens), "seconds": sum(seconds),
            "tps": tokens_per_second(sum(tokens), sum(seconds)), "tps_ci": tps.bounds(),
            "plain_seconds": sum(plain_seconds), "plain_tps": tokens_per_second(sum(plain_tokens), sum(plain_seconds)),
            "plain_tps_ci": plain_tps.bounds(), "speedup": speedup.estimate, "speedup_ci": speedup.bounds(),
            "draft_seconds": sum(t.main.draft_seconds for t in timings),
            "verify_seconds": sum(t.main.verify_seconds for t in timings)}


def acceptance_fields(timings: list[PromptTiming], drafts_per_step: int, seed: int) -> dict:
    """Acceptance (``domino.acceptance``) with intervals; the plain baseline's trivial values."""
    if drafts_per_step == 0:
        new_tokens = sum(len(t.plain.new_token_ids) for t in timings)
        return {"acceptance_length": 1.0, "acceptance_length_ci": [1.0, 1.0],
                "acceptance_length_per_prompt_mean": 1.0, "acceptance_length_per_prompt_mean_ci": [1.0, 1.0],
                "per_position_acceptance": [], "per_position_acceptance_ci": [], "conditional_acceptance": [],
                "drafts_per_step": 0, "steps": new_tokens, "accepted": 0}
    acc_lists = [t.speculative.accepted_per_step for t in timings]
    if not any(acc_lists):  # no step drafted on any prompt (an n-gram lookup that never found a match)
        zeros = [0.0] * drafts_per_step
        return {"acceptance_length": 1.0, "acceptance_length_ci": [1.0, 1.0],
                "acceptance_length_per_prompt_mean": 1.0, "acceptance_length_per_prompt_mean_ci": [1.0, 1.0],
                "per_position_acceptance": zeros, "per_position_acceptance_ci": [[0.0, 0.0] for _ in zeros],
                "conditional_acceptance": zeros, "drafts_per_step": drafts_per_step, "steps": 0, "accepted": 0}
    return {**acceptance_summary(acc_lists, drafts_per_step),
            **acceptance_intervals(acc_lists, drafts_per_step, RESAMPLES, seed), "drafts_per_step": drafts_per_step}


def verifier_behaviour(timings: list[PromptTiming]) -> dict:
    """How the verifier itself behaves (plain output): a verifier stuck in loops makes acceptance easy."""
    plain = [t.plain for t in timings]
    return {"eos_share": sum(r.stop_reason == "eos" for r in plain) / len(plain),
            "repeated_4gram_share": sum(repeated_ngram_share(r.new_token_ids) for r in plain) / len(plain)}


def prompt_records(tasks: list[dict], encoded: list[list[int]], timings: list[PromptTiming],
                   turns: list[tuple[list[list[int]], list[PromptTiming]]] | None = None) -> list[dict]:
    """One record per task (docs/results.md). ``turns`` (a task of several turns): each turn's
    prompts and timings; the record's figures are then the task's, its turns' summed, and
    ``turns`` holds each turn's own, with the task's ``category``."""
    out = [{"task_id": task["task_id"], "prompt_token_ids": ids, "new_token_ids": t.main.new_token_ids,
            "accepted_per_step": t.main.accepted_per_step, "seconds": t.main.seconds,
            "plain_seconds": t.plain.seconds, "plain_first": t.plain_first, "position": t.position,
            "plain_position": t.plain_position, "stop_reason": t.main.stop_reason}
           for task, ids, t in zip(tasks, encoded, timings)]
    if turns is None:
        return out
    for i, (task, record) in enumerate(zip(tasks, out)):
        record["category"] = task["category"]
        record["turns"] = [{"prompt_token_ids": enc[i], "new_token_ids": tm[i].main.new_token_ids,
                            "accepted_per_step": tm[i].main.accepted_per_step, "seconds": tm[i].main.seconds,
                            "plain_seconds": tm[i].plain.seconds, "stop_reason": tm[i].main.stop_reason}
                           for enc, tm in turns]
    return out


def summarise(timings: list[PromptTiming], drafts_per_step: int, near_ties: list[dict], tie_tolerance: float | None,
              seed: int) -> dict:
    """The ``summary`` of a results file (docs/results.md): speed, acceptance, verifier behaviour,
    the lossless verdict and the bootstrap's settings."""
    speculative = drafts_per_step > 0
    return {**speed_summary(timings, seed), **acceptance_fields(timings, drafts_per_step, seed),
            **verifier_behaviour(timings), "matches_baseline": not near_ties, "near_tie_divergences": near_ties,
            "tie_tolerance": tie_tolerance if speculative else 0.0,
            # one job decodes the baseline file and every row beside it: their plain decodes are one
            "plain_matches_baseline_file": True if speculative else None,
            "bootstrap": {"resamples": RESAMPLES, "seed": seed, "level": LEVEL, "unit": "prompt"}}


def decoder_records(spec: DecoderSpec) -> dict:
    """What a results file says of a row without training of its own: its ``decoder`` record and,
    for an n-gram lookup row, its ``lookup`` record."""
    lookup = lookup_record(spec)
    return {"decoder": spec.record(), **({"lookup": lookup} if lookup else {})}


def lookup_record(spec: DecoderSpec) -> dict | None:
    """An n-gram lookup row's ``lookup`` record (what vLLM's ``ngram`` method and the card read);
    None for other rows."""
    if spec.kind not in ("ngram", "ngram-then"):
        return None
    return {k: spec.settings[k] for k in ("max_n", "min_n", "drafts")} | {"then": spec.checkpoint}
