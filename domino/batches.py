"""Training rows: packed feature rows, their anchors and targets, aux-state noise, and the
named random streams they draw from.

Everything random is derived from ``(seed, stream, ...)`` keys (``SeedStream``): the row order
of each epoch, the anchors of each row and its aux-state noise. A resumed run therefore draws
what an uninterrupted one would, and data-parallel ranks that split a step's rows draw exactly
what a single process would.

Anchors (PR 685 style): up to ``anchors_per_row`` distinct positions per packed row, drawn
without replacement among the valid ones: at least one context token of the same document
before the anchor, the whole block and its shifted target (``a .. a+B``) inside the same
document, and an assistant token at ``a+1``. The same rule serves all three checkpoints so
that their budgets are identical.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .data import pack


class AuxNoise(NamedTuple):
    """Noise added to the auxiliary states of training rows: ``uniform`` draws from
    ``[-scale, scale)``, ``gaussian`` from ``N(0, scale^2)``; ``none`` (or scale 0) adds nothing."""

    kind: str = "none"
    scale: float = 0.0

    @property
    def active(self) -> bool:
        return self.kind != "none" and self.scale > 0



def aux_noise(noise: str, noise_scale: float) -> AuxNoise:
    """The noise of training rows from ``train.noise`` and ``train.noise_scale``."""
    return AuxNoise(noise, noise_scale if noise != "none" else 0.0)


def draw_aux_noise(shape, noise: AuxNoise, generator: torch.Generator) -> torch.Tensor:
    """float32 noise of ``shape`` drawn from ``generator`` (see ``AuxNoise``); scaled in place,
    so a card-sized row allocates one tensor, not three."""
    if noise.kind == "gaussian":
        return torch.randn(shape, generator=generator).mul_(noise.scale)
    if noise.kind == "uniform":
        return torch.rand(shape, generator=generator).mul_(2).sub_(1).mul_(noise.scale)
    raise ValueError(f"no noise to draw for kind {noise.kind!r}")


class PackedRows:
    """Feature tensors packed into rows of ``pack_len`` tokens with document ids."""

    def __init__(self, feats: dict, pack_len: int):
        self.f = feats
        offs = feats["offsets"].tolist()
        self.spans = [(offs[i], offs[i + 1]) for i in range(len(offs) - 1)]
        self.packs = pack([e - s for s, e in self.spans], pack_len)
        self.pack_len = pack_len

    def __len__(self):
        return len(self.packs)

    def batch(self, rows: list[int], noise: AuxNoise = AuxNoise(), noise_seed: tuple = ()) -> dict:
        """Rows ``rows`` as (R, T) tensors; ``row_ids`` keeps their indices for per-row randomness.

        The noise of row ``p`` comes from the generator of ``(*noise_seed, p)``; it covers the
        whole row, padding included."""
        T, f = self.pack_len, self.f
        R = len(rows)
        A = f["aux"].shape[1]
        out = {
            "input_ids": torch.zeros(R, T, dtype=torch.long),
            "position_ids": torch.zeros(R, T, dtype=torch.long),
            "doc_ids": torch.full((R, T), -1, dtype=torch.long),
            "loss_mask": torch.zeros(R, T, dtype=torch.bool),
            "target": torch.zeros(R, T, dtype=torch.long),
            # stored dtype (bf16 at card scale) unless noise is added: half the bytes to the device
            "aux": torch.zeros(R, T, A, dtype=torch.float32 if noise.active else f["aux"].dtype),
        }
        for r, p in enumerate(rows):
            cur = 0
            for d, si in enumerate(self.packs[p]):
                s, e = self.spans[si]
                n = min(e - s, T - cur)
                sl = slice(cur, cur + n)
                out["input_ids"][r, sl] = f["input_ids"][s:s + n]
                out["position_ids"][r, sl] = torch.arange(n)
                out["doc_ids"][r, sl] = d
                out["loss_mask"][r, sl] = f["loss_mask"][s:s + n]
                out["target"][r, sl] = f["target"][s:s + n]
                out["aux"][r, sl] = f["aux"][s:s + n]
                cur += n
            if noise.active:
                out["aux"][r] += draw_aux_noise(out["aux"][r].shape, noise, keyed_generator(*noise_seed, p))
        out["row_ids"] = list(rows)
        return out


def valid_anchor_mask(doc_ids: torch.Tensor, loss_mask: torch.Tensor, block_size: int) -> torch.Tensor:
    """(R, T) bool: positions ``a`` that can serve as anchors.

    ``a`` is valid when ``1 <= a <= T-B-1`` (a context token before it; ``a+B``, the last
    shifted target, inside the row), ``a-1`` and ``a+B`` lie in ``a``'s document (so the
    whole span ``a-1 .. a+B`` does: documents are contiguous), ``a`` is not padding (doc id -1)
    and ``a+1`` is a loss-mask (assistant) token."""
    R, T = doc_ids.shape
    B = block_size
    ok = torch.zeros(R, T, dtype=torch.bool)
    if T <= B + 1:
        return ok
    a = slice(1, T - B)
    ok[:, a] = (
        (doc_ids[:, 1:T - B] >= 0)
        & (doc_ids[:, 0:T - B - 1] == doc_ids[:, 1:T - B])
        & (doc_ids[:, 1 + B:T] == doc_ids[:, 1:T - B])
        & loss_mask[:, 2:T - B + 1]
    )
    return ok


def sample_anchors(valid: torch.Tensor, n: int, generators) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to n distinct valid anchors per row (one generator per row), ascending.

    Rows with fewer valid positions are padded with an invalid copy of their first anchor."""
    R, T = valid.shape
    anchors = torch.zeros(R, n, dtype=torch.long)
    ok = torch.zeros(R, n, dtype=torch.bool)
    for r in range(R):
        cand = valid[r].nonzero().flatten()
        if len(cand) == 0:
            continue
        pick = cand[torch.randperm(len(cand), generator=generators[r])[:n]].sort().values
        anchors[r, : len(pick)] = pick
        ok[r, : len(pick)] = True
        anchors[r, len(pick):] = pick[0]
    return anchors, ok


def slot_targets(batch: dict, anchors: torch.Tensor, ok: torch.Tensor, block_size: int, shift_label: bool):
    """Targets (R, N, B) draft ids and their mask: slot k predicts position t = a + k + shift,
    whose target is the verifier's greedy draft-vocab token stored at t - 1; the mask is the
    loss mask at t (the predicted token is an assistant token) and the anchor's validity."""
    T = batch["target"].shape[1]
    t = anchors[..., None] + torch.arange(block_size) + int(shift_label)  # (R, N, B)
    t = t.clamp(max=T - 1)
    tgt = batch["target"].gather(1, (t - 1).flatten(1)).view(t.shape)
    mask = batch["loss_mask"].gather(1, t.flatten(1)).view(t.shape) & ok[..., None]
    return tgt, mask


class SeedStream:
    """The named random streams of training: a generator is seeded by ``(seed, stream, ...)``,
    so each use draws independently of the others and of the order of the steps."""

    EPOCH_ORDER = 1  # (seed, EPOCH_ORDER, epoch): the order of the packed rows in an epoch
    NOISE = 2        # (seed, NOISE, step, row): noise on the aux states of a training row
    ANCHORS = 3      # (seed, ANCHORS, step, row): the anchors of a training row
    VALIDATION = 4   # (seed, VALIDATION, batch, row): the anchors of a validation row


def keyed_generator(*keys) -> torch.Generator:
    """A CPU generator seeded by a hash of ``keys`` (``SeedStream``)."""
    return torch.Generator().manual_seed(_mix(*keys))


def _mix(*keys) -> int:
    h = 1469598103934665603
    for k in keys:
        h = ((h ^ (int(k) + 0x9E3779B97F4A7C15)) * 1099511628211) % (2**63)
    return h

