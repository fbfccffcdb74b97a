"""The decoders a benchmark job runs beside plain greedy and the trained drafters that need no
training of their own, behind one seam: a ``Kind`` per decoder (its config section, the label the
card gives its row, whether it drafts with a trained checkpoint, and how it is built), and
``decoder_specs`` turning ``benchmark`` config into the job's rows, in order. Row names, the
workflow's outputs, the results files' ``row`` and ``decoder`` records and the card's rows all
come from here; ``docs/extending.md`` shows the whole change for a new decoder.

Light on import (the workflow reads the row names): what a decoder is built from is imported
only when ``build`` runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class DecoderSpec:
    """One row: its name, its ``Kind``'s name, the settings it is built with (a copy of its
    config sections) and the checkpoint it drafts with (None: none)."""

    name: str
    kind: str
    settings: dict = field(default_factory=dict)
    checkpoint: str | None = None

    def __hash__(self) -> int:  # a job's rows are keyed by spec; a row's name is one row
        return hash((self.name, self.kind, self.checkpoint))

    @property
    def label(self) -> str:
        """How the card names the row, ``{checkpoint}`` standing for its checkpoint's label."""
        return KINDS[self.kind].label

    @property
    def free(self) -> bool:
        """A model-free row (no trained drafter): the bar a trained drafter must clear."""
        return KINDS[self.kind].free

    def record(self) -> dict:
        """What a results file says of the row (``decoder``)."""
        return {"kind": self.kind, "label": self.label, "free": self.free, "checkpoint": self.checkpoint,
                "settings": self.settings}


@dataclass(frozen=True)
class Kind:
    """A decoder: ``rows(bench, checkpoints)`` its specs from the ``benchmark`` section (none when
    off), ``label`` how the card names its row (``{checkpoint}``: the checkpoint's label, which the
    card fills in), ``free`` whether it drafts without a
    trained checkpoint, ``build(spec, neural)`` the drafter the loop decodes with (``neural``: the
    checkpoint's ``domino.decode.NeuralDraft``, or None). ``every_step``: whether every step of
    the decode sends a draft, so that its acceptance length counts every step, as a trained
    drafter's does; a decoder that may send nothing (a plain step, which its acceptance length
    leaves out) has an acceptance length of another definition, which the card compares with no
    other row's."""

    rows: Callable[[dict, list[str]], list[DecoderSpec]]
    label: str
    free: bool
    build: Callable[[DecoderSpec, object], object]
    every_step: bool = False
    sections: tuple[str, ...] = ()  # the config sections its rows read (the benchmark stage declares them)
    cost_aware: bool = False  # its drafts are chosen by the costs the job measured (domino.adaptive): a timing
    describe: Callable[[dict], str] | None = None  # how it drafts, one sentence of the card's, from its settings
    # (a kind it makes unnecessary, the card's sentence when that kind's row is not decoded beside it)
    replaces: tuple[str, str] | None = None


def _ngram_rows(bench: dict, checkpoints) -> list[DecoderSpec]:
    ng = bench["ngram"]
    settings = {k: ng[k] for k in ("max_n", "min_n", "drafts")}
    return [DecoderSpec("ngram", "ngram", settings)] if ng["enabled"] else []


def _ngram_then_rows(bench: dict, checkpoints) -> list[DecoderSpec]:
    ng = bench["ngram"]
    if not ng["enabled"] or ng["then"] is None:
        return []
    return [DecoderSpec(f"ngram-{ng['then']}", "ngram-then", {k: ng[k] for k in ("max_n", "min_n", "drafts")},
                        ng["then"])]


def _suffix_rows(bench: dict, checkpoints) -> list[DecoderSpec]:
    s = bench["suffix"]
    return [DecoderSpec("suffix", "suffix", {k: v for k, v in s.items() if k != "enabled"})] if s["enabled"] else []


def _cost_aware_settings(bench: dict) -> dict:
    ca = bench["cost_aware"]
    return {"probe_every": ca["probe_every"]}


def _adaptive_rows(bench: dict, checkpoints) -> list[DecoderSpec]:
    ca = bench["cost_aware"]
    if ca["checkpoint"] is None or not ca["adaptive"]:
        return []
    return [DecoderSpec(f"{ca['checkpoint']}-adaptive", "adaptive", _cost_aware_settings(bench), ca["checkpoint"])]


def _hybrid_rows(bench: dict, checkpoints) -> list[DecoderSpec]:
    ca = bench["cost_aware"]
    if ca["checkpoint"] is None or not ca["hybrid"]:
        return []
    settings = {**_cost_aware_settings(bench), "free": list(ca["free"])}
    if "suffix" in ca["free"]:
        settings["suffix"] = {k: v for k, v in bench["suffix"].items() if k != "enabled"} | dict(ca.get("suffix") or {})
    if "ngram" in ca["free"]:
        settings["ngram"] = {k: bench["ngram"][k] for k in ("max_n", "min_n", "drafts")}
    return [DecoderSpec("hybrid", "hybrid", settings, ca["checkpoint"])]


def ngram_draft(s: dict):
    """The n-gram lookup of a row's settings (``benchmark.ngram``'s ``drafts``, ``max_n``, ``min_n``)."""
    from .decode import NgramDraft
    return NgramDraft(s["drafts"], s["max_n"], s["min_n"])


def _build_ngram_then(spec: DecoderSpec, neural):
    from .decode import LookupThenDraft
    return LookupThenDraft(neural, spec.settings["max_n"], spec.settings["min_n"])


def suffix_draft(s: dict):
    """The suffix cache of a row's settings (``benchmark.suffix``'s keys but ``enabled``)."""
    from .suffix import SuffixDraft
    return SuffixDraft(s["drafts"], s["max_depth"], s["max_spec_factor"], s["max_spec_offset"], s["min_token_prob"])


def _build_adaptive(spec: DecoderSpec, neural):
    from .adaptive import CostAwareDraft
    return CostAwareDraft(neural, probe_every=spec.settings["probe_every"])


def _build_hybrid(spec: DecoderSpec, neural):
    from .adaptive import CostAwareDraft, NgramSource, SuffixSource
    s = spec.settings
    free = {"suffix": lambda: SuffixSource(suffix_draft(s["suffix"])),
            "ngram": lambda: NgramSource(ngram_draft(s["ngram"]))}
    return CostAwareDraft(neural, {name: free[name]() for name in s["free"]}, probe_every=s["probe_every"])


def _describe_ngram(s: dict) -> str:
    return (f"The lookup drafts what followed the latest earlier occurrence of the context's last {s['max_n']} "
            f"(down to {s['min_n']}) tokens, {s['drafts']} tokens a step, and a step without a match is a plain step, "
            "which its acceptance length does not count.")


def _describe_suffix(s: dict) -> str:
    return ("The suffix cache drafts the most frequent continuation of the context's tail in a tree over the prompt "
            "and the output so far and one over **the earlier answers of the same job** (in prompt order: only "
            "answers already produced, never the current prompt's), up to "
            f"{s['drafts']} tokens a step; a step without a match is a plain step.")


# The registry, in the order a job's rows are listed: the model-free rows, then those over a checkpoint.
KINDS: dict[str, Kind] = {
    "ngram": Kind(_ngram_rows, "n-gram lookup, no training", True, lambda spec, n: ngram_draft(spec.settings),
                  sections=("benchmark.ngram",),
                  describe=_describe_ngram),
    "suffix": Kind(_suffix_rows, "suffix cache, no training", True, lambda spec, n: suffix_draft(spec.settings),
                   sections=("benchmark.suffix",), describe=_describe_suffix),
    "ngram-then": Kind(_ngram_then_rows, "n-gram lookup, then {checkpoint}", False, _build_ngram_then,
                       every_step=True, sections=("benchmark.ngram",)),
    "adaptive": Kind(_adaptive_rows, "{checkpoint}, cost-aware", False, _build_adaptive,
                     sections=("benchmark.cost_aware",), cost_aware=True),
    "hybrid": Kind(_hybrid_rows, "hybrid: {checkpoint}, the free drafts or none, cost-aware", False,
                   _build_hybrid, sections=("benchmark.cost_aware", "benchmark.suffix", "benchmark.ngram"),
                   cost_aware=True,
                   replaces=("ngram-then", "The lookup-then-{checkpoint} row is not decoded: the hybrid row chooses "
                             "each step between {checkpoint}'s draft, the free drafts and none by their measured "
                             "cost, which covers what that row did (the lookup where it matches, {checkpoint} "
                             "elsewhere); `benchmark.ngram.then` brings it back.")),
}
SECTIONS = tuple(dict.fromkeys(s for kind in KINDS.values() for s in kind.sections))  # every kind's, once

RESERVED = ("baseline", "ngram", "suffix", "hybrid")  # row names no checkpoint may take
RESERVED_PATTERNS = ("ngram-*", "*-adaptive")


def decoder_specs(bench: dict, checkpoints=()) -> list[DecoderSpec]:
    """The job's untrained rows from the ``benchmark`` config section, in ``KINDS`` order."""
    return [spec for kind in KINDS.values() for spec in kind.rows(bench, list(checkpoints))]


def build(spec: DecoderSpec, neural=None):
    """The drafter of ``spec``'s row; ``neural``: its checkpoint's ``NeuralDraft`` where it has one."""
    if KINDS[spec.kind].free != (spec.checkpoint is None):
        raise ValueError(f"decoder {spec.name}: kind {spec.kind} {'needs no' if KINDS[spec.kind].free else 'needs a'} checkpoint")
    return KINDS[spec.kind].build(spec, neural)


LOOKUP = "ngram"  # the n-gram lookup's row name (benchmark.ngram), the one row vLLM also serves


def untrained_rows(cfg: dict) -> list[str]:
    """The benchmark's rows that need no training of their own (the n-gram lookup, the suffix
    cache, the lookup-then-checkpoint row, the cost-aware rows), each where configured, in the
    registry's order."""
    return [spec.name for spec in decoder_specs(cfg["benchmark"], cfg["checkpoints"])]


def vllm_rows(cfg: dict) -> list[str]:
    """What vLLM serves: the plain verifier, every checkpoint (``domino.vllm.plugin``) and the
    n-gram lookup row where the benchmark decodes it (vLLM's ``ngram`` method; the
    lookup-then-checkpoint row has no vLLM method)."""
    return ["baseline"] + list(cfg["checkpoints"]) + [r for r in untrained_rows(cfg) if r == LOOKUP]
