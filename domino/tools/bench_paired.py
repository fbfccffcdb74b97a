"""Robustness of the paired speedup under load: ``python -m domino.tools.bench_paired``.

Runs the benchmark stage (``domino.bench.job.run_benchmark``, greedy) twice on a finished run's
verifier and checkpoints: once quiet, once beside a CPU-bound process (a busy loop pinned to
one core). Prints each checkpoint's paired speedup with its 95% bootstrap interval from both
runs and whether the intervals overlap, beside the unpaired figure (speculative TPS under load
over plain TPS of the quiet run). The results files go to a temporary folder; nothing is kept
unless ``--json``.

    python -m domino.tools.bench_paired                     # the default run, from the checkout
    python -m domino.tools.bench_paired --max-prompts 40    # a shorter check

A measurement script, not a test: its figures depend on the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ..bench.job import BenchmarkConfig, run_benchmark
from ..bench.timing import PLAIN
from ..checkpoints import trained_checkpoints
from ..config import load_config
from ..io import write_json
from . import tool_parser


@contextlib.contextmanager
def competing_process(core: int):
    """A busy-loop Python process pinned to ``core`` for the duration of the block."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(proc.pid, {core})
        yield proc
    finally:
        proc.kill()
        proc.wait()


def benchmark_config(cfg: dict) -> BenchmarkConfig:
    """The greedy benchmark stage's config of HumanEval, from a run's whole config."""
    b = cfg["benchmark"]
    return BenchmarkConfig(device=cfg["device"], verifier_name=cfg["verifier"]["name"],
                           verifier_dtype=cfg["verifier"]["dtype"], enable_thinking=cfg["data"]["enable_thinking"],
                           dataset=b["sources"]["humaneval"], max_prompts=b["max_prompts"], max_new_tokens=b["max_new_tokens"],
                           chat_template=b["chat_template"], threads=b["threads"], seed=cfg["seed"], temperature=0.0,
                           top_p=1.0, tie_tolerance=float(b["tie_tolerance"]))


def benchmark_once(cfg: dict, run_dir: Path, load: bool, core: int) -> dict[str, dict]:
    """One greedy benchmark of every trained checkpoint of ``run_dir`` (quiet, or beside a busy loop)."""
    verifier = str(run_dir / "results/verifier/model") if cfg["verifier"]["source"] == "embedded" \
        else cfg["verifier"]["source"]
    trained = trained_checkpoints(cfg["checkpoints"], cfg["train"]["replicates"])
    checkpoints = {name: str(run_dir / "results/train" / name / "checkpoint") for name in trained}
    with tempfile.TemporaryDirectory() as tmp, competing_process(core) if load else contextlib.nullcontext():
        outs = {row: str(Path(tmp) / f"{row}.json") for row in (PLAIN, *checkpoints)}
        return run_benchmark(benchmark_config(cfg), verifier, checkpoints, outs)


def overlap(a: list[float], b: list[float]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def _ci(value: float, bounds: list[float]) -> str:
    return f"{value:.3f} [{bounds[0]:.3f}, {bounds[1]:.3f}]"


def compare(row: str, quiet: dict, loaded: dict) -> dict:
    """The figures of one row, quiet vs loaded (results files of ``run_benchmark``); prints them."""
    q, ld = quiet["summary"], loaded["summary"]
    unpaired = ld["tps"] / q["plain_tps"]
    tokens = [[r["new_token_ids"] for r in res["prompts"]] for res in (quiet, loaded)]
    out = {"row": row, "quiet": q, "loaded": ld, "speedup_intervals_overlap": overlap(q["speedup_ci"], ld["speedup_ci"]),
           "unpaired_speedup_loaded_vs_quiet": unpaired, "same_tokens": tokens[0] == tokens[1]}
    for label, s in (("quiet", q), ("loaded", ld)):
        print(f"{row} {label:6s}: plain TPS {_ci(s['plain_tps'], s['plain_tps_ci'])}, speculative TPS "
              f"{_ci(s['tps'], s['tps_ci'])}, paired speedup {_ci(s['speedup'], s['speedup_ci'])}")
    print(f"{row}: paired speedup intervals overlap: {'yes' if out['speedup_intervals_overlap'] else 'NO'}; "
          f"unpaired speedup (loaded speculative TPS / quiet plain TPS) {unpaired:.3f}; identical tokens in both "
          f"runs: {'yes' if out['same_tokens'] else 'no'}")
    return out


def parser() -> argparse.ArgumentParser:
    ap = tool_parser("bench_paired", __doc__)
    ap.add_argument("--directory", default=".", help="the finished run's directory (snakemake --directory)")
    ap.add_argument("--configfile", nargs="+", default=[], help="the run's overlays, as given to snakemake")
    ap.add_argument("--max-prompts", type=int, default=None,
                    help="prompts to decode (without it: the config's benchmark.max_prompts)")
    ap.add_argument("--core", type=int, default=0, help="the core the competing process is pinned to")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    return ap


def main(argv=None) -> list[dict]:
    a = parser().parse_args(argv)
    root = Path(__file__).resolve().parents[2]
    cfg = load_config([root / "config.yaml", *a.configfile])
    if a.max_prompts is not None:
        cfg["benchmark"]["max_prompts"] = a.max_prompts
    b = cfg["benchmark"]
    print(f"{b['max_prompts']} prompts x {b['max_new_tokens']} new tokens, {b['threads']} torch thread(s) "
          f"(benchmark.threads), {os.cpu_count()} cores; load: a busy loop on core {a.core}")
    run_dir = Path(a.directory)
    quiet = benchmark_once(cfg, run_dir, load=False, core=a.core)
    loaded = benchmark_once(cfg, run_dir, load=True, core=a.core)
    rows = [compare(row, quiet[row], loaded[row]) for row in quiet if row != PLAIN]
    if a.json:
        write_json(a.json, {"benchmark": b, "rows": rows})
    print(json.dumps({r["row"]: r["speedup_intervals_overlap"] for r in rows}))
    return rows


if __name__ == "__main__":
    main()
