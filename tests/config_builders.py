"""Config builders shared by test_scale.py and test_report.py (candidates for conftest.py)."""

import json
from pathlib import Path

import yaml
from snakemake.utils import update_config

from domino import scale
from domino.config import validate_config
from domino.shapes import QWEN3_0_6B

ROOT = Path(__file__).resolve().parent.parent


def load(*files, **verifier):
    """Config files merged as Snakemake merges --configfile overlays, then validated."""
    cfg = {}
    for f in files:
        update_config(cfg, yaml.safe_load((ROOT / f).read_text()))
    if verifier:
        update_config(cfg, {"verifier": verifier})
    return validate_config(cfg)


def random_verifier_dir(tmp_path) -> Path:
    """A config-only stand-in for `python -m domino.random_verifier` output: Qwen3-0.6B's config and the marker."""
    d = tmp_path / "random_verifier"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen3", "num_hidden_layers": QWEN3_0_6B["num_hidden_layers"],
                                               **{k: QWEN3_0_6B[k] for k in ("vocab_size", "hidden_size",
                                                                             "num_attention_heads", "head_dim")}}))
    (d / scale.RANDOM_WEIGHTS_MARKER).write_text("{}")
    return d
