"""Training and validation of a drafter on extracted features.

Everything random is derived from ``(seed, epoch)`` or ``(seed, step, row)``: the row order of
each epoch, the anchors of each row and its aux-state noise. A resumed run therefore only needs
the weights, the optimizer state and the step to continue exactly where it stopped; the
learning rate and lambda are functions of the step. Because randomness is per row, data-parallel
ranks that split a step's rows draw exactly what a single process would.

Data parallelism (``torchrun``, gloo on CPU, nccl on CUDA): each rank takes every
``world``-th row of the step's global batch, the supervised-slot count is summed over ranks
before the loss is normalised, and gradients are summed, so the update equals the
single-process update on the same global batch. Rank 0 alone writes files.

Anchors (PR 685 style): up to ``anchors_per_row`` distinct positions per packed row, drawn
without replacement among the valid ones: at least one context token of the same document
before the anchor, the whole block and its shifted target (``a .. a+B``) inside the same
document, and an assistant token at ``a+1``. The same rule serves all three checkpoints so
that their budgets are identical.
"""

from __future__ import annotations

import functools
import json
import math
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .data import pack
from .io import atomic_path, write_json, write_jsonl
from .loss import curriculum_loss, lambda_at, linear_warmup_lr, slot_accuracy, slot_weights, weighted_ce_terms


@dataclass
class TrainConfig:
    epochs: int = 2
    lr: float = 6e-4
    warmup_steps: int = 50
    gamma: float = 7.0
    lambda0: float = 1.0
    lambda_ratio: float = 0.5
    anchors_per_row: int = 256
    pack_len: int = 4096
    rows_per_step: int = 1
    noise_std: float = 0.0
    weight_decay: float = 0.0
    betas: tuple = (0.9, 0.999)
    grad_clip: float = 1.0
    checkpoint_every: int = 100
    seed: int = 0
    weighting: str = "shifted"  # "classic" (DFlash, w_0 = 0) | "shifted" (Domino, w_0 = 1)


# -----------------------------------------------------------------------------
# batches


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

    def batch(self, rows: list[int], noise_std: float = 0.0, noise_seed: tuple = ()) -> dict:
        """Rows ``rows`` as (R, T) tensors; ``row_ids`` keeps their indices for per-row randomness."""
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
            "aux": torch.zeros(R, T, A, dtype=torch.float32 if noise_std > 0 else f["aux"].dtype),
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
            if noise_std > 0:
                g = _generator(*noise_seed, p)
                out["aux"][r] += noise_std * torch.randn(out["aux"][r].shape, generator=g)
        out["row_ids"] = list(rows)
        return out


def valid_anchor_mask(doc_ids: torch.Tensor, loss_mask: torch.Tensor, block_size: int) -> torch.Tensor:
    """(R, T) bool: positions that can serve as anchors (see the module docstring)."""
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
    whose target is the verifier's greedy draft-vocab token stored at t - 1."""
    T = batch["target"].shape[1]
    t = anchors[..., None] + torch.arange(block_size) + int(shift_label)  # (R, N, B)
    t = t.clamp(max=T - 1)
    tgt = batch["target"].gather(1, (t - 1).flatten(1)).view(t.shape)
    mask = batch["loss_mask"].gather(1, t.flatten(1)).view(t.shape) & ok[..., None]
    return tgt, mask


# -----------------------------------------------------------------------------
# training


def _generator(*keys) -> torch.Generator:
    return torch.Generator().manual_seed(_mix(*keys))


def _mix(*keys) -> int:
    h = 1469598103934665603
    for k in keys:
        h = ((h ^ (int(k) + 0x9E3779B97F4A7C15)) * 1099511628211) % (2**63)
    return h


def total_steps(n_rows: int, cfg: TrainConfig) -> int:
    return cfg.epochs * math.ceil(n_rows / cfg.rows_per_step)


def step_rows(step: int, n_rows: int, cfg: TrainConfig) -> list[int]:
    """The global batch of a step: ``rows_per_step`` rows of the epoch's seeded order. The last
    step of an epoch is topped up from the start of that order so every step has a full batch."""
    per_epoch = math.ceil(n_rows / cfg.rows_per_step)
    epoch, i = divmod(step, per_epoch)
    order = _epoch_order(cfg.seed, epoch, n_rows)
    return [order[j % n_rows] for j in range(i * cfg.rows_per_step, (i + 1) * cfg.rows_per_step)]


@functools.lru_cache(maxsize=2)
def _epoch_order(seed: int, epoch: int, n_rows: int) -> tuple[int, ...]:
    """The seeded row order of one epoch, drawn once per epoch rather than once per step."""
    return tuple(torch.randperm(n_rows, generator=_generator(seed, 1, epoch)).tolist())


def compute_losses(drafter, batch, cfg: TrainConfig, step_seed, device, autocast_dtype=None, reduce_sum=None):
    """One teacher-forced forward: (base loss, final loss, base logits, final logits, targets, mask).

    ``reduce_sum`` sums the supervised-slot count over data-parallel ranks (None: one process).
    """
    B = drafter.cfg.block_size
    valid = valid_anchor_mask(batch["doc_ids"], batch["loss_mask"], B)
    gens = [_generator(*step_seed, r) for r in batch["row_ids"]]
    anchors, ok = sample_anchors(valid, cfg.anchors_per_row, gens)
    tgt, mask = slot_targets(batch, anchors, ok, B, drafter.cfg.shift_label)
    w = slot_weights(B, cfg.gamma, cfg.weighting).to(device)
    mv = lambda x: x.to(device)  # noqa: E731
    with torch.autocast(device_type=device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        base, final = drafter.forward_train(mv(batch["input_ids"]), mv(batch["position_ids"]),
                                            mv(batch["doc_ids"]), mv(batch["aux"]).to(drafter.fc.weight.dtype),
                                            mv(anchors))
    tgt, mask = mv(tgt), mv(mask)
    sum_base, count = weighted_ce_terms(base, tgt, mask, w)
    sum_final = weighted_ce_terms(final, tgt, mask, w)[0] if drafter.head is not None else sum_base
    if reduce_sum is not None:
        count = reduce_sum(count)
    count = count.clamp(min=1)
    return sum_base / count, sum_final / count, base, final, tgt, mask


def _dist():
    """(rank, world size) of a torch.distributed run, (0, 1) otherwise."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _sum_gradients(params) -> None:
    """Sum gradients over ranks in one flat buffer (an unused parameter counts as zero)."""
    import torch.distributed as dist

    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    i = 0
    for p, g in zip(params, grads):
        n = g.numel()
        p.grad = flat[i:i + n].view_as(p)  # flat is this call's own buffer: views are safe
        i += n


def _all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    import torch.distributed as dist

    t = t.clone()
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


class _Interrupt:
    """Turns SIGTERM / SIGINT into a flag, so the loop can save its state before exiting."""

    def __init__(self):
        self.hit = False
        self.old = {}

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self.old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread
                pass
        return self

    def _handle(self, signum, frame):
        self.hit = True

    def __exit__(self, *exc):
        for sig, h in self.old.items():
            signal.signal(sig, h)


class Interrupted(RuntimeError):
    pass


def train(drafter, feats: dict, cfg: TrainConfig, out_dir: str | Path, device="cpu",
          autocast_dtype=None, log=print, max_steps: int | None = None) -> dict:
    """Train ``drafter`` in place; write ``checkpoint/``, ``metrics.jsonl`` and ``summary.json``.

    A state file ``state/state.pt`` is saved every ``checkpoint_every`` steps and on SIGTERM;
    a rerun with the same inputs resumes from it (a state from other settings, features or drafter
    config is refused, naming the file). ``max_steps`` stops early (for tests that
    simulate a crash); the state is saved there too.
    """
    from tqdm import tqdm

    out_dir = Path(out_dir)
    state_path = out_dir / "state" / "state.pt"
    device = torch.device(device)
    rank, world = _dist()
    if cfg.rows_per_step % world:
        raise ValueError(f"train.rows_per_step {cfg.rows_per_step} must be a multiple of the {world} ranks")
    reduce_sum = _all_reduce_sum if world > 1 else None
    if rank != 0:
        log = lambda msg: None  # noqa: E731  (rank 0 speaks for the run)
    drafter.to(device).train()
    rows = PackedRows(feats, cfg.pack_len)
    n_rows = len(rows)
    total = total_steps(n_rows, cfg)
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
    step, metrics, seconds = 0, [], 0.0
    inputs = _inputs_fingerprint(drafter, feats)
    if state_path.exists():
        try:
            st = torch.load(state_path, map_location=device, weights_only=False)
        except Exception as err:  # atomic writes make this rare: a damaged disk, a foreign file
            raise RuntimeError(f"{state_path} cannot be read ({type(err).__name__}: {err}); "
                               "delete it to start over") from None
        if st.get("config") != asdict(cfg) or st.get("total_steps") != total:
            raise RuntimeError(f"{state_path} was written with other training settings; delete it to start over")
        if st.get("inputs") != inputs:
            raise RuntimeError(f"{state_path} was written for other features or another drafter config; "
                               "delete it to start over")
        drafter.load_state_dict(st["model"])
        opt.load_state_dict(st["optimizer"])
        step, metrics, seconds = st["step"], st["metrics"], st["seconds"]
        log(f"resuming at step {step} of {total} from {state_path}")

    def save_state():
        if rank != 0:
            return
        st = {"model": drafter.state_dict(), "optimizer": opt.state_dict(), "step": step, "metrics": metrics,
              "seconds": seconds, "config": asdict(cfg), "total_steps": total, "inputs": inputs}
        with atomic_path(state_path) as tmp:
            torch.save(st, tmp)

    log(f"{n_rows} packed rows of {cfg.pack_len} tokens, {total} steps, weighting {cfg.weighting}, "
        f"projector {drafter.cfg.projector}, shift_label {drafter.cfg.shift_label}")
    bar = tqdm(total=total, initial=step, desc=f"train {out_dir.name}", mininterval=5, disable=rank != 0)
    stop_at = total if max_steps is None else min(total, max_steps)
    with _Interrupt() as interrupt:
        while step < stop_at:
            t0 = time.perf_counter()
            lr = linear_warmup_lr(step, total, cfg.warmup_steps, cfg.lr)
            lam = lambda_at(step, total, cfg.lambda0, cfg.lambda_ratio)
            for g in opt.param_groups:
                g["lr"] = lr
            mine = step_rows(step, n_rows, cfg)[rank::world]
            batch = rows.batch(mine, cfg.noise_std, (cfg.seed, 2, step))
            l_base, l_final, *_ = compute_losses(drafter, batch, cfg, (cfg.seed, 3, step), device, autocast_dtype,
                                                 reduce_sum)
            loss = curriculum_loss(l_final, l_base, lam)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            losses = torch.stack([loss.detach(), l_base.detach(), l_final.detach()])
            if world > 1:  # each rank's loss is its share of the global loss: sum gradients and losses
                _sum_gradients(params)
                losses = _all_reduce_sum(losses)
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            loss_v, base_v, final_v = losses.tolist()  # the step's one host sync
            seconds += time.perf_counter() - t0
            metrics.append({"step": step, "epoch": step * cfg.epochs // total, "loss": loss_v,
                            "base_loss": base_v, "final_loss": final_v, "lambda": lam, "lr": lr})
            step += 1
            bar.update(1)
            if step % 25 == 0:
                bar.set_postfix(loss=f"{loss_v:.3f}", lam=f"{lam:.2f}")
            if step % cfg.checkpoint_every == 0 or interrupt.hit:
                save_state()
            if interrupt.hit:
                raise Interrupted(f"interrupted at step {step}; state saved to {state_path}")
    bar.close()
    if step < total:
        save_state()
        return {"steps": step, "complete": False}
    drafter.eval()
    if rank != 0:
        return {"steps": total, "complete": True, "rank": rank}
    drafter.cpu().save(out_dir / "checkpoint")
    write_jsonl(out_dir / "metrics.jsonl", metrics, sort_keys=True)
    summary = {"steps": total, "epochs": cfg.epochs, "rows": n_rows, "seconds": seconds, "config": asdict(cfg),
               "final_loss": metrics[-1]["loss"], "complete": True}
    write_json(out_dir / "summary.json", summary)
    if state_path.exists():
        state_path.unlink()
    return summary


def _inputs_fingerprint(drafter, feats: dict) -> str:
    """What a saved state is only valid for: the drafter's config and the features' content."""
    import hashlib

    h = hashlib.sha256(json.dumps(asdict(drafter.cfg), sort_keys=True, default=str).encode())
    shards = (feats.get("index") or {}).get("shards") if isinstance(feats.get("index"), dict) else None
    if shards and all(sh.get("sha256") for sh in shards):
        h.update(json.dumps([sh["sha256"] for sh in shards]).encode())
    else:
        for k in ("input_ids", "loss_mask", "target", "offsets", "aux"):
            t = feats[k].detach().cpu().contiguous()
            h.update(f"{k} {t.dtype} {tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


# -----------------------------------------------------------------------------
# validation


@torch.no_grad()
def validate(drafter, feats: dict, cfg: TrainConfig, device="cpu", autocast_dtype=None) -> dict:
    """Teacher-forced greedy accuracy per slot of the base and final logits on held-out rows."""
    device = torch.device(device)
    drafter.to(device).eval()
    rows = PackedRows(feats, cfg.pack_len)
    dc = drafter.cfg
    B = dc.block_size
    hits_b = hits_f = counted = None
    loss_b = loss_f = 0.0
    n_batches = anchors = 0
    for i in range(0, len(rows), cfg.rows_per_step):
        batch = rows.batch(list(range(i, min(len(rows), i + cfg.rows_per_step))))
        l_base, l_final, base, final, tgt, mask = compute_losses(drafter, batch, cfg, (cfg.seed, 4, i), device,
                                                                 autocast_dtype)
        hb, c = slot_accuracy(base, tgt, mask)
        hf, _ = slot_accuracy(final, tgt, mask)
        hits_b = hb if hits_b is None else hits_b + hb
        hits_f = hf if hits_f is None else hits_f + hf
        counted = c if counted is None else counted + c
        loss_b, loss_f, n_batches = loss_b + l_base.item(), loss_f + l_final.item(), n_batches + 1
        anchors += int(mask.any(-1).sum())
    hits_b, hits_f, counted = hits_b.cpu(), hits_f.cpu(), counted.cpu()
    shift = int(dc.shift_label)
    per_slot = []
    for k in range(B):
        off = k + shift
        per_slot.append({"slot": k, "target": "a" if off == 0 else f"a+{off}", "count": int(counted[k]),
                         "base_acc": float(hits_b[k] / max(1, counted[k])),
                         "final_acc": float(hits_f[k] / max(1, counted[k]))})
    first = dc.first_draft_slot
    draft = slice(first, B)
    n_all = int(counted[draft].sum())
    w = slot_weights(B, cfg.gamma, cfg.weighting)
    a1 = 1 - shift  # the slot that predicts a+1
    first_trained = a1 if w[a1] > 0 else None
    return {
        "projector": dc.projector, "shift_label": dc.shift_label, "weighting": cfg.weighting,
        "first_trained_slot": first_trained,
        "first_trained_accuracy": per_slot[first_trained]["final_acc"] if first_trained is not None else None,
        "per_slot": per_slot,
        "overall": {"base_acc": float(hits_b[draft].sum() / max(1, n_all)),
                    "final_acc": float(hits_f[draft].sum() / max(1, n_all)), "count": n_all},
        "loss": {"base": loss_b / max(1, n_batches), "final": loss_f / max(1, n_batches)},
        "rows": len(rows),
        "anchors": anchors,
    }
