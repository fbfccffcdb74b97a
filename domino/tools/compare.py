"""Compare two runs, timing aside: ``python -m domino.tools.compare RUN_A RUN_B``.

RUN_A and RUN_B are workflow directories (each with ``results/`` and ``reports/``). Every file
under ``results/`` must be byte-identical, except that JSON files are compared with their
timing fields removed (and a folder's ``SHA256SUMS.json`` without the digests of its JSON
files, which are compared so); in ``reports/model_card.md`` and its appendix every table cell must
match except the columns that hold timings (TPS, speedup, step cost, its floor and time shares,
wall and training time). A cost-aware row (``domino.adaptive``: a results file whose ``decoder`` kind is
``cost_aware`` in ``domino.decoders.KINDS``) chooses its drafts by the costs the job measured, so only its tokens are compared: its steps,
acceptance and choices are timings here, as are its rows of the card's tables (their label says
"cost-aware": the registry's labels) and the appendix's Cost-aware decoding section.
Prints the paths that differ and how many; exits 1 on a difference.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import NamedTuple

from ..decoders import KINDS, Kind
from ..io import MANIFEST, SEAL_KEY
from . import tool_parser

# JSON keys holding timings, and what derives from them (paired speedup intervals included): any
# duration (seconds, tokens_per_second's second, elapsed, wall, latency, a "time" or "ms" word),
# any throughput (tps, throughput), any speed ratio, and the machine's load while timing
# (machine_load). A word is matched whole where a substring would catch a result ("items",
# "generated_tokens").
TIMING_KEY = re.compile(r"second|tps|speedup|throughput|duration|elapsed|latency|wall"
                        r"|(^|_)(time|timestamp|ms|secs?|load)(_|$)", re.I)
TIMING_COLUMNS = re.compile(r"TPS|Speedup|time|cost|share|floor|vs DFlash noshift", re.I)
CARD_FILES = ("reports/model_card.md", "reports/model_card_appendix.md")  # the card and its appendix


# a card row of a cost-aware decoder: its label (domino.decoders' labels, the checkpoint's label in place)
TIMED_CHOICES = re.compile("|".join(re.escape(k.label).replace(re.escape("{checkpoint}"), ".*")
                                    for k in KINDS.values() if k.cost_aware))
TIMED_SECTION = "## Cost-aware decoding"  # the appendix's section on what those rows chose
# what a cost-aware row's choices decide, besides its tokens
CHOICE_KEY = re.compile(r"^(adaptive|accepted|accepted_per_step|steps|acceptance_length.*|per_position_acceptance.*"
                        r"|conditional_acceptance.*)$")


NOT_A_KIND = Kind(lambda bench, checkpoints: [], "", True, lambda spec, neural: None)  # a file of no registry kind


def strip_timing(obj, choices: bool | None = None):
    """``obj`` without its timing fields (nor the seal of a sealed file, which covers them); a
    cost-aware row's results (its ``decoder`` kind cost-aware) without what its timed choices decide."""
    if choices is None:
        choices = isinstance(obj, dict) and isinstance(obj.get("decoder"), dict) \
            and KINDS.get(obj["decoder"].get("kind"), NOT_A_KIND).cost_aware
    if choices and isinstance(obj, dict):
        obj = {k: v for k, v in obj.items() if not CHOICE_KEY.match(k)}
    if isinstance(obj, dict):
        return {k: strip_timing(v, choices) for k, v in obj.items() if not TIMING_KEY.search(k) and k != SEAL_KEY}
    if isinstance(obj, list):
        return [strip_timing(v, choices) for v in obj]
    return obj


def manifest_files(path: Path) -> dict:
    """A folder's manifest without its JSON files, whose digests cover their timing fields."""
    files = json.loads(path.read_text()).get("files", {})
    return {k: v for k, v in files.items() if not k.endswith(".json")}


def card_tables(text: str) -> list[list[str]]:
    """Markdown table rows of a card, with timing columns blanked and bold dropped (the card sets
    its fastest row in bold, which is a timing too)."""
    rows, mask, timed_section = [], [], False
    for line in text.splitlines():
        if line.startswith("## "):
            timed_section = line.strip() == TIMED_SECTION
        if not line.startswith("|") or timed_section:
            mask = []
            continue
        cells = [c.strip().replace("**", "") for c in line.strip().strip("|").split("|")]  # bold: the fastest row
        if not mask:  # a header row
            mask = [bool(TIMING_COLUMNS.search(c)) for c in cells]
        if any(TIMED_CHOICES.search(c) for c in cells):  # a cost-aware row: its label only
            rows.append([c if TIMED_CHOICES.search(c) else "*" for c in cells])
            continue
        rows.append([("*" if m else c) for c, m in zip(cells, mask + [False] * len(cells))])
    return rows


def result_files(run: Path) -> list[Path]:
    """Files under ``run/results``, relative to ``run``."""
    return sorted(p.relative_to(run) for p in (run / "results").rglob("*") if p.is_file())


class RunComparison(NamedTuple):
    diffs: list[str]  # one line per path that differs
    files: int        # files under results/ in either run


def compare_runs(a: str | Path, b: str | Path) -> list[str]:
    """One line per path that differs (``results/...`` files, then the card and its appendix), timing aside."""
    return _compare(Path(a), Path(b)).diffs


def _compare(a: Path, b: Path) -> RunComparison:
    for run in (a, b):  # a missing run would read as one whose every file is missing
        if not (run / "results").is_dir():
            raise FileNotFoundError(f"{run} has no results/ folder (allowed: a workflow run directory, such as the "
                                    "checkout after the default run or a --directory of snakemake)")
    diffs = []
    fa, fb = result_files(a), result_files(b)
    diffs += [f"{rel} only in A" for rel in sorted(set(fa) - set(fb))]
    diffs += [f"{rel} only in B" for rel in sorted(set(fb) - set(fa))]
    for rel in sorted(set(fa) & set(fb)):
        pa, pb = a / rel, b / rel
        if rel.name == MANIFEST:  # the JSON files it lists are compared on their own, timing aside
            same = manifest_files(pa) == manifest_files(pb)
        elif rel.suffix == ".json":
            same = strip_timing(json.loads(pa.read_text())) == strip_timing(json.loads(pb.read_text()))
        else:
            same = pa.read_bytes() == pb.read_bytes()
        if not same:
            diffs.append(f"{rel} differs")
    for card in CARD_FILES:
        ca, cb = a / card, b / card
        if ca.exists() != cb.exists():
            diffs.append(f"{card} only in {'A' if ca.exists() else 'B'}")
        elif ca.exists():
            ta, tb = card_tables(ca.read_text()), card_tables(cb.read_text())
            if ta != tb:
                bad = [i for i, (x, y) in enumerate(zip(ta, tb)) if x != y]
                diffs.append(f"{card} differs: tables differ in {len(bad) + abs(len(ta) - len(tb))} rows, "
                             f"first: {ta[bad[0]] if bad else '(row count)'}")
    return RunComparison(diffs, len(set(fa) | set(fb)))


def parser() -> argparse.ArgumentParser:
    p = tool_parser("compare", __doc__)
    p.add_argument("run_a", help="a workflow run directory (with results/ and reports/)")
    p.add_argument("run_b", help="another one")
    return p


def main(argv=None) -> None:
    p = parser()
    a = p.parse_args(argv)
    try:
        diffs, n = _compare(Path(a.run_a), Path(a.run_b))
    except FileNotFoundError as err:
        raise SystemExit(f"{p.prog}: {err}") from None
    for d in diffs:
        print(d)
    if diffs:
        print(f"DIFFERENT: {len(diffs)} of {n} files under results/ and the card's tables differ, timing aside")
    else:
        print(f"identical: {n} files under results/ and the card's tables, timing aside")
    raise SystemExit(1 if diffs else 0)


if __name__ == "__main__":
    main()
