"""Decoding-loop benchmark: ``python -m domino.bench_decode [--verifier DIR] [--checkpoint DIR]``.

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
prompts and prints the largest logit gap found at the parting token (``domino.bench.divergence``)
instead of stopping.
"""

from __future__ import annotations

import argparse
import time

import torch

from .decode import NeuralDraft, OracleDraft, greedy_decode, speculative_decode
from .metrics import acceptance_summary


def _random_verifier(seed: int):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048,
                      tie_word_embeddings=False, initializer_range=0.2)
    return Qwen3ForCausalLM(cfg).eval()


def _card_verifier(seed: int):
    """Random weights in the shape of Qwen/Qwen3-0.6B (nothing downloaded)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from .random_verifier import QWEN3_0_6B

    torch.manual_seed(seed)
    return Qwen3ForCausalLM(Qwen3Config(**QWEN3_0_6B)).eval()


def _card_drafter(verifier, seed: int):
    from .bench_memory import CARD
    from .model import Drafter, DrafterConfig
    from .vocab import mappings

    d2t, t2d = mappings(torch.arange(CARD["draft_vocab_size"]), verifier.config.vocab_size)
    cfg = DrafterConfig.from_verifier(verifier.config, projector="domino", **CARD)
    torch.manual_seed(seed)
    return Drafter.from_verifier(verifier, cfg, d2t, t2d).eval()


def _random_drafter(verifier, block_size: int, seed: int):
    from .model import Drafter, DrafterConfig
    from .vocab import mappings

    V = verifier.config.vocab_size
    ids = torch.arange(0, V - 1, 2)[: V // 4]
    d2t, t2d = mappings(ids, V)
    cfg = DrafterConfig.from_verifier(verifier.config, num_layers=1, block_size=block_size, aux_layer_ids=[1, 2, 3],
                                      mask_token_id=V - 1, draft_vocab_size=len(ids), projector="domino",
                                      gru_hidden_size=256, bottleneck_size=64)
    torch.manual_seed(seed)
    return Drafter.from_verifier(verifier, cfg, d2t, t2d).eval()


def _sum(results, field):
    return sum(getattr(r, field) for r in results)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m domino.bench_decode", description=__doc__.split("\n")[0])
    ap.add_argument("--verifier", help="a save_pretrained Qwen3 directory (default: random)")
    ap.add_argument("--checkpoint", help="a trained drafter checkpoint directory (default: random Domino)")
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--card-shapes", action="store_true", help="random verifier and drafter at the card's shapes")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)

    from .model import Drafter

    if a.verifier:
        from .verifier import load_verifier

        verifier = load_verifier(a.verifier)
    else:
        verifier = _card_verifier(a.seed) if a.card_shapes else _random_verifier(a.seed)
    if a.checkpoint:
        drafter = Drafter.load(a.checkpoint)
    else:
        drafter = _card_drafter(verifier, a.seed) if a.card_shapes else _random_drafter(verifier, a.block_size, a.seed)
    from .verifier import DTYPES

    dtype = DTYPES[a.dtype]
    verifier = verifier.to(a.device, dtype)
    drafter = drafter.to(a.device, dtype).eval()
    cuda = a.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    D = drafter.cfg.drafts_per_step
    V = verifier.config.vocab_size
    g = torch.Generator().manual_seed(a.seed)
    prompts = [torch.randint(0, V - 1, (a.prompt_len,), generator=g).tolist() for _ in range(a.prompts)]

    # warm-up, untimed
    greedy_decode(verifier, prompts[0], 8)
    speculative_decode(verifier, NeuralDraft(drafter), prompts[0], 8)

    if cuda:
        torch.cuda.reset_peak_memory_stats(a.device)
    plain = [greedy_decode(verifier, p, a.max_new_tokens) for p in prompts]
    spec = [speculative_decode(verifier, NeuralDraft(drafter), p, a.max_new_tokens) for p in prompts]
    oracle = [speculative_decode(verifier, OracleDraft(r.new_token_ids, D), p, a.max_new_tokens)
              for p, r in zip(prompts, plain)]
    from .bench import divergence

    parted = [divergence(verifier, p, r.new_token_ids, s.new_token_ids)
              for p, r, s in zip(prompts, plain, spec) if s.new_token_ids != r.new_token_ids]
    if a.dtype == "float32":
        assert not parted and all(o.new_token_ids == r.new_token_ids for r, o in zip(plain, oracle)), \
            "decoding is not lossless"

    # one verifier forward over a whole block ([anchor] + D drafts) after a prompt-length cache
    from transformers import DynamicCache

    from .decode import _cache_kwarg

    ck = _cache_kwarg(verifier)
    times = []
    with torch.inference_mode():
        for p in prompts:
            cache = DynamicCache(config=verifier.config)
            verifier(input_ids=torch.tensor([p], device=a.device), **{ck: cache}, use_cache=True)
            sync()
            t0 = time.perf_counter()
            verifier(input_ids=torch.tensor([p[: D + 1]], device=a.device), **{ck: cache}, use_cache=True)
            sync()
            times.append(time.perf_counter() - t0)
    block_fwd = sorted(times)[len(times) // 2]

    n_new = sum(len(r.new_token_ids) for r in plain)
    plain_tps = n_new / _sum(plain, "seconds")
    plain_step = _sum(plain, "seconds") / n_new
    where = torch.cuda.get_device_name(a.device) if cuda else f"CPU, {torch.get_num_threads()} threads"
    print(f"verifier: {sum(p.numel() for p in verifier.parameters()) / 1e6:.1f}M parameters, {a.dtype}, {where}; "
          f"{a.prompts} prompts x {a.prompt_len} tokens, {a.max_new_tokens} new tokens, {D} drafts per step")
    print(f"plain greedy          : {plain_tps:8.1f} tok/s   ({plain_step * 1e3:.2f} ms per token)")
    print(f"one block forward     : {block_fwd * 1e3:8.2f} ms   ({D + 1} tokens)")
    for name, rs in (("drafter", spec), ("oracle", oracle)):
        al = acceptance_summary([r.accepted_per_step for r in rs], D)["acceptance_length"]
        total = _sum(rs, "seconds")
        over = _sum(rs, "overhead_seconds") / total
        t = n_new / total
        line = (f"speculative ({name:7s}): {t:8.1f} tok/s   AL {al:.3f}   speedup {t / plain_tps:.3f}x   "
                f"draft {_sum(rs, 'draft_seconds') / total:.1%}  verify {_sum(rs, 'verify_seconds') / total:.1%}  "
                f"overhead {over:.1%} of step time")
        print(line)
        if name == "oracle":
            ideal = al * plain_step / block_fwd
            print(f"oracle ideal speedup  : {ideal:.3f}x (AL x plain step / block forward); "
                  f"reached {t / plain_tps / ideal:.1%} of it (goal >= 80%)")
    if a.dtype != "float32":
        gaps = [d["gap"] for d in parted if d["gap"] is not None]
        print(f"parted from plain greedy: {len(parted)} of {a.prompts} prompts"
              + (f", largest logit gap at the parting token {max(gaps):.4f}" if gaps else ""))
    if cuda:
        print(f"peak GPU memory       : {torch.cuda.max_memory_allocated(a.device) / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
