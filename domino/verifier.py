"""Load a verifier: a hub id or a local ``save_pretrained`` directory, checked to be a Qwen3
causal LM the drafter can copy, with its tokenizer, end-of-generation ids and mask token.

The embedded verifier is written by ``domino.embedded`` and loads here like any other.
"""

from __future__ import annotations

from pathlib import Path

from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from .attention import GROUPED_SDPA
from .common import DTYPES

MASK_TOKEN = "<|MASK|>"


class VerifierError(ValueError):
    """A verifier this project cannot draft for."""


def check_local(path: str) -> None:
    """Refuse a local path that is not a directory, naming it, before transformers reads it as a
    malformed hub id. A path is local unless it reads as ``org/name`` (``domino.config.is_local_source``)."""
    from .config import is_local_source

    if is_local_source(str(path)) and not Path(path).expanduser().is_dir():
        where = "" if Path(path).expanduser().is_absolute() else f" (relative paths are read from {Path.cwd()})"
        raise VerifierError(f"{str(path)!r} is not a directory{where}; a "
                            "local verifier is a save_pretrained directory, such as results/verifier/model once "
                            "the verifier rule has run, and a hub verifier an id like Qwen/Qwen3-0.6B")


def check_files(path: str) -> None:
    """A local verifier or tokenizer folder written by this workflow, checked against its
    manifest (a hub id or a folder without one is not checked)."""
    from .io import check_manifest

    if Path(path).is_dir():
        check_manifest(path, "verifier" if Path(path).name != "tokenizer" else "tokenizer")


def load_tokenizer(path: str):
    """The verifier's tokenizer, from the same hub id or directory."""
    check_local(path)
    check_files(path)
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
    check_local(path)
    if Path(path).expanduser().is_dir() and not (Path(path).expanduser() / "config.json").exists():
        raise VerifierError(f"{str(path)!r} has no config.json (allowed: a save_pretrained directory)")
    check_files(path)
    try:
        config = AutoConfig.from_pretrained(path)
    except OSError as err:
        raise VerifierError(f"cannot load the verifier from {path!r}: {err}") from None
    check_qwen3_like(config)
    # transformers' SDPA, with grouped heads kept grouped under a mask on a CPU (domino.attention)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype],
                                                 attn_implementation=GROUPED_SDPA).to(device).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model
