"""The published card's relative claims beside this run's paired figures, each with a computed verdict.

A claim is a relative difference ``d = A / B - 1`` between two checkpoints (``published.CLAIMS``;
a ratio ``r`` the card states is the difference ``r - 1``). This run's figure is the same
difference, paired over the prompts both checkpoints decoded (``domino.stats``: BCa bootstrap,
the benchmark file's own bootstrap settings), with its 95% interval ``[low, high]``.

The verdict, stated once (``verdict``; docs/results.md quotes it), with ``p`` the published value:

* **reproduced in direction and size**: the interval leaves out 0 on the side of ``p`` and
  contains ``p`` itself;
* **same direction, different size**: the interval leaves out 0 on the side of ``p`` but leaves
  out ``p`` too (the run's difference is clearly there, of another size);
* **same direction, interval includes zero**: the estimate lies on the side of ``p``, the interval
  reaches 0: these prompts do not separate the two checkpoints;
* **opposite direction, interval includes zero**: the estimate lies on the other side of 0, the
  interval reaches 0;
* **no difference**: the estimate and both ends of the interval are exactly 0 (the two checkpoints
  give the same figure on every resample of the prompts: they tie);
* an estimate of exactly 0 whose interval is not a point at 0 has no side, and counts as
  **opposite direction, interval includes zero** (it does not lean the published way);
* **contradicted**: the interval leaves out 0 on the other side;
* **no figure**: the run cannot measure the difference (B never accepted a draft there).

One rule withholds every verdict of a run at once (``withheld``), and the card, its appendix and
the reproduction report all read it, so that they give or withhold their verdicts together; each
claim then reads, first that applies:

* **not tested: random verifier**: the verifier has random weights, so no acceptance it yields,
  and no speed that follows from acceptance, says anything about the claim;
* **not tested: the verifier loops**: more than ``REPEATING_SHARE`` of the 4-grams of the
  verifier's own greedy outputs repeat an earlier one (``summary.repeated_4gram_share`` of the
  plain decodes); a verifier that loops is easy to draft for, so its acceptance says nothing of
  the drafter on text;
* **not tested: no draft accepted**: neither checkpoint of the claims had a draft accepted on any
  prompt, so there is no acceptance to compare and their speeds differ only by what drafting costs.

A suite of ``benchmark.suites`` reads the rule on its own plain decodes and rows.

Relative differences carry across scales where absolute figures do not: a run with another
verifier, data and hardware (its scale statement says which) can still test them. What the claims
are to a run depends on its verifier (``claims_scope``, stated once here):

* **reproduction**: the verifier is the published card's own (``Qwen/Qwen3-0.6B`` from the Hub), so
  the run reproduces the card and its card opens with the verdicts;
* **other verifier**: a trained verifier that is not the card's (the embedded one, a GGUF model, a
  local directory, another Hub model), so the run asks whether the claims carry over to it; its
  card opens with this run's own figures, and the verdicts stay in the reproduction report;
* **random verifier**: random weights, so no claim is tested; the figures are set side by side for
  speed, memory and the pipeline only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..stats import paired_relative_difference
from .published import CLAIMS, SETTINGS
from .scale import ScaleStatement
from .tables import Estimate, bootstrap_settings, compare

REPRODUCED = "reproduced in direction and size"
OTHER_SIZE = "same direction, different size"
SAME_NOT_SEPARATED = "same direction, interval includes zero"
OPPOSITE_NOT_SEPARATED = "opposite direction, interval includes zero"
NO_DIFFERENCE = "no difference"
CONTRADICTED = "contradicted"
NO_FIGURE = "no figure"
NOT_TESTED = "not tested: random verifier"
LOOPING = "not tested: the verifier loops"
NOTHING_ACCEPTED = "not tested: no draft accepted"
WITHHELD = (NOT_TESTED, LOOPING, NOTHING_ACCEPTED)  # what every claim reads when the run gives no verdict
VERDICTS = (REPRODUCED, OTHER_SIZE, SAME_NOT_SEPARATED, OPPOSITE_NOT_SEPARATED, NO_DIFFERENCE, CONTRADICTED, NO_FIGURE,
            *WITHHELD)

REPRODUCTION = "reproduction"
OTHER_VERIFIER = "other verifier"
RANDOM_VERIFIER = "random verifier"


REPEATING_SHARE = 0.5  # plain outputs with more of their 4-grams repeating an earlier one: a looping verifier


def repeating_share(plain_summary: dict) -> float | None:
    """The share of the plain (verifier-only) outputs' 4-grams that repeat an earlier one
    (``summary.repeated_4gram_share``) when it exceeds ``REPEATING_SHARE``, else None. A verifier
    that loops (a random-weight one writing one token forever) is easy to draft for: its acceptance
    says nothing of the drafter on text, so no report gives a verdict on such a run (``withheld``)."""
    share = plain_summary.get("repeated_4gram_share")
    return float(share) if share is not None and share > REPEATING_SHARE else None


@dataclass(frozen=True)
class Withheld:
    """Why a run gives no verdict on the published claims: ``verdict``, what each claim reads
    instead (one of ``WITHHELD``); for ``LOOPING`` the plain outputs' repeated 4-gram ``share``
    against the ``limit``; for ``NOTHING_ACCEPTED`` the claims' checkpoints as the card labels
    them (``rows``)."""
    verdict: str
    share: float | None = None
    limit: float = REPEATING_SHARE
    rows: tuple[str, ...] = ()


def claim_checkpoints() -> list[str]:
    """The checkpoints the published claims compare, in the claims' order."""
    return list(dict.fromkeys(r for c in CLAIMS for r in (c["a"], c["b"])))


def _accepted_nothing(bench: dict) -> bool:
    """No draft of the row was accepted on any prompt (its per-prompt records)."""
    return not any(any(p["accepted_per_step"]) for p in bench["prompts"])


def withheld(scope: str, benchmarks: dict[str, dict], labels: dict[str, str]) -> Withheld | None:
    """The one rule (the module docstring's) by which every report withholds its verdicts on the
    published claims: ``scope`` is ``claims_scope``'s, ``benchmarks`` one suite's results by row
    name, "baseline" (the plain decodes) among them, ``labels`` the card's row names. None: the
    run gives its verdicts."""
    if scope == RANDOM_VERIFIER:
        return Withheld(NOT_TESTED)
    share = repeating_share(benchmarks["baseline"]["summary"])
    if share is not None:
        return Withheld(LOOPING, share=share)
    checkpoints = claim_checkpoints()
    if all(_accepted_nothing(benchmarks[r]) for r in checkpoints):
        return Withheld(NOTHING_ACCEPTED, rows=tuple(labels.get(r, r) for r in checkpoints))
    return None


def claims_scope(scale: ScaleStatement) -> str:
    """What the published claims are to this run, by its verifier (the module docstring's three
    scopes): ``REPRODUCTION``, ``OTHER_VERIFIER`` or ``RANDOM_VERIFIER``."""
    if scale.verifier_kind == "random":
        return RANDOM_VERIFIER
    verifier = next(c for c in scale.checks if c.name == "verifier")
    return REPRODUCTION if verifier.matches else OTHER_VERIFIER


def verdict(published: float, measured: Estimate | None) -> str:
    """The verdict on a published relative difference ``published`` (nonzero) given this run's
    paired figure ``measured`` (value, low, high, as relative differences; None: no figure)."""
    if published == 0:
        raise ValueError("a published claim of no difference has no direction to test")
    if measured is None:
        return NO_FIGURE
    side = 1.0 if published > 0 else -1.0
    if measured.value == measured.low == measured.high == 0.0:
        return NO_DIFFERENCE
    if measured.low <= 0.0 <= measured.high:
        return SAME_NOT_SEPARATED if side * measured.value > 0 else OPPOSITE_NOT_SEPARATED
    if side * measured.low > 0:  # the whole interval on the published side
        return REPRODUCED if measured.low <= published <= measured.high else OTHER_SIZE
    return CONTRADICTED


@dataclass(frozen=True)
class ClaimRow:
    pair: str                 # the two checkpoints, "Domino vs DFlash noshift"
    short: str                # the figure compared, "acceptance length"
    stated: str               # the claim as the published card prints it
    kind: str                 # "relative" (printed as +x.x%) or "ratio" (printed as x.xx×)
    published: float          # the claim as a relative difference
    measured: Estimate | None  # this run's paired relative difference; None: no figure
    verdict: str

    @property
    def quantity(self) -> str:
        return f"{self.pair}, {self.short}"

    @property
    def format(self) -> str:
        """The card filter that prints the claim: a signed percentage, or a ratio."""
        return "times" if self.kind == "ratio" else "signed_pct"

    @property
    def published_shown(self) -> str:
        """The published value in the claim's own form: "+27.7%" or "9.70×"."""
        return f"{self.published + 1:.2f}×" if self.kind == "ratio" else f"{100 * self.published:+.1f}%"

    @property
    def shown(self) -> Estimate | None:
        """``measured`` in the claim's own form: a ratio for "ratio" claims."""
        if self.measured is None or self.kind == "relative":
            return self.measured
        m = self.measured
        return Estimate(m.value + 1.0, m.low + 1.0, m.high + 1.0)


def _first_draft_difference(bench_a: dict, bench_b: dict) -> Estimate | None:
    """Paired relative difference of the a+1 acceptance rate (steps accepting at least one draft
    over steps), A over B; None when B accepted no first draft (no ratio to take)."""
    boot = bootstrap_settings(bench_a)
    counts = []
    for bench in (bench_a, bench_b):
        accepted = [p["accepted_per_step"] for p in bench["prompts"]]
        counts += [np.array([sum(c >= 1 for c in p) for p in accepted], dtype=float),
                   np.array([len(p) for p in accepted], dtype=float)]
    if counts[2].sum() == 0 or counts[3].sum() == 0 or counts[1].sum() == 0:
        return None
    iv = paired_relative_difference(*counts, resamples=boot.resamples, seed=boot.seed, level=boot.level)
    return Estimate(iv.estimate, iv.low, iv.high)


def measure(figure: str, bench_a: dict, bench_b: dict) -> Estimate | None:
    """This run's paired relative difference A / B - 1 of ``figure``: "acceptance_length" (pooled),
    "tps" (speculative tokens per second, the ratio of the two rows' token rates: both are timed
    beside the same plain decodes, so it is ``tables.compare``'s speedup difference), or
    "first_draft_acceptance" (pos_0, the token a+1)."""
    if figure == "first_draft_acceptance":
        return _first_draft_difference(bench_a, bench_b)
    c = compare(bench_a, bench_b)
    return {"acceptance_length": c.acceptance_length, "tps": c.speedup}[figure]


def claim_rows(benchmarks: dict[str, dict], labels: dict[str, str], scope: str = REPRODUCTION) -> list[ClaimRow]:
    """One row per ``published.CLAIMS`` entry, from one suite's benchmark results by row name
    ("baseline" among them); where ``withheld`` withholds the verdicts each figure is still
    measured, and reads why in place of a verdict."""
    held = withheld(scope, benchmarks, labels)
    rows = []
    for c in CLAIMS:
        measured = measure(c["figure"], benchmarks[c["a"]], benchmarks[c["b"]])
        said = held.verdict if held else verdict(c["published"], measured)
        rows.append(ClaimRow(f"{labels[c['a']]} vs {labels[c['b']]}", c["quantity"], c["stated"], c["kind"],
                             c["published"], measured, said))
    return rows


def differences_clause(scale: ScaleStatement, backend: str) -> str:
    """What separates this run from the published card, in one clause: scale (how many of the
    settings the card states differ), backend and hardware."""
    n, k = len(scale.checks), len(scale.mismatches)
    return (f"this run differs in scale ({k} of the {n} settings the card states), in backend ({backend} against "
            f"{SETTINGS['backend']}) and in hardware ({scale.hardware} against {SETTINGS['hardware']})")
