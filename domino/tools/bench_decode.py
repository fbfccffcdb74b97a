"""Decoding-loop benchmark: ``python -m domino.tools.bench_decode [--verifier DIR] [--checkpoint DIR]``.

Prints, for one verifier on this machine: plain greedy TPS, speculative TPS, acceptance
length, speedup, and the share of step time spent outside the verifier and drafter forwards
(the loop's own overhead). An oracle drafter, which proposes the verifier's own greedy tokens
at no cost, shows the loop's ceiling: its ideal speedup is
``tokens per step x (plain greedy step time / one verifier forward over a whole block)``.
Goals: overhead <= 10% of step time; oracle speedup >= 0.8 x its ideal.

Without ``--verifier`` a random Qwen3 (hidden 256, 4 layers, vocab 4096) is used, and
without ``--checkpoint`` a random Domino drafter; neither changes what the loop costs.
``--card-shapes`` makes both random at the card's shapes instead (a Qwen3-0.6B-shaped
verifier, the card's 3-layer Domino drafter), and ``--device cuda --dtype bfloat16`` runs them
as the card does. Outside float32 a speculative run may part from plain greedy at a near-tie
(one block forward and one-token forwards round differently); the script then counts those
prompts and prints the largest logit gap found at the parting token (``domino.bench.lossless.divergence``)
instead of stopping.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import NamedTuple

import torch
from transformers import DynamicCache, Qwen3ForCausalLM

from ..acceptance import acceptance_summary
from ..bench.lossless import divergence
from ..common import DTYPES
from ..decode import DecodeResult, NeuralDraft, OracleDraft, cache_kwarg, decode
from ..model import Drafter, DrafterConfig
from ..shapes import qwen3_config
from ..verifier.load import load_verifier
from ..vocab import mappings
from . import CARD_DRAFTER, add_threads_argument, card_drafter_config, tool_parser, wait_policy


def _random_verifier(seed: int):
    torch.manual_seed(seed)
    cfg = qwen3_config(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048,
                       tie_word_embeddings=False, initializer_range=0.2,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    return Qwen3ForCausalLM(cfg).eval()


def _card_verifier(seed: int):
    """Random weights in the shape of Qwen/Qwen3-0.6B (nothing downloaded)."""
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(qwen3_config()).eval()


def _card_drafter(verifier, seed: int):
    d2t, t2d = mappings(torch.arange(CARD_DRAFTER["draft_vocab_size"]), verifier.config.vocab_size)
    cfg = card_drafter_config(verifier.config, projector="domino", shift_label=True)
    torch.manual_seed(seed)
    return Drafter.from_verifier(verifier, cfg, d2t, t2d).eval()


def _random_drafter(verifier, block_size: int, seed: int):
    V = verifier.config.vocab_size
    ids = torch.arange(0, V - 1, 2)[: V // 4]
    d2t, t2d = mappings(ids, V)
    cfg = DrafterConfig.schema_defaults(verifier.config, num_layers=1, block_size=block_size, aux_layer_ids=[1, 2, 3],
                                        mask_token_id=V - 1, draft_vocab_size=len(ids), projector="domino",
                                        shift_label=True, gru_hidden_size=256, bottleneck_size=64)
    torch.manual_seed(seed)
    return Drafter.from_verifier(verifier, cfg, d2t, t2d).eval()


def _sum(results, field):
    return sum(getattr(r, field) for r in results)


class Models(NamedTuple):
    verifier: Qwen3ForCausalLM
    drafter: Drafter


@dataclass
class Runs:
    """Every prompt decoded three ways (timed), and where the drafter's run parted from plain greedy."""

    plain: list[DecodeResult]
    drafter: list[DecodeResult]
    oracle: list[DecodeResult]
    parted: list[dict]  # domino.bench.lossless.divergence of each prompt whose drafter run differs


def parser() -> argparse.ArgumentParser:
    ap = tool_parser("bench_decode", __doc__)
    ap.add_argument("--verifier", help="a save_pretrained Qwen3 directory, such as results/verifier/model "
                                       "(without it: a random Qwen3)")
    ap.add_argument("--checkpoint", help="a trained drafter checkpoint directory, such as "
                                         "results/train/domino/checkpoint (without it: a random Domino drafter)")
    ap.add_argument("--prompts", type=int, default=12, help="how many random prompts to decode")
    ap.add_argument("--prompt-len", type=int, default=128, help="tokens per random prompt")
    ap.add_argument("--max-new-tokens", type=int, default=96, help="tokens each decode generates")
    ap.add_argument("--block-size", type=int, default=8, help="the random drafter's block size (a checkpoint "
                                                              "keeps its own)")
    add_threads_argument(ap)
    ap.add_argument("--seed", type=int, default=0, help="seed of the prompts and of the random weights")
    ap.add_argument("--card-shapes", action="store_true", help="random verifier and drafter at the card's shapes")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                    help="the weights' dtype; outside float32 near-ties may part a run from plain greedy")
    return ap


def parse_args(argv=None) -> argparse.Namespace:
    return parser().parse_args(argv)


def build_models(a: argparse.Namespace) -> Models:
    """The verifier and drafter the arguments ask for (loaded or random), on ``a.device`` in ``a.dtype``."""
    if a.verifier:
        verifier = load_verifier(a.verifier)
    else:
        verifier = _card_verifier(a.seed) if a.card_shapes else _random_verifier(a.seed)
    if a.checkpoint:
        drafter = Drafter.load(a.checkpoint)
    else:
        drafter = _card_drafter(verifier, a.seed) if a.card_shapes else _random_drafter(verifier, a.block_size, a.seed)
    dtype = DTYPES[a.dtype]
    return Models(verifier.to(a.device, dtype), drafter.to(a.device, dtype).eval())


def random_prompts(vocab_size: int, n: int, length: int, seed: int) -> list[list[int]]:
    """``n`` prompts of ``length`` uniform token ids, never the last id (the random drafter's mask)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size - 1, (length,), generator=g).tolist() for _ in range(n)]


def decode_all(verifier, drafter, prompts: list[list[int]], max_new_tokens: int) -> Runs:
    """One untimed warm-up, then every prompt plain, with the drafter, and with the oracle."""
    decode(verifier, prompts[0], 8)
    decode(verifier, prompts[0], 8, draft=NeuralDraft(drafter))
    if verifier.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(verifier.device)
    D = drafter.cfg.drafts_per_step
    plain = [decode(verifier, p, max_new_tokens) for p in prompts]
    spec = [decode(verifier, p, max_new_tokens, draft=NeuralDraft(drafter)) for p in prompts]
    # the oracle proposes the verifier's own continuation, a block past the budget included
    context = verifier.config.max_position_embeddings
    refs = [decode(verifier, p, min(max_new_tokens + D, context - len(p))).new_token_ids for p in prompts]
    oracle = [decode(verifier, p, max_new_tokens, draft=OracleDraft(ref, D)) for p, ref in zip(prompts, refs)]
    parted = [divergence(verifier, p, r.new_token_ids, s.new_token_ids)
              for p, r, s in zip(prompts, plain, spec) if s.new_token_ids != r.new_token_ids]
    return Runs(plain, spec, oracle, parted)


@torch.inference_mode()
def block_forward_seconds(verifier, prompts: list[list[int]], drafts_per_step: int) -> float:
    """Median time of one verifier forward over a whole block ([anchor] + drafts) after a
    prompt-length cache."""
    cuda = verifier.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    ck = cache_kwarg(verifier)
    times = []
    for p in prompts:
        cache = DynamicCache(config=verifier.config)
        verifier(input_ids=torch.tensor([p], device=verifier.device), **{ck: cache}, use_cache=True)
        sync()
        t0 = time.perf_counter()
        verifier(input_ids=torch.tensor([p[: drafts_per_step + 1]], device=verifier.device), **{ck: cache},
                 use_cache=True)
        sync()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def print_report(a: argparse.Namespace, verifier, runs: Runs, block_fwd: float, D: int) -> None:
    """The figures, one line each: plain greedy, the block forward, drafter and oracle, the oracle's ideal."""
    n_new = sum(len(r.new_token_ids) for r in runs.plain)
    plain_tps = n_new / _sum(runs.plain, "seconds")
    plain_step = _sum(runs.plain, "seconds") / n_new
    cuda = verifier.device.type == "cuda"
    where = torch.cuda.get_device_name(verifier.device) if cuda else f"CPU, {torch.get_num_threads()} threads, OpenMP wait policy {wait_policy()}"
    print(f"verifier: {sum(p.numel() for p in verifier.parameters()) / 1e6:.1f}M parameters, {a.dtype}, {where}; "
          f"{a.prompts} prompts x {a.prompt_len} tokens, {a.max_new_tokens} new tokens, {D} drafts per step")
    print(f"plain greedy          : {plain_tps:8.1f} tok/s   ({plain_step * 1e3:.2f} ms per token)")
    print(f"one block forward     : {block_fwd * 1e3:8.2f} ms   ({D + 1} tokens)")
    for name, rs in (("drafter", runs.drafter), ("oracle", runs.oracle)):
        al = acceptance_summary([r.accepted_per_step for r in rs], D)["acceptance_length"]
        total = _sum(rs, "seconds")
        over = _sum(rs, "overhead_seconds") / total
        t = n_new / total
        print(f"speculative ({name:7s}): {t:8.1f} tok/s   AL {al:.3f}   speedup {t / plain_tps:.3f}x   "
              f"draft {_sum(rs, 'draft_seconds') / total:.1%}  verify {_sum(rs, 'verify_seconds') / total:.1%}  "
              f"overhead {over:.1%} of step time")
        if name == "oracle":
            ideal = al * plain_step / block_fwd
            print(f"oracle ideal speedup  : {ideal:.3f}x (AL x plain step / block forward); "
                  f"reached {t / plain_tps / ideal:.1%} of it (goal >= 80%)")
    if a.dtype != "float32":
        gaps = [d["gap"] for d in runs.parted if d["gap"] is not None]
        print(f"parted from plain greedy: {len(runs.parted)} of {a.prompts} prompts"
              + (f", largest logit gap at the parting token {max(gaps):.4f}" if gaps else ""))
    if cuda:
        print(f"peak GPU memory       : {torch.cuda.max_memory_allocated(verifier.device) / 2**30:.2f} GiB")


def main(argv=None) -> None:
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    verifier, drafter = build_models(a)
    D = drafter.cfg.drafts_per_step
    prompts = random_prompts(verifier.config.vocab_size, a.prompts, a.prompt_len, a.seed)
    runs = decode_all(verifier, drafter, prompts, a.max_new_tokens)
    lossless = not runs.parted and all(o.new_token_ids == r.new_token_ids for r, o in zip(runs.plain, runs.oracle))
    if a.dtype == "float32" and not lossless:
        raise RuntimeError("decoding is not lossless: in float32 a speculative run parted from plain greedy")
    print_report(a, verifier, runs, block_forward_seconds(verifier, prompts, D), D)


if __name__ == "__main__":
    main()
