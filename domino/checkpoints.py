"""A checkpoint's names, read by the workflow, the stages and the card: what is trained (the
checkpoint and its seed replicates, each a row of the benchmark named by the ``{row}`` of its
results files), the answers it trains on and whether its training is validated served. The rows
that decode without training of their own, and what vLLM serves, are ``domino.decoders``'s; a
run directory is ``domino.rundir``'s."""

from __future__ import annotations

import re

REPLICATE = re.compile(r"(.+)-seed([1-9][0-9]*)")  # "<checkpoint>-seed<r>": replicate r >= 1


def responses_of(cfg: dict, checkpoint: str) -> str:
    """The answers ``checkpoint`` trains on (``data.responses``, or its entry's override)."""
    return (cfg["checkpoints"][checkpoint].get("data") or {}).get("responses", cfg["data"]["responses"])


def served_validated(cfg: dict, checkpoint: str) -> bool:
    """Whether ``checkpoint`` trains with served validation (``train.served_prompts`` > 0, or its
    entry's override): its training then reads the verifier in its dtype and the held-out split."""
    over = cfg["checkpoints"][checkpoint].get("train") or {}
    return over.get("served_prompts", cfg["train"]["served_prompts"]) > 0


def trained_checkpoints(checkpoints, replicates: int) -> list[str]:
    """Everything trained: the checkpoints in config order (replicate 0, the card's rows), then
    for r = 1 .. replicates - 1 (``train.replicates``) each checkpoint again as ``<checkpoint>-seed<r>``."""
    names = list(checkpoints)
    return names + [f"{name}-seed{r}" for r in range(1, replicates) for name in names]


def split_replicate(name: str) -> tuple[str, int]:
    """``(checkpoint, r)`` of a trained name: ``("domino", 2)`` for ``domino-seed2``, ``("domino", 0)``
    for ``domino``. Checkpoint names never end in ``-seed<r>`` (refused by the config check)."""
    m = REPLICATE.fullmatch(name)
    return (m.group(1), int(m.group(2))) if m else (name, 0)
