"""Draft vocabulary: the most frequent loss-masked tokens, in the EAGLE/speculators format.

Its size is a number of rows, or ``"seen"``: every token the training answers hold (and the stop
tokens), so that no row is a class the drafter is never shown. A fixed size larger than that
keeps rows that are never a target, and the drafter pays for them at every slot.

``d2t[i] = target_id(i) - i`` (int64, one entry per draft id) and ``t2d`` is a bool mask over
the target vocabulary. Draft ids are the chosen target ids sorted ascending, so
``target_id = i + d2t[i]``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .io import load_safetensors, save_safetensors, write_json


def count_tokens(input_ids, loss_masks, target_vocab_size: int) -> torch.Tensor:
    """Counts (int64, target vocab) of the tokens whose loss mask is set."""
    counts = torch.zeros(target_vocab_size, dtype=torch.long)
    for ids, mask in zip(input_ids, loss_masks):
        ids = torch.as_tensor(ids, dtype=torch.long)
        mask = torch.as_tensor(mask, dtype=torch.bool)
        counts += torch.bincount(ids[mask], minlength=target_vocab_size)
    return counts


SEEN = "seen"  # drafter.draft_vocab_size: as many rows as the training answers hold distinct tokens


def seen_size(counts: torch.Tensor, always=()) -> int:
    """Rows of a ``"seen"`` draft vocabulary: the tokens counted at least once, and ``always``."""
    seen = counts > 0
    seen[list(always)] = True
    return int(seen.sum())


def select_draft_vocab(counts: torch.Tensor, draft_vocab_size: int, always=()) -> torch.Tensor:
    """Target ids of the draft vocabulary, ascending.

    Most frequent first, ties broken by the smaller id; ids in ``always`` (e.g. EOS) are
    included first. Tokens never seen still fill the tail (by id) when the corpus is small.
    """
    V = counts.numel()
    if not 0 < draft_vocab_size <= V:
        raise ValueError(f"draft vocab size {draft_vocab_size} must be in 1..{V} (the verifier's vocabulary)")
    score = counts.clone().double()
    for t in always:
        score[t] = float("inf")
    # stable sort on (-count) keeps ascending id order among equal counts
    order = torch.sort(-score, stable=True).indices
    return torch.sort(order[:draft_vocab_size]).values


def mappings(draft_ids: torch.Tensor, target_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t, t2d) for ascending target ids ``draft_ids``."""
    draft_ids = torch.as_tensor(draft_ids, dtype=torch.long)
    d2t = draft_ids - torch.arange(len(draft_ids))
    t2d = torch.zeros(target_vocab_size, dtype=torch.bool)
    t2d[draft_ids] = True
    return d2t, t2d


def target_ids(d2t: torch.Tensor) -> torch.Tensor:
    """Target-vocabulary id of every draft id: ``i + d2t[i]``."""
    return d2t + torch.arange(len(d2t), device=d2t.device)


def save_vocab(path: str | Path, d2t: torch.Tensor, t2d: torch.Tensor, counts: torch.Tensor) -> None:
    save_safetensors({"d2t": d2t.contiguous(), "t2d": t2d.contiguous(), "counts": counts.contiguous()}, path)


def load_vocab(path: str | Path) -> tuple[torch.Tensor, torch.Tensor]:
    t = load_safetensors(path, "draft vocabulary")
    return t["d2t"], t["t2d"]


def build_draft_vocab(rows: list[dict], target_vocab_size: int, draft_vocab_size: int | str, always, vocab_path,
                      summary_path) -> dict:
    """Count the assistant tokens of ``rows``, keep the most frequent (``draft_vocab_size`` of
    them, or every one seen), write the vocab and its summary."""
    if draft_vocab_size != SEEN and draft_vocab_size > target_vocab_size:
        raise ValueError(f"drafter.draft_vocab_size {draft_vocab_size} exceeds the verifier's vocabulary "
                         f"of {target_vocab_size}")
    counts = count_tokens([r["input_ids"] for r in rows], [r["loss_mask"] for r in rows], target_vocab_size)
    if draft_vocab_size == SEEN:
        draft_vocab_size = seen_size(counts, always)
    ids = select_draft_vocab(counts, draft_vocab_size, always=always)
    d2t, t2d = mappings(ids, target_vocab_size)
    save_vocab(vocab_path, d2t, t2d, counts)
    summary = {"draft_vocab_size": draft_vocab_size, "target_vocab_size": target_vocab_size,
               "assistant_token_coverage": float(counts[ids].sum() / counts.sum().clamp(min=1)),
               "seen_tokens": int((counts > 0).sum()),
               "unseen_rows": int((counts[ids] == 0).sum())}
    write_json(summary_path, summary)
    return summary
