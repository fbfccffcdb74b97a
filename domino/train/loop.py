"""Training and validation of a drafter on extracted features.

The rows, anchors, noise and random streams a step draws come from ``domino.train.batches``; the
optimizers from ``domino.train.optim``. Everything random is keyed by the seed, a named stream
(``domino.train.batches.SeedStream``) and the epoch or the step and row, so a resumed run only needs
the weights, the optimizer state and the step
to continue exactly where it stopped; the learning rate and lambda are functions of the step.

Data parallelism (``torchrun``, gloo on CPU, nccl on CUDA): each rank takes every
``world``-th row of the step's global batch, the supervised-slot count is summed over ranks
before the loss is normalised, and gradients are summed, so the update equals the
single-process update on the same global batch. Rank 0 alone writes files and logs.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import logging
import math
import signal
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.distributed as dist
from tqdm import tqdm

from ..aux import decoder_parts
from ..io import save_torch, sha256_file, write_json, write_jsonl
from ..loss import (
    curriculum_loss,
    cut_after_first_wrong,
    lambda_at,
    linear_warmup_lr,
    slot_accuracy,
    slot_ce,
    slot_kl,
    slot_weights,
    weighted_terms,
)
from ..schema import AuxNoise, aux_noise
from ..verifier.families import FINAL_NORMS
from .batches import (
    PackedRows,
    SeedStream,
    keyed_generator,
    sample_anchors,
    slot_last_states,
    slot_targets,
    valid_anchor_mask,
)
from .optim import Optimizers, build_optimizers
from .served import ServedValidation, evaluated_after, evaluation_interval, kept_step, mean_loss, stops_early

logger = logging.getLogger(__name__)

# keys of the config's train: section that the stage reads, not one run's training settings
STAGE_KEYS = ("autocast", "nproc_per_node", "replicates", "samples")


@dataclass
class TrainConfig:
    """Every training setting of one run. The field names are the keys of the config's ``train:``
    section, whose schema (``config.schema.yaml``) holds their defaults and allowed values;
    ``seed`` is the config's seed (+ r for seed replicate r), ``weighting`` the checkpoint's."""

    epochs: int
    lr: float
    warmup_steps: int
    gamma: float
    lambda0: float
    lambda_ratio: float
    anchors_per_row: int
    pack_len: int
    rows_per_step: int
    noise: str  # see domino.schema.AuxNoise
    noise_scale: float  # uniform half-width or Gaussian std (PR 685: uniform, 0.05)
    noise_dtype: str  # "float32" | "storage": where the noise is added (domino.schema.AuxNoise)
    loss_mask_at: str  # "target" | "input": whose loss mask gates slots and anchors (domino.train.batches.LOSS_MASK_AT)
    loss: str  # "ce" | "kl_div": the per-slot loss (domino.loss.LOSSES); kl_div needs a VerifierHead
    loss_cut: str  # "none" | "first_wrong": slots after a block's first wrong draft leave the loss (domino.loss.LOSS_CUTS)
    weights_dtype: str  # "float32" | "bfloat16": the trainable weights, optimizer state and updates
    rotary_dtype: str  # "float32" | "weights": the RoPE frequencies in training (see ``set_precision``)
    optimizer: str  # see domino.train.optim
    weight_decay: float  # AdamW's, on the parameters AdamW updates
    betas: tuple  # AdamW's
    muon_lr_scale: float  # Muon's learning rate = this x the scheduled (AdamW) learning rate
    muon_momentum: float
    muon_weight_decay: float
    muon_ns_steps: int  # Newton-Schulz iterations
    muon_adjust_lr_fn: str  # torch.optim.Muon's adjust_lr_fn
    grad_clip: float
    checkpoint_every: int
    served_prompts: int  # served validation's held-out prompts; 0: off (domino.train.served)
    served_max_new_tokens: int  # the tokens each is decoded to
    served_every: float  # epochs between evaluations
    keep: str  # "last" | "best_served": the checkpoint written (domino.train.served.kept_step)
    patience: int  # evaluations without a new best before training stops; 0: never
    seed: int
    weighting: str  # "classic" (DFlash, w_0 = 0) | "shifted" (Domino, w_0 = 1)

    @property
    def aux_noise(self) -> AuxNoise:
        return aux_noise(self.noise, self.noise_scale, self.noise_dtype)

    @classmethod
    def from_section(cls, section: dict, *, seed: int, weighting: str) -> "TrainConfig":
        """From a validated ``train:`` section (every key present, defaults filled in); the stage's
        own keys (``STAGE_KEYS``) are left out, any other unknown key is refused."""
        kept = {k: v for k, v in section.items() if k not in STAGE_KEYS}
        return cls(**{**kept, "betas": tuple(kept["betas"]), "seed": seed, "weighting": weighting})

    @classmethod
    def schema_defaults(cls, *, seed: int = 0, weighting: str = "shifted", **overrides) -> "TrainConfig":
        """The config schema's defaults with ``overrides``: a ``TrainConfig`` for tests and tools."""
        from ..schema import section_defaults

        return cls.from_section({**section_defaults("train"), **overrides}, seed=seed, weighting=weighting)


# -----------------------------------------------------------------------------
# the schedule and the loss of one step


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
    return tuple(torch.randperm(n_rows, generator=keyed_generator(seed, SeedStream.EPOCH_ORDER, epoch)).tolist())


class VerifierHead(torch.nn.Module):
    """The verifier's final norm and its output embedding's draft-vocabulary rows, frozen: what
    turns a stored last hidden state (``features.last_hidden_state``) into the verifier's logits
    over the draft vocabulary, the targets of ``train.loss: kl_div`` (PR 685's ``verifier_norm``
    and ``verifier_lm_head``). Kept apart from the drafter: never trained, saved or exported."""

    def __init__(self, verifier, draft_target_ids: torch.Tensor):
        super().__init__()
        norm = decoder_parts(verifier)["norm"]  # model.norm, GPT-2's transformer.ln_f, ...
        if norm is None:
            raise ValueError(f"train.loss kl_div needs the verifier's final norm, which {type(verifier).__name__} "
                             f"keeps under none of the names {', '.join(FINAL_NORMS)}")
        self.norm = copy.deepcopy(norm).float().requires_grad_(False)
        rows = verifier.get_output_embeddings().weight.detach()[draft_target_ids.to(verifier.device)]
        self.register_buffer("rows", rows.float().cpu().clone())  # (Vd, H)

    @torch.no_grad()
    def forward(self, last: torch.Tensor) -> torch.Tensor:
        """(..., H) last hidden states -> (..., Vd) float32 logits."""
        return self.norm(last.float()) @ self.rows.T


def compute_losses(drafter, batch, cfg: TrainConfig, step_seed, device, autocast_dtype=None, reduce_sum=None,
                   verifier_head: VerifierHead | None = None):
    """One teacher-forced forward: (base loss, final loss, base logits, final logits, targets, mask).

    ``cfg.loss`` picks the per-slot loss: ``ce`` against the stored greedy targets, ``kl_div``
    against ``verifier_head`` applied to the batch's last hidden states. ``reduce_sum`` sums the
    supervised-slot count over data-parallel ranks (None: one process).
    """
    B = drafter.cfg.block_size
    valid = valid_anchor_mask(batch["doc_ids"], batch["loss_mask"], B, cfg.loss_mask_at)
    gens = [keyed_generator(*step_seed, r) for r in batch["row_ids"]]
    anchors, ok = sample_anchors(valid, cfg.anchors_per_row, gens)
    tgt, mask = slot_targets(batch, anchors, ok, B, drafter.cfg.shift_label, cfg.loss_mask_at)
    w = slot_weights(B, cfg.gamma, cfg.weighting).to(device)
    mv = lambda x: x.to(device)  # noqa: E731
    with torch.autocast(device_type=device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        base, final = drafter.forward_train(mv(batch["input_ids"]), mv(batch["position_ids"]),
                                            mv(batch["doc_ids"]), mv(batch["aux"]).to(drafter.fc.weight.dtype),
                                            mv(anchors))
    tgt, mask = mv(tgt), mv(mask)
    if cfg.loss_cut == "first_wrong":  # Spec-AUF: what serving would reject after the first wrong draft
        mask = cut_after_first_wrong(final.detach().argmax(-1) == tgt, mask, drafter.cfg.first_draft_slot)
    if cfg.loss == "kl_div":
        if verifier_head is None or "last" not in batch:
            raise ValueError("train.loss kl_div needs the verifier's head and features holding the last hidden "
                             "state (features.last_hidden_state: true)")
        states = slot_last_states(batch, anchors, B, drafter.cfg.shift_label)  # (R, N, B, H)
        verifier_logits = verifier_head(mv(states))  # (R, N, B, Vd)
        per_slot = lambda logits: slot_kl(logits, verifier_logits)  # noqa: E731
    else:
        per_slot = lambda logits: slot_ce(logits, tgt)  # noqa: E731
    sum_base, count = weighted_terms(per_slot(base), mask, w)
    sum_final = weighted_terms(per_slot(final), mask, w)[0] if drafter.head is not None else sum_base
    if reduce_sum is not None:
        count = reduce_sum(count)
    count = count.clamp(min=1)
    return sum_base / count, sum_final / count, base, final, tgt, mask



# -----------------------------------------------------------------------------
# data parallelism


def _dist():
    """(rank, world size) of a torch.distributed run, (0, 1) otherwise."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _sum_gradients(params) -> None:
    """Sum gradients over ranks in one flat buffer (an unused parameter counts as zero)."""
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    i = 0
    for p, g in zip(params, grads):
        n = g.numel()
        p.grad = flat[i:i + n].view_as(p)  # flat is this call's own buffer: views are safe
        i += n


def _all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    t = t.clone()
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


# -----------------------------------------------------------------------------
# the training run


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
    """SIGTERM / SIGINT during training; the message is one line: what was saved, how to resume.
    A stop asked for, not a fault: the stage's log keeps no traceback of it (``resumable``)."""

    resumable = True


@dataclass
class _Run:
    """Everything one training run shares between its steps, and its progress."""

    drafter: torch.nn.Module
    cfg: TrainConfig
    rows: PackedRows
    total: int
    opt: Optimizers
    params: list
    device: torch.device
    autocast_dtype: torch.dtype | None
    rank: int
    world: int
    state_path: Path
    inputs: str
    verifier_head: VerifierHead | None = None
    data: dict | None = None  # what the features were made from, for the summary
    served: ServedValidation | None = None  # served validation (train.served_prompts > 0)
    step: int = 0
    metrics: list = field(default_factory=list)
    seconds: float = 0.0
    curve: list = field(default_factory=list)  # served validation's evaluations, in step order
    best: dict | None = None  # train.keep best_served: the weights of the kept evaluation so far

    @property
    def interval(self) -> int:
        """Steps between served evaluations."""
        return evaluation_interval(self.cfg.served_every, self.total // self.cfg.epochs)

    @property
    def stopped(self) -> bool:
        """Whether served validation's patience has run out (``domino.train.served.stops_early``)."""
        return self.served is not None and stops_early(self.curve, self.cfg.patience)


@dataclass(frozen=True)
class TrainOutputs:
    """Where a training run writes: the checkpoint folder, the metrics, the summary, the state."""

    checkpoint: Path
    metrics: Path
    summary: Path
    state_dir: Path

    @classmethod
    def under(cls, out_dir: str | Path) -> "TrainOutputs":
        """The workflow's layout inside one folder (``results/train/<checkpoint>/``)."""
        d = Path(out_dir)
        return cls(d / "checkpoint", d / "metrics.jsonl", d / "summary.json", d / "state")


def train(drafter, feats: dict, cfg: TrainConfig, out: TrainOutputs | str | Path, device="cpu",
          autocast_dtype=None, max_steps: int | None = None, verifier_head: VerifierHead | None = None,
          data: dict | None = None, served: ServedValidation | None = None) -> dict:
    """Train ``drafter`` in place; write the checkpoint, the metrics and the summary to ``out``
    (a ``TrainOutputs``, or a folder holding the workflow's layout).

    A state file ``state.pt`` in ``out.state_dir`` is saved every ``checkpoint_every`` steps and on SIGTERM /
    SIGINT (then ``Interrupted`` is raised, its message saying what was saved and how to
    resume); a rerun with the same inputs resumes from it (a state from other settings,
    features or drafter config is refused, naming the file). ``max_steps`` stops early (for
    tests that simulate a crash); the state is saved there too. ``train.loss: kl_div`` needs
    ``verifier_head`` and features with the last hidden state. ``data``: what the features were
    made from, where the summary should say so, recorded as its ``data`` (the workflow: a
    checkpoint that overrides ``data.responses``, ``{"responses": ...}``).

    ``served`` (needed when ``cfg.served_prompts > 0``): served validation after every
    ``served_every`` epochs and the last step (``domino.train.served``); each evaluation is added to
    its step's metrics row (``served_acceptance``) and to the summary's ``served_validation``;
    ``keep: best_served`` writes the best evaluation's weights, and ``patience`` may end training
    early. The evaluations and the kept weights are part of the state, so a resumed run keeps what
    an uninterrupted one keeps.
    """
    out = out if isinstance(out, TrainOutputs) else TrainOutputs.under(out)
    if cfg.loss == "kl_div" and "last" not in feats:
        raise ValueError("train.loss kl_div needs the verifier's last hidden state in the features: set "
                         "features.last_hidden_state true and rerun extract_hidden_states")
    if cfg.loss == "kl_div" and verifier_head is None:
        raise ValueError("train.loss kl_div needs the verifier's head (train.VerifierHead)")
    if (cfg.served_prompts > 0) != (served is not None) or (served is None and (cfg.keep != "last" or cfg.patience)):
        raise ValueError("train.served_prompts > 0, and with it train.keep best_served and train.patience, needs "
                         "served validation's prompts and verifier (domino.train.served.ServedValidation)")
    run = _start_run(drafter, feats, cfg, Path(out.state_dir) / "state.pt", device, autocast_dtype)
    run.data, run.served = data, served
    run.verifier_head = None if verifier_head is None else verifier_head.to(run.device)
    _resume(run)
    if run.rank == 0:  # rank 0 speaks for the run
        logger.info("%d packed rows of %d tokens, %d steps, weighting %s, optimizer %s, noise %s %g, projector %s, "
                    "shift_label %s", len(run.rows), cfg.pack_len, run.total, cfg.weighting, cfg.optimizer,
                    cfg.aux_noise.kind, cfg.aux_noise.scale, drafter.cfg.projector, drafter.cfg.shift_label)
    stop_at = run.total if max_steps is None else min(run.total, max_steps)
    _run_steps(run, stop_at, f"train {Path(out.checkpoint).parent.name}")
    if run.step < run.total and not run.stopped:
        _save_state(run)
        return {"steps": run.step, "complete": False}
    return _finish(run, out)


def train_steps(drafter, feats: dict, cfg: TrainConfig, steps: int, device="cpu", autocast_dtype=None) -> dict:
    """The first ``steps`` optimizer steps of ``train``'s loop on ``drafter``, in place, writing
    nothing: no state file, no checkpoint (at the card's shapes a state file is 1.5 GB).
    What ``domino.tools.bench_memory`` measures; ``train`` is what a run uses."""
    run = _start_run(drafter, feats, cfg, None, device, autocast_dtype)  # no state path: nothing is saved
    while run.step < min(steps, run.total):
        _train_step(run)
    return {"steps": run.step, "seconds": run.seconds}


WEIGHT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def set_precision(drafter, cfg: TrainConfig) -> None:
    """Cast the whole drafter to ``cfg.weights_dtype`` (frozen copies included, as PR 685's
    ``self.model.to(hidden_states_dtype)``); with ``rotary_dtype: weights``, round its RoPE
    frequencies to that dtype as the cast rounds PR 685's. They are kept in float32, rounded:
    ``Qwen3RotaryEmbedding`` computes its angles in float32 from them, so the angles are PR 685's,
    and a later ``.to()`` keeps them (``Drafter._apply`` restores exact float32 frequencies only
    where they are in another dtype). Exports and decoding rebuild the drafter and use exact ones."""
    dtype = WEIGHT_DTYPES[cfg.weights_dtype]
    drafter.to(dtype)
    if cfg.rotary_dtype == "weights":
        rope = drafter.rotary_emb
        rope.inv_freq = rope.inv_freq.to(dtype).float()
        rope.original_inv_freq = rope.inv_freq.clone()


def _start_run(drafter, feats: dict, cfg: TrainConfig, state_path: Path, device, autocast_dtype) -> _Run:
    device = torch.device(device)
    rank, world = _dist()
    if cfg.rows_per_step % world:
        raise ValueError(f"train.rows_per_step {cfg.rows_per_step} must be a multiple of the {world} ranks")
    set_precision(drafter, cfg)
    drafter.to(device).train()
    rows = PackedRows(feats if cfg.loss == "kl_div" else _without_last(feats), cfg.pack_len)
    return _Run(drafter=drafter, cfg=cfg, rows=rows, total=total_steps(len(rows), cfg),
                opt=build_optimizers(drafter, cfg), params=[p for p in drafter.parameters() if p.requires_grad],
                device=device, autocast_dtype=autocast_dtype, rank=rank, world=world, state_path=state_path,
                inputs=_inputs_fingerprint(drafter, feats))


def _without_last(feats: dict) -> dict:
    """The features without the last hidden state: what a ``ce`` loss and validation read."""
    return {k: v for k, v in feats.items() if k != "last"}


def _resume(run: _Run) -> None:
    """Continue from ``run.state_path`` if it exists, after checking it belongs to this run. The
    file is read with ``weights_only=True``: a state file executes nothing when loaded."""
    path = run.state_path
    if not path.exists():
        return
    try:
        st = torch.load(path, map_location=run.device, weights_only=True)
    except Exception as err:  # atomic writes make this rare: a damaged disk, a foreign file
        raise RuntimeError(f"{path} cannot be read ({type(err).__name__}: {err}); delete it to start over") from None
    if st.get("config") != asdict(run.cfg) or st.get("total_steps") != run.total:
        raise RuntimeError(f"{path} was written with other training settings; delete it to start over")
    if st.get("inputs") != run.inputs:
        raise RuntimeError(f"{path} was written for other features or another drafter config; "
                           "delete it to start over")
    run.drafter.load_state_dict(st["model"])
    run.opt.load_state_dict(st["optimizer"])
    run.step, run.metrics, run.seconds = st["step"], st["metrics"], st["seconds"]
    run.curve, run.best = st.get("served_curve", []), st.get("best_weights")
    if run.rank == 0:
        logger.info("resuming at step %d of %d from %s", run.step, run.total, path)


def _save_state(run: _Run) -> None:
    """The state ``_resume`` reads: tensors, numbers, strings, lists and dicts only (the config as
    ``asdict``), so that it loads with ``torch.load(weights_only=True)``, which runs no pickled code."""
    if run.rank != 0:
        return
    st = {"model": run.drafter.state_dict(), "optimizer": run.opt.state_dict(), "step": run.step,
          "metrics": run.metrics, "seconds": run.seconds, "config": asdict(run.cfg), "total_steps": run.total,
          "inputs": run.inputs, "served_curve": run.curve, "best_weights": run.best}
    save_torch(st, run.state_path)  # a full disk is named, with the file


def _run_steps(run: _Run, stop_at: int, desc: str) -> None:
    """Steps until ``stop_at``, saving every ``checkpoint_every``; on a signal, save and raise."""
    bar = tqdm(total=run.total, initial=run.step, desc=desc, mininterval=5, disable=run.rank != 0)
    try:
        with _Interrupt() as interrupt:
            while run.step < stop_at and not run.stopped:
                row = _train_step(run)
                bar.update(1)
                if run.step % 25 == 0:
                    bar.set_postfix(loss=f"{row['loss']:.3f}", lam=f"{row['lambda']:.2f}")
                if run.served is not None and evaluated_after(row["step"], run.interval, run.total):
                    _evaluate(run)
                if run.step % run.cfg.checkpoint_every == 0 or interrupt.hit:
                    _save_state(run)
                if interrupt.hit:
                    raise Interrupted(f"interrupted at step {run.step} of {run.total}; state saved to "
                                      f"{run.state_path}; to resume, rerun the same snakemake command")
    finally:
        bar.close()


def _train_step(run: _Run) -> dict:
    """One optimizer step on the step's global batch (this rank's share of it); its metrics row."""
    cfg, step = run.cfg, run.step
    t0 = time.perf_counter()
    lr = linear_warmup_lr(step, run.total, cfg.warmup_steps, cfg.lr)
    lam = lambda_at(step, run.total, cfg.lambda0, cfg.lambda_ratio)
    run.opt.set_lr(lr)
    mine = step_rows(step, len(run.rows), cfg)[run.rank::run.world]
    batch = run.rows.batch(mine, cfg.aux_noise, (cfg.seed, SeedStream.NOISE, step))
    reduce_sum = _all_reduce_sum if run.world > 1 else None
    l_base, l_final, *_ = compute_losses(run.drafter, batch, cfg, (cfg.seed, SeedStream.ANCHORS, step),
                                         run.device, run.autocast_dtype, reduce_sum, run.verifier_head)
    loss = curriculum_loss(l_final, l_base, lam)
    run.opt.zero_grad()
    loss.backward()
    losses = torch.stack([loss.detach(), l_base.detach(), l_final.detach()])
    if run.world > 1:  # each rank's loss is its share of the global loss: sum gradients and losses
        _sum_gradients(run.params)
        losses = _all_reduce_sum(losses)
    if cfg.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(run.params, cfg.grad_clip)
    run.opt.step()
    loss_v, base_v, final_v = losses.tolist()  # the step's one host sync
    run.seconds += time.perf_counter() - t0
    row = {"step": step, "epoch": step * cfg.epochs // run.total, "loss": loss_v, "base_loss": base_v,
           "final_loss": final_v, "lambda": lam, "lr": lr}
    run.metrics.append(row)
    run.step += 1
    return row


def _evaluate(run: _Run) -> None:
    """Served validation of the weights after the step just taken: its evaluation appended to the
    curve and to the step's metrics row; under ``keep: best_served`` a new best's weights kept."""
    t0 = time.perf_counter()
    r = run.served.acceptance(run.drafter)
    step = run.step - 1
    since = run.curve[-1]["step"] if run.curve else -1
    run.curve.append({"step": step, "epochs": run.step * run.cfg.epochs / run.total,
                      "mean_loss": mean_loss(run.metrics, since), **r, "seconds": time.perf_counter() - t0})
    run.metrics[-1]["served_acceptance"] = r["acceptance_length"]
    if run.cfg.keep == "best_served" and kept_step(run.curve, "best_served") == step:
        run.best = {k: v.detach().cpu().clone() for k, v in run.drafter.state_dict().items()}
    if run.rank == 0:
        logger.info("step %d (epoch %.2f): served acceptance length %.3f over %d steps of %d prompts",
                    step, run.curve[-1]["epochs"], r["acceptance_length"], r["steps"], len(run.served.prompts))


def _served_summary(run: _Run) -> dict:
    """The summary's ``served_validation``: the settings, the curve and the step kept."""
    return {"prompts": len(run.served.prompts), "max_new_tokens": run.served.max_new_tokens,
            "every_steps": run.interval, "keep": run.cfg.keep, "patience": run.cfg.patience,
            "kept_step": kept_step(run.curve, run.cfg.keep), "stopped_early": run.step < run.total,
            "seconds": sum(e["seconds"] for e in run.curve), "curve": run.curve}


def _finish(run: _Run, out: TrainOutputs) -> dict:
    """Write the checkpoint (the kept evaluation's weights under ``keep: best_served``), metrics and
    summary (rank 0) and remove the state file."""
    run.drafter.eval()
    if run.rank != 0:
        return {"steps": run.step, "complete": True, "rank": run.rank}
    if run.cfg.keep == "best_served":
        run.drafter.load_state_dict(run.best)
    run.drafter.cpu().save(out.checkpoint)
    write_jsonl(out.metrics, run.metrics, sort_keys=True)
    summary = {"steps": run.step, "metrics_sha256": sha256_file(out.metrics), "epochs": run.cfg.epochs, "rows": len(run.rows), "seconds": run.seconds,
               "config": asdict(run.cfg), "final_loss": run.metrics[-1]["loss"], "complete": True,
               **({"data": run.data} if run.data else {}),
               **({"served_validation": _served_summary(run)} if run.served is not None else {})}
    write_json(out.summary, summary, seal=True)  # the card reads it only with its seal
    if run.state_path.exists():
        run.state_path.unlink()
    return summary


def _inputs_fingerprint(drafter, feats: dict) -> str:
    """What a saved state is only valid for: the drafter's config and the features' content."""
    h = hashlib.sha256(json.dumps(asdict(drafter.cfg), sort_keys=True, default=str).encode())
    shards = (feats.get("index") or {}).get("shards") if isinstance(feats.get("index"), dict) else None
    if shards and all(sh.get("sha256") for sh in shards):
        h.update(json.dumps([sh["sha256"] for sh in shards]).encode())
        h.update(json.dumps(feats["index"].get("chosen")).encode())  # a subset of them (train.samples)
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
    """Teacher-forced greedy accuracy per slot of the base and final logits on held-out rows.

    Every valid anchor of a batch of rows counts once per slot that the training mask keeps
    (``loss_mask_at``: the predicted token, or the slot's input token, is an assistant token),
    noise-free. ``loss`` is the position-weighted cross-entropy against the greedy targets
    whatever ``train.loss`` trained, so that runs of either loss compare. ``overall`` pools the drafting slots
    (``first_draft_slot .. B-1``) whatever their loss weight: the DFlash shift row's slot 0,
    which has weight 0 and is never trained, counts there, and the noshift anchor slot (slot 0,
    not a draft) does not. ``first_trained_slot`` is the slot that predicts ``a+1`` when its
    weight is non-zero, else None.

    ``base_acc``/``final_acc`` are marginal: each slot on its own. Acceptance is counted per anchor
    too (``loss.prefix_accuracy``): per drafting slot the conditional accuracy, right given every
    earlier drafting slot right (``*_conditional_acc`` over ``*_conditional_count`` anchors), the
    share right up to it (``*_all_right``), and ``acceptance_length``, ``1 + sum_k P(drafting
    slots up to k all right)``, what a served step's acceptance length is taught to reach.
    """
    from ..loss import counted_acceptance, prefix_accuracy

    device = torch.device(device)
    drafter.to(device).eval()
    rows = PackedRows(_without_last(feats), cfg.pack_len)
    ce = replace(cfg, loss="ce", loss_cut="none")  # every slot counted, whatever trained
    dc = drafter.cfg
    B = dc.block_size
    hits_b = hits_f = counted = torch.zeros(B, dtype=torch.long)
    right_b = right_f = reached_b = reached_f = torch.zeros(B, dtype=torch.long)
    loss_b = loss_f = 0.0
    n_batches = anchors = 0
    for i in range(0, len(rows), cfg.rows_per_step):
        batch = rows.batch(list(range(i, min(len(rows), i + cfg.rows_per_step))))
        seed = (cfg.seed, SeedStream.VALIDATION, i)
        l_base, l_final, base, final, tgt, mask = compute_losses(drafter, batch, ce, seed, device, autocast_dtype)
        hb, c = slot_accuracy(base, tgt, mask)
        hf, _ = slot_accuracy(final, tgt, mask)
        hits_b, hits_f, counted = hits_b + hb.cpu(), hits_f + hf.cpu(), counted + c.cpu()
        rb, nb = prefix_accuracy(base, tgt, mask, dc.first_draft_slot)
        rf, nf = prefix_accuracy(final, tgt, mask, dc.first_draft_slot)
        right_b, reached_b = right_b + rb.cpu(), reached_b + nb.cpu()
        right_f, reached_f = right_f + rf.cpu(), reached_f + nf.cpu()
        loss_b, loss_f, n_batches = loss_b + l_base.item(), loss_f + l_final.item(), n_batches + 1
        anchors += int(mask.any(-1).sum())
    shift = int(dc.shift_label)
    per_slot = [{"slot": k, "target": "a" if k + shift == 0 else f"a+{k + shift}", "count": int(counted[k]),
                 "base_acc": float(hits_b[k] / max(1, counted[k])), "final_acc": float(hits_f[k] / max(1, counted[k]))}
                for k in range(B)]
    draft = slice(dc.first_draft_slot, B)
    counted_b = counted_acceptance(right_b[draft], reached_b[draft])
    counted_f = counted_acceptance(right_f[draft], reached_f[draft])
    for k, row in enumerate(per_slot):  # the anchor slot (noshift slot 0) is no draft: null there
        j = k - dc.first_draft_slot
        row.update({"base_conditional_count": int(reached_b[k]) if j >= 0 else None,
                    "final_conditional_count": int(reached_f[k]) if j >= 0 else None,
                    "base_conditional_acc": counted_b["conditional"][j] if j >= 0 else None,
                    "final_conditional_acc": counted_f["conditional"][j] if j >= 0 else None,
                    "base_all_right": counted_b["all_right"][j] if j >= 0 else None,
                    "final_all_right": counted_f["all_right"][j] if j >= 0 else None})
    n_all = int(counted[draft].sum())
    a1 = 1 - shift  # the slot that predicts a+1
    first_trained = a1 if slot_weights(B, cfg.gamma, cfg.weighting)[a1] > 0 else None
    return {
        "projector": dc.projector, "shift_label": dc.shift_label, "weighting": cfg.weighting,
        "first_trained_slot": first_trained,
        "first_trained_accuracy": per_slot[first_trained]["final_acc"] if first_trained is not None else None,
        "per_slot": per_slot,
        "overall": {"base_acc": float(hits_b[draft].sum() / max(1, n_all)),
                    "final_acc": float(hits_f[draft].sum() / max(1, n_all)), "count": n_all},
        "loss": {"base": loss_b / max(1, n_batches), "final": loss_f / max(1, n_batches)},
        "acceptance_length": {"base": counted_b["acceptance_length"], "final": counted_f["acceptance_length"]},
        "rows": len(rows),
        "anchors": anchors,
    }
