"""The config schema's light facts, read by every room: where the schema ships, each section's
keys and defaults, what the ``train.noise*`` keys mean, the error a refused value raises
(``ConfigError``) and what a hub id looks like. The gate that checks a whole run (cross checks
against the verifier's offline facts, overlays) is ``domino.config``; it imports this."""

from __future__ import annotations

import copy
import functools
import re
from pathlib import Path
from typing import NamedTuple

import yaml

SCHEMA = Path(__file__).resolve().parent / "config.schema.yaml"  # shipped inside the package
# a Hugging Face hub id (org/name), as verifier.source and benchmark.sources name one
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


class ConfigError(ValueError):
    """A config value the workflow refuses."""


def load_schema(path: str | Path = SCHEMA) -> dict:
    return yaml.safe_load(Path(path).read_text())


@functools.lru_cache(maxsize=1)
def _shipped_schema() -> dict:
    return load_schema()


def _section_schema(section: str) -> dict:
    """The shipped schema's node of ``section``, a dotted path (``"train"``, ``"verifier.embedded"``)."""
    node = _shipped_schema()
    for part in section.split("."):
        node = node["properties"][part]
    return node


def section_keys(section: str) -> list[str]:
    """Every key the schema declares in ``section`` (a dotted path), in the schema's order."""
    return list(_section_schema(section)["properties"])


def section_defaults(section: str) -> dict:
    """The schema's default of every key of ``section`` that has one (``"train"``, ``"drafter"``,
    a dotted path such as ``"verifier.embedded"``): what a config that leaves them out is given.

    The schema is the one owner of these values; tests and tools that build a ``TrainConfig`` or
    a ``DrafterConfig`` without a config file start from here."""
    return {k: copy.deepcopy(v["default"]) for k, v in _section_schema(section)["properties"].items()
            if "default" in v}


# -----------------------------------------------------------------------------
# what the train.noise* keys mean (domino.train.batches draws the noise; the card describes it)


class AuxNoise(NamedTuple):
    """Noise added to the auxiliary states of training rows: ``uniform`` draws from
    ``[-scale, scale)``, ``gaussian`` from ``N(0, scale^2)``; ``none`` (or scale 0) adds nothing.

    ``dtype`` says where the sum is formed: ``float32`` adds the noise to the states cast to
    float32; ``storage`` rounds the noise to the features' storage dtype and adds it there, so
    the noisy states are rounded to that dtype (speculators PR 685 adds its noise after casting
    the states to bf16, where a step between neighbouring values is 1/16 for 8 <= |x| < 16, so
    noise of 0.05 leaves most such values unchanged)."""

    kind: str = "none"
    scale: float = 0.0
    dtype: str = "float32"

    @property
    def active(self) -> bool:
        return self.kind != "none" and self.scale > 0


def aux_noise(noise: str, noise_scale: float, noise_dtype: str = "float32") -> AuxNoise:
    """The noise of training rows from ``train.noise``, ``train.noise_scale`` and ``train.noise_dtype``."""
    if noise_dtype not in ("float32", "storage"):
        raise ValueError(f"noise_dtype must be float32 or storage, got {noise_dtype!r}")
    return AuxNoise(noise, noise_scale if noise != "none" else 0.0, noise_dtype)


def card_model_name(verifier_name: str, block_size: int) -> str:
    """The card's name when ``report.model_name`` is null: the verifier's name, its last part
    (``Qwen/Qwen3-0.6B`` and a folder's path alike), then ``-Domino-b<block_size>``:
    ``Qwen3-0.6B-Domino-b8``, the published card's."""
    return f"{verifier_name.rstrip('/').split('/')[-1]}-Domino-b{block_size}"
