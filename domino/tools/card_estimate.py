"""What each stage needs at a configuration's scale, before a GPU is booked:
``python -m domino.tools.card_estimate [CONFIG ...]`` (default: config.yaml, then config/card.yaml).

Prints one Markdown table, a row per stage: what its time scales with, its host memory, its GPU
memory and its disk, computed from the config's values with the package's own functions
(``domino.data.features.estimate_bytes``, ``domino.train.loop.total_steps``, the parameter
counts of the verifier and the drafter built on PyTorch's meta device, which allocates nothing).
Token counts are upper bounds: every conversation at ``data.seq_len``; a run's real count is in
``results/prepare_data/summary.json``. Memory figures are what the stage must hold at least
(weights, gradients, optimizer state, the features it keeps); a step's activations and the
allocator's slack come on top, and seconds need a GPU: ``bench_memory`` and ``bench_decode``
measure them there. The verifier's shape is Qwen/Qwen3-0.6B's (``domino.shapes.QWEN3_0_6B``),
the card's; another verifier is refused in one line.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, fields

from . import tool_parser

CARD_VERIFIER = "Qwen/Qwen3-0.6B"
GIB = 2**30


@dataclass(frozen=True)
class Need:
    """One stage's row: what its time scales with and its memory and disk, as printed."""

    stage: str
    time: str
    host: str
    gpu: str
    disk: str


def gib(n_bytes: float) -> str:
    """Bytes as GiB to one decimal, ``12.3 GiB``; under 0.1 GiB in whole MiB."""
    return f"{n_bytes / GIB:.1f} GiB" if n_bytes >= 0.1 * GIB else f"{n_bytes / 2**20:.0f} MiB"


def parameter_counts(cfg: dict) -> tuple[int, int, int]:
    """(verifier parameters, drafter trainable, drafter frozen) of ``cfg``'s Domino drafter over
    Qwen3-0.6B's shape, counted on the meta device."""
    import torch
    from transformers import Qwen3ForCausalLM

    from ..model import Drafter, DrafterConfig
    from ..shapes import qwen3_config

    verifier_config = qwen3_config()
    known = {f.name for f in fields(DrafterConfig)}
    drafter_fields = {k: v for k, v in cfg["drafter"].items() if k in known}
    with torch.device("meta"):
        verifier = Qwen3ForCausalLM(verifier_config)
        drafter = Drafter(DrafterConfig.from_verifier(verifier_config, projector="domino", shift_label=True,
                                                      **drafter_fields))
    trainable = sum(p.numel() for p in drafter.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in drafter.parameters() if not p.requires_grad)
    return sum(p.numel() for p in verifier.parameters()), trainable, frozen


def stage_needs(cfg: dict, counts: tuple[int, int, int]) -> list[Need]:
    """The rows for a validated config ``cfg`` and its ``parameter_counts``."""
    from ..checkpoints import trained_checkpoints
    from ..common import DTYPES
    from ..data.features import estimate_bytes
    from ..decoders import untrained_rows
    from ..shapes import QWEN3_0_6B
    from ..train.loop import total_steps

    data, train, bench, feats = cfg["data"], cfg["train"], cfg["benchmark"], cfg["features"]
    verifier_params, trainable, frozen = counts
    H, A = QWEN3_0_6B["hidden_size"], len(cfg["drafter"]["aux_layer_ids"])
    tokens = data["samples"] * data["seq_len"]
    val_tokens = math.ceil(tokens * data["val_fraction"])
    train_tokens = tokens - val_tokens
    per_token = estimate_bytes(1, A, H, feats["dtype"], feats["last_hidden_state"])
    verifier_bytes = verifier_params * DTYPES[cfg["verifier"]["dtype"]].itemsize
    weights = DTYPES[train["weights_dtype"]].itemsize
    moments = 1 if train["optimizer"] == "muon" else 2  # Muon keeps one buffer on 2-D weights, AdamW two
    train_gpu = trainable * weights * (2 + moments) + frozen * weights
    steps = total_steps(math.ceil(train_tokens / train["pack_len"]), _Rows(train["epochs"], train["rows_per_step"]))
    runs = trained_checkpoints(cfg["checkpoints"], train["replicates"])
    rows = 1 + len(runs) + len(untrained_rows(cfg))
    prompts = f"{bench['max_prompts']} prompts" if bench["max_prompts"] else "every prompt"
    temps = [t for t in bench["temperatures"] if t > 0]
    export_bytes = (trainable + frozen) * DTYPES[cfg["verifier"]["dtype"]].itemsize
    return [
        Need("prepare_data", f"{data['samples']:,} conversations tokenized (CPU)", "the conversations", "none",
             "the tokenized conversations"),
        Need("extract_hidden_states", f"{tokens:,} tokens through the verifier, {feats['batch_size']} "
             f"conversations a forward", f"one shard of {feats['shard_samples']} conversations",
             f"{gib(verifier_bytes)} verifier weights + one batch's activations",
             f"{gib(per_token * tokens)} of features ({per_token:,} B a token)"),
        Need("train", f"{steps:,} optimizer steps of {train['rows_per_step']} x {train['pack_len']:,} tokens, "
             f"x {len(runs)} runs", f"{gib(per_token * train_tokens)} (the train split's features)",
             f"{gib(train_gpu)} weights, gradients and optimizer state + a step's activations",
             "a checkpoint and its resumable state a run"),
        Need("validate", f"{val_tokens:,} held-out tokens, x {len(runs)} runs",
             f"{gib(per_token * val_tokens)} (the held-out split's features)",
             f"{gib((trainable + frozen) * weights)} drafter weights + a row's activations", "a results file"),
        Need("benchmark", f"{prompts} x {bench['max_new_tokens']} new tokens, x {rows} rows "
             f"(plain, trained, decoded without training), x {len(bench['suites'])} suite(s)", "the prompts",
             f"{gib(verifier_bytes)} verifier + {gib((trainable + frozen) * weights)} drafter weights + KV cache",
             "a results file a row"),
        *([Need("sampling", f"the benchmark's tokens at each of {len(temps)} temperature(s), plain and "
                f"{len(cfg['checkpoints'])} checkpoints", "the prompts", "as the benchmark", "a results file a row")]
          if temps else []),
        Need("export", f"{len(cfg['checkpoints'])} checkpoints written (CPU)", f"{gib(export_bytes)} a checkpoint",
             "none", f"{gib(export_bytes)} a checkpoint, x {len(cfg['checkpoints'])}"),
    ]


@dataclass(frozen=True)
class _Rows:
    """The two fields of ``TrainConfig`` that ``total_steps`` reads."""

    epochs: int
    rows_per_step: int


def table(needs: list[Need]) -> str:
    """The rows as a Markdown table."""
    lines = ["| stage | time scales with | host memory | GPU memory | disk |", "|---|---|---|---|---|"]
    lines += [f"| `{n.stage}` | {n.time} | {n.host} | {n.gpu} | {n.disk} |" for n in needs]
    return "\n".join(lines)


def parser():
    p = tool_parser("card_estimate", __doc__)
    p.add_argument("configs", nargs="*", default=["config.yaml", "config/card.yaml"],
                   help="config files, merged in order as --configfile merges them")
    return p


def main(argv=None) -> None:
    from ..config import load_config
    from ..schema import ConfigError

    a = parser().parse_args(argv)
    try:
        cfg = load_config(a.configs)
    except ConfigError as err:
        sys.exit(f"config error: {err}")
    if cfg["verifier"]["source"] != CARD_VERIFIER:
        sys.exit(f"config error: verifier.source: {cfg['verifier']['source']!r} (allowed: {CARD_VERIFIER}, "
                 f"the card's verifier, whose shape this estimate knows)")
    print(table(stage_needs(cfg, parameter_counts(cfg))))


if __name__ == "__main__":
    main()
