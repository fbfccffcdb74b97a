"""The optimizers of training (``train.optimizer``).

``adamw`` updates every trainable parameter with one AdamW. ``muon`` follows speculators PR 685:
``torch.optim.Muon`` on the 2-D weight matrices (``muon_parameter_names``: every trainable 2-D
weight except the embedding and the lm_head, so ``fc``, the attention and MLP projections, and
the Domino head's GRU and bottleneck matrices) at ``muon_lr_scale`` times the scheduled learning
rate, and AdamW (``weight_decay``) on the rest (the RMSNorm weights; the embedding and lm_head
are frozen here and get no update at all).
"""

from __future__ import annotations

import functools
from typing import Protocol

import torch


class OptimizerSettings(Protocol):
    """The ``train.*`` keys the optimizers read (``domino.train.loop.TrainConfig`` has them all)."""

    optimizer: str  # "adamw" | "muon"
    lr: float
    betas: list[float]
    weight_decay: float
    muon_lr_scale: float
    muon_weight_decay: float
    muon_momentum: float
    muon_ns_steps: int
    muon_adjust_lr_fn: str


def muon_parameter_names(model: torch.nn.Module) -> list[str]:
    """Trainable parameters Muon updates: 2-D weight matrices except the embedding and lm_head."""
    excluded = ("embed_tokens.", "lm_head.")
    return [n for n, p in model.named_parameters() if p.requires_grad and p.ndim == 2 and not n.startswith(excluded)]


class Optimizers:
    """One or two torch optimizers stepped as one; each carries a multiple of the scheduled lr."""

    def __init__(self, parts: list[tuple[torch.optim.Optimizer, float]]):
        self.parts = parts

    def set_lr(self, lr: float) -> None:
        for opt, scale in self.parts:
            for g in opt.param_groups:
                g["lr"] = lr * scale

    def zero_grad(self) -> None:
        for opt, _ in self.parts:
            opt.zero_grad(set_to_none=True)

    def step(self) -> None:
        for opt, _ in self.parts:
            opt.step()

    def state_dict(self) -> list[dict]:
        return [opt.state_dict() for opt, _ in self.parts]

    def load_state_dict(self, states: list[dict]) -> None:
        for (opt, _), st in zip(self.parts, states, strict=True):
            opt.load_state_dict(st)


def build_optimizers(model: torch.nn.Module, cfg: OptimizerSettings) -> Optimizers:
    """AdamW on every trainable parameter, or Muon on ``muon_parameter_names`` + AdamW on the rest."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    adamw = functools.partial(torch.optim.AdamW, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adamw":
        return Optimizers([(adamw([p for _, p in named]), 1.0)])
    matrices = set(muon_parameter_names(model))
    muon = torch.optim.Muon([p for n, p in named if n in matrices], lr=cfg.lr * cfg.muon_lr_scale,
                            weight_decay=cfg.muon_weight_decay, momentum=cfg.muon_momentum,
                            ns_steps=cfg.muon_ns_steps, adjust_lr_fn=cfg.muon_adjust_lr_fn)
    parts = [(muon, cfg.muon_lr_scale)]
    rest = [p for n, p in named if n not in matrices]
    if rest:
        parts.append((adamw(rest), 1.0))
    return Optimizers(parts)
