"""Robustness of the paired speedup under load: ``python -m domino.bench_paired``.

For each checkpoint, the benchmark's paired measurement (``domino.bench.timed_decodes``) runs
twice on the same verifier, drafter and prompts: once quiet, once with a CPU-bound process
(a busy loop) pinned to one core. Prints both paired speedups with their 95% bootstrap
intervals and whether the intervals overlap, beside what the unpaired method would have
reported (loaded speculative TPS over quiet plain TPS). Nothing is written unless ``--json``.

    python -m domino.bench_paired --verifier results/verifier/model \\
        --checkpoint results/train/domino/checkpoint --max-prompts 40

A measurement script, not a test: its figures depend on the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import yaml

from .bench import acceptance_fields, encode_tasks, load_run, speed_summary, timed_decodes
from .io import write_json


def bench_params(cfg: dict, max_prompts: int | None, max_new_tokens: int | None) -> dict:
    """The benchmark stage's config values, read from a config file as written (not validated
    against the schema, so the config of an older finished run serves as well)."""
    try:
        b = dict(cfg["benchmark"])
        missing = [k for k in ("dataset", "max_prompts", "max_new_tokens", "chat_template") if k not in b]
        if missing:
            raise KeyError(f"benchmark.{missing[0]}")
        v = cfg["verifier"]
        p = {"seed": cfg["seed"], "threads": cfg["threads"], "device": cfg.get("device", "cpu"),
             "verifier": {"name": v.get("name", v["source"]), "dtype": v["dtype"]},
             "data": {"enable_thinking": cfg.get("data", {}).get("enable_thinking")}, "benchmark": b}
    except KeyError as err:
        raise SystemExit(f"the config lacks {err}; pass the config of the run being measured (--config)") from None
    if max_prompts is not None:
        b["max_prompts"] = max_prompts
    if max_new_tokens is not None:
        b["max_new_tokens"] = max_new_tokens
    return p


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


def measure(p: dict, checkpoint: str, verifier_path: str, load: bool, core: int) -> dict:
    """One paired benchmark of ``checkpoint`` (quiet or under load): speed and acceptance summary."""
    loaded = load_run(p, Path(checkpoint).parent.name, verifier_path, checkpoint)
    _, encoded = encode_tasks(p, loaded.tokenizer, loaded.verifier.config.max_position_embeddings)
    n = p["benchmark"]["max_new_tokens"]
    with competing_process(core) if load else contextlib.nullcontext():
        timings = timed_decodes(loaded, encoded, n, desc="loaded" if load else "quiet")
    seed = p["seed"]
    out = {**speed_summary(timings, seed), **acceptance_fields(timings, loaded.draft.drafts_per_step, seed)}
    out["new_token_ids"] = [t.speculative.new_token_ids for t in timings]
    return out


def overlap(a: list[float], b: list[float]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def _ci(value: float, bounds: list[float]) -> str:
    return f"{value:.3f} [{bounds[0]:.3f}, {bounds[1]:.3f}]"


def compare(name: str, quiet: dict, loaded: dict) -> dict:
    """The figures of one checkpoint, quiet vs loaded; prints them."""
    unpaired = loaded["tps"] / quiet["plain_tps"]
    row = {"checkpoint": name, "quiet": {k: v for k, v in quiet.items() if k != "new_token_ids"},
           "loaded": {k: v for k, v in loaded.items() if k != "new_token_ids"},
           "speedup_intervals_overlap": overlap(quiet["speedup_ci"], loaded["speedup_ci"]),
           "unpaired_speedup_loaded_vs_quiet": unpaired,
           "same_tokens": quiet["new_token_ids"] == loaded["new_token_ids"]}
    for label, s in (("quiet", quiet), ("loaded", loaded)):
        print(f"{name} {label:6s}: plain TPS {_ci(s['plain_tps'], s['plain_tps_ci'])}, speculative TPS "
              f"{_ci(s['tps'], s['tps_ci'])}, paired speedup {_ci(s['speedup'], s['speedup_ci'])}, "
              f"AL {_ci(s['acceptance_length'], s['acceptance_length_ci'])}")
    print(f"{name}: paired speedup intervals overlap: {'yes' if row['speedup_intervals_overlap'] else 'NO'}; "
          f"unpaired speedup (loaded speculative TPS / quiet plain TPS) {unpaired:.3f}; identical tokens in both "
          f"runs: {'yes' if row['same_tokens'] else 'no'}")
    return row


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(prog="python -m domino.bench_paired", description=__doc__.split("\n")[0])
    ap.add_argument("--verifier", default="results/verifier/model")
    ap.add_argument("--checkpoint", action="append", required=True, help="a checkpoint directory; repeat for more")
    ap.add_argument("--config", default="config.yaml", help="config file (benchmark, seed, threads, device)")
    ap.add_argument("--max-prompts", type=int, default=None, help="default: the config's benchmark.max_prompts")
    ap.add_argument("--max-new-tokens", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: the config's)")
    ap.add_argument("--core", type=int, default=0, help="the core the competing process is pinned to")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    a = ap.parse_args(argv)
    cfg = yaml.safe_load(Path(a.config).read_text()) or {}
    p = bench_params(cfg, a.max_prompts, a.max_new_tokens)
    torch.set_num_threads(a.threads or int(cfg["threads"]))
    torch.manual_seed(p["seed"])
    print(f"{p['benchmark']['max_prompts']} prompts x {p['benchmark']['max_new_tokens']} new tokens, "
          f"{torch.get_num_threads()} torch threads, {os.cpu_count()} cores; load: a busy loop on core {a.core}")
    rows = []
    for ckpt in a.checkpoint:
        quiet = measure(p, ckpt, a.verifier, load=False, core=a.core)
        loaded = measure(p, ckpt, a.verifier, load=True, core=a.core)
        rows.append(compare(Path(ckpt).parent.name, quiet, loaded))
    if a.json:
        write_json(a.json, {"params": p, "threads": torch.get_num_threads(), "rows": rows})
    print(json.dumps({r["checkpoint"]: r["speedup_intervals_overlap"] for r in rows}))
    return rows


if __name__ == "__main__":
    main()
