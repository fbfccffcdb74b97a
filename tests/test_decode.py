"""Speculative decoding is lossless: token-for-token the verifier's plain greedy output."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import tiny_drafter, tiny_verifier
from domino.decode import LookupThenDraft, NeuralDraft, NgramDraft, OracleDraft, crop_cache, decode, ngram_lookup

KINDS = [("dflash", True), ("dflash", False), ("domino", True)]
ROOT = Path(__file__).resolve().parent.parent


def _prompts(n, vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 40, (n,), generator=g).tolist()
    return [torch.randint(0, vocab - 1, (L,), generator=g).tolist() for L in lengths]


def _truncate_at(tokens, eos):
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1]
    return tokens


@pytest.mark.parametrize("projector,shift", KINDS)
def test_lossless_random_weights(verifier, projector, shift):
    drafter = tiny_drafter(verifier, projector=projector, shift_label=shift)
    for i, prompt in enumerate(_prompts(50, verifier.config.vocab_size)):
        max_new = 5 + (i * 7) % 23
        ref = decode(verifier, prompt, max_new)
        out = decode(verifier, prompt, max_new, draft=NeuralDraft(drafter))
        assert out.new_token_ids == ref.new_token_ids, f"prompt {i}"
        # every step drafts a full block (vLLM's counting); only the last one can be cut by the budget
        assert len(out.new_token_ids) <= 1 + out.steps + sum(out.accepted_per_step)
        assert len(out.new_token_ids) > out.steps + sum(out.accepted_per_step[:-1])


def test_lossless_with_eos_and_length_inside_accepted_blocks(verifier):
    """The oracle accepts whole blocks, so EOS and max_new_tokens land mid-block."""
    hits = {"eos_mid_block": 0, "length_mid_block": 0}
    for i, prompt in enumerate(_prompts(60, verifier.config.vocab_size, seed=1)):
        full = decode(verifier, prompt, 40).new_token_ids
        eos = {full[3 + i % 11]}
        expect = _truncate_at(full, eos)
        got = decode(verifier, prompt, 40, eos)
        assert got.new_token_ids == expect and got.stop_reason == "eos"
        spec = decode(verifier, prompt, 40, eos, draft=OracleDraft(full, 4))
        assert spec.new_token_ids == expect and spec.stop_reason == "eos"
        if spec.accepted_per_step and spec.accepted_per_step[-1] > 0 and len(expect) > 1:
            hits["eos_mid_block"] += 1
        max_new = 6 + i % 5  # not a multiple of the 5 tokens per step
        spec = decode(verifier, prompt, max_new, draft=OracleDraft(full, 4))
        assert spec.new_token_ids == full[:max_new] and spec.stop_reason == "length"
        hits["length_mid_block"] += max_new % 5 != 1
    assert all(v > 10 for v in hits.values()), hits


@pytest.mark.parametrize("projector,shift", KINDS)
def test_lossless_with_eos_for_drafters(verifier, projector, shift):
    drafter = tiny_drafter(verifier, projector=projector, shift_label=shift)
    for i, prompt in enumerate(_prompts(20, verifier.config.vocab_size, seed=2)):
        full = decode(verifier, prompt, 30).new_token_ids
        eos = {full[(i * 3) % 30]}
        out = decode(verifier, prompt, 30, eos, draft=NeuralDraft(drafter))
        assert out.new_token_ids == _truncate_at(full, eos)


def test_oracle_accepts_everything(verifier):
    prompt = _prompts(1, verifier.config.vocab_size, seed=4)[0]
    full = decode(verifier, prompt, 21).new_token_ids
    out = decode(verifier, prompt, 21, draft=OracleDraft(full, 4))
    assert out.accepted_per_step == [4, 4, 4, 4]
    assert out.new_token_ids == full


def test_ngram_lookup_by_hand():
    # the latest earlier occurrence of the 2-gram (1, 2) is at 3: what followed it, then the copy
    # runs on into what it proposes (period 8 - 3 - 2 = 3)
    assert ngram_lookup([1, 2, 5, 1, 2, 7, 1, 2], 2, 1, 5) == [7, 1, 2, 7, 1]
    # the longest n-gram with a match wins over a later match of a shorter one
    assert ngram_lookup([4, 1, 2, 9, 3, 2, 1, 2], 2, 1, 2) == [9, 3]
    assert ngram_lookup([4, 1, 2, 9, 3, 2, 1, 2], 1, 1, 2) == [1, 2]  # 1-grams only: the 2 at 5
    assert ngram_lookup([1, 2, 3], 2, 1, 3) == []  # nothing repeats
    assert ngram_lookup([1, 2, 3, 1], 3, 2, 3) == []  # a 1-gram would match, min_n 2 forbids it
    assert ngram_lookup([7], 2, 1, 3) == []
    with pytest.raises(ValueError):
        NgramDraft(4, max_n=1, min_n=2)


def test_ngram_lookup_and_lookup_then_draft_are_lossless(verifier):
    """Both lookups leave greedy output unchanged, with EOS and the budget anywhere; the lookup
    keeps the context the loop committed, and it drafts (and has drafts accepted) on these
    prompts, so the check is not vacuous."""
    drafter = tiny_drafter(verifier, projector="domino", shift_label=True)
    accepted = steps = 0
    for i, prompt in enumerate(_prompts(30, verifier.config.vocab_size, seed=5)):
        prompt = prompt + prompt[: 1 + i % 7]  # a repeat for the lookup to find
        max_new = 5 + (i * 7) % 31
        full = decode(verifier, prompt, max_new).new_token_ids
        eos = {full[(i * 3) % len(full)]} if i % 2 else set()
        expect = _truncate_at(full, eos)
        lookup = NgramDraft(4, max_n=2, min_n=1)
        out = decode(verifier, prompt, max_new, eos, draft=lookup)
        assert out.new_token_ids == expect, f"prompt {i}"
        committed = lookup.tokens[len(prompt):]
        assert committed == expect[: len(committed)] and len(committed) >= len(expect) - 5
        accepted, steps = accepted + sum(out.accepted_per_step), steps + out.steps
        both = decode(verifier, prompt, max_new, eos, draft=LookupThenDraft(NeuralDraft(drafter)))
        assert both.new_token_ids == expect, f"prompt {i}"
    assert steps > 0 and accepted > 0


def _vllm_counts(accepted_per_step: list[int], block: int) -> tuple[int, int, list[int]]:
    """vLLM's SpecDecodingStats from per-step accepted counts: num_drafts, num_accepted_tokens,
    num_accepted_tokens_per_pos (observe_draft: position i counts when accepted > i)."""
    return (len(accepted_per_step), sum(accepted_per_step),
            [sum(a > i for a in accepted_per_step) for i in range(block)])


def test_near_budget_and_eos_count_as_vllm(verifier):
    """One token of budget left: vLLM still drafts and verifies a full block and counts it; no
    step without drafts is recorded. Accepted drafts past an EOS count, as in vLLM's
    ``len(generated_token_ids) - 1``."""
    prompt = _prompts(1, verifier.config.vocab_size, seed=4)[0]
    full = decode(verifier, prompt, 40).new_token_ids
    # prefill gives 1 token, step 1 commits 4 + 1 = 6: one token of budget is left for step 2
    out = decode(verifier, prompt, 7, draft=OracleDraft(full, 4))
    assert out.new_token_ids == full[:7] and out.stop_reason == "length"
    assert out.accepted_per_step == [4, 4]  # both steps verified a full block, all accepted
    assert _vllm_counts(out.accepted_per_step, 4) == (2, 8, [2, 2, 2, 2])
    # the budget ends exactly after step 1: nothing is left for a second step
    out = decode(verifier, prompt, 6, draft=OracleDraft(full, 4))
    assert out.new_token_ids == full[:6] and out.accepted_per_step == [4]
    # EOS at a draft of step 1 (a token not seen before it): the output stops there, the count
    # keeps all four accepted drafts
    i = next(i for i in range(1, 5) if full[i] not in full[:i])
    out = decode(verifier, prompt, 40, {full[i]}, draft=OracleDraft(full, 4))
    assert out.new_token_ids == full[:i + 1] and out.stop_reason == "eos"
    assert _vllm_counts(out.accepted_per_step, 4) == (1, 4, [1, 1, 1, 1])


def test_crop_cache_uses_the_current_api(verifier):
    from transformers import DynamicCache

    cache = DynamicCache(config=verifier.config)
    with torch.no_grad():
        verifier(torch.tensor([[1, 2, 3, 4, 5]]), cache=cache, use_cache=True)
    crop_cache(cache, 3)
    assert cache.get_seq_length() == 3
    crop_cache(cache, 7)  # never grows
    assert cache.get_seq_length() == 3


def test_prompt_longer_than_the_context_is_refused():
    v = tiny_verifier(max_pos=32)
    with pytest.raises(ValueError, match="exceeds the verifier's context of 32"):
        decode(v, list(range(1, 31)), 4)
    with pytest.raises(ValueError, match="empty prompt"):
        decode(v, [], 4)
    assert len(decode(v, list(range(1, 29)), 4).new_token_ids) == 4  # exactly at the limit is fine


@pytest.fixture(scope="module")
def trained_drafters(verifier, tmp_path_factory):
    """The three kinds trained briefly on the verifier's own greedy continuations."""
    from domino.data.features import extract, load_features
    from domino.train.loop import TrainConfig, train

    V = verifier.config.vocab_size
    rows = []
    for i, prompt in enumerate(_prompts(24, V, seed=7)):
        cont = decode(verifier, prompt, 24).new_token_ids
        rows.append({"input_ids": prompt + cont, "loss_mask": [0] * len(prompt) + [1] * len(cont)})
    out = {}
    for projector, shift in KINDS:
        d = tiny_drafter(verifier, projector=projector, shift_label=shift)
        tmp = tmp_path_factory.mktemp(f"{projector}-{shift}")
        target_ids = d.draft_to_target(torch.arange(d.cfg.draft_vocab_size))
        extract(verifier, rows, d.cfg.aux_layer_ids, target_ids, tmp / "feat" / "index.json", 8, 100, "float32")
        feats = load_features(tmp / "feat" / "index.json")
        feats["aux"] = feats["aux"].double()
        cfg = TrainConfig.schema_defaults(epochs=12, lr=3e-3, warmup_steps=2, anchors_per_row=16, pack_len=256,
                                          checkpoint_every=10**6,
                                          weighting="classic" if projector == "dflash" else "shifted")
        train(d, feats, cfg, tmp / "train")
        out[(projector, shift)] = d.to(torch.float64).eval()
    return out


@pytest.mark.parametrize("projector,shift", KINDS)
def test_lossless_trained_weights(verifier, trained_drafters, projector, shift):
    drafter = trained_drafters[(projector, shift)]
    accepted = 0
    for i, prompt in enumerate(_prompts(50, verifier.config.vocab_size, seed=8)):
        max_new = 8 + (i * 5) % 20
        full = decode(verifier, prompt, 40).new_token_ids
        eos = {full[(i * 7) % 40]} if i % 3 == 0 else set()
        ref = decode(verifier, prompt, max_new, eos)
        out = decode(verifier, prompt, max_new, eos, draft=NeuralDraft(drafter))
        assert out.new_token_ids == ref.new_token_ids, f"prompt {i}"
        accepted += sum(out.accepted_per_step)
    assert accepted > 0  # training made the drafts land, so the accept path is exercised


def _loaded_after_import(module: str, watched: tuple[str, ...]) -> list[str]:
    """The modules of ``watched`` that importing ``module`` loads, in a fresh interpreter."""
    code = f"import sys, {module}; print(' '.join(m for m in {watched!r} if m in sys.modules))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    return out.stdout.split()


def test_decoding_loads_neither_a_tokenizer_nor_the_verifier_loader():
    """Decoding is model code: it takes token ids and a loaded verifier, and the sampling rule
    never reaches back into the loops."""
    assert _loaded_after_import("domino.decode", ("tokenizers", "domino.verifier.load")) == []
    assert _loaded_after_import("domino.sampling", ("tokenizers", "domino.verifier.load", "domino.decode")) == []
