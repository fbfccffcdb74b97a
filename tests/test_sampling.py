"""Sampling at temperature > 0: plain, and speculative with the lossless rule, for all three kinds.

The statistical tests compare the joint distribution of the first three sampled tokens with the
exact one, enumerated from the verifier over every prefix, by a chi-square test (cells with
fewer than 5 expected samples pooled); a deliberately wrong rule (accept every draft), applied
to the same random draws, must fail the same test. The joint over some 640 cells is blind to
small errors; the one-token marginals, with more steps, detect a total-variation error of 0.01
with power >= 0.9 (the computation is in their test's docstring).
"""

from typing import NamedTuple

import pytest
import torch

from conftest import tiny_drafter, tiny_verifier
from domino import sampling
from domino.aux import aux_states
from domino.decode import NeuralDraft, OracleDraft, decode
from domino.model import Drafter, DrafterConfig
from domino.sampling import SamplingRule, accept_or_resample, propose_sampled, sampling_probs, seeded_generator
from domino.vocab import mappings

KINDS = [("dflash", True), ("dflash", False), ("domino", True)]
# (projector, shift_label, temperature, top_p) for the statistical tests
STAT_KINDS = [("dflash", True, 1.0, 1.0), ("dflash", False, 0.8, 0.9), ("domino", True, 1.0, 1.0)]
STEP_SAMPLES = 20_000  # samples of the speculative step (exact p and q tables + the rule) per kind
MARGINAL_SAMPLES = 110_000  # steps per kind for the one-token marginals (power: test_one_token_marginals)
ALPHA = 1e-3  # a lossless rule fails a fit this often by chance
DECODE_SAMPLES = 20_000  # full speculative sampling decodes per kind (about a minute each on 2 cores)
PLAIN_SAMPLES = 3_000  # plain sampling decodes of two tokens
PROMPT = [5]
V = 16  # the statistical tests' vocabulary


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here on one thread: the timings stay put and the seeded draws bitwise fixed."""


def _prompts(n, vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 30, (n,), generator=g).tolist()
    return [torch.randint(0, vocab - 1, (L,), generator=g).tolist() for L in lengths]


# --- the pure functions, by hand ----------------------------------------------------------


def test_sampling_probs_hand_worked():
    logits = torch.tensor([0.5, 0.3, 0.2]).log()
    assert torch.allclose(sampling_probs(logits, 1.0), torch.tensor([0.5, 0.3, 0.2]))
    # T = 0.5 squares the probabilities before renormalising: (.25, .09, .04) / .38
    assert torch.allclose(sampling_probs(logits, 0.5), torch.tensor([0.25, 0.09, 0.04]) / 0.38)
    # top-p 0.6: mass before the tokens is 0, .5, .8, so the first two stay: (.5, .3) / .8
    assert torch.allclose(sampling_probs(logits, 1.0, 0.6), torch.tensor([0.625, 0.375, 0.0]))
    # top-p 0.5: the second token's preceding mass is .5, not below .5
    assert torch.allclose(sampling_probs(logits, 1.0, 0.5), torch.tensor([1.0, 0.0, 0.0]))
    with pytest.raises(ValueError, match="greedy"):
        sampling_probs(logits, 0.0)
    with pytest.raises(ValueError, match="top_p"):
        sampling_probs(logits, 1.0, 0.0)


def test_accept_or_resample_hand_worked():
    """p = (.5, .3, .2), q = (.2, .6, .2) at the single draft, bonus distribution one-hot at 2.

    Draft 0: p/q = 2.5, always accepted, then the bonus 2. Draft 2: p/q = 1, the same.
    Draft 1: accepted with p/q = 1/2; else the residual max(p - q, 0) = (.3, 0, 0) gives 0.
    So the first token is 0 w.p. .2 + .6 * .5 = .5, 1 w.p. .3 and 2 w.p. .2: exactly p.
    """
    p = torch.tensor([[0.5, 0.3, 0.2], [0.0, 0.0, 1.0]], dtype=torch.float64)
    q = torch.tensor([[0.2, 0.6, 0.2]], dtype=torch.float64)
    g = seeded_generator(0)
    for x in (0, 2):
        assert accept_or_resample(torch.tensor([x]), q, p, g) == (1, 2)
    outcomes = [accept_or_resample(torch.tensor([1]), q, p, g) for _ in range(20_000)]
    assert set(outcomes) == {(1, 2), (0, 0)}
    accepted = sum(o.accepted for o in outcomes) / len(outcomes)
    assert abs(accepted - 0.5) < 4.5 * (0.25 / len(outcomes)) ** 0.5, accepted
    # a draft the verifier gives probability 0 is always rejected; the residual is (0, .5, 0)
    p0 = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    q0 = torch.tensor([[0.5, 0.5, 0.0]], dtype=torch.float64)
    assert all(accept_or_resample(torch.tensor([0]), q0, p0, g) == (0, 1) for _ in range(50))
    # two drafts both certain under p: both accepted, then the bonus from the last row
    p2 = torch.eye(3, dtype=torch.float64)[[1, 2, 0]]
    assert accept_or_resample(torch.tensor([1, 2]), torch.full((2, 3), 1 / 3, dtype=torch.float64), p2, g) == (2, 0)
    # no drafts: the token comes from p[0]
    assert accept_or_resample(torch.tensor([], dtype=torch.long), p2[:0], p2[2:], g) == (0, 0)


def test_accept_or_resample_refuses_bad_input():
    p = torch.full((2, 3), 1 / 3)
    with pytest.raises(ValueError, match="n\\+1"):
        accept_or_resample(torch.tensor([0]), p[:1], p[:1], seeded_generator(0))
    with pytest.raises(ValueError, match="probability 0 under q"):
        accept_or_resample(torch.tensor([2]), torch.tensor([[0.5, 0.5, 0.0]]), p, seeded_generator(0))


# --- the drafter's pick_token hook ----------------------------------------------------------


def _drafter_with_context(verifier, drafter, prompt):
    draft = NeuralDraft(drafter)
    draft.reset(len(prompt))
    draft.add_context(aux_states(verifier, torch.tensor([prompt]), drafter.cfg.aux_layer_ids), 0)
    return draft


@pytest.mark.parametrize("projector,shift", KINDS)
def test_pick_token_argmax_is_the_default(verifier, projector, shift):
    d = tiny_drafter(verifier, projector=projector, shift_label=shift)
    nd = _drafter_with_context(verifier, d, [3, 1, 4, 1, 5])
    ref, ref_logits = d.draft(9, 5, nd.kv, return_logits=True)
    got, got_logits = d.draft(9, 5, nd.kv, return_logits=True, pick_token=lambda rows: rows.argmax(-1))
    assert got == ref and torch.equal(got_logits, ref_logits)


@pytest.mark.parametrize("projector,corrected", [("dflash", False), ("domino", True)])
def test_domino_head_reads_the_picked_token(verifier, projector, corrected):
    d = tiny_drafter(verifier, projector=projector, shift_label=True)
    nd = _drafter_with_context(verifier, d, [3, 1, 4, 1, 5])
    rows = [d.draft(9, 5, nd.kv, 2, return_logits=True, pick_token=lambda r, t=t: torch.full(r.shape[:1], t))[1]
            for t in (0, 7)]
    assert torch.equal(rows[0][0], rows[1][0])  # slot 0 is never corrected
    assert torch.equal(rows[0][1], rows[1][1]) != corrected  # slot 1 read the token picked at slot 0


# --- the decoding entry points ---------------------------------------------------------------


@pytest.mark.parametrize("projector,shift", KINDS)
def test_same_seed_same_tokens_and_eos(verifier, projector, shift):
    """Same seed: same tokens. An EOS cuts the same draws at its first occurrence."""
    draft = NeuralDraft(tiny_drafter(verifier, projector=projector, shift_label=shift))
    prompt = _prompts(1, verifier.config.vocab_size, seed=5)[0]

    def spec(seed, eos=()):
        return decode(verifier, prompt, 30, eos, draft=draft, rule=SamplingRule(1.0, 1.0, seeded_generator(seed)))

    a, b, c = spec(0), spec(0), spec(1)
    assert (a.new_token_ids, a.accepted_per_step) == (b.new_token_ids, b.accepted_per_step)
    assert a.new_token_ids != c.new_token_ids
    # a sampled step shortened for the budget commits tokens but is not counted (vLLM drafts a full block)
    assert len(a.new_token_ids) == 30 >= 1 + a.steps + sum(a.accepted_per_step) and a.stop_reason == "length"
    eos = a.new_token_ids[17]
    cut = spec(0, {eos})
    assert cut.new_token_ids == a.new_token_ids[: a.new_token_ids.index(eos) + 1] and cut.stop_reason == "eos"
    plain = [decode(verifier, prompt, 20, rule=SamplingRule(0.7, 0.9, seeded_generator(s)))
             for s in (0, 0, 1)]
    assert plain[0].new_token_ids == plain[1].new_token_ids != plain[2].new_token_ids


def test_sampling_needs_a_temperature_a_generator_and_a_drafter(verifier):
    """Temperature 0 is greedy decoding (decode's default rule), not a sampling rule."""
    with pytest.raises(ValueError, match="Generator"):
        SamplingRule(1.0, 1.0, None)
    with pytest.raises(ValueError, match="temperature 0 is greedy decoding"):
        SamplingRule(0.0, 1.0, seeded_generator(0))
    with pytest.raises(ValueError, match="temperature"):
        SamplingRule(-1.0, 1.0, seeded_generator(0))
    with pytest.raises(ValueError, match="top_p"):
        SamplingRule(1.0, 0.0, seeded_generator(0))
    with pytest.raises(TypeError, match="OracleDraft has none"):
        decode(verifier, [1, 2], 4, draft=OracleDraft([1] * 8, 4), rule=SamplingRule(1.0, 1.0, seeded_generator(0)))


# --- losslessness, measured -----------------------------------------------------------------


class Fit(NamedTuple):
    tv: float  # total variation between the empirical and the exact distribution
    chi2: float
    dof: int
    p_value: float


def _fit(counts: torch.Tensor, probs: torch.Tensor) -> Fit:
    """Chi-square goodness of fit; cells expecting fewer than 5 samples pooled into one."""
    counts, probs = counts.double().flatten(), probs.double().flatten()
    n = counts.sum()
    expected = probs * n
    small = expected < 5
    obs = torch.cat([counts[~small], counts[small].sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    if bool(((exp == 0) & (obs > 0)).any()):
        return Fit(float(0.5 * (counts / n - probs).abs().sum()), float("inf"), len(obs) - 1, 0.0)
    obs, exp = obs[exp > 0], exp[exp > 0]
    chi2 = ((obs - exp) ** 2 / exp).sum()
    dof = len(obs) - 1
    p_value = torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), chi2 / 2)
    return Fit(float(0.5 * (counts / n - probs).abs().sum()), float(chi2), dof, float(p_value))


def _stat_drafter(verifier, projector, shift):
    """A 1-layer drafter on the 1-layer verifier whose q is flatter than p and far from it."""
    g = torch.Generator().manual_seed(1)
    d2t, t2d = mappings(torch.sort(torch.randperm(V - 1, generator=g)[:12]).values, V)
    cfg = DrafterConfig.schema_defaults(
        verifier.config, num_layers=1, block_size=4, aux_layer_ids=[0, 1], mask_token_id=V - 1,
        draft_vocab_size=12, shift_label=shift, projector=projector, gru_hidden_size=16,
        bottleneck_size=8, attn_implementation="eager")
    torch.manual_seed(1)
    drafter = Drafter.from_verifier(verifier, cfg, d2t, t2d).to(verifier.dtype).eval()
    with torch.no_grad():
        drafter.lm_head.weight.mul_(0.2)
        if drafter.head is not None:
            drafter.head.up.weight.mul_(20)
    return drafter


class Exact(NamedTuple):
    """The verifier's distributions after PROMPT + k tokens, k = 0..3: dist[k][t1, .., tk] (V,)."""

    dist: list[torch.Tensor]

    @property
    def joint3(self) -> torch.Tensor:  # (V, V, V)
        d0, d1, d2 = self.dist[:3]
        return d0[:, None, None] * d1[:, :, None] * d2


@torch.no_grad()
def _exact(verifier, temperature, top_p) -> Exact:
    """Enumerate every prefix of up to three tokens after PROMPT (one batched forward per length)."""
    dist = []
    for k in range(4):
        tails = torch.cartesian_prod(*[torch.arange(V)] * k).view(-1, k) if k else torch.zeros(1, 0, dtype=torch.long)
        ids = torch.cat([torch.tensor(PROMPT).expand(len(tails), -1), tails], 1)
        dist.append(sampling_probs(verifier(ids).logits[:, -1], temperature, top_p).view(*[V] * k, V))
    return Exact(dist)


@pytest.fixture(scope="module")
def stat_verifier():
    verifier = tiny_verifier(vocab=V, layers=1, hidden=32)
    for p in verifier.parameters():
        p.requires_grad_(False)
    return verifier


def _null_tv(probs: torch.Tensor, n: int) -> float:
    """TV of n samples drawn straight from probs: what sampling noise alone gives."""
    draws = torch.multinomial(probs.flatten(), n, replacement=True, generator=seeded_generator(99))
    return float(0.5 * (torch.bincount(draws, minlength=probs.numel()) / n - probs.flatten()).abs().sum())


def _report(kind, what, right: Fit, wrong: Fit, accepted: torch.Tensor, probs: torch.Tensor):
    """Print the fits, sampling noise's TV, and how the first step's two drafts fared."""
    share = [f"{float((accepted == c).double().mean()):.3f}" for c in range(3)]
    rejected = float((accepted < 2).double().sum() / (accepted + 1).clamp(max=2).sum())
    print(f"\n{kind} {what}: lossless TV {right.tv:.4f} chi2 {right.chi2:.1f}/{right.dof} p {right.p_value:.3g}; "
          f"accept-all TV {wrong.tv:.4f} chi2 {wrong.chi2:.1f}/{wrong.dof} p {wrong.p_value:.3g}; "
          f"exact-sample TV {_null_tv(probs, len(accepted)):.4f}; first step accepted 0/1/2 drafts "
          f"{'/'.join(share)}, {rejected:.3f} of the drafts tested rejected")


def _check(right: Fit, wrong: Fit):
    assert right.p_value > ALPHA, right
    assert wrong.p_value < 1e-9 and wrong.tv > 3 * right.tv, wrong


class DraftTables(NamedTuple):
    """The drafter's q over the target vocabulary after PROMPT + t1: q0 (V, V) [t1, x] and
    q1 (V, V, V) [t1, d0, x] (rows only for d0 in the draft vocabulary)."""

    q0: torch.Tensor
    q1: torch.Tensor


@torch.no_grad()
def _draft_tables(draft, temperature, top_p) -> DraftTables:
    """Enumerate the drafter's two slots, forcing each draft-vocabulary token at the first."""
    d = draft.drafter
    target = d.draft_to_target(torch.arange(d.cfg.draft_vocab_size))
    q0, q1 = torch.zeros(V, V, dtype=torch.float64), torch.zeros(V, V, V, dtype=torch.float64)
    for t1 in range(V):
        for i, d0 in enumerate(target.tolist()):
            _, logits = d.draft(t1, len(PROMPT), draft.kv, 2, return_logits=True,
                                pick_token=lambda rows, i=i: torch.full(rows.shape[:1], i))
            q = sampling_probs(logits, temperature, top_p)
            q0[t1, target], q1[t1, d0, target] = q[0], q[1]
    return DraftTables(q0, q1)


def _resample_from_p(draft_ids, q, p, generator):
    """A wrong rule: the right acceptance test, but a rejected draft is replaced by a draw from p."""
    c, _ = accept_or_resample(draft_ids, q, p, generator)
    return c, int(torch.multinomial(p[c], 1, generator=generator))


def _sample_steps(exact: Exact, tables: DraftTables, rule, g, n: int = STEP_SAMPLES):
    """``n`` steps -> counts of the first three tokens under ``rule`` and under accept-all, and
    the number of drafts the rule accepted at each step."""
    right, accept_all, accepted = torch.zeros(V, V, V), torch.zeros(V, V, V), torch.zeros(n)
    for i in range(n):
        t1 = int(torch.multinomial(exact.dist[0], 1, generator=g))
        d0 = int(torch.multinomial(tables.q0[t1], 1, generator=g))
        d1 = int(torch.multinomial(tables.q1[t1, d0], 1, generator=g))
        q = torch.stack([tables.q0[t1], tables.q1[t1, d0]])
        p = torch.stack([exact.dist[1][t1], exact.dist[2][t1, d0], exact.dist[3][t1, d0, d1]])
        c, nxt = rule(torch.tensor([d0, d1]), q, p, g)
        tokens = [t1, d0, d1][: c + 1] + [nxt]
        if len(tokens) < 3:  # the next step's token, whatever its drafts, is distributed as p
            tokens.append(int(torch.multinomial(exact.dist[2][tuple(tokens)], 1, generator=g)))
        right[tuple(tokens[:3])] += 1
        accept_all[t1, d0, d1] += 1
        accepted[i] = c
    return right, accept_all, accepted


@pytest.mark.parametrize("projector,shift,temperature,top_p", STAT_KINDS)
def test_speculative_step_is_lossless(stat_verifier, projector, shift, temperature, top_p):
    """20,000 steps: t1 from p, two drafts from the drafter's q, the rule, p and q from exact tables.

    The tables are the library's own: ``propose_sampled`` returns exactly their rows for the
    tokens it drafts (checked first), so the step is the one the decode loop takes.
    """
    exact = _exact(stat_verifier, temperature, top_p)
    draft = _drafter_with_context(stat_verifier, _stat_drafter(stat_verifier, projector, shift), PROMPT)
    tables = _draft_tables(draft, temperature, top_p)
    g = seeded_generator(0)
    for t1 in range(V):
        prop = propose_sampled(draft, t1, len(PROMPT), 2, temperature, top_p, g)
        expected = torch.stack([tables.q0[t1], tables.q1[t1, prop.token_ids[0]]])
        assert torch.allclose(prop.q, expected, rtol=0, atol=1e-12)
    right, wrong, accepted = _sample_steps(exact, tables, accept_or_resample, seeded_generator(1))
    fits = _fit(right, exact.joint3), _fit(wrong, exact.joint3)
    kind = f"{projector} shift={shift} T={temperature} top_p={top_p}"
    _report(kind, f"{STEP_SAMPLES} steps", *fits, accepted, exact.joint3)
    _check(*fits)
    subtle = _fit(_sample_steps(exact, tables, _resample_from_p, seeded_generator(1))[0], exact.joint3)
    print(f"  resample-from-p rule: TV {subtle.tv:.4f} chi2 {subtle.chi2:.1f}/{subtle.dof} p {subtle.p_value:.3g}")
    assert subtle.p_value < 1e-9, subtle


def _power(dof: int, lam: float, alpha: float = ALPHA, draws: int = 200_000) -> float:
    """P(chi-square statistic > its critical value at ``alpha``) when the noncentrality is
    ``lam``, by simulation: the statistic is a sum of ``dof`` squared unit normals, shifted by
    ``lam`` in total, and the critical value is the null's (1 - alpha) quantile, simulated too."""
    g = torch.Generator().manual_seed(5)
    null = torch.randn(draws, dof, generator=g, dtype=torch.float64).pow(2).sum(1)
    shift = torch.zeros(dof, dtype=torch.float64)
    shift[0] = lam ** 0.5
    alt = (torch.randn(draws, dof, generator=g, dtype=torch.float64) + shift).pow(2).sum(1)
    return float((alt > torch.quantile(null, 1 - alpha)).double().mean())


@pytest.mark.parametrize("projector,shift,temperature,top_p", STAT_KINDS)
def test_one_token_marginals_detect_a_total_variation_error_of_one_percent(stat_verifier, projector, shift,
                                                                           temperature, top_p):
    """The second and the third sampled token, each alone (16 cells), over 110,000 steps.

    Power: a wrong rule whose marginal differs from the exact ``p`` by total variation
    ``delta`` has chi-square noncentrality ``lam = n * sum_i d_i^2 / p_i >= 4 n delta^2`` (Cauchy-Schwarz,
    with ``sum |d_i| = 2 delta`` and ``sum p_i <= 1``), whatever cells it moves. With n = 110,000
    and delta = 0.01, lam >= 44; at ``dof <= 15`` and alpha = 1e-3 the fit then rejects with
    probability >= 0.9 (``_power``, asserted below for the fit's own dof). The joint test above,
    over some 640 cells, needs lam near 150 for the same power, which 20,000 steps give only from
    delta = 0.04. The accept-all rule, run on the same draws, must fail both marginals.
    """
    exact = _exact(stat_verifier, temperature, top_p)
    draft = _drafter_with_context(stat_verifier, _stat_drafter(stat_verifier, projector, shift), PROMPT)
    tables = _draft_tables(draft, temperature, top_p)
    right, wrong, _ = _sample_steps(exact, tables, accept_or_resample, seeded_generator(2), MARGINAL_SAMPLES)
    kind = f"{projector} shift={shift} T={temperature} top_p={top_p}"
    for token, others in ((2, (0, 2)), (3, (0, 1))):
        probs = exact.joint3.sum(others)
        fit, bad = _fit(right.sum(others), probs), _fit(wrong.sum(others), probs)
        power = _power(fit.dof, 4 * MARGINAL_SAMPLES * 0.01 ** 2)
        print(f"\n{kind} token {token} marginal, {MARGINAL_SAMPLES} steps: lossless TV {fit.tv:.4f} "
              f"chi2 {fit.chi2:.1f}/{fit.dof} p {fit.p_value:.3g}; accept-all TV {bad.tv:.4f} p {bad.p_value:.3g}; "
              f"power against TV 0.01: {power:.3f}")
        assert power >= 0.9, power
        assert fit.p_value > ALPHA, fit
        assert bad.p_value < 1e-9, bad


@pytest.mark.parametrize("projector,shift,temperature,top_p", STAT_KINDS)
def test_speculative_sampling_is_lossless(stat_verifier, projector, shift, temperature, top_p, monkeypatch):
    """Full decodes of four tokens (the first step drafts two: one budget slot is the bonus's).

    The first three tokens are compared; the accept-all rule is read off the same decodes'
    first-step drafts.
    """
    exact = _exact(stat_verifier, temperature, top_p)
    draft = NeuralDraft(_stat_drafter(stat_verifier, projector, shift))
    calls = []

    def spy(draft_ids, q, p, generator):
        outcome = accept_or_resample(draft_ids, q, p, generator)
        calls.append((draft_ids.tolist(), outcome.accepted))
        return outcome

    monkeypatch.setattr(sampling, "accept_or_resample", spy)
    g = seeded_generator(0)
    right, wrong, accepted = torch.zeros(V, V, V), torch.zeros(V, V, V), torch.zeros(DECODE_SAMPLES)
    for i in range(DECODE_SAMPLES):
        calls.clear()
        out = decode(stat_verifier, PROMPT, 4, draft=draft, rule=SamplingRule(temperature, top_p, g))
        (drafts, accepted[i]) = calls[0]
        right[tuple(out.new_token_ids[:3])] += 1
        wrong[tuple([out.new_token_ids[0]] + drafts)] += 1
    fits = _fit(right, exact.joint3), _fit(wrong, exact.joint3)
    kind = f"{projector} shift={shift} T={temperature} top_p={top_p}"
    _report(kind, f"{DECODE_SAMPLES} decodes", *fits, accepted, exact.joint3)
    _check(*fits)
    # the accept-all rule run for real gives the spy's reading: t1 and the drafts, same seed
    calls.clear()
    ref = decode(stat_verifier, PROMPT, 4, draft=draft, rule=SamplingRule(temperature, top_p, seeded_generator(7)))
    monkeypatch.setattr(sampling, "accept_or_resample", lambda ids, q, p, gen: (len(ids), 0))
    bad = decode(stat_verifier, PROMPT, 4, draft=draft, rule=SamplingRule(temperature, top_p, seeded_generator(7)))
    assert len(calls[0][0]) == 2 and bad.new_token_ids[:3] == ref.new_token_ids[:1] + calls[0][0]


def test_plain_sampling_is_the_verifiers_distribution(stat_verifier):
    exact = _exact(stat_verifier, 0.8, 0.9)
    g = seeded_generator(0)
    counts = torch.zeros(V, V)
    for _ in range(PLAIN_SAMPLES):
        out = decode(stat_verifier, PROMPT, 2, rule=SamplingRule(0.8, 0.9, g))
        counts[tuple(out.new_token_ids)] += 1
    fit = _fit(counts, exact.joint3.sum(-1))
    print(f"\nplain sampling T=0.8 top_p=0.9, {PLAIN_SAMPLES} decodes of 2 tokens: TV {fit.tv:.4f} "
          f"chi2 {fit.chi2:.1f}/{fit.dof} p {fit.p_value:.3g}")
    assert fit.p_value > 1e-3, fit
    assert _fit(counts.T, exact.joint3.sum(-1)).p_value < 1e-9  # the same counts, tokens swapped: caught
