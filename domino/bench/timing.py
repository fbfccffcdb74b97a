"""The paired-timing harness: decoders timed side by side on each prompt, in one process.

A speed comparison here is a ratio of decodes of the same moments, never of two timings taken
apart: every decoder runs on a prompt back to back with the others, the order rotated from one
prompt to the next (``rotation``), each decode timed with the garbage collector off (``timed``),
after one untimed warm-up per decoder (``untimed_tokens``). ``paired_decodes`` does all of it;
the benchmark (``domino.bench.run``), the vLLM cross-check (``domino.vllm.backend``) and the tools
(``domino/tools``) time through it. What the timings are turned into (summaries, intervals)
lives with each of them.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Callable

from tqdm import tqdm

from ..decode import DecodeResult

TIMING = ("paired: every decoder on each prompt back to back, the order rotated cyclically from one prompt to the "
          "next, garbage collection off while a decode is timed, one untimed warm-up of a full block per decoder")

PLAIN = "baseline"  # the plain decoder's name in a paired run, and its run's: results/benchmark/humaneval/baseline.json

Decode = Callable[[int, list[int], int], DecodeResult]  # (prompt index, prompt ids, max new tokens) -> result


def tokens_per_second(new_tokens: int, seconds: float) -> float:
    return new_tokens / seconds if seconds > 0 else 0.0


def rotation(names: tuple[str, ...], prompt_index: int) -> tuple[str, ...]:
    """Prompt ``prompt_index``'s order: ``names`` rotated left by ``prompt_index`` places (a cyclic
    Latin square). Over any k consecutive prompts, k = len(names), every decoder takes every
    place exactly once, so a drift of the machine's speed with the place in the order (a warm
    cache after the decoder before, a turbo budget spent) falls on every decoder alike."""
    k = prompt_index % len(names)
    return names[k:] + names[:k]


def untimed_tokens(drafts_per_step: int, max_new_tokens: int) -> int:
    """The warm-up's token budget: the prefill's token, one step of a full block of drafts and its
    token, and one more, so that the verifier runs its 1 + B-row verify shape and the drafter
    its full block before anything is timed (capped by the run's own budget)."""
    return max(1, min(max_new_tokens, drafts_per_step + 3))


def timed(run: Decode, i: int, ids: list[int], max_new_tokens: int) -> DecodeResult:
    """One decode with the garbage collector off, so that no collection lands inside the timing;
    the collector's previous state comes back even if the decode raises."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return run(i, ids, max_new_tokens)
    finally:
        if was_enabled:
            gc.enable()


@dataclass
class PromptTiming:
    """One prompt decoded plain and (with a drafter) speculatively, back to back."""
    plain: DecodeResult
    speculative: DecodeResult | None
    plain_first: bool
    position: int = 0  # the main decode's place in the prompt's order, 0 = first
    plain_position: int = 0

    @property
    def main(self) -> DecodeResult:
        """The decode the run is about: speculative, or plain for the baseline."""
        return self.speculative or self.plain


@dataclass
class PromptDecodes:
    """One prompt decoded by every decoder of the job, in ``order``, back to back."""
    results: dict[str, DecodeResult]
    order: tuple[str, ...]

    def timing(self, run: str) -> PromptTiming:
        """The pair of this prompt that run ``run`` is measured by (plain alone for the baseline)."""
        plain_at = self.order.index(PLAIN)
        if run == PLAIN:
            return PromptTiming(self.results[PLAIN], None, True, plain_at, plain_at)
        at = self.order.index(run)
        return PromptTiming(self.results[PLAIN], self.results[run], plain_at < at, at, plain_at)


def paired_decodes(runs: dict[str, Decode], prompts: list[list[int]], max_new_tokens: int, warm_tokens: int,
                   desc: str = "paired decodes") -> list[PromptDecodes]:
    """Every prompt decoded by every decoder of ``runs`` (name -> decode) back to back, in the
    cyclic order of ``rotation``, each decode ``timed``. First one untimed warm-up per decoder on
    the first prompt, ``warm_tokens`` long (``untimed_tokens``), so that allocator, kernel and
    thread-pool start-up land on no timed prompt."""
    for warm_up in runs.values():
        warm_up(0, prompts[0], warm_tokens)
    names, out = tuple(runs), []
    for i, ids in enumerate(tqdm(prompts, desc=desc, mininterval=5)):
        order = rotation(names, i)
        out.append(PromptDecodes({name: timed(runs[name], i, ids, max_new_tokens) for name in order}, order))
    return out


def joined_turns(results: list[DecodeResult]) -> DecodeResult:
    """The decodes of a task's turns as one: tokens and steps in turn order, seconds summed, the
    last turn's stop reason."""
    return DecodeResult([t for r in results for t in r.new_token_ids], [a for r in results for a in r.accepted_per_step],
                        sum(r.draft_seconds for r in results), sum(r.verify_seconds for r in results),
                        sum(r.seconds for r in results), results[-1].stop_reason)


def merge_turns(turns: tuple[PromptTiming, ...] | list[PromptTiming]) -> PromptTiming:
    """A task of several turns as one timing, the unit of its suite's intervals: each decoder's
    turns joined (tokens, steps and seconds), the first turn's places in the order."""
    first = turns[0]
    speculative = None if first.speculative is None else joined_turns([t.speculative for t in turns])
    return PromptTiming(joined_turns([t.plain for t in turns]), speculative, first.plain_first, first.position,
                        first.plain_position)
