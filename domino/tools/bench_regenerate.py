"""Regeneration's throughput beside plain decoding's: ``python -m domino.tools.bench_regenerate``.

The regenerate stage answers the training conversations in batches (``domino.data.regenerate.generate_batch``:
``data.generation_batch_size`` left-padded prompts under one KV cache); the benchmark's plain greedy
decodes one prompt at a time (``domino.decode.decode``). This tool times both on the same prompts in
this one process: the first ``--conversations`` rows of a finished run's
``results/regenerate/train.jsonl`` (a row's prompt is its ids before the answer), sorted by length as
the stage sorts them, in groups of ``data.generation_batch_size``; each group is answered once batched
and once one prompt at a time, which goes first alternating from group to group. It prints each way's
tokens per second, the ratio batched over one at a time with its 95% BCa interval over the groups,
and how many answers are the same token for token both ways and as the stage wrote them (in float32
all of them; in bf16 a batch's rows may round otherwise than a row alone).

    python -m domino.tools.bench_regenerate --directory runs/regenerated --configfile config/regenerate.yaml
    python -m domino.tools.bench_regenerate --directory runs/regenerated --configfile config/regenerate.yaml --conversations 64

With ``--against vllm`` (in the vLLM environment, docs/card-scale.md) the other way is vLLM
answering the whole group in one call (its continuous batching, ``domino.vllm.backend.vllm_answers``,
what ``data.generation_backend: vllm`` runs) in place of one prompt at a time:

    .venv-vllm/bin/python -m domino.tools.bench_regenerate --directory runs/regenerated --configfile config/regenerate.yaml --against vllm

A measurement script, not a test: its figures depend on the machine.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch

from ..config import load_config
from ..data.regenerate import generate_batch
from ..decode import decode
from ..io import read_jsonl, write_json
from ..stats import RESAMPLES, paired_rate_ratio
from ..verifier.load import eos_ids, load_tokenizer, load_verifier
from . import tool_parser


def prompt_and_answer(row: dict) -> tuple[list[int], list[int]]:
    """A regenerated row's prompt (its ids before the first answer token) and answer (the rest,
    cut at ``data.seq_len`` as the stage wrote it)."""
    start = row["loss_mask"].index(1) if 1 in row["loss_mask"] else len(row["input_ids"])
    return row["input_ids"][:start], row["input_ids"][start:]


def time_group(verifier, prompts: list[list[int]], max_new: int, stops: list[int], pad: int,
               batched_first: bool, other=None) -> dict:
    """One group answered batched and another way, in the order given: tokens, seconds and
    answers of each way. The other way is one prompt at a time (``"plain"``), or ``other``, a
    function of the group's prompts that returns their answers (``"other"``)."""
    def batched():
        t0 = time.perf_counter()
        answers = [a for a, _ in generate_batch(verifier, prompts, max_new, stops, pad)]
        return answers, time.perf_counter() - t0

    def one_at_a_time():
        t0 = time.perf_counter()
        answers = [decode(verifier, p, max_new, stops).new_token_ids for p in prompts]
        return answers, time.perf_counter() - t0

    def through_other():
        t0 = time.perf_counter()
        answers = other(prompts)
        return answers, time.perf_counter() - t0

    second = "plain" if other is None else "other"
    ways = {"batched": batched, "plain": one_at_a_time, "other": through_other}
    order = ("batched", second) if batched_first else (second, "batched")
    out = {}
    for way in order:
        answers, seconds = ways[way]()
        out[way] = {"answers": answers, "seconds": seconds, "tokens": sum(map(len, answers))}
    return out


def verifier_path(cfg: dict, run_dir: Path) -> str:
    """Where a run's later stages load its verifier from (an embedded or GGUF verifier's converted folder)."""
    return str(run_dir / "results/verifier/model") if cfg["verifier"]["source"] in ("embedded", "gguf") \
        else cfg["verifier"]["source"]


def parser():
    ap = tool_parser("bench_regenerate", __doc__)
    ap.add_argument("--directory", default=".", help="the finished run's directory (snakemake --directory), "
                                                     "with results/regenerate/train.jsonl")
    ap.add_argument("--configfile", nargs="+", default=[], help="the run's overlays, as given to snakemake")
    ap.add_argument("--conversations", type=int, default=256, help="the first N regenerated rows of the split")
    ap.add_argument("--split", choices=("train", "val"), default="train", help="the regenerated split read")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (without it: the config's "
                                                              "threads, the regenerate job's count)")
    ap.add_argument("--against", choices=("plain", "vllm"), default="plain",
                    help="the other way: one prompt at a time (plain) or vLLM's batched call (vllm)")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    return ap


def main(argv=None) -> dict:
    a = parser().parse_args(argv)
    root = Path(__file__).resolve().parents[2]
    cfg = load_config([root / "config.yaml", *a.configfile])
    run_dir, d = Path(a.directory), cfg["data"]
    threads = a.threads or cfg["threads"]
    torch.set_num_threads(threads)
    rows = read_jsonl(run_dir / f"results/regenerate/{a.split}.jsonl")[:a.conversations]
    pairs = sorted((prompt_and_answer(r) for r in rows), key=lambda pa: len(pa[0]))
    path = verifier_path(cfg, run_dir)
    tok = load_tokenizer(path)
    verifier = load_verifier(path, cfg["verifier"]["dtype"], cfg["device"])
    stops = eos_ids(tok, verifier.config, getattr(verifier, "generation_config", None))
    pad = tok.pad_token_id if tok.pad_token_id is not None else stops[0]
    size, max_new = d["generation_batch_size"], d["max_new_tokens"]
    print(f"{len(pairs)} prompts in groups of {size} (data.generation_batch_size), at most {max_new} new tokens, "
          f"verifier in {cfg['verifier']['dtype']}, {threads} torch thread(s), {os.cpu_count()} cores")
    other, way, name = None, "plain", "one at a time"
    if a.against == "vllm":  # the vLLM environment's interpreter runs this
        from ..vllm.backend import load_llm, vllm_answers

        llm = load_llm(path, cfg["verifier"]["dtype"], max_model_len=d["seq_len"], seed=cfg["seed"],
                       memory_fraction=cfg["vllm"]["memory_fraction"])

        def other(prompts):
            return [ans for ans, _ in vllm_answers(llm, prompts, max_new, stops)]
        other([pairs[0][0]])  # warm-up
        way, name = "other", "vLLM"
    generate_batch(verifier, [pairs[0][0]], 4, stops, pad)  # warm-up: allocator and thread pool
    groups = []
    for g, start in enumerate(range(0, len(pairs), size)):
        group = pairs[start:start + size]
        res = time_group(verifier, [p for p, _ in group], max_new, stops, pad, batched_first=g % 2 == 0, other=other)
        res["as_written"] = [answer for _, answer in group]
        groups.append(res)
        print(f"group {g}: batched {res['batched']['tokens'] / res['batched']['seconds']:.0f} tok/s, {name} "
              f"{res[way]['tokens'] / res[way]['seconds']:.0f} tok/s")
    col = {w: {k: [gr[w][k] for gr in groups] for k in ("tokens", "seconds")} for w in ("batched", way)}
    ratio = paired_rate_ratio(col["batched"]["tokens"], col["batched"]["seconds"], col[way]["tokens"],
                              col[way]["seconds"], RESAMPLES, cfg["seed"])
    answers = [(b, p, w) for gr in groups for b, p, w in zip(gr["batched"]["answers"], gr[way]["answers"],
                                                             gr["as_written"])]
    label = "plain" if way == "plain" else a.against
    out = {"prompts": len(pairs), "groups": len(groups), "batch_size": size, "threads": threads,
           "dtype": cfg["verifier"]["dtype"], "against": a.against,
           "batched_tokens_per_second": sum(col["batched"]["tokens"]) / sum(col["batched"]["seconds"]),
           f"{label}_tokens_per_second": sum(col[way]["tokens"]) / sum(col[way]["seconds"]),
           f"batched_over_{label}": ratio.estimate, f"batched_over_{label}_ci": ratio.bounds(),
           "same_answers_both_ways": sum(b == p for b, p, _ in answers),
           "batched_as_written": sum(b[:len(w)] == w for b, _, w in answers)}  # w: cut at data.seq_len
    print(f"batched {out['batched_tokens_per_second']:.0f} tok/s, {name} {out[f'{label}_tokens_per_second']:.0f} "
          f"tok/s: batched / {name} {ratio.estimate:.2f}x [{ratio.low:.2f}x, {ratio.high:.2f}x] over "
          f"{len(groups)} groups; answers the same both ways {out['same_answers_both_ways']} of {len(answers)}, "
          f"batched as the stage wrote them {out['batched_as_written']} of {len(answers)}")
    if a.json:
        write_json(a.json, out)
    print(json.dumps({k: v for k, v in out.items() if not isinstance(v, list)}))
    return out


if __name__ == "__main__":
    main()
