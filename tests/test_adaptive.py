"""Cost-aware drafting (``domino.adaptive``): the rule's pure parts against hand-computed cases,
and every cost-aware decoder lossless in the loop."""

import pytest
import torch

from conftest import tiny_drafter
from domino.adaptive import (
    Calibration,
    CostAwareDraft,
    CostCurve,
    NgramSource,
    SuffixSource,
    best_prefix,
    expected_tokens,
)
from domino.decode import NeuralDraft, NgramDraft, OracleDraft, decode
from domino.suffix import SuffixDraft


def test_expected_tokens_by_hand():
    # E_0 = 1; E_1 = 1 + 0.5; E_2 = 1.5 + 0.5 * 0.4 = 1.7; E_3 = 1.7 + 0.2 * 1.0 = 1.9
    assert expected_tokens([0.5, 0.4, 1.0]) == pytest.approx([1.0, 1.5, 1.7, 1.9])


def test_best_prefix_by_hand():
    # rows cost 1.0, 1.1, 1.2, 2.0 s; at rate 1 token/s: values 1-1 = 0, 1.5-1.1 = 0.4,
    # 1.7-1.2 = 0.5, 1.9-2.0 = -0.1 -> two drafts
    costs = CostCurve((1.0, 1.1, 1.2, 2.0))
    assert best_prefix([0.5, 0.4, 1.0], costs, 1.0) == (2, pytest.approx(0.5))
    # at a rate where every extra row costs more than it yields: a plain step
    assert best_prefix([0.5, 0.4, 1.0], costs, 5.0)[0] == 0
    # a flat curve sends everything that has any chance
    assert best_prefix([0.5, 0.4, 1.0], CostCurve((1.0,) * 4), 1.0)[0] == 3


def test_the_curve_extends_its_last_slope():
    c = CostCurve((1.0, 1.5, 2.0))
    assert c.rows(3) == 2.0 and c.rows(5) == pytest.approx(3.0)
    assert c.plain_rate == 1.0


def test_calibration_starts_at_the_estimate_and_learns_the_acceptance():
    cal = Calibration(bins=10, prior=2.0)
    assert cal.p("s", 0, 0.93) == pytest.approx(0.95)  # the bin's middle, before any token is judged
    for _ in range(8):
        cal.observe("s", 0, 0.93, False)
    assert cal.p("s", 0, 0.93) == pytest.approx(1.9 / 10)  # (0 + 2 * 0.95) / (8 + 2)
    assert cal.p("s", 1, 0.93) == pytest.approx(0.95)  # another slot group keeps its prior
    assert cal.table() == [{"source": "s", "slot": 0, "q": [0.9, 1.0], "judged": 8, "accepted_share": 0.0}]


def _prompts(n, vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab - 1, (int(torch.randint(2, 30, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def _decoders(verifier, costs):
    drafter = tiny_drafter(verifier, projector="domino", shift_label=True)
    return {
        "adaptive": CostAwareDraft(NeuralDraft(drafter), costs=costs),
        "hybrid": CostAwareDraft(NeuralDraft(drafter), {"suffix": SuffixSource(SuffixDraft(6)),
                                                        "ngram": NgramSource(NgramDraft(5))}, costs=costs),
        "free": CostAwareDraft(None, {"suffix": SuffixSource(SuffixDraft(6))}, costs=costs),
    }


@pytest.mark.parametrize("curve", [(1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0), (1.0, 1.3, 1.6, 1.9, 2.2, 2.5, 2.8)])
def test_cost_aware_decoders_are_lossless(verifier, curve):
    """Whatever each step sends (flat costs send much, steep costs little), the output is plain greedy's."""
    costs = CostCurve(curve, drafter=0.2)
    for name, draft in _decoders(verifier, costs).items():
        for i, prompt in enumerate(_prompts(10, verifier.config.vocab_size, seed=3)):
            ref = decode(verifier, prompt, 30)
            out = decode(verifier, prompt, 30, draft=draft)
            assert out.new_token_ids == ref.new_token_ids, (name, i)
            draft.learn(out.new_token_ids)
        chosen = draft.record()["chosen"]
        assert sum(c["steps"] for c in chosen.values()) > 0


def test_a_drafter_that_is_always_right_is_sent_and_a_costly_useless_one_is_not(verifier):
    """With the oracle's tokens (always accepted) and cheap rows the decoder sends long drafts;
    when rows cost as much as a plain step each, it sends none once calibration has seen them fail."""
    prompt = _prompts(1, verifier.config.vocab_size, seed=5)[0]
    full = decode(verifier, prompt, 40).new_token_ids

    class Oracle(SuffixSource):  # the oracle as a free source, its estimate 1.0 for each token
        def __init__(self):
            self.o, self.drafts_per_step = OracleDraft(full, 6), 6

        def reset(self, prompt_ids):
            self.o.reset(prompt_ids)

        def advance(self, anchor, anchor_pos):
            self.pos = anchor_pos

        def best(self, n):
            toks = self.o.propose(0, self.pos, n)
            return toks, [1.0] * len(toks)

        def sent(self, anchor_pos, drafts):
            pass

    cheap = CostAwareDraft(None, {"oracle": Oracle()}, costs=CostCurve((1.0,) + (1.01,) * 6))
    out = decode(verifier, prompt, 40, draft=cheap)
    assert out.new_token_ids == full and min(out.accepted_per_step[:-1]) == 6

    class Wrong(Oracle):
        def best(self, n):
            toks, est = super().best(n)
            return [(t + 1) % 90 for t in toks], est

    costly = CostAwareDraft(None, {"wrong": Wrong()}, costs=CostCurve(tuple(float(k) for k in range(1, 8))))
    out = decode(verifier, prompt, 40, draft=costly)
    assert out.new_token_ids == full
    assert costly.chosen["none"][0] > costly.chosen.get("wrong", [0])[0]


def test_a_cost_aware_decoder_needs_its_costs(verifier):
    d = CostAwareDraft(None, {"suffix": SuffixSource(SuffixDraft(4))})
    with pytest.raises(RuntimeError, match="after its costs are measured"):
        decode(verifier, [1, 2, 3], 5, draft=d)


def _simulated(full, prompt_len, costs):
    """A cost-aware decoder over ``_oracle_drafter`` on a clock that advances by the curve's cost of
    the rows each step sent and by the drafter's forward when it runs: the seconds it measures are
    the cost model's."""
    t = [0.0]
    decoder = CostAwareDraft(_oracle_drafter(full, prompt_len, t, costs.drafter), costs=costs)
    decoder.clock = lambda: t[0]
    propose = decoder.propose

    def step(anchor, anchor_pos, n):
        out = propose(anchor, anchor_pos, n)
        t[0] += decoder.costs.rows(len(out) + 1)
        return out

    decoder.propose = step
    return decoder


def _oracle_drafter(full, prompt_len, clock=None, seconds=0.0):
    """What LazyContext and CostAwareDraft read of a NeuralDraft, drafting the verifier's own next
    tokens (``full``), the slots asked for, each estimated at about 0.9; each draft advances a
    simulated ``clock`` (a one-item list) by ``seconds``."""

    class Drafter:
        def draft(self, anchor, anchor_pos, kv, n, return_logits=False, tables=None):
            if clock is not None:
                clock[0] += seconds
            start = anchor_pos + 1 - prompt_len
            tokens = full[start:start + n]
            logits = torch.full((len(tokens), 4), 0.0)
            logits[:, 0] = 5.0  # softmax max about 0.9
            return tokens, logits

    class Oracle:
        aux_layer_ids = None
        drafts_per_step, kv, tables, drafter = 8, None, None, Drafter()

        def reset(self, prompt_ids):
            pass

        def add_context(self, aux, start):
            pass

    return Oracle()


def test_a_drafter_kept_short_by_a_cost_step_recovers_its_long_drafts(verifier):
    """A verify forward whose cost steps up at two rows and stays flat after (as a CPU kernel's
    switch does): two drafts do not pay, eight do. A drafter whose recent drafts were short drafts
    short (two slots more than it sent); its probes draft the whole block, so it finds the long
    drafts that pay and sends them, instead of staying short and sitting out."""
    prompt = _prompts(1, verifier.config.vocab_size, seed=5)[0]
    full = decode(verifier, prompt, 60).new_token_ids
    costs = CostCurve((1.0, 3.0, 3.0, 3.05, 3.05, 3.05, 3.05, 3.05, 3.1), drafter=0.3)
    d = _simulated(full, len(prompt), costs)
    d.sent_k, d.slots = 0.0, 2  # after a stretch of drafts not sent
    out = decode(verifier, prompt, 60, draft=d)
    assert out.new_token_ids == full
    assert d.chosen["drafter"][1] / d.chosen["drafter"][0] > 5  # long drafts, once a probe found them
    assert max(out.accepted_per_step) == 8


@pytest.mark.parametrize("drafter_cost, runs_every_step", [(0.3, True), (40.0, False)])
def test_the_drafter_runs_by_what_its_steps_measured(verifier, drafter_cost, runs_every_step):
    """The same always-right drafter on a clock that charges its forward: cheap, it runs every step
    once measured; costing 40 plain steps (its nine tokens a step cannot pay), it runs only for its
    first measured steps and its probes, and sits out the next request."""
    prompt = _prompts(1, verifier.config.vocab_size, seed=5)[0]
    full = decode(verifier, prompt, 120).new_token_ids
    costs = CostCurve((1.0, 1.1, 1.1, 1.1, 1.2, 1.2, 1.2, 1.2, 1.2), drafter=drafter_cost)
    d = _simulated(full, len(prompt), costs)
    out = decode(verifier, prompt, 120, draft=d)
    assert out.new_token_ids == full
    steps = sum(n for n, _ in d.chosen.values())
    if runs_every_step:
        assert d.drafter_runs == steps and d.chosen["drafter"][1] / d.chosen["drafter"][0] > 5
        assert d.benched_requests == 0
    else:
        assert d.drafter_runs < steps / 4 and d.chosen["none"][0] > 3 * d.chosen["drafter"][0]
        assert d.benched_requests == 1 and not d.plan(prompt)  # benched: the next request is decoded plainly


def test_the_drafter_pays_by_its_measured_steps_against_the_steps_without_it():
    """By hand: the drafter's steps' tokens per second against the steps' without it in the same
    situation (measured once there are MIN_STEPS, the model's rival before)."""
    d = CostAwareDraft(free={"ngram": NgramSource(NgramDraft(4, 2, 1))}, costs=CostCurve((0.004, 0.005)))
    rival = (1.0, 0.004)  # a plain step by the curve: 250 tokens/s
    assert d._measured_pays("none", rival)  # not measured yet: it runs to be measured
    d.measured[("none", True)] = [10, 30, 0.05]  # 600 tokens/s
    assert d._measured_pays("none", rival)
    d.measured[("none", True)] = [10, 30, 0.5]  # 60 tokens/s
    assert not d._measured_pays("none", rival)
    d.measured[("none", False)] = [3, 3, 0.15]  # 20 tokens/s, but three steps: the rival still
    assert not d._measured_pays("none", rival)
    d.measured[("none", False)] = [4, 4, 0.2]  # four: measured
    assert d._measured_pays("none", rival)
    assert d._measured_pays("free", rival)  # another situation: measured on its own


def test_the_rate_is_the_jobs_measured_one_from_a_prior_at_plain_decodings():
    """``R`` starts at plain decoding's rate by the curve (a prior of 16 tokens), follows the
    tokens and measured seconds of the job's requests, the current one included, and never
    falls below plain decoding's: by hand."""
    from domino.adaptive import NgramSource
    from domino.decode import NgramDraft

    d = CostAwareDraft(free={"ngram": NgramSource(NgramDraft(4, 2, 1))}, costs=CostCurve((0.01, 0.011)))
    assert d.rate == pytest.approx(100.0)  # 16 / 0.16
    d.job_tokens, d.job_seconds = 84.0, 0.5  # earlier requests: 168 tokens/s
    assert d.rate == pytest.approx(100 / 0.66)
    d.tokens_so_far, d.seconds_so_far = 100.0, 0.34  # the current request
    assert d.rate == pytest.approx(200 / 1.0)
    d.finish()
    d.reset([1, 2, 3])  # a new request folds the last into the job's
    assert (d.job_tokens, d.job_seconds, d.tokens_so_far) == (184.0, pytest.approx(0.84), 0.0)
    assert d.rate == pytest.approx(200.0)
    d.job_tokens, d.job_seconds = 10.0, 1.0  # slower than plain: plain's rate
    assert d.rate == pytest.approx(100.0)
