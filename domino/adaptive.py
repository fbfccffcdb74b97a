"""Cost-aware drafting: at each step send the draft, and the number of its tokens, that pays most
on this machine, or none.

The rule (renewal-reward, as in Dinkelbach's ratio maximisation): a step that sends k drafts
yields ``E_k = 1 + sum_{j=1..k} prod_{i<=j} p_i`` tokens in expectation (the bonus token, then
each draft accepted only if every one before it was; ``p_i`` the probability that draft i is
accepted when the ones before it were) and costs ``c(k+1)`` seconds, a verifier forward over
k + 1 rows (``CostCurve``, measured on this machine and dtype before the timed decodes). At a
rate of ``R`` tokens per second the step is worth ``E_k - R c(k+1)``; the best k maximises it
(``best_prefix``), k = 0 (a plain step, worth ``1 - R c(1)``) always a candidate. ``R`` is the
rate the decoder has reached so far in the job, in measured seconds (each step's wall time, from
one proposal to the next), from a prior of 16 tokens at plain decoding's ``1 / c(1)`` and never
below it, so no step is chosen that a plain step beats in expectation. A rate by the cost model
alone, or one request's, runs high (the curve leaves out what a step spends outside its forwards;
a request's first steps are few), and a high ``R`` prices every draft out, the drafter's first
(what a step spends outside its forwards adds to every candidate alike, so it changes no choice).

The drafter drafts two slots more than it has sent lately (an average), since each slot of a
Domino head costs a GRU step; a slot past them would be verified by no step. A probe (below)
drafts the whole block: where short drafts do not pay but long ones would (a verify forward whose
cost steps up at a few rows, then stays flat), the average of drafts sent would otherwise stay
short for good.

The ``p_i`` come from each source's own estimate of its token (a drafter's softmax probability of
its token, the suffix cache's frequency ratio, the n-gram lookup's slot), mapped through a
``Calibration`` learnt online from the steps already verified in the job: only tokens the
verifier has judged, never the one being drafted.

A trained drafter costs a forward before its draft is known, so whether to run it is decided
before, and by what its steps have measured rather than by the model: the tokens and wall seconds
of each step are kept apart by the situation it began in (a free source offered a draft worth
sending, or nothing did) and by whether the drafter ran; a step in which it ran but another draft
(or none) was sent counts for the steps without it too, its seconds less the drafter's run (the
same tokens would have come without it), so that those are measured while the drafter runs. It runs
when its steps yield more tokens per second than the steps without it in the same situation: theirs
measured once there are ``MIN_STEPS`` of them, before that the model's (a plain step, or the free
source's draft, at the curve's cost; no overhead outside the forward, so the drafter must beat an
optimistic rival). A rate, not the step's value at ``R``: the situation is the text's (where the
free sources have nothing to offer, they have nothing however the stretch is crossed), so what
counts is the seconds a token of it costs each way. A drafter's measured step pays for what the
model leaves out (its forward, the context handed to it, the loop's bookkeeping of a longer step);
a model of its value from its own estimates did not see those and, estimated per step from few
drafts, sat the drafter out where always drafting was faster (docs/speed.md). The drafter runs for
its first ``MIN_STEPS`` steps in a situation, and anyway after ``probe_every`` steps without it, a
wait that doubles each time a probe's draft is not sent (up to 16 times), so that the means follow
the text without a useless drafter costing a forward every few steps. Its context (the verifier's
states of committed rows) is handed to it only when it drafts, all pending rows in one forward
(``LazyContext``). A request after which the drafter pays in no situation benches it for the next
requests (1, 2, 4, ... up to 64 after each such request; back to 1 after one where it pays): a
request without it and without a free source is decoded by the plain loop (``plan``), at plain
decoding's cost.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class CostCurve:
    """Seconds of one verifier forward over k = 1 .. len(verify) rows (``verify[k - 1]``) against
    a KV cache at a typical context length, and of one forward of the trained drafter over its
    block with its head (``drafter``; None where no trained drafter is measured), on this machine
    and dtype: ``domino.bench.costs.measure_costs``."""

    verify: tuple[float, ...]
    drafter: float | None = None
    context_tokens: int = 0  # the context length they were measured at

    def rows(self, k: int) -> float:
        """A verifier forward over ``k`` rows (past the curve's end: its last slope, extended)."""
        v = self.verify
        if k <= len(v):
            return v[k - 1]
        slope = (v[-1] - v[0]) / (len(v) - 1) if len(v) > 1 else 0.0
        return v[-1] + slope * (k - len(v))

    @property
    def plain_rate(self) -> float:
        """Tokens per second of plain decoding by the curve: one token per one-row forward."""
        return 1.0 / self.verify[0]

    def record(self) -> dict:
        return {"verify_seconds": list(self.verify), "drafter_seconds": self.drafter,
                "context_tokens": self.context_tokens}


def expected_tokens(p: list[float]) -> list[float]:
    """``E_k`` for k = 0 .. len(p): the tokens a step yields in expectation when it sends the
    first k drafts, ``p[i]`` each one's acceptance probability given the ones before it were
    accepted. ``E_0 = 1`` (the verifier's own token)."""
    out, alive = [1.0], 1.0
    for q in p:
        alive *= q
        out.append(out[-1] + alive)
    return out


def best_prefix(p: list[float], costs: CostCurve, rate: float) -> tuple[int, float]:
    """The k in 0 .. len(p) that maximises ``E_k - rate * c(k + 1)``, and that value (ties: the
    smaller k)."""
    best_k, best_v = 0, -math.inf
    for k, e in enumerate(expected_tokens(p)):
        v = e - rate * costs.rows(k + 1)
        if v > best_v + 1e-12:
            best_k, best_v = k, v
    return best_k, best_v


class Calibration:
    """The probability that a draft token is accepted, given the tokens before it were, as a
    function of its source's own estimate ``q``: per source and slot group, ``bins`` equal bins of
    ``q`` in [0, 1], each a Beta prior centred on the bin's middle (``prior`` pseudo-tokens) plus
    the tokens the verifier has judged there. Slot groups: 0, 1, 2 and 3 or later."""

    def __init__(self, bins: int = 10, prior: float = 2.0):
        self.bins, self.prior = bins, prior
        self.counts: dict[tuple[str, int, int], list[int]] = {}  # key -> [accepted, judged]

    def _key(self, source: str, slot: int, q: float) -> tuple[str, int, int]:
        return source, min(slot, 3), min(self.bins - 1, max(0, int(q * self.bins)))

    def p(self, source: str, slot: int, q: float) -> float:
        key = self._key(source, slot, q)
        acc, n = self.counts.get(key, (0, 0))
        mid = (key[2] + 0.5) / self.bins
        return (acc + self.prior * mid) / (n + self.prior)

    def observe(self, source: str, slot: int, q: float, accepted: bool) -> None:
        c = self.counts.setdefault(self._key(source, slot, q), [0, 0])
        c[0] += int(accepted)
        c[1] += 1

    def table(self) -> list[dict]:
        """Every bin judged at least once: source, slot group, the bin's range of ``q``, tokens
        judged and the share accepted (the calibration curve)."""
        return [{"source": s, "slot": slot, "q": [b / self.bins, (b + 1) / self.bins], "judged": n,
                 "accepted_share": acc / n}
                for (s, slot, b), (acc, n) in sorted(self.counts.items()) if n]


class LazyContext:
    """A ``domino.decode.NeuralDraft`` whose context rows are queued and handed to it in one
    forward when it next drafts (``flush``), instead of one forward per verified step."""

    def __init__(self, neural):
        self.neural = neural
        self.pending: list[torch.Tensor] = []
        self.start = 0

    def reset(self, prompt_ids) -> None:
        self.neural.reset(prompt_ids)
        self.pending = []

    def add(self, aux: torch.Tensor, start: int) -> None:
        if not self.pending:
            self.start = start
        self.pending.append(aux)

    def flush(self) -> None:
        if self.pending:
            aux = self.pending[0] if len(self.pending) == 1 else torch.cat(self.pending, 1)
            self.neural.add_context(aux, self.start)
            self.pending = []


@dataclass
class Choice:
    """What one step sent: the source (``"none"`` for a plain step), its tokens and their
    estimates, whether the trained drafter ran, and the situation it ran or not in."""

    source: str
    tokens: list[int] = field(default_factory=list)
    estimates: list[float] = field(default_factory=list)
    drafter_ran: bool = False
    drafter_seconds: float = 0.0  # what its run took, context handed over included
    situation: str = "none"  # what the free sources offered before the drafter: "free" (a draft) or "none"


def drafter_estimates(logits: torch.Tensor) -> list[float]:
    """A drafter's own estimate of each drafted token: its softmax probability in the slot's
    final logits (n, Vd), the token being the slot's argmax (greedy drafting)."""
    if logits.shape[0] == 0:
        return []
    return torch.softmax(logits.float(), -1).amax(-1).tolist()


class CostAwareDraft:
    """The decoder of the module docstring, over a trained drafter (``neural``, a
    ``NeuralDraft``; None: none) and free sources (``free``: name -> a drafter with ``advance``,
    ``best`` and ``sent``, as ``domino.suffix.SuffixDraft`` and ``NgramSource`` have). Row
    ``<checkpoint>-adaptive`` is the drafter alone; row ``hybrid`` the drafter with the suffix
    cache and the n-gram lookup.

    ``costs`` (a ``CostCurve``) must be set before decoding. ``chosen`` counts, over the decoder's
    life, the steps each source was sent and the tokens it sent; ``calibration`` is shared by every
    request of the job."""

    variable_drafts = True  # the loop records every step that sent a draft, whatever its length
    MIN_STEPS = 4  # measured steps of an arm in a situation before its mean replaces the model's
    clock = staticmethod(time.perf_counter)  # seconds (a test's simulated clock replaces it)

    def __init__(self, neural=None, free: dict | None = None, drafts_per_step: int | None = None,
                 probe_every: int = 16, costs: CostCurve | None = None):
        if neural is None and not free:
            raise ValueError("a cost-aware decoder needs a trained drafter or a free source")
        self.neural = None if neural is None else LazyContext(neural)
        self.free = dict(free or {})
        self._aux_layer_ids = neural.aux_layer_ids if neural is not None else None
        self.use_drafter = neural is not None  # in the current request (``plan``)
        self.benched_requests = 0  # requests left before the next that probes a drafter whose runs did not pay
        self.bench_length = 1
        self.requests = self.plain_requests = 0
        sizes = [d.drafts_per_step for d in self.free.values()] + ([neural.drafts_per_step] if neural else [])
        self.drafts_per_step = drafts_per_step or max(sizes)
        self.probe_every = probe_every
        self.costs = costs
        self.calibration = Calibration()
        # the steps measured, by (situation, whether the drafter ran): [steps, tokens, seconds]
        self.measured: dict[tuple[str, bool], list[float]] = {}
        self.job_tokens, self.job_seconds = 0.0, 0.0  # the job's earlier requests: tokens, measured seconds
        self.backoff = 0  # probes in a row whose draft was not sent
        self.sent_k, self.slots = float(self.drafts_per_step), self.drafts_per_step  # drafts sent lately; slots drafted
        self.chosen: dict[str, list[int]] = {}  # source -> [steps, tokens sent]
        self.drafter_runs = 0
        self._reset_request()

    def _reset_request(self) -> None:
        if getattr(self, "seconds_so_far", 0.0) > 0:
            self.job_tokens += self.tokens_so_far
            self.job_seconds += self.seconds_so_far
        self.last: tuple[int, Choice] = (-1, Choice("none"))
        self.since_drafter = 0
        self.tokens_so_far, self.seconds_so_far = 0.0, 0.0
        self._t_last = 0.0  # when the latest step's proposal began

    @property
    def aux_layer_ids(self):
        """The verifier states the loop hands over: the drafter's, in a request it may draft in."""
        return self._aux_layer_ids if self.use_drafter else None

    def plan(self, prompt_ids: list[int]) -> bool:
        """Before a request: whether the drafter may run in it (it is not sitting out requests
        after runs that did not pay, ``finish``), and whether the request needs the speculative
        loop at all (False: no free source and no drafter, so ``domino.decode.decode`` decodes it
        plainly, without the loop's bookkeeping)."""
        if self.costs is None:
            raise RuntimeError("a cost-aware decoder decodes only after its costs are measured (CostAwareDraft.costs)")
        self.use_drafter = self.neural is not None and self.benched_requests <= 0
        if self.neural is not None and not self.use_drafter:
            self.benched_requests -= 1
        self.requests += 1
        self.plain_requests += not (self.use_drafter or self.free)
        return self.use_drafter or bool(self.free)

    def reset(self, prompt_ids: list[int]) -> None:
        if self.costs is None:
            raise RuntimeError("a cost-aware decoder decodes only after its costs are measured (CostAwareDraft.costs)")
        if self.use_drafter:
            self.neural.reset(prompt_ids)
        for d in self.free.values():
            d.reset(prompt_ids)
        self._reset_request()

    def learn(self, answer: list[int]) -> None:
        for d in self.free.values():
            if hasattr(d, "learn"):
                d.learn(answer)

    def add_context(self, aux, start: int) -> None:
        if self.use_drafter:
            self.neural.add(aux, start)

    @property
    def rate(self) -> float:
        """``R``: the job's tokens per second so far, in measured seconds, from a prior of 16 tokens at
        plain decoding's rate by the curve, and never below that rate."""
        plain = self.costs.plain_rate
        t, sec = self.job_tokens + self.tokens_so_far, self.job_seconds + self.seconds_so_far
        return max(plain, (t + 16) / (sec + 16 / plain))

    def _judge(self, anchor_pos: int) -> None:
        """What the previous step's drafts became: calibration, the measured steps, the rate."""
        prev_pos, choice = self.last
        if prev_pos < 0:
            return
        accepted = anchor_pos - prev_pos - 1
        for j, q in enumerate(choice.estimates[: accepted + 1]):
            self.calibration.observe(choice.source, j, q, j < accepted)
        seconds = self.clock() - self._t_last  # the step's wall time, drafting included
        self._measure(choice.situation, choice.drafter_ran, accepted + 1, seconds)
        if choice.drafter_ran and choice.source != "drafter":  # the step without it: the same tokens, less its run
            self._measure(choice.situation, False, accepted + 1, seconds - choice.drafter_seconds)
        self.tokens_so_far += accepted + 1
        self.seconds_so_far += seconds

    def _measure(self, situation: str, ran: bool, tokens: int, seconds: float) -> None:
        m = self.measured.setdefault((situation, ran), [0, 0, 0.0])
        m[0], m[1], m[2] = m[0] + 1, m[1] + tokens, m[2] + seconds

    def _probs(self, source: str, estimates: list[float]) -> list[float]:
        return [self.calibration.p(source, j, q) for j, q in enumerate(estimates)]

    def propose(self, anchor: int, anchor_pos: int, n: int) -> list[int]:
        self._judge(anchor_pos)
        self._t_last = self.clock()
        R = self.rate
        best = Choice("none")
        best_value = 1.0 - R * self.costs.rows(1)  # a plain step
        for name, d in self.free.items():
            d.advance(anchor, anchor_pos)
            tokens, estimates = d.best(min(n, d.drafts_per_step)) if n > 0 else ([], [])
            k, v = best_prefix(self._probs(name, estimates), self.costs, R)
            if k > 0 and v > best_value:
                best, best_value = Choice(name, tokens[:k], estimates[:k]), v
        best.situation = situation = "none" if best.source == "none" else "free"
        c = self.costs.rows(len(best.tokens) + 1)
        rival = (best_value + R * c, c)  # the best step without the drafter: its expected tokens, its rows' seconds
        probe = self._probing(situation)
        if self.use_drafter and n > 0 and (probe or self._measured_pays(situation, rival)):
            t0 = self.clock()
            self.neural.flush()
            nd = self.neural.neural
            slots = nd.drafts_per_step if probe else self.slots  # a probe drafts the whole block
            tokens, logits = nd.drafter.draft(anchor, anchor_pos, nd.kv, min(n, nd.drafts_per_step, slots),
                                              return_logits=True, tables=nd.tables)
            estimates = drafter_estimates(logits)
            k, v = best_prefix(self._probs("drafter", estimates), self.costs, R)
            run_seconds = self.clock() - t0
            self.since_drafter, self.drafter_runs = 0, self.drafter_runs + 1
            if k > 0 and v > best_value:
                best = Choice("drafter", tokens[:k], estimates[:k], situation=situation)
                self.backoff = 0
            else:
                self.backoff = min(self.backoff + 1, 4)
            # draft two slots more than the drafts sent lately: a slot past them costs a GRU step for nothing
            self.sent_k = 0.9 * self.sent_k + 0.1 * len(best.tokens if best.source == "drafter" else [])
            self.slots = max(2, math.ceil(self.sent_k) + 2)
            best.drafter_ran, best.drafter_seconds = True, run_seconds
        elif self.use_drafter:
            self.since_drafter += 1
        for d in self.free.values():
            d.sent(anchor_pos, best.tokens)
        steps = self.chosen.setdefault(best.source, [0, 0])
        steps[0] += 1
        steps[1] += len(best.tokens)
        self.last = (anchor_pos, best)
        return best.tokens

    def finish(self) -> None:
        """After a request: a drafter that pays in no situation by its measured steps sits out the
        next requests, twice as many each time it is tried again and still does not pay (at most 64)."""
        if not self.use_drafter:
            return
        situations = {s for s, _ in self.measured} or {"none"}
        if any(self._measured_pays(s, (1.0, self.costs.rows(1))) for s in situations):
            self.bench_length = 1
        else:
            self.benched_requests = self.bench_length
            self.bench_length = min(64, self.bench_length * 2)

    def _steps(self, situation: str, ran: bool) -> list[float] | None:
        """The measured steps (steps, tokens, seconds) of an arm in ``situation``; None: fewer than
        ``MIN_STEPS``."""
        m = self.measured.get((situation, ran))
        return m if m is not None and m[0] >= self.MIN_STEPS else None

    def _probing(self, situation: str) -> bool:
        """Whether the drafter runs now whatever its steps measured: fewer than ``MIN_STEPS`` of
        them in ``situation``, or ``probe_every`` steps (doubled per unsent probe) without it."""
        return self._steps(situation, True) is None or self.since_drafter >= self.probe_every << self.backoff

    def _measured_pays(self, situation: str, rival: tuple[float, float]) -> bool:
        """Whether the drafter's measured steps in ``situation`` yield more tokens per second than
        the steps without it there: theirs measured once there are ``MIN_STEPS``, before that
        ``rival`` (the model's tokens and seconds of the best step without it). Too few steps of
        the drafter's own: it pays (it must be measured)."""
        d, o = self._steps(situation, True), self._steps(situation, False)
        if d is None:
            return True
        tokens, seconds = rival if o is None else (o[1], o[2])
        return d[1] / d[2] > tokens / seconds

    def record(self) -> dict:
        """What a results file says of the decoder's choices (``adaptive``)."""
        return {"costs": self.costs.record() if self.costs else None,
                "chosen": {s: {"steps": n, "tokens": t} for s, (n, t) in sorted(self.chosen.items())},
                "drafter_runs": self.drafter_runs, "requests": self.requests, "plain_requests": self.plain_requests,
                "calibration": self.calibration.table()}


class NgramSource:
    """The n-gram lookup (``domino.decode.NgramDraft``) as a free source of ``CostAwareDraft``: its
    draft and, as its estimate of each token, the share of the match's length in the longest
    n-gram looked up (the calibration learns what each is worth per slot)."""

    def __init__(self, lookup):
        self.lookup = lookup
        self.drafts_per_step = lookup.drafts_per_step

    def reset(self, prompt_ids) -> None:
        self.lookup.reset(prompt_ids)

    def advance(self, anchor: int, anchor_pos: int) -> None:
        self.lookup.advance(anchor, anchor_pos)

    def best(self, n: int) -> tuple[list[int], list[float]]:
        tokens, m = self.lookup.match(n)
        return tokens, [m / self.lookup.max_n] * len(tokens)

    def sent(self, anchor_pos: int, drafts: list[int]) -> None:
        self.lookup.sent(anchor_pos, drafts)


class SuffixSource:
    """The suffix cache (``domino.suffix.SuffixDraft``) as a free source of ``CostAwareDraft``: its
    draft and, as its estimate of each token, the frequency ratio of that token alone (the
    conditional the rule multiplies)."""

    def __init__(self, suffix):
        self.suffix = suffix
        self.drafts_per_step = suffix.drafts_per_step

    def reset(self, prompt_ids) -> None:
        self.suffix.reset(prompt_ids)

    def learn(self, answer) -> None:
        self.suffix.learn(answer)

    def advance(self, anchor: int, anchor_pos: int) -> None:
        self.suffix.advance(anchor, anchor_pos)

    def best(self, n: int) -> tuple[list[int], list[float]]:
        d = self.suffix.best(n)
        cond = [p / q for p, q in zip(d.probs, [1.0, *d.probs[:-1]])]
        return d.tokens, cond

    def sent(self, anchor_pos: int, drafts: list[int]) -> None:
        self.suffix.sent(anchor_pos, drafts)
