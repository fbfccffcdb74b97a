"""The decoding loops, plain and speculative, both with KV caches, and their one entry ``decode``.

A rule picks and checks the tokens: ``GreedyRule`` (the card's protocol) here, and
``domino.sampling.SamplingRule`` at temperature > 0. The loops are the same for both.

The speculative loop: prefill the verifier and take its greedy token (the anchor); then
repeat: draft a block after the anchor, verify ``[anchor, drafts]`` in one verifier forward,
accept the longest prefix of drafts equal to the verifier's greedy tokens, commit the
accepted drafts plus the verifier's own next token (the bonus, the next anchor), crop the
verifier cache to the committed rows and hand their auxiliary states to the drafter as new
context. Greedy verification makes the output the verifier's own greedy output; the
sampling rule keeps it distributed as plain sampling.

Token accounting: ``new_token_ids`` = the prefill's token + per step ``accepted + 1``,
truncated at the first EOS (inclusive) or at ``max_new_tokens``.

Step accounting follows vLLM's spec-decode counters (``vllm/v1/core/sched/scheduler.py``,
``Scheduler.update_from_output`` -> ``make_spec_decoding_stats`` ->
``vllm/v1/spec_decode/metrics.py`` ``SpecDecodingStats.observe_draft``): a step is recorded
(one of vLLM's ``num_drafts``) only when it verified at least one draft; its ``accepted`` is
every draft the verifier accepted, counted before the output is cut at EOS or at the token
budget (vLLM's ``len(generated_token_ids) - 1``); position i counts the step as accepted
when ``accepted > i`` (``num_accepted_tokens_per_pos``). vLLM never shortens a block for the
token budget (its scheduler drafts the full block, "we don't schedule partial draft tokens"),
only for the context length, so the greedy rule drafts the full block up to the context
(``n <= context - anchor position - 2``: the token after the drafts stays inside it), and
every recorded step counts in every position's denominator, as in vLLM's
``num_draft_tokens_per_pos``. The sampling rule drafts at most ``budget - 1`` tokens (more
would draw other random numbers and change the sampled output); a step it shortened for the
budget is not recorded, since vLLM would have drafted, and counted, a full block there.
A step that drafts nothing is a plain verifier step and is never recorded.
Hence ``len(new) == 1 + steps + sum(accepted)`` holds when no recorded step was cut and no
step went unrecorded; otherwise ``len(new)`` is smaller or larger accordingly.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from .aux import AuxCapture


@dataclass
class DecodeResult:
    new_token_ids: list[int]
    accepted_per_step: list[int] = field(default_factory=list)  # recorded steps (module docstring); empty for plain
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0  # every verifier forward, prefill included
    seconds: float = 0.0  # wall time of the whole call
    stop_reason: str = "length"  # "eos" | "length"

    @property
    def steps(self) -> int:
        return len(self.accepted_per_step)

    @property
    def overhead_seconds(self) -> float:
        return max(0.0, self.seconds - self.draft_seconds - self.verify_seconds)


def crop_cache(cache, length: int) -> None:
    """Keep the first ``length`` positions. transformers 5.x ``crop`` takes a negative count."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def cache_kwarg(verifier) -> str:
    """transformers 5.x renamed ``past_key_values`` to ``cache`` in the model forward."""
    params = inspect.signature(verifier.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class _Stopper:
    def __init__(self, max_new_tokens: int, eos_ids):
        self.max_new, self.eos = max_new_tokens, set(eos_ids or ())
        self.tokens: list[int] = []
        self.reason = None

    def push(self, tok: int) -> bool:
        """Append a token; True when generation is over."""
        self.tokens.append(tok)
        if tok in self.eos:
            self.reason = "eos"
        elif len(self.tokens) >= self.max_new:
            self.reason = "length"
        return self.reason is not None

    @property
    def budget(self) -> int:
        return self.max_new - len(self.tokens)


def _check_prompt(verifier, prompt_ids, max_new_tokens):
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be >= 1")
    limit = verifier.config.max_position_embeddings
    if len(prompt_ids) == 0:
        raise ValueError("empty prompt")
    if len(prompt_ids) + max_new_tokens > limit:
        raise ValueError(
            f"prompt of {len(prompt_ids)} tokens + {max_new_tokens} new tokens exceeds the verifier's "
            f"context of {limit} positions"
        )


class GreedyRule:
    """How a speculative step picks and checks tokens, greedily: the verifier's argmax is the
    next token, and the drafts accepted are the longest prefix equal to the argmax tokens.

    ``domino.sampling.SamplingRule`` is the same interface at temperature > 0; the loops
    (``plain_loop``, ``speculative_loop``) are shared."""

    def pick(self, logits: torch.Tensor) -> int:
        """logits (V,) of the verifier's next position -> the token there."""
        return int(logits.argmax())

    def drafts_for_budget(self, block: int, budget: int) -> int:
        """Drafts to propose when ``budget`` tokens remain: the full block (vLLM's schedule; the
        tokens past the budget are verified and dropped, which leaves greedy output unchanged)."""
        return block

    def propose(self, draft, anchor: int, anchor_pos: int, n: int):
        """``n`` drafts after the anchor, and what ``verify`` needs of them (nothing here)."""
        return (draft.propose(anchor, anchor_pos, n) if n > 0 else []), None

    def verify(self, drafts: list[int], proposal, logits: torch.Tensor) -> tuple[int, int]:
        """logits (n+1, V) of ``[anchor, drafts]`` -> (drafts accepted, the token after them)."""
        greedy = logits.argmax(-1).tolist()  # greedy[j] is the verifier's token for pos+j+1
        c = 0
        while c < len(drafts) and drafts[c] == greedy[c]:
            c += 1
        return c, greedy[c]


@torch.inference_mode()
def decode(verifier, prompt_ids, max_new_tokens: int, eos_ids=(), *, draft=None, rule=None) -> DecodeResult:
    """Decode ``max_new_tokens`` after ``prompt_ids``, stopping after any of ``eos_ids``.

    ``draft`` None: plain decoding, one verifier forward per token (the baseline); else the
    speculative loop with that drafter (a ``NeuralDraft`` or an ``OracleDraft``). ``rule`` None:
    greedy (``GreedyRule``); a ``domino.sampling.SamplingRule`` samples.
    """
    rule = GreedyRule() if rule is None else rule
    # a drafter that plans its requests (domino.adaptive) may find one not worth the speculative loop
    if draft is None or (hasattr(draft, "plan") and not draft.plan(prompt_ids)):
        return plain_loop(verifier, prompt_ids, max_new_tokens, eos_ids, rule)
    out = speculative_loop(verifier, draft, prompt_ids, max_new_tokens, eos_ids, rule)
    if hasattr(draft, "finish"):
        draft.finish()
    return out


def plain_loop(verifier, prompt_ids, max_new_tokens: int, eos_ids, rule) -> DecodeResult:
    """One verifier forward per token, each token picked by ``rule.pick``."""
    _check_prompt(verifier, prompt_ids, max_new_tokens)
    dev = verifier.device
    t_start = time.perf_counter()
    cache, ck = DynamicCache(config=verifier.config), cache_kwarg(verifier)
    stop = _Stopper(max_new_tokens, eos_ids)
    inp = torch.tensor([prompt_ids], device=dev)
    while True:
        out = verifier(input_ids=inp, **{ck: cache}, use_cache=True, logits_to_keep=1)
        tok = rule.pick(out.logits[0, -1])
        if stop.push(tok):
            break
        inp = torch.tensor([[tok]], device=dev)
    seconds = time.perf_counter() - t_start
    return DecodeResult(stop.tokens, [], 0.0, seconds, seconds, stop.reason)


class NeuralDraft:
    """Adapter from a ``Drafter`` to the decoding loop: owns the drafter's context cache and the
    Domino head's decoding tables (``Drafter.decode_tables``), built here once from the weights
    as they are: a session decodes with the drafter it was given; build another after changing
    the weights."""

    def __init__(self, drafter):
        self.drafter = drafter
        self.aux_layer_ids = drafter.cfg.aux_layer_ids
        self.drafts_per_step = drafter.cfg.drafts_per_step
        self.tables = drafter.decode_tables()
        self.kv = None

    def reset(self, prompt_ids: list[int]) -> None:
        self.kv = None

    def add_context(self, aux: torch.Tensor, start: int) -> None:
        """aux (1, S, A*H) of positions start .. start+S-1, appended to every layer's cache."""
        d = self.drafter
        aux = aux.to(d.fc.weight.dtype)
        pos = torch.arange(start, start + aux.shape[1], device=aux.device)[None]
        new = d.context_kv(d.fuse_context(aux), pos)
        if self.kv is None:
            self.kv = new
        else:
            self.kv = [(torch.cat([k0, k1], 2), torch.cat([v0, v1], 2)) for (k0, v0), (k1, v1) in zip(self.kv, new)]

    def propose(self, anchor: int, anchor_pos: int, n: int) -> list[int]:
        return self.drafter.draft(anchor, anchor_pos, self.kv, n, tables=self.tables)


class OracleDraft:
    """Proposes the verifier's own greedy continuation at no cost: the loop's ideal drafter."""

    aux_layer_ids = None

    def __init__(self, reference_new_tokens: list[int], drafts_per_step: int):
        self.ref = list(reference_new_tokens)
        self.drafts_per_step = drafts_per_step
        self.prompt_len = 0

    def reset(self, prompt_ids: list[int]) -> None:
        self.prompt_len = len(prompt_ids)

    def add_context(self, aux, start: int) -> None:
        pass

    def propose(self, anchor: int, anchor_pos: int, n: int) -> list[int]:
        i = anchor_pos - self.prompt_len + 1  # index in ref of the token after the anchor
        out = self.ref[i:i + n]
        # past the reference's end (a block beyond the token budget) pad with its last token
        return out + [self.ref[-1] if self.ref else 0] * (n - len(out))


def ngram_lookup(tokens: list[int], max_n: int, min_n: int, n_drafts: int, with_length: bool = False):
    """Prompt lookup: the ``n_drafts`` tokens that followed the latest earlier occurrence of the
    last m tokens of ``tokens``, for the largest m in ``max_n .. min_n`` that has one; [] when
    none has. The copy may run into the tokens it proposes (``a b a b`` after the 2-gram
    ``a b`` proposes ``a b a b ...``), so a match always gives a full block. ``with_length``:
    ``(drafts, m)``, m the length of the n-gram matched (0 for none)."""
    L = len(tokens)
    for m in range(min(max_n, L - 1), min_n - 1, -1):
        tail = tokens[L - m:]
        for j in range(L - m - 1, -1, -1):  # the latest occurrence that ends before the tail does
            if tokens[j:j + m] == tail:
                out = tokens[j + m:j + m + n_drafts]
                while len(out) < n_drafts:  # the copy overlaps what it proposes
                    out.append(out[len(out) - (L - j - m)])
                return (out, m) if with_length else out
    return ([], 0) if with_length else []


class NgramDraft:
    """The n-gram lookup (prompt lookup, vLLM's ``ngram``, transformers'
    ``prompt_lookup_num_tokens``): drafts what followed the latest earlier occurrence of the
    context's last n tokens (``ngram_lookup``), prompt and output so far, no training and no
    verifier state. A step without a match drafts nothing and is a plain verifier step, which
    the loop does not record (vLLM counts no draft there either).

    The context is kept here: ``reset`` gives the prompt, and each ``propose`` learns from its
    anchor's position how many of the previous step's drafts were accepted."""

    aux_layer_ids = None

    def __init__(self, drafts_per_step: int, max_n: int = 2, min_n: int = 1):
        if not 1 <= min_n <= max_n or drafts_per_step < 1:
            raise ValueError(f"an n-gram lookup needs 1 <= min_n <= max_n and drafts >= 1, got "
                             f"min_n {min_n}, max_n {max_n}, drafts {drafts_per_step}")
        self.drafts_per_step, self.max_n, self.min_n = drafts_per_step, max_n, min_n
        self.tokens: list[int] = []
        self.last: tuple[int, list[int]] = (-1, [])  # the previous step's anchor position and drafts

    def reset(self, prompt_ids: list[int]) -> None:
        self.tokens, self.last = list(prompt_ids), (-1, [])

    def add_context(self, aux, start: int) -> None:
        pass

    def advance(self, anchor: int, anchor_pos: int) -> None:
        """Commit the previous step's accepted drafts and the anchor (``anchor_pos`` tells how many)."""
        prev_pos, prev = self.last
        if prev_pos >= 0:  # commit the drafts the verifier accepted after the previous anchor
            del self.tokens[prev_pos + 1:]
            self.tokens += prev[:anchor_pos - prev_pos - 1]
        self.tokens.append(anchor)
        if len(self.tokens) != anchor_pos + 1:
            raise RuntimeError(f"n-gram lookup: the context holds {len(self.tokens)} tokens at anchor position {anchor_pos}")

    def match(self, n: int) -> tuple[list[int], int]:
        """``n`` drafts after the context (after ``advance``) and the length of the n-gram matched
        (0 and no drafts where none matches)."""
        return ngram_lookup(self.tokens, self.max_n, self.min_n, n, with_length=True) if n > 0 else ([], 0)

    def propose(self, anchor: int, anchor_pos: int, n: int) -> list[int]:
        self.advance(anchor, anchor_pos)
        out = self.match(n)[0]
        self.sent(anchor_pos, out)
        return out

    def sent(self, anchor_pos: int, drafts: list[int]) -> None:
        """The drafts this step verifies after the anchor at ``anchor_pos``, whoever proposed them:
        the next ``propose`` commits the ones the verifier accepted."""
        self.last = (anchor_pos, drafts)


class LookupThenDraft:
    """The n-gram lookup where the context holds a match, ``neural`` (a ``NeuralDraft``)
    elsewhere: each step drafts ``neural``'s block, from whichever proposes. The drafter reads
    every verified row's states whichever proposed, so that its context stays whole."""

    def __init__(self, neural: NeuralDraft, max_n: int = 2, min_n: int = 1):
        self.neural = neural
        self.lookup = NgramDraft(neural.drafts_per_step, max_n, min_n)
        self.aux_layer_ids = neural.aux_layer_ids
        self.drafts_per_step = neural.drafts_per_step

    def reset(self, prompt_ids: list[int]) -> None:
        self.neural.reset(prompt_ids)
        self.lookup.reset(prompt_ids)

    def add_context(self, aux, start: int) -> None:
        self.neural.add_context(aux, start)

    def propose(self, anchor: int, anchor_pos: int, n: int) -> list[int]:
        out = self.lookup.propose(anchor, anchor_pos, n) or self.neural.propose(anchor, anchor_pos, n)
        self.lookup.sent(anchor_pos, out)
        return out


def speculative_loop(verifier, draft, prompt_ids, max_new_tokens, eos_ids, rule) -> DecodeResult:
    """The speculative loop of the module docstring, picking and checking tokens by ``rule``."""
    _check_prompt(verifier, prompt_ids, max_new_tokens)
    # the aux states in the speculators convention, taken by hooks (domino.aux): (1, S, A*H)
    with AuxCapture(verifier, draft.aux_layer_ids or []) as cap:
        return _speculative_loop(verifier, draft, prompt_ids, max_new_tokens, eos_ids, cap, rule)


def _speculative_loop(verifier, draft, prompt_ids, max_new_tokens, eos_ids, cap, rule) -> DecodeResult:
    dev = verifier.device
    want_aux = draft.aux_layer_ids is not None
    t_draft = t_verify = 0.0
    t_start = time.perf_counter()
    cache, ck = DynamicCache(config=verifier.config), cache_kwarg(verifier)
    stop = _Stopper(max_new_tokens, eos_ids)
    accepted_per_step: list[int] = []

    t0 = time.perf_counter()
    out = verifier(input_ids=torch.tensor([prompt_ids], device=dev), **{ck: cache}, use_cache=True, logits_to_keep=1)
    anchor = rule.pick(out.logits[0, -1])
    t1 = time.perf_counter()
    t_verify += t1 - t0
    draft.reset(list(prompt_ids))
    if want_aux:
        draft.add_context(cap.aux(), 0)
    t_draft += time.perf_counter() - t1
    pos = len(prompt_ids)  # position of the anchor, which the verifier has not read yet
    done = stop.push(anchor)
    context = verifier.config.max_position_embeddings
    while not done:
        t0 = time.perf_counter()
        # vLLM's schedule: the full block, cut only where the token after it would leave the context
        full = max(0, min(draft.drafts_per_step, context - pos - 2))
        n = rule.drafts_for_budget(full, stop.budget)
        drafts, proposal = rule.propose(draft, anchor, pos, n)
        t1 = time.perf_counter()
        out = verifier(input_ids=torch.tensor([[anchor] + drafts], device=dev), **{ck: cache}, use_cache=True)
        c, nxt = rule.verify(drafts, proposal, out.logits[0])
        t2 = time.perf_counter()
        crop_cache(cache, pos + c + 1)  # keep the anchor and the accepted drafts
        if want_aux:
            draft.add_context(cap.aux()[:, : c + 1], pos)
        t3 = time.perf_counter()
        t_draft += (t1 - t0) + (t3 - t2)
        t_verify += t2 - t1
        for tok in drafts[:c] + [nxt]:
            if stop.push(tok):
                done = True
                break
        # vLLM's num_drafts: a step that verified a block; a decoder that chooses its drafts' number
        # (``variable_drafts``, domino.adaptive) every step that verified at least one
        if 0 < len(drafts) == full or (drafts and getattr(draft, "variable_drafts", False)):
            accepted_per_step.append(c)
        anchor, pos = nxt, pos + c + 1
    seconds = time.perf_counter() - t_start
    return DecodeResult(stop.tokens, accepted_per_step, t_draft, t_verify, seconds, stop.reason)
