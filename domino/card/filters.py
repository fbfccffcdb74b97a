"""The card's number formats, as Jinja filters: a missing value raises instead of rendering empty."""

from __future__ import annotations

from typing import NamedTuple

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from .published import LABELS
from .tables import Estimate


class PerCheckpoint(NamedTuple):
    """A setting that a ``checkpoints.<name>`` entry overrides for some of the card's rows:
    ``shared`` is the config's own value (None when every row overrides it), ``own`` each
    overriding row's value by checkpoint name, in the card's row order."""
    shared: object
    own: dict


def _num(x):
    if x is None or isinstance(x, bool) or not isinstance(x, (int, float)):
        raise ValueError(f"expected a number, got {x!r}")
    return x


def _fixed(spec: str, suffix: str = "", scale: int = 1):
    """A filter writing ``scale * x`` in the format ``spec``, then ``suffix``."""
    def fmt(x):
        return f"{scale * _num(x):{spec}}{suffix}"
    return fmt


f3, f2, f1 = _fixed(".3f"), _fixed(".2f"), _fixed(".1f")
pct = _fixed(".1f", "%", 100)  # a fraction as a percent: 0.277 -> 27.7%
signed_pct = _fixed("+.1f", "%", 100)  # a relative change: 0.277 -> +27.7%
signed_pp = _fixed("+.1f", " pp", 100)  # a difference of two fractions, in percentage points
times = _fixed(".2f", "×")  # a ratio: 0.71 -> 0.71×


def signed(x, decimals=3):
    return f"{_num(x):+.{decimals}f}"


def thousands(x):
    return f"{_num(x):,}"


def sci(x):
    """Learning-rate style: 0.0006 -> 6e-4."""
    mant, exp = f"{_num(x):e}".split("e")
    mant = mant.rstrip("0").rstrip(".")
    return f"{mant}e{int(exp)}"


def plain(x):
    """Shortest exact form of a float (1.0, 0.5, 0.75)."""
    return repr(float(_num(x)))


def g(x):
    """Compact general form (7.0 -> 7, 0.05 -> 0.05)."""
    return f"{_num(x):g}"


INTERVAL_FORMATS = {"f3": f3, "f2": f2, "f1": f1, "pct": pct, "signed_pct": signed_pct, "times": times}


def ci(est: Estimate | None, kind: str = "f3") -> str:
    """An estimate and its 95% interval, both in format ``kind``: "2.156 [2.022, 2.308]"; "n/a"
    for a figure the run has not (a draft position beyond its block); a rate with nothing
    counted as ``zero_count``."""
    if est is None:
        return "n/a"
    fmt = INTERVAL_FORMATS[kind]
    if est.successes == 0:
        return zero_count(est, kind)
    return f"{fmt(est.value)} [{fmt(est.low)}, {fmt(est.high)}]"


def zero_count(est: Estimate, kind: str = "f3") -> str:
    """A rate with nothing counted, as the count it is, with its upper bound and what the bound is
    taken over: "0 of 1,234 steps (95% upper bound over 40 prompts: 0.012)"; "0 of 0 steps" where
    no step reached the position. An acceptance length with nothing accepted (value 1):
    "1.000, no draft accepted in 1,234 steps (95% upper bound over 40 prompts: 1.090)"."""
    if not est.trials:
        return "0 of 0 steps"
    fmt = INTERVAL_FORMATS[kind]
    over = "" if est.prompts is None else f" over {est.prompts:,} prompt{'' if est.prompts == 1 else 's'}:"
    bound = f"(95% upper bound{over} {fmt(est.high)})"
    if est.value != 0:
        return f"{fmt(est.value)}, no draft accepted in {est.trials:,} steps {bound}"
    return f"0 of {est.trials:,} steps {bound}"


def each(value, kind: str = "plain_value") -> str:
    """A setting in format ``kind`` (a filter name, or "plain_value": as it is); a ``PerCheckpoint``
    as the shared value with each overriding row named, "3e-3 (Domino: 1e-3)", or, when no row
    keeps the shared value, every row's own, "DFlash shift: 1e-3; Domino: 2e-3"."""
    fmt = FILTERS.get(kind, str)
    if not isinstance(value, PerCheckpoint):
        return fmt(value)
    groups: dict[str, list[str]] = {}
    for name, v in value.own.items():
        groups.setdefault(fmt(v), []).append(LABELS.get(name, name))
    own = "; ".join(f"{', '.join(labels)}: {text}" for text, labels in groups.items())
    return own if value.shared is None else f"{fmt(value.shared)} ({own})"


def environment(templates) -> Environment:
    """A strict Jinja environment over the folder ``templates`` with every filter of this module."""
    env = Environment(loader=FileSystemLoader(str(templates)), undefined=StrictUndefined,
                      keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True, autoescape=False)
    env.filters.update(FILTERS, each=each)
    return env


FILTERS = dict(f3=f3, f2=f2, f1=f1, pct=pct, signed_pct=signed_pct, signed_pp=signed_pp, signed=signed,
               thousands=thousands, sci=sci, plain=plain, g=g, times=times, ci=ci, zero_count=zero_count)
