"""Where a speculative step's time goes: ``python -m domino.tools.profile_step --run DIR``.

Decodes the first ``--prompts`` prompts of a finished run's benchmark
(``results/benchmark/humaneval/baseline.json``) plain and with each trained checkpoint of the run
(``results/train/*/checkpoint``), as the benchmark does (one process, the decoders in a
rotating order, the verifier in the benchmark's dtype unless ``--dtype``), with a timer around
each part of the speculative step:

* drafter forward   ``Drafter.backbone``: the draft layers over the block, context cache read
* correction loop   the rest of ``Drafter.draft``: base logits, the Domino head slot by slot
                    (a DFlash drafter: base logits and argmax), ids mapped to the target vocabulary
* context update    ``NeuralDraft.add_context``: the accepted rows' keys/values for the drafter
* verify forward    the verifier over ``[anchor, drafts]``, aux states taken, logits checked
* bookkeeping       everything else in the loop (cache cropping, token accounting)

It then times the step's floor on the same shapes, each forward alone with nothing around it:
the drafter's forward with its base logits over one block, and the verifier's forward over
``1 + drafts`` tokens after a cache of the run's mean context length (``domino.bench.costs.step_floor``).
Every figure is per speculative step, in milliseconds and in plain steps (plain decoding's
mean time per token in the same process).
"""

from __future__ import annotations

import argparse
import functools
import time
from collections import defaultdict
from pathlib import Path

import torch

from ..bench.costs import step_floor
from ..bench.timing import rotation
from ..common import hardware
from ..decode import NeuralDraft, decode
from ..io import read_json
from ..model import Drafter
from ..verifier.load import eos_ids, load_tokenizer, load_verifier
from . import add_threads_argument, tool_parser, wait_policy

PARTS = ("drafter forward", "correction loop", "context update", "verify forward", "bookkeeping")


class _Clock:
    """Each wrapped callable's call times, in call order, by label."""

    def __init__(self, sync):
        self.sync, self.times = sync, defaultdict(list)

    def wrap(self, obj, name: str, label: str) -> None:
        fn = getattr(obj, name)

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            self.sync()
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            self.sync()
            self.times[label].append(time.perf_counter() - t0)
            return out

        setattr(obj, name, timed)


def profile(verifier, drafts: dict[str, NeuralDraft], prompts: list[list[int]], max_new_tokens: int,
            stop_ids, floor_repeats: int = 30) -> dict[str, dict]:
    """Run -> mean seconds per step of each part in ``PARTS`` (``plain``: its step alone), the
    step's floor (``domino.bench.costs.StepFloor``) and the step count; all in this process."""
    cuda = verifier.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    clock = _Clock(sync)
    clock.wrap(verifier, "forward", "verify")
    for row, draft in drafts.items():
        clock.wrap(draft.drafter, "backbone", f"{row}/backbone")
        clock.wrap(draft.drafter, "draft", f"{row}/draft")
        clock.wrap(draft, "add_context", f"{row}/context")
    names = ("plain",) + tuple(drafts)
    for row in names:  # warm-up, untimed
        decode(verifier, prompts[0], min(max_new_tokens, 12), stop_ids, draft=drafts.get(row))
    sums = {row: defaultdict(float) for row in names}
    context = []
    for i, ids in enumerate(prompts):
        for row in rotation(names, i):
            clock.times.clear()
            sync()
            t0 = time.perf_counter()
            r = decode(verifier, ids, max_new_tokens, stop_ids, draft=drafts.get(row))
            sync()
            loop = time.perf_counter() - t0 - clock.times["verify"][0]  # the prefill's forward aside
            t = sums[row]
            if row == "plain":
                t["steps"] += len(r.new_token_ids) - 1
                t["step"] += loop
                continue
            if row == names[1]:
                context.append(list(ids) + r.new_token_ids)
            loop -= clock.times[f"{row}/context"][0]  # the prefill's context, ditto
            parts = {"drafter forward": sum(clock.times[f"{row}/backbone"]),
                     "correction loop": sum(clock.times[f"{row}/draft"]) - sum(clock.times[f"{row}/backbone"]),
                     "context update": sum(clock.times[f"{row}/context"][1:]),
                     "verify forward": sum(clock.times["verify"][1:])}
            parts["bookkeeping"] = loop - sum(parts.values())
            t["steps"] += len(clock.times["verify"]) - 1
            t["step"] += loop
            for k, v in parts.items():
                t[k] += v
    out = {}
    for row, t in sums.items():
        steps = t.pop("steps")
        out[row] = {k: v / steps for k, v in t.items()} | {"steps": int(steps)}
    for row, draft in drafts.items():  # the floor, on a median-length context of the decodes
        ids = sorted(context, key=len)[len(context) // 2]
        out[row]["floor"] = step_floor(verifier, draft, ids, floor_repeats)
    return out


def print_profile(prof: dict[str, dict], header: str) -> None:
    plain = prof["plain"]["step"]
    print(header)
    print(f"plain step: {plain * 1e3:.3f} ms per token ({prof['plain']['steps']} tokens)")
    print("| row | steps | " + " | ".join(PARTS) + " | step | floor (drafter + verify alone) | step / floor |")
    print("|---|---|" + "---|" * (len(PARTS) + 3))
    for row, p in prof.items():
        if row == "plain":
            continue
        f = p["floor"]
        cells = [f"{p[k] * 1e3:.3f} ms ({p[k] / plain:.2f})" for k in PARTS + ("step",)]
        print(f"| {row} | {p['steps']} | " + " | ".join(cells)
              + f" | {f.step * 1e3:.3f} ms ({f.step / plain:.2f}) = {f.drafter_forward * 1e3:.3f} + "
              f"{f.verify_forward * 1e3:.3f} | {p['step'] / f.step:.2f} |")
    print("(milliseconds per speculative step; in brackets, plain steps)")


def parser() -> argparse.ArgumentParser:
    ap = tool_parser("profile_step", __doc__)
    ap.add_argument("--run", required=True, help="a finished run's directory (the one holding results/)")
    ap.add_argument("--prompts", type=int, default=32, help="benchmark prompts to decode")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="tokens per decode")
    add_threads_argument(ap)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                    help="the verifier's dtype (default: the one the run's benchmark decoded in)")
    return ap


def main(argv=None) -> None:
    args = parser().parse_args(argv)
    results = Path(args.run) / "results"
    baseline = results / "benchmark" / "humaneval" / "baseline.json"
    checkpoints = sorted(results.glob("train/*/checkpoint/drafter_config.json"))
    if not baseline.is_file() or not checkpoints:
        raise SystemExit(f"{args.run}: no finished benchmark (results/benchmark/humaneval/baseline.json) or no trained "
                         "checkpoint (results/train/*/checkpoint); run the workflow there first")
    torch.set_num_threads(args.threads)
    verifier_dir = results / "verifier" / "model"
    if not verifier_dir.is_dir():
        raise SystemExit(f"{verifier_dir}: missing; the profile reads the embedded verifier of a run")
    record = read_json(baseline, "plain greedy's benchmark results", sealed=True)
    dtype = args.dtype or record["protocol"].get("verifier_dtype", "float32")
    verifier = load_verifier(str(verifier_dir), dtype, device=args.device)
    stop = eos_ids(load_tokenizer(str(verifier_dir)), verifier.config)
    prompts = [r["prompt_token_ids"] for r in record["prompts"][: args.prompts]]
    drafts = {c.parent.parent.name: NeuralDraft(Drafter.load(c.parent).to(args.device, verifier.dtype).eval())
              for c in checkpoints}
    prof = profile(verifier, drafts, prompts, args.max_new_tokens, stop)
    print_profile(prof, f"{hardware()}, {dtype}, OpenMP wait policy {wait_policy()}; {len(prompts)} prompts x "
                        f"{args.max_new_tokens} new tokens, run {args.run}")


if __name__ == "__main__":
    main()
