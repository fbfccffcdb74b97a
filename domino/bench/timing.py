"""The paired-timing harness: decoders timed side by side on each prompt, in one process.

A speed comparison here is a ratio of decodes of the same moments, never of two timings taken
apart: every decoder runs on a prompt back to back with the others, the order changed from one
prompt to the next by a design balanced for places and for predecessors (``rotation``), each
decode timed with the garbage collector off (``timed``), after one untimed warm-up per decoder
(``untimed_tokens``). ``paired_decodes`` does all of it;
the benchmark (``domino.bench.job``), the vLLM cross-check (``domino.vllm.backend``) and the tools
(``domino/tools``) time through it. What the timings are turned into (summaries, intervals)
lives with each of them.

A ``Journal`` keeps each prompt's decodes as the prompt finishes, so a stopped job resumes at the
prompts it lacks. A prompt's pair stays a pair of one moment; prompts timed before and after a
stop are different moments, as two prompts always are.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tqdm import tqdm

from ..common import busy_cpu_seconds
from ..decode import DecodeResult
from ..io import atomic_path, seal_problem, with_seal

logger = logging.getLogger(__name__)

TIMING = ("paired: every decoder on each prompt back to back, the order from one prompt to the next a Williams design "
          "(every decoder in every place and after every other equally often), garbage collection off while a decode "
          "is timed, one untimed warm-up of a full block per decoder")

PLAIN = "baseline"  # the plain decoder's name in a paired job, and its row's: results/benchmark/humaneval/baseline.json

Decode = Callable[[int, list[int], int], DecodeResult]  # (prompt index, prompt ids, max new tokens) -> result


def tokens_per_second(new_tokens: int, seconds: float) -> float:
    return new_tokens / seconds if seconds > 0 else 0.0


def rotation(names: tuple[str, ...], prompt_index: int) -> tuple[str, ...]:
    """Prompt ``prompt_index``'s order: row ``prompt_index`` of a Williams design over ``names``
    (the crossover trials' square balanced for first-order carryover). Its first row takes the
    places 0, 1, k-1, 2, k-2, ... and row r adds r to each, modulo k = len(names); for odd k the
    k rows reversed follow. Over any cycle of its rows (k prompts, 2k for odd k) every decoder
    takes every place equally often, so a drift of the machine's speed with the place in the order
    (a turbo budget spent) falls on every decoder alike, and follows every other decoder equally
    often, so what a decoder leaves behind (a cache it filled, memory it touched) slows every other
    alike. A cyclic rotation balances the places only: each decoder would always follow the same
    one."""
    k = len(names)
    first, low, high = [0], 1, k - 1
    while len(first) < k:
        first.append(low)
        low += 1
        if len(first) < k:
            first.append(high)
            high -= 1
    rows = [[(x + r) % k for x in first] for r in range(k)]
    if k % 2:
        rows += [row[::-1] for row in rows]
    return tuple(names[j] for j in rows[prompt_index % len(rows)])


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
        """The decode the row is about: speculative, or plain for the baseline."""
        return self.speculative or self.plain


@dataclass
class PromptDecodes:
    """One prompt decoded by every decoder of the job, in ``order``, back to back; the CPU seconds
    other processes were busy meanwhile (None where unknown) and the wall seconds it took, and
    whether an earlier process of the job decoded it (``Journal``)."""
    results: dict[str, DecodeResult]
    order: tuple[str, ...]
    other_cpu_seconds: float | None = None
    wall_seconds: float = 0.0
    resumed: bool = False

    def timing(self, row: str) -> PromptTiming:
        """The pair of this prompt that row ``row`` is measured by (plain alone for the baseline)."""
        plain_at = self.order.index(PLAIN)
        if row == PLAIN:
            return PromptTiming(self.results[PLAIN], None, True, plain_at, plain_at)
        at = self.order.index(row)
        return PromptTiming(self.results[PLAIN], self.results[row], plain_at < at, at, plain_at)


class Journal:
    """The decodes of a job kept on disk, one line per prompt as it finishes (appended, flushed and
    synced), so that a stopped job, started again, reads back the prompts it decoded and decodes
    only the rest.

    ``key`` stands for everything that decides the decodes (the job's settings, its decoders and
    the weights they load); a line is read back only for the same key, the same prompt at the same
    place and the same token budget. Each line is sealed (``domino.io.with_seal``): a line whose
    seal does not match its content (altered, or damaged some other way) is never read back; its
    prompt is decoded again and the log names the file and the line. Lines of another key, and a
    last line cut by the stop, are passed over; a file with no line to read back starts again
    empty. ``close`` deletes the file once the job's results are written."""

    def __init__(self, path: str | Path, key: str):
        self.path, self.key, self.kept = Path(path), key, {}
        self.digest = hashlib.sha256(key.encode()).hexdigest()
        text = self.path.read_text(errors="replace") if self.path.exists() else ""
        lines = text.splitlines()
        good = []
        for n, line in enumerate(lines, 1):
            cut = n == len(lines) and not text.endswith("\n")  # the stop came while it was written
            problem, decodes = self._read_line(line)
            if problem is None and decodes is None:
                continue  # decoded with other settings, decoders or weights
            if problem is not None:
                if not cut:
                    logger.warning("benchmark journal %s:%d %s; its prompt is decoded again", self.path, n, problem)
                continue
            prompt, self.kept[prompt] = decodes
            good.append(line)
        if text and not self.kept:
            self.path.unlink()
        elif text != "".join(f"{line}\n" for line in good):  # what is appended starts on a line of its own
            with atomic_path(self.path) as tmp:
                tmp.write_text("".join(f"{line}\n" for line in good))

    def _read_line(self, line: str) -> tuple[str | None, tuple[str, PromptDecodes] | None]:
        """(what is wrong with a journal line, None) or (None, its prompt key and decodes); (None,
        None) for an intact line of another key."""
        try:
            row = json.loads(line)
        except ValueError:
            return "is not valid JSON (cut short or altered)", None
        problem = seal_problem(row)
        if problem:
            return problem, None
        if row.get("key") != self.digest:
            return None, None
        try:
            return None, (row["prompt"], PromptDecodes(
                {name: DecodeResult(**r) for name, r in row["results"].items()}, tuple(row["order"]),
                row["other_cpu_seconds"], row["wall_seconds"], resumed=True))
        except (KeyError, TypeError, AttributeError):
            return "holds another layout", None

    def prompt_key(self, i: int, ids: list[int], max_new_tokens: int) -> str:
        """Prompt ``i`` of the call (its place sets its order and, sampling, its generator's seed)."""
        return hashlib.sha256(json.dumps([self.key, i, list(ids), max_new_tokens]).encode()).hexdigest()

    def get(self, i: int, ids: list[int], max_new_tokens: int) -> PromptDecodes | None:
        return self.kept.get(self.prompt_key(i, ids, max_new_tokens))

    def add(self, i: int, ids: list[int], max_new_tokens: int, decodes: PromptDecodes) -> None:
        row = {"key": self.digest, "prompt": self.prompt_key(i, ids, max_new_tokens), "order": list(decodes.order),
               "results": {name: dataclasses.asdict(r) for name, r in decodes.results.items()},
               "other_cpu_seconds": decodes.other_cpu_seconds, "wall_seconds": decodes.wall_seconds}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(with_seal(row)) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def close(self) -> None:
        self.path.unlink(missing_ok=True)


def paired_decodes(runs: dict[str, Decode], prompts: list[list[int]], max_new_tokens: int, warm_tokens: int,
                   desc: str = "paired decodes", journal: Journal | None = None,
                   learners: dict[str, Callable[[list[int]], None]] | None = None) -> list[PromptDecodes]:
    """Every prompt decoded by every decoder of ``runs`` (name -> decode) back to back, in the
    order of ``rotation``, each decode ``timed``. First one untimed warm-up per decoder on
    the first prompt, ``warm_tokens`` long (``untimed_tokens``), so that allocator, kernel and
    thread-pool start-up land on no timed prompt. With a ``journal``, a prompt it kept is read
    back instead of decoded (warm-ups run only where something is left to decode). ``learners``
    (name -> callable): a decoder that learns from its earlier answers (the suffix cache) is given
    its own output of each prompt once every decoder has decoded it, read back ones included, so
    that no decode of a prompt ever sees that prompt's answer."""
    kept = [journal.get(i, ids, max_new_tokens) if journal else None for i, ids in enumerate(prompts)]
    if any(k is None for k in kept):
        for warm_up in runs.values():
            warm_up(0, prompts[0], warm_tokens)
    if journal and any(k is not None for k in kept):
        logger.info("%s: %d of %d prompts read back from %s, decoded before a stop", desc,
                    sum(k is not None for k in kept), len(prompts), journal.path)
    names, out = tuple(runs), []
    for i, ids in enumerate(tqdm(prompts, desc=desc, mininterval=5)):
        if kept[i] is not None:
            out.append(kept[i])
            _learn(learners, kept[i])
            continue
        order = rotation(names, i)
        busy0, own0, wall0 = busy_cpu_seconds(), time.process_time(), time.perf_counter()
        results = {name: timed(runs[name], i, ids, max_new_tokens) for name in order}
        busy, wall = busy_cpu_seconds(), time.perf_counter() - wall0
        other = None if busy is None or busy0 is None else max(0.0, busy - busy0 - (time.process_time() - own0))
        out.append(PromptDecodes(results, order, other, wall))
        if journal:
            journal.add(i, ids, max_new_tokens, out[-1])
        _learn(learners, out[-1])
    return out


def _learn(learners: dict | None, decodes: PromptDecodes) -> None:
    for name, learn in (learners or {}).items():
        learn(decodes.results[name].new_token_ids)


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
