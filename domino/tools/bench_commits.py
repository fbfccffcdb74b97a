"""Decoding speed of this checkout against another commit: ``python -m domino.tools.bench_commits --run DIR --against REV``.

Extracts the ``domino`` package of commit ``REV`` (``git archive``) into a temporary folder,
imports it under another name beside this checkout's, and decodes the first ``--prompts``
benchmark prompts of a finished run (``results/benchmark/humaneval/baseline.json``) with both, on the
same verifier weights, each version loading them with its own ``load_verifier`` (which picks
the attention), and the same checkpoints (``results/train/*/checkpoint``): plain greedy, and
speculative with each checkpoint. Within a prompt the two versions' decodes run
back to back in alternating order, so both see the same moments of the machine. For each
decoder it prints this checkout's TPS over the other commit's, pooled over the prompts, with
its 95% paired bootstrap interval (``domino.stats.paired_rate_ratio``), and whether the two
versions' outputs were identical on every prompt.

A measurement script, not a test: its figures depend on the machine and its load.
"""

from __future__ import annotations

import importlib
import io
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import torch

from ..bench.timing import paired_decodes
from ..decode import NeuralDraft, decode
from ..model import Drafter
from ..stats import paired_rate_ratio
from ..verifier.load import eos_ids, load_tokenizer, load_verifier
from . import add_threads_argument, tool_parser, wait_policy

ROOT = Path(__file__).resolve().parents[2]


def import_commit(rev: str, into: Path):
    """``domino`` as of ``rev``, imported as the package ``domino_<rev>`` from ``into``: its decode,
    model and verifier-loading modules (the last ``verifier/load.py``, or ``verifier.py`` in a
    commit before the package's folders)."""
    name = "domino_" + "".join(c if c.isalnum() else "_" for c in rev)
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev, "domino"], capture_output=True)
    if tar.returncode:
        raise SystemExit(f"bench_commits: git archive {rev} failed: {tar.stderr.decode().strip()}")
    with tarfile.open(fileobj=io.BytesIO(tar.stdout)) as t:
        t.extractall(into, filter="data")
    (into / "domino").rename(into / name)
    sys.path.insert(0, str(into))
    loader = "verifier.load" if (into / name / "verifier" / "load.py").is_file() else "verifier"
    return (importlib.import_module(f"{name}.decode"), importlib.import_module(f"{name}.model"),
            importlib.import_module(f"{name}.{loader}"))


def parser():
    p = tool_parser("bench_commits", __doc__)
    p.add_argument("--run", required=True, help="a finished run's directory (the one holding results/)")
    p.add_argument("--against", default="HEAD~1", help="the commit to compare with (any git revision)")
    p.add_argument("--prompts", type=int, default=48, help="benchmark prompts to decode")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens per decode")
    add_threads_argument(p)
    return p


def main(argv=None) -> None:
    a = parser().parse_args(argv)
    results = Path(a.run) / "results"
    verifier_dir = results / "verifier" / "model"
    baseline = results / "benchmark" / "humaneval" / "baseline.json"
    checkpoints = sorted(p.parent for p in results.glob("train/*/checkpoint/drafter_config.json"))
    if not (verifier_dir.is_dir() and baseline.is_file() and checkpoints):
        raise SystemExit(f"bench_commits: {a.run} is not a finished embedded run (results/verifier/model, "
                         "results/benchmark/humaneval/baseline.json, results/train/*/checkpoint)")
    torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory() as tmp:
        other_decode, other_model, other_verifier = import_commit(a.against, Path(tmp))
        verifiers = {"this": load_verifier(str(verifier_dir)), a.against: other_verifier.load_verifier(str(verifier_dir))}
        verifier = verifiers["this"]
        stop = eos_ids(load_tokenizer(str(verifier_dir)), verifier.config)
        prompts = [r["prompt_token_ids"] for r in json.loads(baseline.read_text())["prompts"][: a.prompts]]
        rows = {"plain": (None, None)}
        for c in checkpoints:
            name = c.parent.name
            rows[name] = (NeuralDraft(Drafter.load(c).eval()), other_decode.NeuralDraft(other_model.Drafter.load(c).eval()))
        versions = {"this": decode, a.against: other_decode.decode}
        print(f"{a.prompts} prompts x {a.max_new_tokens} tokens, {a.threads} torch thread(s), OpenMP wait policy {wait_policy()}; this checkout against {a.against}")
        print("| decoder | TPS this / other (95% interval) | identical outputs |")
        print("|---|---|---|")
        for row, (draft_this, draft_other) in rows.items():
            drafts = {"this": draft_this, a.against: draft_other}

            def run_of(v):
                return lambda _, p, n: versions[v](verifiers[v], p, n, stop, draft=drafts[v])

            decodes = paired_decodes({v: run_of(v) for v in versions}, prompts, a.max_new_tokens, 12, desc=row)
            tok = {v: [len(d.results[v].new_token_ids) for d in decodes] for v in versions}
            sec = {v: [d.results[v].seconds for d in decodes] for v in versions}
            same = sum(d.results["this"].new_token_ids == d.results[a.against].new_token_ids for d in decodes)
            ratio = paired_rate_ratio(tok["this"], sec["this"], tok[a.against], sec[a.against])
            print(f"| {row} | {ratio.estimate:.3f} [{ratio.low:.3f}, {ratio.high:.3f}] | {same} of {len(prompts)} |",
                  flush=True)


if __name__ == "__main__":
    main()
