"""Hidden-state extraction: the verifier's auxiliary layers and greedy targets, in shards.

One shard holds ``shard_samples`` conversations, concatenated along the token axis:

* ``input_ids`` (n,) int64, ``loss_mask`` (n,) uint8
* ``aux`` (n, A*H) in the configured dtype: the state of each aux id, concatenated
  (aux ids as ``domino.aux.AuxCapture`` defines them)
* ``target`` (n,) int64: the verifier's greedy token *within the draft vocabulary* (a draft id)
  at each position, i.e. its prediction for the next position
* ``last`` (n, H) in the configured dtype, with ``features.last_hidden_state``: the verifier's
  last layer output before its final norm (aux id L), from which training computes the
  verifier's distribution over the draft vocabulary for ``train.loss: kl_div``, as PR 685 does
  (H more values per token: a third more than three aux layers)
* ``offsets`` (samples+1,) int64: where each conversation starts

Each shard is written atomically with a ``.sha256`` sidecar (the file's sha256, then a key of
the inputs it was made from: the verifier's config and weights, the conversations, the aux
ids, the draft vocabulary, the batch size and the dtype); a rerun skips shards whose sidecar
matches both, so an interrupted extraction resumes at the first missing shard and a shard
left over from other inputs is never reused.
``index.json`` is written last and is what later stages (and Snakemake) take as done; it is
sealed with the sha256 of its content, and ``load_features`` refuses an altered index or shard
in one line naming it and what to do.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
from pathlib import Path

import torch
from safetensors.torch import load, load_file, save_file
from tqdm import tqdm

from ..aux import AuxCapture
from ..common import DTYPES
from ..io import atomic_path, read_json, sha256_file, write_json

logger = logging.getLogger(__name__)


class ShardError(RuntimeError):
    """A feature shard that is missing, corrupted or does not match its index."""


def estimate_bytes(n_tokens: int, n_aux: int, hidden: int, dtype: str, last_hidden_state: bool = False) -> int:
    per = DTYPES[dtype].itemsize
    return n_tokens * ((n_aux + int(last_hidden_state)) * hidden * per + 8 + 1 + 8)


@torch.inference_mode()
def extract(verifier, rows: list[dict], aux_layer_ids: list[int], draft_target_ids: torch.Tensor,
            index_path: str | Path, batch_size: int, shard_samples: int, dtype: str, backend=None,
            last_hidden_state: bool = False) -> dict:
    """Run the verifier over ``rows``; write the index to ``index_path`` and the shards beside it.

    ``last_hidden_state`` also stores each token's last layer output before the final norm (``last``).

    ``backend`` computes one shard's tensors: None runs ``verifier`` through transformers here;
    ``domino.vllm.backend.VllmExtractor`` runs the same weights through vLLM. Its ``name`` is
    part of the shard key, so shards from one backend are never taken for the other's.
    """
    out_dir = Path(index_path).parent
    out_dir.mkdir(parents=True, exist_ok=True)
    H, L = verifier.config.hidden_size, verifier.config.num_hidden_layers
    for i in aux_layer_ids:
        if not 0 <= i <= L:
            raise ValueError(f"aux layer id {i} is outside 0..{L} for this verifier")
    n_tokens = sum(len(r["input_ids"]) for r in rows)
    need = estimate_bytes(n_tokens, len(aux_layer_ids), H, dtype, last_hidden_state)
    logger.info("extracting %d conversations, %d tokens, %d aux layers x %d in %s%s: about %.1f MiB on disk",
                len(rows), n_tokens, len(aux_layer_ids), H, dtype,
                " and the last hidden state" if last_hidden_state else "", need / 2**20)
    dev = verifier.device
    head = verifier.get_output_embeddings().weight[draft_target_ids.to(dev)]  # (Vd, H)
    n_shards = math.ceil(len(rows) / shard_samples)
    backend_name = getattr(backend, "name", "transformers")
    common = _common_key(verifier, aux_layer_ids, draft_target_ids, batch_size, dtype, backend_name,
                         last_hidden_state)
    shards = []
    bar = tqdm(total=len(rows), desc=f"extract {out_dir.name}", mininterval=5)
    for s in range(n_shards):
        part = rows[s * shard_samples:(s + 1) * shard_samples]
        name = f"shard-{s:05d}.safetensors"
        path, side = out_dir / name, out_dir / f"{name}.sha256"
        key = _part_key(common, part)
        recorded = side.read_text().split() if side.exists() else []
        if path.exists() and len(recorded) == 3 and recorded[1:] == ["inputs", key] \
                and recorded[0] == sha256_file(path):
            logger.info("%s: present and verified, skipped", name)
            shards.append({"file": name, "samples": len(part), "tokens": sum(len(r["input_ids"]) for r in part),
                           "sha256": recorded[0]})
            bar.update(len(part))
            continue
        if path.exists():
            logger.info("%s: present but unverified or made from other inputs, extracted again", name)
        if backend is None:
            # the bar moves per batch: a shard of 1,000 conversations takes minutes on a slow CPU
            tensors = _extract_part(verifier, part, aux_layer_ids, head, batch_size, DTYPES[dtype], last_hidden_state,
                                    progress=bar.update)
        else:
            tensors = backend(part, head, batch_size, DTYPES[dtype], last_hidden_state)
            bar.update(len(part))
        with atomic_path(path) as tmp:
            save_file(tensors, str(tmp))
        digest = sha256_file(path)
        with atomic_path(side) as tmp:
            tmp.write_text(f"{digest}\ninputs {key}\n")
        shards.append({"file": name, "samples": len(part), "tokens": int(tensors["input_ids"].numel()),
                       "sha256": digest})
    bar.close()
    index = {"shards": shards, "aux_layer_ids": list(aux_layer_ids), "hidden_size": H, "dtype": dtype,
             "samples": len(rows), "tokens": n_tokens, "draft_vocab_size": int(len(draft_target_ids)),
             "backend": backend_name, "last_hidden_state": bool(last_hidden_state)}
    write_json(index_path, index, seal=True)
    return index


def _common_key(verifier, aux_layer_ids, draft_target_ids, batch_size, dtype, backend="transformers",
                last_hidden_state=False) -> str:
    """What every shard depends on besides its conversations: settings, verifier config and weights."""
    h = hashlib.sha256()
    settings = {"aux_layer_ids": list(aux_layer_ids), "draft": [int(i) for i in draft_target_ids.tolist()],
                "batch_size": batch_size, "dtype": dtype, "backend": backend, "config": verifier.config.to_diff_dict()}
    if last_hidden_state:  # absent otherwise: shards made without it keep their key
        settings["last_hidden_state"] = True
    h.update(json.dumps(settings, sort_keys=True, default=str).encode())
    for name, t in sorted(verifier.state_dict().items()):
        h.update(f"{name} {t.dtype} {tuple(t.shape)}".encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def _part_key(common: str, part: list[dict]) -> str:
    h = hashlib.sha256(common.encode())
    for r in part:
        h.update(json.dumps([list(r["input_ids"]), list(r["loss_mask"])], separators=(",", ":")).encode())
    return h.hexdigest()


def _extract_part(verifier, part, aux_layer_ids, head, batch_size, dtype, last_hidden_state=False,
                  progress=lambda n: None):
    """One shard's features, batch by batch; `progress(n)` is told of each batch's n conversations."""
    dev = verifier.device
    L = verifier.config.num_hidden_layers
    ids_l, mask_l, aux_l, tgt_l, last_l = [], [], [], [], []
    for b in range(0, len(part), batch_size):
        batch = part[b:b + batch_size]
        T = max(len(r["input_ids"]) for r in batch)
        # right padding: causal attention keeps real tokens blind to the pad
        x = torch.zeros(len(batch), T, dtype=torch.long)
        for j, r in enumerate(batch):
            x[j, : len(r["input_ids"])] = torch.tensor(r["input_ids"])
        last_capture = AuxCapture(verifier, [L]) if last_hidden_state else contextlib.nullcontext()
        with AuxCapture(verifier, aux_layer_ids) as cap, last_capture as last_cap:
            out = verifier.base_model(input_ids=x.to(dev))  # the decoder without its head, any family
        aux = cap.aux()
        last = last_cap.aux() if last_hidden_state else None  # aux id L: the state before the final norm
        greedy = (out.last_hidden_state @ head.T.to(out.last_hidden_state.dtype)).argmax(-1)  # draft ids
        for j, r in enumerate(batch):
            n = len(r["input_ids"])
            ids_l.append(x[j, :n])
            mask_l.append(torch.tensor(r["loss_mask"], dtype=torch.uint8))
            aux_l.append(aux[j, :n].to("cpu", dtype))
            tgt_l.append(greedy[j, :n].cpu())
            if last_hidden_state:
                last_l.append(last[j, :n].to("cpu", dtype))
        progress(len(batch))
    return shard_tensors(ids_l, mask_l, aux_l, tgt_l, last_l if last_hidden_state else None)


def shard_tensors(ids_l, mask_l, aux_l, tgt_l, last_l=None) -> dict:
    """One shard's tensors from per-conversation lists, concatenated along the token axis
    (``last`` only when ``last_l`` is given)."""
    lengths = torch.tensor([len(t) for t in ids_l])
    extra = {} if last_l is None else {"last": torch.cat(last_l).contiguous()}
    return {
        **extra,
        "input_ids": torch.cat(ids_l).contiguous(),
        "loss_mask": torch.cat(mask_l).contiguous(),
        "aux": torch.cat(aux_l).contiguous(),
        "target": torch.cat(tgt_l).long().contiguous(),
        "offsets": torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]).contiguous(),
    }


def chosen_conversations(total: int, samples: int | None, seed: int) -> list[int] | None:
    """Which of ``total`` conversations a run trains on when it takes ``samples`` of them (None:
    all): the first ``samples`` of a seeded permutation, in their file order. Each size's choice
    holds every smaller size's, so points of a data-size study differ by data added, not swapped."""
    if samples is None or samples >= total:
        return None
    order = torch.randperm(total, generator=torch.Generator().manual_seed(seed))
    return sorted(order[:samples].tolist())


def _take(part: dict, keep: list[int]) -> dict:
    """The conversations ``keep`` (indices into the shard) of one shard's tensors."""
    offs = part["offsets"].tolist()
    spans = [torch.arange(offs[i], offs[i + 1]) for i in keep]
    rows = torch.cat(spans) if spans else torch.zeros(0, dtype=torch.long)
    lengths = torch.tensor([len(s) for s in spans], dtype=torch.long)
    out = {k: v[rows] for k, v in part.items() if k != "offsets"}
    out["offsets"] = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    return out


def load_features(index_path: str | Path, verify: bool = True, samples: int | None = None, seed: int = 0) -> dict:
    """All shards of one split, checked against their sha256, as one set of token tensors; with
    ``samples``, only the conversations ``chosen_conversations`` picks (each shard is cut as it is
    read, so memory holds the subset and one shard)."""
    index_path = Path(index_path)
    if not index_path.exists():
        raise ShardError(f"{index_path} is missing: run extract_hidden_states first")
    try:
        index = read_json(index_path, "features index", sealed=True)
    except ValueError as err:
        raise ShardError(str(err)) from None
    hint = (f"delete {index_path} and run the same command again (rule extract_hidden_states re-extracts "
            "the shards that do not match their .sha256)")
    keep = chosen_conversations(sum(sh["samples"] for sh in index["shards"]), samples, seed)
    parts, first = [], 0
    for sh in index["shards"]:
        path = index_path.parent / sh["file"]
        if not path.exists():
            raise ShardError(f"feature shard {path} is missing; {hint}")
        try:
            if verify:  # one read serves both the check and the tensors
                data = path.read_bytes()
                if hashlib.sha256(data).hexdigest() != sh["sha256"]:
                    raise ShardError(f"feature shard {path} is corrupted (sha256 differs from {index_path.name}); {hint}")
                parts.append(load(data))
            else:
                parts.append(load_file(str(path)))
        except ShardError:
            raise
        except Exception as err:  # safetensors raises several types on a damaged file
            raise ShardError(f"feature shard {path} cannot be read ({err}); {hint}") from None
        if keep is not None:
            parts[-1] = _take(parts[-1], [i - first for i in keep if first <= i < first + sh["samples"]])
        first += sh["samples"]
    offsets, base = [], 0
    for p in parts:
        offsets.append(p["offsets"][:-1] + base)
        base += int(p["offsets"][-1])
    extra = {"last": torch.cat([p["last"] for p in parts])} if index.get("last_hidden_state") else {}
    return {
        **extra,
        "input_ids": torch.cat([p["input_ids"] for p in parts]),
        "loss_mask": torch.cat([p["loss_mask"] for p in parts]).bool(),
        "aux": torch.cat([p["aux"] for p in parts]),
        "target": torch.cat([p["target"] for p in parts]),
        "offsets": torch.cat(offsets + [torch.tensor([base])]),
        "index": index if keep is None else {**index, "chosen": {"samples": len(keep), "seed": seed}},
    }
