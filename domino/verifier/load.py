"""Load a verifier: a hub id or a local ``save_pretrained`` directory, checked to be a causal LM
the drafter can read (``domino.verifier.facts.check_verifier_config``), with its tokenizer, its end of
turn, its end-of-generation ids and its mask token.

A decoder-only causal LM of transformers whose layers all attend to the whole context, of a
tested family (``domino.verifier.families``: Qwen3, Qwen2, Llama, Mistral, Gemma, GPT-2, GPT-NeoX), can
verify; the drafter's own layers stay Qwen3-style whatever the verifier, as the card's and vLLM's
DFlash drafters are, and share only its hidden size, heads and embedding. The embedded verifier
(``domino.verifier.embedded``) and a converted GGUF verifier (``domino.verifier.gguf``) load here like any other.
"""

from __future__ import annotations

from pathlib import Path

from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from ..aux import decoder_parts
from ..common import DTYPES
from ..schema import ConfigError
from .attention import GROUPED_SDPA
from .facts import check_verifier_config, is_local_source, shape_fields, tokenizer_files_problem, unused_special_ids
from .families import EMBEDDINGS, FINAL_NORMS, LAYERS, SHAPE_ALIASES

MASK_TOKEN = "<|MASK|>"


class VerifierError(ValueError):
    """A verifier this project cannot draft for."""


def check_local(path: str) -> None:
    """Refuse a local path that is not a directory, naming it, before transformers reads it as a
    malformed hub id. A path is local unless it reads as ``org/name`` (``domino.verifier.facts.is_local_source``)."""
    if is_local_source(str(path)) and not Path(path).expanduser().is_dir():
        where = "" if Path(path).expanduser().is_absolute() else f" (relative paths are read from {Path.cwd()})"
        raise VerifierError(f"{str(path)!r} is not a directory{where}; a "
                            "local verifier is a save_pretrained directory, such as results/verifier/model once "
                            "the verifier rule has run, and a hub verifier an id like Qwen/Qwen3-0.6B")


def check_files(path: str) -> None:
    """A local verifier or tokenizer folder written by this workflow, checked against its
    manifest (a hub id or a folder without one is not checked)."""
    from ..io import check_manifest

    if Path(path).is_dir():
        check_manifest(path, "verifier" if Path(path).name != "tokenizer" else "tokenizer")


def load_tokenizer(path: str):
    """The verifier's tokenizer, from the same hub id or directory (a directory without usable
    tokenizer files is refused naming it, where transformers' own message names no folder)."""
    check_local(path)
    check_files(path)
    problem = tokenizer_files_problem(path) if Path(path).expanduser().is_dir() else None
    if problem:
        raise VerifierError(problem)
    return AutoTokenizer.from_pretrained(path)


def end_of_turn(tokenizer, chat_template_kwargs=None) -> str | None:
    """The special token the chat template writes right after an assistant turn's content
    (``<|im_end|>`` for ChatML, ``<|eot_id|>`` for Llama 3), None when it writes none.

    Read by rendering a two-turn conversation with sentinel contents: the end of turn is the
    longest special token that starts where the assistant's content ends."""
    if not getattr(tokenizer, "chat_template", None):
        raise VerifierError(f"the tokenizer of {tokenizer.name_or_path!r} has no chat template (allowed: a "
                            "tokenizer whose tokenizer_config.json or chat_template.jinja holds one)")
    sentinel = "\u2063domino-reply\u2063"
    text = tokenizer.apply_chat_template([{"role": "user", "content": "\u2063domino-ask\u2063"},
                                          {"role": "assistant", "content": sentinel}], tokenize=False,
                                         **(chat_template_kwargs or {}))
    after = text[text.rindex(sentinel) + len(sentinel):] if sentinel in text else ""
    found = [t for t in tokenizer.all_special_tokens + [str(t) for t in tokenizer.added_tokens_decoder.values()
                                                        if t.special] if t and after.startswith(t)]
    return max(found, key=len) if found else None


def mask_token_id(tokenizer, configured: int | None, stop_ids=(), embedding_rows: int | None = None) -> int:
    """The token that fills a block's masked slots, the first of:

    1. the configured id (``drafter.mask_token_id``);
    2. the tokenizer's ``<|MASK|>``;
    3. the first embedding row past the tokenizer's tokens, when the verifier's embedding has such
       free rows (``embedding_rows``, its ``vocab_size``): Qwen3-0.6B's 151,669, the card's mask;
    4. the highest-id special token that the verifier never writes in a conversation: not an
       end-of-generation id, not bos, pad or unk, nowhere in the chat template's text. SmolLM2 has
       neither a ``<|MASK|>`` nor a free row; its last special token, ``<empty_output>`` (a
       code-notebook marker), is such a token.

    The mask is never a stop token: a masked slot that read as the end of generation would teach
    the drafter to stop."""
    stop = set(stop_ids)
    if configured is not None:
        if int(configured) in stop:
            raise VerifierError(f"drafter.mask_token_id: {configured} is an end-of-generation id of the verifier "
                                f"(allowed: any other token; ends {sorted(stop)})")
        return int(configured)
    tid = tokenizer.convert_tokens_to_ids(MASK_TOKEN)
    if tid is not None and tid != tokenizer.unk_token_id:
        return int(tid)
    if embedding_rows is not None and embedding_rows > len(tokenizer):
        return len(tokenizer)
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
    named = {getattr(tokenizer, f"{k}_token_id", None) for k in ("bos", "eos", "pad", "unk")}
    unused = unused_special_ids({i: str(t) for i, t in tokenizer.added_tokens_decoder.items() if t.special},
                                stop | named, template)
    if not unused:
        raise VerifierError(f"the tokenizer of {tokenizer.name_or_path!r} has no {MASK_TOKEN} token, the "
                            "verifier's embedding no free row and the tokenizer no special token unused in "
                            "conversations: set drafter.mask_token_id to a token the verifier never writes")
    return int(max(unused))


def eos_ids(tokenizer, model_config, generation_config=None) -> list[int]:
    """Token ids that end generation, ascending: every ``eos_token_id`` of the verifier's
    generation config (an int or a list; Qwen3 lists ``<|im_end|>`` and ``<|endoftext|>``, and
    ``generate`` and vLLM stop on each), the model config's, the chat template's end of turn
    (``end_of_turn``) and the tokenizer's eos token.

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
    turn_end = end_of_turn(tokenizer) if getattr(tokenizer, "chat_template", None) else None
    for t in (turn_end, tokenizer.eos_token):
        tid = tokenizer.convert_tokens_to_ids(t) if t else None
        if tid is not None and tid != tokenizer.unk_token_id:
            ids.add(int(tid))
    return sorted(ids)


def check_causal_lm(model) -> None:
    """Refuse a loaded model whose modules the drafter and ``domino.aux.AuxCapture`` cannot read:
    the base model's embedding, decoder layers and final norm (by the names of
    ``domino.aux.decoder_parts``, the families' names) and output embeddings."""
    parts = decoder_parts(model)
    names = {"embed": EMBEDDINGS, "layers": LAYERS, "norm": FINAL_NORMS}
    missing = [f"base model {'|'.join(names[k])}" for k in names if parts[k] is None] if parts["base"] is not None \
        else ["a base model (model, transformer, ...)"]
    if model.get_output_embeddings() is None:
        missing.append("output embeddings (lm_head)")
    if missing:
        raise VerifierError(f"verifier {type(model).__name__} lacks {', '.join(missing)} (allowed: a decoder-only "
                            "causal LM of transformers, such as Qwen3ForCausalLM or LlamaForCausalLM)")


def load_verifier(path: str, dtype: str = "float32", device: str = "cpu"):
    """``AutoModelForCausalLM.from_pretrained`` after checking the config (``check_verifier_config``)
    and, once loaded, the modules (``check_causal_lm``)."""
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
    try:
        check_verifier_config(config.to_dict())
    except ConfigError as err:
        raise VerifierError(str(err)) from None
    # transformers' SDPA, with grouped heads kept grouped under a mask on a CPU (domino.verifier.attention)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype],
                                                 attn_implementation=GROUPED_SDPA).to(device).eval()
    check_causal_lm(model)
    _fill_shape_fields(model.config)
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def _fill_shape_fields(config) -> None:
    """Give the loaded config the shape fields the drafter reads (``DrafterConfig.from_verifier``)
    under their usual names where its family names them otherwise or leaves them out
    (``domino.verifier.facts.shape_fields``: GPT-2's ``n_inner``, a LayerNorm's epsilon, full-size
    key/value heads); a field the config already answers is left as it is."""
    filled = shape_fields(config.to_dict())
    for key in (*SHAPE_ALIASES, "num_key_value_heads"):
        if getattr(config, key, None) is None and filled.get(key) is not None:
            setattr(config, key, filled[key])
