"""The verifier's offline facts: what the config gate (``domino.config``) and the loader
(``domino.verifier.load``) know of a verifier before any model loads, read without torch (the
workflow reads them when it plans a run).

The shape fields by each family's own names (the families, one entry each, are
``domino.verifier.families``'s), the check of a verifier's config, its depth, vocabulary and the
token ids its files name (``verifier_facts``), the aux-layer ids a depth gives, its tokenizer files, and whether a source is a local folder or a hub id
that can be loaded. A refusal is a ``domino.schema.ConfigError``: one line naming the key.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..schema import HUB_ID, ConfigError
from .families import FAMILIES, FINAL_NORM_AT, REFUSED_FAMILIES, SHAPE_ALIASES, VERIFIER_FAMILIES


def shape_fields(c: dict) -> dict:
    """A verifier's config (a mapping) with the drafter's shape fields filled in from the family's
    own names; key/value heads, when not given, as many as the query heads (GPT-2, GPT-NeoX);
    the MLP size, when the config leaves it null, the family's multiple of the hidden size
    (``Family.mlp_ratio``: GPT-2's ``n_inner`` null is four times the hidden size, as GPT-2 builds it)."""
    out = dict(c)
    for key, names in SHAPE_ALIASES.items():
        if out.get(key) is None:
            out[key] = next((out[n] for n in names if out.get(n) is not None), None)
    family = FAMILIES.get(out["model_type"]) if isinstance(out.get("model_type"), str) else None
    ratio = family.mlp_ratio if family is not None else None
    if out.get("intermediate_size") is None and ratio is not None and isinstance(out.get("hidden_size"), int):
        out["intermediate_size"] = ratio * out["hidden_size"]
    if out.get("num_key_value_heads") is None:
        out["num_key_value_heads"] = out.get("num_attention_heads")
    return out


def check_verifier_config(c: dict, key: str = "verifier.source", shape: bool = True) -> None:
    """Refuse, in one line naming the field, a verifier config the drafter cannot read or serve:
    shape fields missing (``shape``: checked when the model loads, where the config is complete),
    sliding-window layers (the drafter reads every position's state and the decoding loop keeps a
    full cache), rope settings per layer type, logit soft-capping, a refused family
    (``REFUSED_FAMILIES``). Shape fields are read by the family's own names too (GPT-2's ``n_layer``)."""
    c = shape_fields(c)
    if c.get("model_type") in REFUSED_FAMILIES:
        raise ConfigError(f"{key}: model_type {c['model_type']!r}: {REFUSED_FAMILIES[c['model_type']]} (allowed: a "
                          f"tested family: {', '.join(VERIFIER_FAMILIES.values())})")
    needed = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
              "intermediate_size", "vocab_size", "rms_norm_eps")
    missing = [k for k in needed if c.get(k) is None] if shape else []
    if missing:
        raise ConfigError(f"{key}: model_type {c.get('model_type')!r} has no {', '.join(missing)} (allowed: a "
                          "decoder-only causal LM with an RMSNorm or LayerNorm, such as Qwen3, Llama or GPT-2)")
    layer_types = set(c.get("layer_types") or ())
    if layer_types - {"full_attention"}:
        raise ConfigError(f"{key}: layer_types {sorted(layer_types)} (allowed: full_attention in every layer)")
    if c.get("sliding_window") is not None and c.get("use_sliding_window", True):
        raise ConfigError(f"{key}: sliding_window {c['sliding_window']} (allowed: null, or use_sliding_window false)")
    rope = c.get("rope_parameters")
    if isinstance(rope, dict) and any(isinstance(v, dict) for v in rope.values()) or "rope_local_base_freq" in c:
        raise ConfigError(f"{key}: rope_parameters per layer type (allowed: one rope setting for every layer)")
    for cap in ("final_logit_softcapping", "attn_logit_softcapping"):
        if c.get(cap) is not None:
            raise ConfigError(f"{key}: {cap} {c[cap]} (allowed: null; soft-capped logits are not served here)")


def default_aux_layer_ids(layers: int) -> list[int]:
    """The aux-layer ids of a verifier of depth ``layers`` when the config gives none, in the
    speculators convention (``domino.aux``): ``[1, L/2 - 1, L - 3]`` from 8 layers up, the rule
    behind the card's ``[1, 13, 25]`` for Qwen3-0.6B's 28 layers (30 layers give ``[1, 14, 27]``);
    below 8 layers, where that rule repeats ids, the distinct ids of ``[1, L/2, L - 1]``: the
    embedded default's ``[1, 2, 3]`` for 4 layers, ``[1, 2]`` for 3, ``[1]`` for 1 or 2."""
    if layers >= 8:
        return [1, layers // 2 - 1, layers - 3]
    return sorted({max(1, i) for i in (1, layers // 2, layers - 1)})


# The files a tokenizer is built from, any one of which is enough: a fast tokenizer, a
# sentencepiece model, a BPE vocabulary with its merges, a WordPiece vocabulary.
TOKENIZER_FILES = (("tokenizer.json",), ("tokenizer.model",), ("spiece.model",), ("vocab.json", "merges.txt"),
                   ("vocab.txt",))


def tokenizer_files_problem(folder: str | Path) -> str | None:
    """Why a local verifier folder holds no usable tokenizer (None when it holds one): the data,
    the benchmark prompts and the chat template all go through the tokenizer saved beside the model."""
    folder = Path(folder)
    if any(all((folder / f).is_file() for f in files) for files in TOKENIZER_FILES):
        return None
    looked = ", ".join(" with ".join(files) for files in TOKENIZER_FILES)
    return (f"{str(folder)!r} has no usable tokenizer files (looked for {looked}; allowed: a folder with its "
            "tokenizer saved beside the model, tokenizer.save_pretrained)")


# directories of a workflow run: a verifier source that starts with one is a local path
RUN_DIRS = ("results", "reports", "logs", "benchmarks", "runs", "config")


def is_local_source(src: str, checkout: str | Path | None = None) -> bool:
    """A verifier source is a local directory unless it reads as a hub id (``org/name``).

    A path that exists, starts with ``/ . ~``, has any number of slashes but one, or begins with
    one of the workflow's own directories (``results/...``) or with a folder of the run directory
    or the ``checkout`` (``byo/none`` where ``byo/`` is one) is local, so a missing one is refused
    at once instead of being looked up on the hub."""
    if Path(src).expanduser().exists() or src.startswith(("/", ".", "~")) or not HUB_ID.fullmatch(src):
        return True
    org = src.split("/")[0]
    return org in RUN_DIRS or Path(org).is_dir() or (checkout is not None and (Path(checkout) / org).is_dir())


def hub_problem(src: str, timeout: float = 10.0) -> str | None:
    """Why a hub id ``verifier.source`` cannot be loaded, in one line, or None: found in the Hugging
    Face cache (its ``config.json``), or on a hub that answers. Checked as a run starts (not by a dry
    run, which needs no network); a folder or a built-in source is not a hub id and is never asked
    for here."""
    import huggingface_hub as hub
    from huggingface_hub.utils import GatedRepoError, RepositoryNotFoundError

    if isinstance(hub.try_to_load_from_cache(src, "config.json"), str):
        return None
    where = f"not a folder, and not in the Hugging Face cache ({hub.constants.HF_HUB_CACHE})"
    if hub.constants.HF_HUB_OFFLINE:
        return f"verifier.source: {src!r} is {where}, and HF_HUB_OFFLINE is set (allowed: a folder, or a hub id " \
               "downloaded first: hf download " + src + ")"
    try:
        hub.HfApi().model_info(src, timeout=timeout)
    except (RepositoryNotFoundError, GatedRepoError) as err:
        return f"verifier.source: {src!r} is {where}, and the hub has no such model you may read " \
               f"({type(err).__name__}) (allowed: a folder, or a hub id you can download)"
    except Exception as err:  # no network, a proxy, a timeout: the hub did not answer
        return f"verifier.source: {src!r} is {where}, and the hub ({hub.constants.ENDPOINT}) could not be reached " \
               f"({type(err).__name__}) (allowed: a folder, or a hub id downloaded first: hf download {src})"
    return None


def verifier_facts(cfg: dict, checkout: str | Path | None = None) -> dict | None:
    """Layers, vocabulary and tokenizer size of the configured verifier, when knowable offline."""
    v = cfg["verifier"]
    if v["source"] == "gguf":
        from .gguf import GGUFError, header_facts

        if v.get("gguf") is None:
            raise ConfigError("verifier.gguf: required key is missing when verifier.source is 'gguf' (allowed: "
                              "a mapping with distribution, file, sha256 and install)")
        try:
            return header_facts(v["gguf"])
        except GGUFError as err:
            raise ConfigError(f"verifier.gguf: {err}") from None
    if v["source"] == "embedded":
        e = v.get("embedded")
        if e is None:
            raise ConfigError("verifier.embedded: required key is missing when verifier.source is 'embedded' "
                              "(allowed: a mapping of the embedded model's sizes, defaults filled in)")
        # the tokenizer holds vocab_size - 1 trained tokens (ChatML specials included) + <|MASK|> last
        return {"layers": e["num_layers"], "vocab": e["vocab_size"], "real_vocab": e["vocab_size"] - 1,
                "mask_id": e["vocab_size"] - 1, "head_dim": e["head_dim"]}
    src = v["source"]
    path = Path(src).expanduser()
    if not path.exists():
        if is_local_source(src, checkout):
            also = f", then the checkout, here {Path(checkout).resolve()}" if checkout is not None else ""
            raise ConfigError(f"verifier.source: {src!r} does not exist (allowed: 'embedded', a hub id like "
                              "'Qwen/Qwen3-0.6B', or an existing local directory; relative paths are read from "
                              f"the run directory, here {Path.cwd()}{also})")
        return None  # a hub id: checked when it is loaded
    cfile = path / "config.json"
    if not cfile.exists():
        raise ConfigError(f"verifier.source: {src!r} has no config.json (allowed: a save_pretrained directory)")
    try:
        c = json.loads(cfile.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"verifier.source: {cfile} is not valid JSON ({err}) (allowed: a save_pretrained "
                          "directory)") from None
    if not isinstance(c, dict):
        raise ConfigError(f"verifier.source: {cfile} holds no mapping (allowed: a save_pretrained directory)")
    check_verifier_config(c, shape=False)
    c = shape_fields(c)  # GPT-2's n_layer is num_hidden_layers
    missing = [k for k in ("num_hidden_layers", "vocab_size") if not isinstance(c.get(k), int)]
    if missing:
        raise ConfigError(f"verifier.source: {cfile} lacks {', '.join(missing)} as integers (allowed: a complete "
                          "config.json)")
    problem = tokenizer_files_problem(path)
    if problem:
        raise ConfigError(f"verifier.source: {problem}")
    head_dim = c.get("head_dim") or (c["hidden_size"] // c["num_attention_heads"]
                                     if isinstance(c.get("hidden_size"), int) and c.get("num_attention_heads") else None)
    facts = {"layers": c["num_hidden_layers"], "vocab": c["vocab_size"], "real_vocab": None, "mask_id": None,
             "special_ids": set(), "head_dim": head_dim, "named_ids": _named_ids(c, path / "generation_config.json"),
             "mask_found": None,
             "model_type": c.get("model_type"), "final_norm": FINAL_NORM_AT.get(c.get("model_type"), "model.norm")}
    has_tokenizer = (path / "tokenizer_config.json").exists() or (path / "tokenizer.json").exists()
    if has_tokenizer and not (path / "chat_template.jinja").exists() \
            and not _has_chat_template(path / "tokenizer_config.json"):
        raise ConfigError(f"verifier.source: {src!r} has no chat template (allowed: a tokenizer whose "
                          "tokenizer_config.json or chat_template.jinja holds one; the data and the benchmark "
                          "prompts go through it)")
    tfile = path / "tokenizer.json"
    if tfile.exists():
        try:
            t = json.loads(tfile.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ConfigError(f"verifier.source: {tfile} is not valid JSON ({err}) (allowed: a tokenizers "
                              "tokenizer.json)") from None
        ids = set(t.get("model", {}).get("vocab", {}).values() if isinstance(t.get("model", {}).get("vocab"), dict) else [])
        ids |= {a["id"] for a in t.get("added_tokens", [])}
        masks = [a["id"] for a in t.get("added_tokens", []) if a["content"] == "<|MASK|>"]
        specials = {a["id"]: a["content"] for a in t.get("added_tokens", []) if a.get("special")}
        facts["special_ids"] = set(specials)
        facts["real_vocab"] = max(ids) + 1 if ids else None
        facts["mask_id"] = masks[0] if masks else None
        by_text = {**(t.get("model", {}).get("vocab") if isinstance(t.get("model", {}).get("vocab"), dict) else {}),
                   **{a["content"]: a["id"] for a in t.get("added_tokens", [])}}
        named_tokens = _tokenizer_named_ids(path / "tokenizer_config.json", by_text)
        facts["named_ids"] = {**named_tokens, **facts["named_ids"]}
        unused = unused_special_ids(specials, set(facts["named_ids"]), _chat_template_text(path))
        facts["mask_found"] = (facts["mask_id"] is not None or (facts["real_vocab"] or 0) < facts["vocab"]
                               or bool(unused))
    return facts


def unused_special_ids(specials: dict[int, str], excluded: set[int], template: str) -> list[int]:
    """The special tokens (id -> text) a verifier never writes in a conversation, ascending: none
    of ``excluded`` (its end-of-generation, bos, pad and unk ids) and none whose text the chat
    ``template`` holds. The last of them is the mask when the tokenizer has no ``<|MASK|>`` and
    the embedding no free row (``domino.verifier.load.mask_token_id``)."""
    return sorted(i for i, text in specials.items() if i not in excluded and str(text) not in template)


def _chat_template_text(folder: Path) -> str:
    """The chat template's text of a verifier folder (``chat_template.jinja``, or every template
    of ``tokenizer_config.json``), '' when there is none."""
    try:
        return (folder / "chat_template.jinja").read_text()
    except OSError:
        pass
    try:
        template = json.loads((folder / "tokenizer_config.json").read_text()).get("chat_template")
    except (OSError, ValueError, AttributeError):
        return ""
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        return "\n".join(str(x.get("template", "")) for x in template if isinstance(x, dict))
    return template if isinstance(template, str) else ""


def _tokenizer_named_ids(tokenizer_config: Path, by_text: dict) -> dict:
    """The ids of the bos, eos, pad and unk tokens that ``tokenizer_config.json`` names, by
    where they are named (``"tokenizer_config.json eos_token"``)."""
    try:
        tc = json.loads(tokenizer_config.read_text())
    except (OSError, ValueError):
        return {}
    ids = {}
    for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
        token = tc.get(key) if isinstance(tc, dict) else None
        token = token.get("content") if isinstance(token, dict) else token
        if isinstance(token, str) and isinstance(by_text.get(token), int):
            ids.setdefault(by_text[token], f"{tokenizer_config.name} {key}")
    return ids


def _named_ids(c: dict, generation_config: Path) -> dict:
    """The bos, eos and pad ids of a verifier's config.json and its generation config (ints or
    lists), each with where it is first named (``"config.json eos_token_id"``)."""
    try:
        g = json.loads(generation_config.read_text())
    except (OSError, ValueError):
        g = {}
    ids = {}
    for name, source in (("config.json", c), (generation_config.name, g if isinstance(g, dict) else {})):
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            v = source.get(key)
            for i in (v if isinstance(v, list) else [v]):
                if isinstance(i, int) and not isinstance(i, bool):
                    ids.setdefault(i, f"{name} {key}")
    return ids


def _has_chat_template(tokenizer_config: Path) -> bool:
    try:
        return bool(json.loads(tokenizer_config.read_text()).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return False


def check_vocabulary_ids(cfg: dict, facts: dict) -> None:
    """Every token id the verifier's files name (bos, eos, pad: config.json, generation_config.json,
    tokenizer_config.json) lies inside its vocabulary (a negative one, an old config's "no pad"
    ``-1``, names no token and passes), and a verifier folder whose mask token is
    left to be found (``drafter.mask_token_id: null``) has one: a ``<|MASK|>``, a free embedding
    row or a special token it never writes (``domino.verifier.load.mask_token_id``)."""
    vocab = facts["vocab"]
    named = facts.get("named_ids") or {}
    for i in sorted(named):
        if i >= vocab:
            where = named[i] if isinstance(named, dict) else "the verifier's bos, eos or pad"
            raise ConfigError(f"verifier.source: {where} is {i}, outside the verifier's vocabulary of {vocab:,} "
                              f"(vocab_size) (allowed: ids 0..{vocab - 1}; correct it in that file, where a stop "
                              "or pad id of another tokenizer was left)")
    if cfg["drafter"].get("mask_token_id") is None and facts.get("mask_found") is False:
        raise ConfigError(f"drafter.mask_token_id: null finds no mask token in the verifier: its tokenizer has no "
                          f"<|MASK|>, its embedding no free row (vocab_size {vocab:,}, {facts['real_vocab']:,} "
                          "tokens) and no special token it never writes (allowed: drafter.mask_token_id, an id of "
                          "a token the verifier never writes; or the verifier saved with a free row, "
                          "model.resize_token_embeddings(len(tokenizer) + 1))")
