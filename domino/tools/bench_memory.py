"""Training-step memory and time at the card's shapes: ``python -m domino.tools.bench_memory``.

Builds the card's drafter (``domino.tools.CARD_DRAFTER`` over Qwen3-0.6B's shape: hidden 1024,
16 heads of 128, vocabulary 151,936; 3 draft layers, block 8, aux layers [1, 13, 25], draft
vocabulary 32,000, Domino head GRU 1024 / bottleneck 256) with random weights, and runs a few optimizer steps through
``domino.train.loop.train_steps`` (the train stage's own step; no state or checkpoint is written) on random features
of one packed row (``--pack-len`` tokens, ``--anchors`` anchors). Prints the trainable parameter count, the peak
memory and the mean step time.

Goal (the card trained on an 8 GB RTX 4060): peak GPU memory of the training step under 8 GiB
with ``--attn sdpa``. On CUDA the peak is ``torch.cuda.max_memory_allocated``; on a CPU it is
the process's peak resident memory (weights, features and Python included), a coarser figure.
Random weights and features change nothing about memory or time. ``docs/memory.md`` works out
what the step should need and records the figures measured so far.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from dataclasses import dataclass

import torch

from ..common import DTYPES
from ..model import Drafter
from ..train.loop import TrainConfig, train_steps
from ..vocab import mappings
from . import card_drafter_config, tool_parser


@dataclass
class StepMemory:
    """What ``measure`` found: the run's settings, the drafter's sizes, the peak and the step time."""

    device: str
    attn: str
    projector: str
    autocast: str | None
    pack_len: int
    anchors: int
    steps: int               # optimizer steps taken
    trainable_params: int
    param_bytes: int         # every parameter of the drafter, trainable or frozen
    trainable_bytes: int     # the trainable ones (each also has a gradient and optimizer state)
    peak_bytes: int
    peak_kind: str           # "cuda max_memory_allocated" or "process peak RSS"
    seconds_per_step: float


def _features(T: int, n_aux: int, H: int, V: int, Vd: int, docs: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.full((docs,), T // docs)
    lengths[-1] += T - int(lengths.sum())
    return {
        "input_ids": torch.randint(0, V - 1, (T,), generator=g),
        "loss_mask": torch.ones(T, dtype=torch.uint8),
        "aux": torch.randn(T, n_aux * H, generator=g).to(torch.bfloat16),
        "target": torch.randint(0, Vd, (T,), generator=g),
        "offsets": torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]),
    }


def measure(device: str, attn: str, projector: str, autocast: str | None, pack_len: int, anchors: int,
            steps: int, seed: int = 0) -> StepMemory:
    torch.manual_seed(seed)
    cfg = card_drafter_config(projector=projector, shift_label=True, attn_implementation=attn)
    drafter = Drafter(cfg)
    d2t, t2d = mappings(torch.arange(cfg.draft_vocab_size), cfg.target_vocab_size)
    drafter.d2t.copy_(d2t)
    drafter.t2d.copy_(t2d)
    feats = _features(pack_len * (steps + 1), len(cfg.aux_layer_ids), cfg.hidden_size, cfg.target_vocab_size,
                      cfg.draft_vocab_size, docs=4 * (steps + 1), seed=seed)
    tc = TrainConfig.schema_defaults(epochs=1, anchors_per_row=anchors, pack_len=pack_len, warmup_steps=1,
                                     checkpoint_every=10**9, seed=seed,
                                     weighting="shifted" if projector == "domino" else "classic")
    dtype = DTYPES[autocast] if autocast else None
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    s = train_steps(drafter, feats, tc, steps, device, dtype)
    seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated(device) if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    trainable = [p for p in drafter.parameters() if p.requires_grad]
    return StepMemory(device=device, attn=attn, projector=projector, autocast=autocast, pack_len=pack_len,
                      anchors=anchors, steps=s["steps"], trainable_params=sum(p.numel() for p in trainable),
                      param_bytes=sum(p.numel() * p.element_size() for p in drafter.parameters()),
                      trainable_bytes=sum(p.numel() * p.element_size() for p in trainable), peak_bytes=peak,
                      peak_kind="cuda max_memory_allocated" if cuda else "process peak RSS",
                      seconds_per_step=seconds / max(1, s["steps"]))


def parser() -> argparse.ArgumentParser:
    ap = tool_parser("bench_memory", __doc__)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="where the training step runs (cpu, cuda or cuda:N)")
    ap.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa", help="the draft layers' attention kernel")
    ap.add_argument("--projector", choices=["domino", "dflash"], default="domino",
                    help="the drafter kind: with the Domino head, or the DFlash backbone alone")
    ap.add_argument("--autocast", choices=["bfloat16", "float16", "none"], default=None,
                    help="autocast dtype (without it: bfloat16 on CUDA, as config/card.yaml, none on a CPU)")
    ap.add_argument("--pack-len", type=int, default=4096, help="tokens in the one packed row (train.pack_len)")
    ap.add_argument("--anchors", type=int, default=256, help="anchors drawn in the row (train.anchors_per_row)")
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps timed (the first one included)")
    return ap


def main(argv=None) -> None:
    a = parser().parse_args(argv)
    autocast = a.autocast or ("bfloat16" if a.device.startswith("cuda") else "none")
    r = measure(a.device, a.attn, a.projector, None if autocast == "none" else autocast, a.pack_len, a.anchors,
                a.steps)
    print(f"card-shape {r.projector} drafter, {r.trainable_params / 1e6:.1f}M trainable parameters, "
          f"attn {r.attn}, autocast {autocast}, one row of {r.pack_len} tokens x {r.anchors} anchors "
          f"on {r.device}")
    print(f"peak memory ({r.peak_kind}): {r.peak_bytes / 2**30:.2f} GiB")
    print(f"{r.seconds_per_step:.2f} s per training step (mean of {r.steps}, first step included)")
    if r.device.startswith("cuda"):
        print(f"goal <= 8 GiB: {'met' if r.peak_bytes <= 8 * 2**30 else 'NOT met'}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
