"""Decoding-loop benchmark: ``python -m domino.bench_decode [--verifier DIR] [--checkpoint DIR]``.

Prints, for one verifier on this machine: plain greedy TPS, speculative TPS, acceptance
length, speedup, and the share of step time spent outside the verifier and drafter forwards
(the loop's own overhead). An oracle drafter, which proposes the verifier's own greedy tokens
at no cost, shows the loop's ceiling: its ideal speedup is
``tokens per step x (plain greedy step time / one verifier forward over a whole block)``.
Goals: overhead <= 10% of step time; oracle speedup >= 0.8 x its ideal.

Without ``--verifier`` a random Qwen3 (hidden 256, 4 layers, vocab 4096) is used, and
without ``--checkpoint`` a random Domino drafter; neither changes what the loop costs.
"""

from __future__ import annotations

import argparse
import time

import torch

from .decode import NeuralDraft, OracleDraft, greedy_decode, speculative_decode


def _random_verifier(seed: int):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048,
                      tie_word_embeddings=False, initializer_range=0.2)
    return Qwen3ForCausalLM(cfg).eval()


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
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)

    from .model import Drafter

    if a.verifier:
        from .verifier import load_verifier

        verifier = load_verifier(a.verifier)
    else:
        verifier = _random_verifier(a.seed)
    drafter = Drafter.load(a.checkpoint) if a.checkpoint else _random_drafter(verifier, a.block_size, a.seed)
    drafter = drafter.to(verifier.dtype).eval()
    D = drafter.cfg.drafts_per_step
    V = verifier.config.vocab_size
    g = torch.Generator().manual_seed(a.seed)
    prompts = [torch.randint(0, V - 1, (a.prompt_len,), generator=g).tolist() for _ in range(a.prompts)]

    # warm-up, untimed
    greedy_decode(verifier, prompts[0], 8)
    speculative_decode(verifier, NeuralDraft(drafter), prompts[0], 8)

    plain = [greedy_decode(verifier, p, a.max_new_tokens) for p in prompts]
    spec = [speculative_decode(verifier, NeuralDraft(drafter), p, a.max_new_tokens) for p in prompts]
    oracle = [speculative_decode(verifier, OracleDraft(r.new_token_ids, D), p, a.max_new_tokens)
              for p, r in zip(prompts, plain)]
    for r, s, o in zip(plain, spec, oracle):
        assert s.new_token_ids == r.new_token_ids == o.new_token_ids, "decoding is not lossless"

    # one verifier forward over a whole block ([anchor] + D drafts) after a prompt-length cache
    from transformers import DynamicCache

    from .decode import _cache_kwarg

    ck = _cache_kwarg(verifier)
    times = []
    with torch.inference_mode():
        for p in prompts:
            cache = DynamicCache(config=verifier.config)
            verifier(input_ids=torch.tensor([p]), **{ck: cache}, use_cache=True)
            t0 = time.perf_counter()
            verifier(input_ids=torch.tensor([p[: D + 1]]), **{ck: cache}, use_cache=True)
            times.append(time.perf_counter() - t0)
    block_fwd = sorted(times)[len(times) // 2]

    n_new = sum(len(r.new_token_ids) for r in plain)
    plain_tps = n_new / _sum(plain, "seconds")
    plain_step = _sum(plain, "seconds") / n_new
    print(f"verifier: {sum(p.numel() for p in verifier.parameters()) / 1e6:.1f}M parameters, "
          f"{torch.get_num_threads()} threads; {a.prompts} prompts x {a.prompt_len} tokens, "
          f"{a.max_new_tokens} new tokens, {D} drafts per step")
    print(f"plain greedy          : {plain_tps:8.1f} tok/s   ({plain_step * 1e3:.2f} ms per token)")
    print(f"one block forward     : {block_fwd * 1e3:8.2f} ms   ({D + 1} tokens)")
    for name, rs in (("drafter", spec), ("oracle", oracle)):
        steps = sum(r.steps for r in rs)
        accepted = sum(sum(r.accepted_per_step) for r in rs)
        al = 1 + accepted / steps
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


if __name__ == "__main__":
    main()
