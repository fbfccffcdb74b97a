"""The benchmark's lossless check: every speculative continuation against the plain one decoded
beside it (``lossless_check``). Where two greedy continuations part, and by how much the verifier's
logits of the two tokens differ there in forwards of other row counts (``divergence``); whether a
parting is a near tie or a defect (``lossless_verdict``); a low-precision row's partings decoded
again in float32, where a correct loop cannot part (``float32_replay``); and which token the
partings favour (``margin_signs``). A defect raises ``domino.bench.BenchmarkError``.
"""

from __future__ import annotations

import math

import torch
from transformers import DynamicCache

from ..decode import cache_kwarg, decode
from . import BenchmarkError
from .timing import PromptTiming


@torch.inference_mode()
def divergence(verifier, prompt_ids: list[int], ref: list[int], other: list[int], verify_rows: int = 0,
               memo: dict | None = None) -> dict | None:
    """Where two greedy continuations of one prompt part, and by how much the verifier's logits
    of the two tokens differ there. None if they are identical.

    The parting position's logits are computed in forwards of other row counts: in one forward
    over the whole common prefix; as plain greedy decoding computed them (the prompt in one
    forward, then one row per generated token against the cache); and, with ``verify_rows`` (the
    speculative loop's 1 + B rows a step), shaped as a verify step: the prefix before the step in
    one forward, then ``verify_rows`` rows in one, the parting position's predecessor at each of
    their places in turn (rows after it hold ``ref``'s next tokens, which a causal forward does not
    read there, and only change its row count). ``margins``: ``logit[ref] - logit[other]`` in each
    (negative where that forward prefers the other token); ``gap``: the first's absolute value;
    ``noise``: the largest logit difference over the vocabulary between the whole-prefix forward
    and any other, what a forward's row counts move a logit by at this position (0 in float32 on
    a CPU, tenths in bf16). ``gap`` is None when one continuation simply ended (EOS) where the
    other went on, which no rounding explains.

    ``memo``: a dict kept across calls that share ``ref`` (every drafter's lossless check against
    one plain decode): the forwards at a parting depend on the prompt, ``ref``, the position and
    ``verify_rows`` only, not on ``other``, so a parting two drafters share is computed once."""
    t = next((i for i, (a, b) in enumerate(zip(ref, other)) if a != b), min(len(ref), len(other)))
    if t == len(ref) == len(other):
        return None
    if t >= len(ref) or t >= len(other):
        return {"position": t, "tokens": [ref[t] if t < len(ref) else None, other[t] if t < len(other) else None],
                "gap": None}
    memo = {} if memo is None else memo
    key = (tuple(prompt_ids), tuple(ref), t, verify_rows)
    if key not in memo:
        forms = _parting_logits(verifier, list(prompt_ids) + list(ref), len(prompt_ids), t, verify_rows)
        memo[key] = forms, max(float((forms[0] - f).abs().max()) for f in forms[1:])
    return _parting(*memo[key], t, ref[t], other[t])


def _parting(forms: list[torch.Tensor], noise: float, t: int, a: int, b: int) -> dict:
    margins = [float(f[a] - f[b]) for f in forms]
    return {"position": t, "tokens": [a, b], "gap": abs(margins[0]), "margins": margins, "noise": noise}


def _parting_logits(verifier, full: list[int], n: int, t: int, verify_rows: int) -> list[torch.Tensor]:
    """The logits that choose new token ``t`` after the prompt ``full[:n]``, in each of the
    forwards ``divergence`` describes, the whole-prefix forward first: [vocab] float32 each."""
    ids = torch.tensor([full[:n + t]], device=verifier.device)
    whole = verifier(input_ids=ids, logits_to_keep=1).logits[0, -1].float()
    cache, ck = DynamicCache(config=verifier.config), cache_kwarg(verifier)
    out = verifier(input_ids=ids[:, :n], **{ck: cache}, use_cache=True, logits_to_keep=1)
    for i in range(n, ids.shape[1]):
        out = verifier(input_ids=ids[:, i:i + 1], **{ck: cache}, use_cache=True)
    forms = [whole, out.logits[0, -1].float()]
    last = ids.shape[1] - 1  # the position whose logits choose new token t
    rows = full[n + t:] + [full[-1]] * verify_rows  # what the rows after it hold
    for j in range(verify_rows):
        start = last - j
        if start < n:  # the step would begin inside the prompt, which the loop prefills
            break
        cache = DynamicCache(config=verifier.config)
        verifier(input_ids=ids[:, :start], **{ck: cache}, use_cache=True, logits_to_keep=1)
        block = torch.tensor([full[start:last + 1] + rows[:verify_rows - j - 1]], device=verifier.device)
        forms.append(verifier(input_ids=block, **{ck: cache}, use_cache=True).logits[0, j].float())
    return forms


def lossless_verdict(divergence_info: dict | None, tie_tolerance: float | None) -> str:
    """"same", "near-tie" or "mismatch" (a defect).

    ``tie_tolerance`` a number: a near tie when the two tokens' logits lie within it (0: none is).
    None: a near tie when, in one of the forwards of ``divergence``, the verifier's preference
    for the plain token is no larger than the row-count noise measured there (or it prefers the
    other token): the rule for a bf16 verifier, whose logits move with a forward's row count, so
    that plain greedy (one row a step) and speculative greedy (1 + B rows) may part at a near tie."""
    if divergence_info is None:
        return "same"
    gap = divergence_info["gap"]
    if gap is None:
        return "mismatch"
    if tie_tolerance is None:
        return "near-tie" if min(divergence_info["margins"]) <= divergence_info["noise"] else "mismatch"
    return "near-tie" if tie_tolerance > 0 and gap <= tie_tolerance else "mismatch"


def lossless_check(verifier, tasks: list[dict], encoded: list[list[int]], timings: list[PromptTiming],
                   tie_tolerance: float | None, verify_rows: int = 0, turn: int | None = None,
                   memo: dict | None = None, exact: bool = True) -> list[dict]:
    """Greedy decoding: every speculative continuation must equal the plain one decoded beside it.
    (A sampled one follows the same distribution, not the same tokens: tests/test_sampling.py.)

    Returns the partings accepted as near ties (``lossless_verdict``), each with ``between``
    naming the pair; raises BenchmarkError on any other parting. ``verify_rows``: the rows of the
    row's verify forward (1 + drafts per step), the shape ``divergence`` also recomputes under
    ``tie_tolerance`` None. ``turn``: the turn of a suite of several turns that ``encoded`` holds,
    recorded with each near tie and named in the error. ``memo``: ``divergence``'s, shared by the
    checks of every row against one plain decode.

    ``exact`` False (a low-precision verifier, whose logits move with a forward's row count): no
    parting raises here; each is returned, marked ``within_noise`` by ``lossless_verdict``, for
    ``float32_replay`` to judge, which is the check there."""
    near_ties, mismatches = [], []
    for task, ids, tm in zip(tasks, encoded, timings):
        if tm.speculative is None or tm.plain.new_token_ids == tm.speculative.new_token_ids:
            continue
        d = divergence(verifier, ids, tm.plain.new_token_ids, tm.speculative.new_token_ids,
                       verify_rows if tie_tolerance is None else 0, memo)
        verdict = lossless_verdict(d, tie_tolerance)
        if verdict == "near-tie" or not exact:
            near_ties.append({"task_id": task["task_id"], **({"turn": turn} if turn else {}),
                              "between": "speculative/plain", **d,
                              **({} if exact else {"within_noise": verdict == "near-tie"})})
        else:
            gap = "n/a (one output ended)" if d["gap"] is None else f"{d['gap']:.4f}"
            noise = f", row-count noise {d['noise']:.4f}" if d.get("noise") is not None else ""
            where = f"{task['task_id']}" + (f" turn {turn}" if turn else "")
            mismatches.append(f"{where} at new token {d['position']}, logit gap {gap}{noise}")
    if mismatches:
        raise BenchmarkError(f"continuations differ on {len(mismatches)} prompts ({'; '.join(mismatches[:5])}); "
                             f"decoding is not lossless or not deterministic (benchmark.tie_tolerance "
                             f"{'null: the row-count noise' if tie_tolerance is None else tie_tolerance} covers "
                             "only smaller logit gaps)")
    return near_ties


def float32_replay(loaded32, row: str, tasks: list[dict], encoded: list[list[int]],
                   timings: list[PromptTiming], max_new_tokens: int, turn: int | None = None,
                   plain_memo: dict | None = None) -> int:
    """The exact lossless check of a low-precision benchmark: every prompt whose speculative
    output parted from plain greedy's is decoded again in float32 (``loaded32``: the same verifier
    and drafters, loaded in float32, a ``domino.bench.job.Loaded``), plain and by ``row``'s drafter,
    and the two must agree token for token; a parting there raises, naming the prompt and the
    position. Returns the number of prompts replayed. In float32 on a CPU a forward's logits do not
    move with its row count, so a correct loop cannot part there, while a loop that accepts a draft
    the verifier does not rank first parts wherever the low-precision one did. ``plain_memo``: the
    float32 plain decodes by prompt, kept across the rows of one job (a prompt several drafters part
    on is decoded once)."""
    v, stop, draft = loaded32.verifier, loaded32.stop_ids, loaded32.drafts[row]
    memo = {} if plain_memo is None else plain_memo
    replayed, defects = 0, []
    for task, ids, tm in zip(tasks, encoded, timings):
        if tm.speculative is None or tm.plain.new_token_ids == tm.speculative.new_token_ids:
            continue
        key = (tuple(ids), max_new_tokens)
        if key not in memo:
            memo[key] = decode(v, ids, max_new_tokens, stop).new_token_ids
        plain = memo[key]
        spec = decode(v, ids, max_new_tokens, stop, draft=draft).new_token_ids
        replayed += 1
        if plain != spec:
            t = next((i for i, (a, b) in enumerate(zip(plain, spec)) if a != b), min(len(plain), len(spec)))
            defects.append(f"{task['task_id']}" + (f" turn {turn}" if turn else "") + f" at new token {t}")
    if defects:
        raise BenchmarkError(f"{row}: replayed in float32, the speculative output still parts from plain greedy on "
                             f"{len(defects)} prompts ({'; '.join(defects[:5])}): decoding is not lossless")
    return replayed


def margin_signs(partings: list[dict]) -> dict:
    """Which token the whole-prefix forward prefers at each parting (``divergence``'s first margin,
    plain token minus speculative token): a correct loop's partings fall on both sides, a loop that
    accepts drafts the verifier ranks lower favours the plain token. A two-sided sign test over the
    partings with a preference (exact binomial, p = 1/2)."""
    margins = [p["margins"][0] for p in partings if p.get("margins")]
    plus, minus = sum(m > 0 for m in margins), sum(m < 0 for m in margins)
    n, k = plus + minus, min(plus, minus)
    p = min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n) if n else 1.0
    return {"plain_preferred": plus, "speculative_preferred": minus, "ties": len(margins) - n, "sign_test_p": p}
