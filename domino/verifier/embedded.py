"""The embedded verifier: its tokenizer and its pretraining, both done by the workflow.

A small ``Qwen3ForCausalLM`` with its own byte-level BPE tokenizer and a ChatML chat template,
trained here and saved with ``save_pretrained`` so that every later stage loads it exactly as
it would load ``Qwen/Qwen3-0.6B`` (``domino.verifier.load``). At the card's scale none of this runs.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from tqdm import tqdm
from transformers import PreTrainedTokenizerFast, Qwen3ForCausalLM

from ..io import atomic_dir, write_json, write_manifest
from ..shapes import qwen3_config
from .load import MASK_TOKEN, VerifierError

logger = logging.getLogger(__name__)

# ChatML's specials, then the drafter's mask token (added after training, the last id)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", MASK_TOKEN]
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def train_tokenizer(texts, vocab_size: int, out_dir: str | Path):
    """Byte-level BPE over ``texts`` with the ChatML specials; the mask token is added last."""
    tok = Tokenizer(models.BPE())
    # newlines are tokens of their own: the chat template's generation prompt ends in "\n", and a
    # tokenizer that merges "\n" with the next line's indentation never shows that lone "\n"
    # before an indented body in training
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split("\n", behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - 1, special_tokens=SPECIAL_TOKENS[:3],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.add_special_tokens({"additional_special_tokens": [MASK_TOKEN]})
    fast.chat_template = CHATML_TEMPLATE
    with atomic_dir(out_dir) as tmp:
        fast.save_pretrained(str(tmp))
        write_manifest(tmp)  # every later stage checks the files against it (domino.verifier.load)
    return fast


def build_embedded_verifier(tokenizer, cfg: dict):
    """A randomly initialised ``Qwen3ForCausalLM`` with the shape ``cfg`` (``verifier.embedded``
    of the config) over ``tokenizer``'s vocabulary, tied embeddings and rope_theta 1e4."""
    config = qwen3_config(
        vocab_size=len(tokenizer), hidden_size=cfg["hidden_size"], intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=cfg["num_layers"], num_attention_heads=cfg["num_attention_heads"],
        num_key_value_heads=cfg["num_key_value_heads"], head_dim=cfg["head_dim"],
        max_position_embeddings=cfg["max_position_embeddings"], tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        bos_token_id=None, eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
    )
    return Qwen3ForCausalLM(config)


def pretrain_embedded_verifier(rows, tokenizer, cfg: dict, out_dir: str | Path, seed: int) -> dict:
    """Next-token pretraining on the concatenated conversations (every token, not only assistant).

    The token stream is cut into ``seq_len`` windows; batches are drawn in a seeded order.
    Returns a summary with the loss curve's start and end.
    """
    torch.manual_seed(seed)
    model = build_embedded_verifier(tokenizer, cfg)
    stream = torch.tensor([t for r in rows for t in r["input_ids"]], dtype=torch.long)
    L, bs, steps = cfg["seq_len"], cfg["batch_size"], cfg["steps"]
    n_win = (len(stream) - 1) // L
    if n_win < bs:
        raise VerifierError(f"only {n_win} windows of {L} tokens for pretraining; need >= batch_size {bs}")
    windows = stream[: n_win * L + 1]
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], betas=(0.9, 0.95), weight_decay=0.1)
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(n_win, generator=g)
    losses, t0, cursor = [], time.perf_counter(), 0
    model.train()
    bar = tqdm(range(steps), desc="pretrain verifier", mininterval=5)
    for step in bar:
        lr = cfg["lr"] * min(1.0, (step + 1) / cfg["warmup_steps"]) * 0.5 * (1 + math.cos(math.pi * step / steps))
        for group in opt.param_groups:
            group["lr"] = lr
        if cursor + bs > n_win:
            order, cursor = torch.randperm(n_win, generator=g), 0
        idx = order[cursor: cursor + bs]
        cursor += bs
        x = torch.stack([windows[i * L: i * L + L] for i in idx])
        y = torch.stack([windows[i * L + 1: i * L + L + 1] for i in idx])
        logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 50 == 0 or step == steps - 1:
            bar.set_postfix(loss=f"{loss.item():.3f}")
            logger.info("step %d loss %.4f lr %.2e", step, loss.item(), lr)
    model.eval()
    summary = {"steps": steps, "tokens_seen": steps * bs * L, "stream_tokens": int(len(stream)),
               "first_loss": losses[0], "final_loss": sum(losses[-20:]) / len(losses[-20:]),
               "seconds": time.perf_counter() - t0,
               "parameters": sum(p.numel() for p in model.parameters())}
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        write_json(tmp / "pretrain_summary.json", summary)
        write_manifest(tmp)
    return summary
