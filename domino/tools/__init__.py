"""Checks a user runs by hand, ``python -m domino.tools.<name>``; the workflow never calls them.
Each prints its use with ``--help``."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from ..schema import section_defaults

if TYPE_CHECKING:
    from transformers import Qwen3Config

    from ..model import DrafterConfig


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and each argument's default after its help."""


def tool_parser(name: str, doc: str) -> argparse.ArgumentParser:
    """The parser of ``python -m domino.tools.<name>``: its module docstring is the description."""
    return argparse.ArgumentParser(prog=f"python -m domino.tools.{name}", description=doc,
                                   formatter_class=_HelpFormatter)


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    """``--threads`` of a tool that times decodes, by default the benchmark job's count (the schema's
    ``benchmark.threads``), so that the tool measures what the benchmark measures. A second
    thread does not pay at the embedded default's shapes: with OpenMP's waiting threads asleep
    (``PASSIVE``, which ``import domino`` selects) every small parallel operation wakes one,
    and two threads made each part of a speculative step 3 to 4.5 times slower there."""
    parser.add_argument("--threads", type=int, default=section_defaults("benchmark")["threads"],
                        help="torch CPU threads (the benchmark job's count)")


def wait_policy() -> str:
    """OpenMP's wait policy in this process, as the environment sets it, for a tool's header."""
    if "OMP_WAIT_POLICY" in os.environ:
        return os.environ["OMP_WAIT_POLICY"]
    if "GOMP_SPINCOUNT" in os.environ:
        return "GOMP_SPINCOUNT=" + os.environ["GOMP_SPINCOUNT"]
    return "libgomp's default"


# the card's drafter over Qwen3-0.6B (domino.shapes.QWEN3_0_6B), as DrafterConfig fields that the
# tools build it from: 3 layers, block 8, aux ids [1, 13, 25] of the 28-layer verifier, a 32,000-token
# draft vocabulary, the Domino head's GRU 1024 / bottleneck 256, <|MASK|> at Qwen3's first unused row.
# config/card.yaml states the same values for the workflow (a test keeps them equal); projector and
# shift_label are left to the caller, as the card trains DFlash and Domino drafters alike.
CARD_DRAFTER = dict(num_layers=3, block_size=8, aux_layer_ids=[1, 13, 25], draft_vocab_size=32000,
                    gru_hidden_size=1024, bottleneck_size=256, mask_token_id=151669, correct_from=1)


def card_drafter_config(verifier_config: Qwen3Config | None = None, **overrides) -> DrafterConfig:
    """The card's drafter over ``verifier_config`` (default: Qwen3-0.6B's), with ``overrides``
    (``projector`` and ``shift_label``, which the caller names, ``attn_implementation``, ...)
    replacing ``CARD_DRAFTER`` or adding fields; a field neither names takes the config schema's
    default."""
    from ..model import DrafterConfig
    from ..shapes import qwen3_config

    verifier_config = verifier_config if verifier_config is not None else qwen3_config()
    return DrafterConfig.schema_defaults(verifier_config, **{**CARD_DRAFTER, **overrides})
