"""CPU jobs on a busy machine: ``python -m domino.tools.bench_threads``.

Times two workloads at the embedded default's shapes (hidden 128, 4 verifier layers,
vocabulary 1024, one draft layer, block 8): a training step of a Domino drafter (forward,
backward, AdamW) and a benchmark decode (plain greedy and speculative, 64 tokens), each in a
fresh process with ``--threads`` torch threads, first on an idle machine and then beside a busy
loop that keeps one core occupied. It does so for each OpenMP wait policy asked for (``ACTIVE``:
threads spin while they wait, libgomp's behaviour when it thinks the cores are free;
``PASSIVE``: they sleep, which ``import domino`` selects unless ``OMP_WAIT_POLICY`` is set)
and prints the slowdown the busy core causes. The policy is read once, when torch loads
OpenMP, so every measurement runs in a process of its own.

"Idle" means whatever else runs on the machine at the time; the script prints the load average
before each measurement so that a reader can tell.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from . import tool_parser

WORKLOADS = ("train", "decode")


def _workload(name: str, threads: int, seconds: float) -> float:
    """Mean seconds of one unit of ``name`` (a training step, or one prompt's two decodes)."""
    import torch
    from transformers import Qwen3ForCausalLM

    from ..decode import NeuralDraft, decode
    from ..model import Drafter, DrafterConfig
    from ..shapes import qwen3_config
    from ..vocab import mappings

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    vcfg = qwen3_config(vocab_size=1024, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=1024,
                        tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    verifier = Qwen3ForCausalLM(vcfg).eval()
    d2t, t2d = mappings(torch.arange(512), 1024)
    cfg = DrafterConfig.schema_defaults(vcfg, num_layers=1, aux_layer_ids=[1, 2, 3], draft_vocab_size=512,
                                        mask_token_id=1023, projector="domino", shift_label=True,
                                        gru_hidden_size=128, bottleneck_size=64)
    drafter = Drafter.from_verifier(verifier, cfg, d2t, t2d)
    g = torch.Generator().manual_seed(1)
    if name == "train":
        R, T, N = 4, 384, 16
        ids = torch.randint(0, 1023, (R, T), generator=g)
        pos = torch.arange(T).repeat(R, 1)
        docs = torch.zeros(R, T, dtype=torch.long)
        aux = torch.randn(R, T, 3 * 128, generator=g)
        anchors = torch.randint(0, T - 8, (R, N), generator=g).sort(-1).values
        opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=1e-3)

        def unit():
            _, final = drafter.forward_train(ids, pos, docs, aux, anchors)
            final.float().logsumexp(-1).mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    else:
        drafter.eval()
        prompts = [torch.randint(0, 1023, (n,), generator=g).tolist() for n in (60, 90, 120, 150)]
        state = {"i": 0}

        def unit():
            p = prompts[state["i"] % len(prompts)]
            state["i"] += 1
            decode(verifier, p, 64)
            decode(verifier, p, 64, draft=NeuralDraft(drafter))
    for _ in range(2):
        unit()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        unit()
        n += 1
    return (time.perf_counter() - t0) / n


def policy_env(policy: str) -> dict:
    """The environment of one wait policy: ``ACTIVE`` or ``PASSIVE`` (``OMP_WAIT_POLICY``), or
    ``SPIN=N``: libgomp's own policy with waiting threads spinning N times before they sleep
    (``GOMP_SPINCOUNT``)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    if policy.startswith("SPIN="):
        return env | {"GOMP_SPINCOUNT": policy.split("=", 1)[1]}
    return env | {"OMP_WAIT_POLICY": policy}


def _measure(name: str, threads: int, policy: str, seconds: float) -> float:
    env = policy_env(policy)
    cmd = [sys.executable, "-m", "domino.tools.bench_threads", "--child", name, "--threads", str(threads),
           "--seconds", str(seconds)]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["seconds"]


def parser() -> argparse.ArgumentParser:
    ap = tool_parser("bench_threads", __doc__)
    ap.add_argument("--threads", type=int, default=2, help="torch threads of each workload (the config's `threads`)")
    ap.add_argument("--policies", nargs="+", default=["ACTIVE", "PASSIVE", "SPIN=10000"],
                    help="OpenMP wait policies to compare: ACTIVE, PASSIVE, or SPIN=N (GOMP_SPINCOUNT)")
    ap.add_argument("--seconds", type=float, default=8.0, help="timed seconds per measurement")
    ap.add_argument("--child", choices=WORKLOADS, help=argparse.SUPPRESS)
    return ap


def main(argv=None) -> None:
    args = parser().parse_args(argv)
    if args.child:
        print(json.dumps({"seconds": _workload(args.child, args.threads, args.seconds)}))
        return
    print(f"{os.cpu_count()} cores, {args.threads} torch threads per workload, {args.seconds:.0f} s per measurement")
    print("| workload | wait policy | idle (ms/unit) | beside a busy core (ms/unit) | slowdown | load before |")
    print("|---|---|---|---|---|---|")
    for name in WORKLOADS:
        for policy in args.policies:
            load = os.getloadavg()[0]
            idle = _measure(name, args.threads, policy, args.seconds)
            busy_loop = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            try:
                time.sleep(0.5)
                busy = _measure(name, args.threads, policy, args.seconds)
            finally:
                busy_loop.kill()
                busy_loop.wait()
            print(f"| {name} | {policy} | {idle * 1e3:.1f} | {busy * 1e3:.1f} | {busy / idle:.2f}x | {load:.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()
