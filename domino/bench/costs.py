"""The cost curve of a benchmark job (``domino.adaptive.CostCurve``): what a verifier forward over
k rows, and a trained drafter's draft, cost on this machine and dtype, measured before the timed
decodes so that the cost-aware decoders choose by it.

Each forward is timed alone, after one untimed call: the verifier's over k = 1 .. ``max_rows`` rows
of the context's own next tokens against a KV cache of the context (cut back after each), in
``repeats`` rounds that each time every k once (so that a slow moment of the machine falls on
every k alike), the median of each k kept; then each k's figure is the least of its own and every
larger k's (a forward over more rows is never cheaper: what is higher was noise). The drafter's
over its block after the same context (its ``draft`` with its final logits, as
``domino.adaptive.CostAwareDraft`` calls it), ``repeats`` times, the median kept.

And a step's floor (``step_floor``), measured after the timed decodes: the forwards a speculative
step cannot do without, each timed alone the same way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from ..adaptive import CostCurve, drafter_estimates
from ..aux import AuxCapture
from ..decode import NeuralDraft, cache_kwarg, crop_cache


def median_seconds(fn, repeats: int, sync=lambda: None) -> float:
    """The median seconds of ``repeats`` calls of ``fn`` after one untimed call; ``sync`` waits
    for the device before and after each (``torch.cuda.synchronize`` on a GPU)."""
    fn()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


@torch.inference_mode()
def measure_costs(verifier, context_ids: list[int], max_rows: int, draft: NeuralDraft | None = None,
                  repeats: int = 21) -> CostCurve:
    """``CostCurve`` after ``context_ids`` (a prompt of typical length): the verifier for 1 ..
    ``max_rows`` rows and, with ``draft``, its drafter. The context must hold more than
    ``max_rows`` tokens: its last ``max_rows`` are the rows verified."""
    dev = verifier.device
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    n = len(context_ids) - max_rows
    if n < 1:
        raise ValueError(f"a cost curve of {max_rows} rows needs more than {max_rows} context tokens, "
                         f"got {len(context_ids)}")
    cache, ck = DynamicCache(config=verifier.config), cache_kwarg(verifier)
    with AuxCapture(verifier, (draft.aux_layer_ids or []) if draft is not None else []) as cap:
        verifier(input_ids=torch.tensor([context_ids[:n]], device=dev), **{ck: cache}, use_cache=True,
                 logits_to_keep=1)
        if draft is not None:
            draft.reset(context_ids[:n])
            draft.add_context(cap.aux(), 0)
    rows = torch.tensor([context_ids[n:]], device=dev)

    def verify(k):
        verifier(input_ids=rows[:, :k], **{ck: cache}, use_cache=True)
        crop_cache(cache, n)

    for k in range(1, max_rows + 1):
        verify(k)  # untimed
    times = [[] for _ in range(max_rows)]
    for _ in range(repeats):
        for k in range(1, max_rows + 1):
            sync()
            t0 = time.perf_counter()
            verify(k)
            sync()
            times[k - 1].append(time.perf_counter() - t0)
    medians = [sorted(t)[len(t) // 2] for t in times]
    curve = tuple(min(medians[k:]) for k in range(max_rows))
    drafter = None
    if draft is not None:
        anchor = context_ids[n]

        def run_draft():
            _, logits = draft.drafter.draft(anchor, n, draft.kv, return_logits=True, tables=draft.tables)
            drafter_estimates(logits)

        drafter = median_seconds(run_draft, repeats, sync)
    return CostCurve(curve, drafter, n)


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
