"""Training rows: packed feature rows, their anchors and targets, aux-state noise, and the
named random streams they draw from.

Everything random is derived from ``(seed, stream, ...)`` keys (``SeedStream``): the row order
of each epoch, the anchors of each row and its aux-state noise. A resumed run therefore draws
what an uninterrupted one would, and data-parallel ranks that split a step's rows draw exactly
what a single process would.

Anchors (PR 685 style): up to ``anchors_per_row`` distinct positions per packed row, drawn
without replacement among the valid ones: at least one context token of the same document
before the anchor, the first drafted position ``a+1`` inside the same document, and an
assistant token where ``train.loss_mask_at`` looks (``LOSS_MASK_AT``). The block may run past
the document's end: the slots whose predicted position falls past it are masked
(``slot_targets``), as PR 685 masks those past the row's end. So an answer's last B-1 tokens,
its stop token among them, are targets of the early slots too. The same rule serves all three
checkpoints so that their budgets are identical.
"""

from __future__ import annotations

import torch

from ..schema import AuxNoise

# train.loss_mask_at: the offset, from a block slot's input position a+k, of the position whose
# loss mask gates the slot; the anchor (slot 0, input a) is valid where that position is an
# assistant token. "target": the position the slot predicts, a+k+shift (an anchor needs an
# assistant token at a+1). "input": the slot's own position a+k, as speculators PR 685
# (core.py: loss_mask[anchored_block_indices]; utils.py select_anchors: loss_mask[a]).
LOSS_MASK_AT = ("target", "input")


def loss_mask_offset(loss_mask_at: str, shift_label: bool) -> int:
    """How far past a slot's input position ``a+k`` its loss mask is read (``LOSS_MASK_AT``)."""
    if loss_mask_at not in LOSS_MASK_AT:
        raise ValueError(f"loss_mask_at must be one of {LOSS_MASK_AT}, got {loss_mask_at!r}")
    return int(shift_label) if loss_mask_at == "target" else 0


def draw_aux_noise(shape, noise: AuxNoise, generator: torch.Generator) -> torch.Tensor:
    """float32 noise of ``shape`` drawn from ``generator`` (see ``AuxNoise``); scaled in place,
    so a card-sized row allocates one tensor, not three."""
    if noise.kind == "gaussian":
        return torch.randn(shape, generator=generator).mul_(noise.scale)
    if noise.kind == "uniform":
        return torch.rand(shape, generator=generator).mul_(2).sub_(1).mul_(noise.scale)
    raise ValueError(f"no noise to draw for kind {noise.kind!r}")


def pack(lengths: list[int], pack_len: int):
    """Next-fit packing in order: lists of sequence indices whose lengths sum to <= pack_len
    (a sequence longer than pack_len gets a row of its own and is cut there)."""
    packs, cur, used = [], [], 0
    for i, length in enumerate(lengths):
        n = min(length, pack_len)
        if cur and used + n > pack_len:
            packs.append(cur)
            cur, used = [], 0
        cur.append(i)
        used += n
    if cur:
        packs.append(cur)
    return packs


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
        whole row, padding included, and is added in float32 or in the storage dtype
        (``AuxNoise.dtype``)."""
        T, f = self.pack_len, self.f
        R = len(rows)
        A = f["aux"].shape[1]
        # stored dtype (bf16 at card scale) unless noise is added in float32: half the bytes to the device
        aux_dtype = torch.float32 if noise.active and noise.dtype == "float32" else f["aux"].dtype
        out = {
            "input_ids": torch.zeros(R, T, dtype=torch.long),
            "position_ids": torch.zeros(R, T, dtype=torch.long),
            "doc_ids": torch.full((R, T), -1, dtype=torch.long),
            "loss_mask": torch.zeros(R, T, dtype=torch.bool),
            "target": torch.zeros(R, T, dtype=torch.long),
            "aux": torch.zeros(R, T, A, dtype=aux_dtype),
        }
        if "last" in f:  # the verifier's last hidden state, for train.loss kl_div: never noised
            out["last"] = torch.zeros(R, T, f["last"].shape[1], dtype=f["last"].dtype)
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
                if "last" in f:
                    out["last"][r, sl] = f["last"][s:s + n]
                cur += n
            if noise.active:
                drawn = draw_aux_noise(out["aux"][r].shape, noise, keyed_generator(*noise_seed, p))
                out["aux"][r] += drawn.to(aux_dtype)
        out["row_ids"] = list(rows)
        return out


def valid_anchor_mask(doc_ids: torch.Tensor, loss_mask: torch.Tensor, block_size: int,
                      loss_mask_at: str = "target") -> torch.Tensor:
    """(R, T) bool: positions ``a`` that can serve as anchors.

    ``a`` is valid when ``1 <= a <= T-2`` (a context token before it, the first drafted
    position ``a+1`` inside the row), ``a-1`` and ``a+1`` lie in ``a``'s document, ``a`` is not
    padding (doc id -1) and the position ``loss_mask_at`` names is a loss-mask (assistant)
    token: ``a+1`` for ``target`` (the first token the block drafts), ``a`` itself for ``input``
    (PR 685). The rest of the block, ``a+2 .. a+B``, may leave the document or the row:
    ``slot_targets`` masks those slots, so ``block_size`` does not narrow the anchors."""
    R, T = doc_ids.shape
    off = loss_mask_offset(loss_mask_at, True)  # a+1 for target (slot 0's shifted target), a for input
    ok = torch.zeros(R, T, dtype=torch.bool)
    if T < 3:
        return ok
    here = doc_ids[:, 1:T - 1]  # the documents of a = 1 .. T-2
    ok[:, 1:T - 1] = (
        (here >= 0)
        & (doc_ids[:, 0:T - 2] == here)
        & (doc_ids[:, 2:T] == here)
        & loss_mask[:, 1 + off:T - 1 + off]
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


def slot_targets(batch: dict, anchors: torch.Tensor, ok: torch.Tensor, block_size: int, shift_label: bool,
                 loss_mask_at: str = "target"):
    """Targets (R, N, B) draft ids and their mask: slot k predicts position t = a + k + shift,
    whose target is the verifier's greedy draft-vocab token stored at t - 1. The mask is the
    anchor's validity, t inside the row and inside the anchor's document (``batch["doc_ids"]``;
    a batch without them is one document per row), and the loss mask (an assistant token) at t
    for ``loss_mask_at`` ``target``, at the slot's input position a + k for ``input``
    (``LOSS_MASK_AT``)."""
    T = batch["target"].shape[1]
    k = torch.arange(block_size)
    t = _predicted_positions(anchors, block_size, shift_label, T)  # (R, N, B), clamped to the row
    tgt = batch["target"].gather(1, (t - 1).flatten(1)).view(t.shape)
    m = (anchors[..., None] + k + loss_mask_offset(loss_mask_at, shift_label)).clamp(max=T - 1)
    mask = batch["loss_mask"].gather(1, m.flatten(1)).view(m.shape) & ok[..., None]
    inside = anchors[..., None] + k + int(shift_label) <= T - 1  # the predicted position is in the row
    if "doc_ids" in batch:  # ... and in the anchor's document
        doc = batch["doc_ids"]
        inside &= doc.gather(1, t.flatten(1)).view(t.shape) == doc.gather(1, anchors)[..., None]
    return tgt, mask & inside


def slot_last_states(batch: dict, anchors: torch.Tensor, block_size: int, shift_label: bool) -> torch.Tensor:
    """(R, N, B, H): for slot k, the verifier's last hidden state at t - 1, t = a + k + shift, the
    position whose next-token distribution is slot k's target (``slot_targets``' greedy token is
    its argmax over the draft vocabulary)."""
    last = batch["last"]
    R, T, H = last.shape
    t = _predicted_positions(anchors, block_size, shift_label, T)
    idx = (t - 1).flatten(1)[..., None].expand(-1, -1, H)
    return last.gather(1, idx).view(*t.shape, H)


def _predicted_positions(anchors: torch.Tensor, block_size: int, shift_label: bool, T: int) -> torch.Tensor:
    """(R, N, B): the position t = a + k + shift that slot k of each anchor's block predicts."""
    return (anchors[..., None] + torch.arange(block_size) + int(shift_label)).clamp(max=T - 1)


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

