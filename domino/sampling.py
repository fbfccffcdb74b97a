"""Sampling at temperature > 0: ``SamplingRule``, the rule ``domino.decode.decode`` samples by,
and its pure pieces (the distributions, the acceptance rule, the drafter's proposal).

Distributions: ``p`` is the verifier's next-token distribution and ``q`` the drafter's at one
block slot, both after the same temperature and optional top-p (nucleus) truncation
(``sampling_probs``), both over the verifier's vocabulary. The drafter's distribution lives on
its draft vocabulary; its draft id ``i`` is target id ``i + d2t[i]`` and ``q`` is 0 on every
target id outside the draft vocabulary.

The speculative step (the standard rule, which keeps the output distributed exactly as plain
sampling from ``p``): draft ``n`` tokens, slot by slot, each sampled from ``q`` at its slot
(the Domino head reads the tokens actually drafted before it); verify ``[anchor, drafts]`` in
one verifier forward, which gives ``p`` for the position of every draft and one more; accept
draft ``x`` at slot ``i`` with probability ``min(1, p_i(x) / q_i(x))`` in order; at the first
rejection draw the next token from ``max(p_i - q_i, 0)`` normalised; when every draft is
accepted draw the bonus token from ``p_n``. Either way the step commits the accepted drafts
plus that one token, which is the next anchor (``accept_or_resample``).

Slot conventions follow ``DrafterConfig``: with ``shift_label`` the ``drafts_per_step`` = B
drafts come from slots 0..B-1; without it slot 0 is the anchor and slots 1..B-1 give B-1
drafts. ``Drafter.draft`` handles this; here a step asks for ``n`` drafts.

Randomness comes only from the caller's ``torch.Generator`` (on the verifier's device), so the
same seed gives the same tokens on the same machine. Temperature 0 is greedy decoding, the
default rule of ``domino.decode.decode``; this module has no rule for it. In a sampled
``DecodeResult``, ``verify_seconds`` also holds the probability computations and the
acceptance rule, ``draft_seconds`` the drafter and its sampling.

This module holds no decoding loop: the loops call the rule, never the reverse.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .vocab import target_ids


def seeded_generator(seed: int, device="cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device`` (the verifier's) seeded with ``seed``."""
    return torch.Generator(device=device).manual_seed(int(seed))


def _check_sampling(temperature: float, top_p: float) -> None:
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


def sampling_probs(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """logits (..., V) -> probabilities (..., V) after temperature and top-p truncation.

    Top-p keeps, by descending probability, every token whose preceding mass is below
    ``top_p`` (so at least the most likely one) and renormalises. Computed in at least float32.
    """
    _check_sampling(temperature, top_p)
    if temperature == 0:
        raise ValueError("temperature 0 is greedy decoding: there is no distribution to sample")
    x = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature
    probs = x.softmax(-1)
    if top_p < 1:
        ordered, order = probs.sort(-1, descending=True)
        keep_ordered = (ordered.cumsum(-1) - ordered) < top_p
        keep = torch.zeros_like(keep_ordered).scatter(-1, order, keep_ordered)
        probs = probs * keep
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def _draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token from probs (V,), which need not be normalised."""
    return int(torch.multinomial(probs, 1, generator=generator))


class StepOutcome(NamedTuple):
    accepted: int  # drafts accepted, 0..n
    next_token: int  # the residual draw at the first rejection, or the bonus draw from p_n


def accept_or_resample(draft_ids: torch.Tensor, q: torch.Tensor, p: torch.Tensor,
                       generator: torch.Generator) -> StepOutcome:
    """The lossless acceptance rule for one verified block.

    draft_ids (n,) target ids, each drawn from its row of q (n, V); p (n+1, V): p[i] is the
    verifier's distribution at draft i's position, p[n] the one after the last draft.
    Uses n uniforms, then one categorical draw, from ``generator``.
    """
    n = draft_ids.shape[0]
    if q.shape[0] != n or p.shape[0] != n + 1:
        raise ValueError(f"need q (n, V) and p (n+1, V) for n = {n} drafts, got {tuple(q.shape)}, {tuple(p.shape)}")
    rows = torch.arange(n, device=p.device)
    px, qx = p[rows, draft_ids], q[rows, draft_ids]
    if bool((qx <= 0).any()):
        raise ValueError("a draft has probability 0 under q: drafts must be sampled from q")
    u = torch.rand(n, generator=generator, device=p.device, dtype=p.dtype)
    rejected = (u * qx >= px).nonzero()  # accept with probability min(1, px / qx)
    if len(rejected) == 0:
        return StepOutcome(n, _draw(p[n], generator))
    c = int(rejected[0])
    residual = (p[c] - q[c]).clamp_min(0)
    if float(residual.sum()) <= 0:  # only by rounding: a rejection implies p[c] != q[c]
        residual = p[c]
    return StepOutcome(c, _draw(residual, generator))


class DraftProposal(NamedTuple):
    token_ids: list[int]  # n drafted target ids
    q: torch.Tensor  # (n, Vt) the drafter's distribution at each slot, over the target vocabulary


class _SlotSampler:
    """``pick_token`` for ``Drafter.draft``: samples the slots it is given, keeps their q."""

    def __init__(self, temperature: float, top_p: float, generator: torch.Generator):
        self.temperature, self.top_p, self.generator = temperature, top_p, generator
        self.rows: list[torch.Tensor] = []  # (k, Vd) each, in slot order

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        # logits (k, Vd) -> (k,) draft-vocabulary ids, one draw per slot
        probs = sampling_probs(logits, self.temperature, self.top_p)
        self.rows.append(probs)
        return torch.multinomial(probs, 1, generator=self.generator)[:, 0]


def propose_sampled(draft, anchor: int, anchor_pos: int, n: int, temperature: float, top_p: float,
                    generator: torch.Generator) -> DraftProposal:
    """Sample ``n`` drafts after ``anchor`` from a ``decode.NeuralDraft`` and return q with them."""
    drafter = getattr(draft, "drafter", None)
    if drafter is None:
        raise TypeError(f"speculative sampling needs a drafter's distribution; {type(draft).__name__} has none")
    if n < 1:
        return DraftProposal([], drafter.d2t.new_zeros(0, drafter.cfg.target_vocab_size, dtype=torch.float32))
    sampler = _SlotSampler(temperature, top_p, generator)
    tokens = drafter.draft(anchor, anchor_pos, draft.kv, n, pick_token=sampler,
                           tables=getattr(draft, "tables", None))
    q_draft = torch.cat(sampler.rows)  # (n, Vd)
    q = q_draft.new_zeros(len(tokens), drafter.cfg.target_vocab_size)
    q[:, target_ids(drafter.d2t)] = q_draft
    return DraftProposal(tokens, q)


class SamplingRule:
    """``decode.GreedyRule``'s interface at temperature > 0: tokens drawn from ``p``, drafts from
    ``q``, each draft kept or replaced by ``accept_or_resample``. Speculative sampling needs a
    drafter's distribution (a ``decode.NeuralDraft``), which an ``OracleDraft`` does not have."""

    def __init__(self, temperature: float, top_p: float, generator: torch.Generator):
        _check_sampling(temperature, top_p)
        if temperature == 0:
            raise ValueError("temperature 0 is greedy decoding: decode's default rule, not a sampling rule")
        if generator is None:
            raise ValueError("sampling at temperature > 0 needs a seeded torch.Generator")
        self.temperature, self.top_p, self.generator = temperature, top_p, generator

    def pick(self, logits: torch.Tensor) -> int:
        return _draw(sampling_probs(logits, self.temperature, self.top_p), self.generator)

    def drafts_for_budget(self, block: int, budget: int) -> int:
        """At most ``budget - 1`` drafts: a draft past the budget would draw random numbers that
        the tokens inside it then no longer draw, and change the sampled output."""
        return min(block, budget - 1)

    def propose(self, draft, anchor: int, anchor_pos: int, n: int):
        proposal = propose_sampled(draft, anchor, anchor_pos, n, self.temperature, self.top_p, self.generator)
        return proposal.token_ids, proposal

    def verify(self, drafts: list[int], proposal: DraftProposal, logits: torch.Tensor) -> tuple[int, int]:
        p = sampling_probs(logits, self.temperature, self.top_p)  # (n+1, Vt): p[j] for position pos+j+1
        ids = torch.tensor(drafts, dtype=torch.long, device=logits.device)
        return tuple(accept_or_resample(ids, proposal.q, p, self.generator))
