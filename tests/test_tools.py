"""domino.tools: every check run by hand explains itself with --help, and each runs once, small."""

import importlib
import json
import pkgutil
import subprocess
import sys

import pytest

import domino.tools
from conftest import ROOT

TOOLS = sorted(m.name for m in pkgutil.iter_modules(domino.tools.__path__))


def test_the_tools_are_found():
    assert {"bench_decode", "bench_memory", "bench_paired", "compare", "random_verifier"} <= set(TOOLS)


@pytest.mark.parametrize("name", TOOLS)
def test_help_says_what_the_tool_does_and_what_each_argument_is(name):
    """The description is the module's docstring, whole; every argument has a help text."""
    module = importlib.import_module(f"domino.tools.{name}")
    p = module.parser()
    assert p.prog == f"python -m domino.tools.{name}"
    assert p.description == module.__doc__ and len(p.description.strip().splitlines()) >= 3
    for action in p._actions:
        if action.dest != "help":
            assert action.help and len(action.help) > 8, (name, action.dest)


def test_help_prints_the_description_and_the_arguments():
    out = subprocess.run([sys.executable, "-m", "domino.tools.compare", "--help"], capture_output=True, text=True,
                         check=True).stdout
    assert "Every file\nunder ``results/`` must be byte-identical" in out  # the docstring as written
    assert "a workflow run directory (with results/ and reports/)" in out


# ------------------------------------------------------------------ the hand-run tools, each run once, small


def test_profile_step_times_each_part_of_every_checkpoints_step(micro_run, capsys):
    from domino.tools import profile_step

    profile_step.main(["--run", str(micro_run), "--prompts", "2", "--max-new-tokens", "8", "--threads", "1"])
    out = capsys.readouterr().out
    for name in ("dflash-shift", "dflash-noshift", "domino", "verify forward", "correction loop"):
        assert name in out, name


def test_bench_commits_against_this_commit_gives_the_same_outputs(micro_run, capsys):
    """The package of HEAD (git archive) beside this checkout's: where the checkout is HEAD, every
    decoder's outputs are the same both ways."""
    from domino.tools import bench_commits

    if subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "domino"], cwd=ROOT).returncode != 0:
        pytest.skip("the checkout's package differs from HEAD's: the outputs may differ")  # a working tree being edited
    bench_commits.main(["--run", str(micro_run), "--against", "HEAD", "--prompts", "2", "--max-new-tokens", "8",
                        "--threads", "1"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and " of 2 |" in line]
    assert [r.split(" | ")[0] for r in rows] == ["| plain", "| dflash-noshift", "| dflash-shift", "| domino"], rows
    assert all(r.endswith("| 2 of 2 |") for r in rows), rows


def test_bench_threads_measures_each_workload_idle_and_beside_a_busy_core(capsys):
    from domino.tools import bench_threads

    bench_threads.main(["--threads", "1", "--policies", "PASSIVE", "--seconds", "0.3"])
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| train")
            or line.startswith("| decode")]
    assert [r[0] for r in rows] == ["| train", "| decode"] and all(r[1] == "PASSIVE" for r in rows)
    assert all(float(r[2]) > 0 and float(r[3]) > 0 and r[4].endswith("x") for r in rows), rows


def test_report_screenshot_opens_the_page_in_the_browser_it_is_given(tmp_path, capsys):
    """A stand-in for Chromium that records what it was asked to load and writes the PNG: the copy
    of the report it loads shows the page by name; without a browser the tool says what to install."""
    from domino.tools import report_screenshot

    report = tmp_path / "report.html"
    report.write_text("<html><body><p>report</p></body></html>")
    browser = tmp_path / "chromium"
    browser.write_text("#!/bin/sh\nfor a in \"$@\"; do case $a in --screenshot=*) out=${a#--screenshot=};; "
                       "file://*) page=${a#file://};; esac; done\ncp \"$page\" \"$out\"\n")
    browser.chmod(0o755)
    report_screenshot.main([str(report), "--page", "model_card.html", "--browser", str(browser)])
    png = tmp_path / "model_card_screenshot.png"
    assert capsys.readouterr().out.strip() == str(png)
    assert '"model_card.html"' in png.read_text() and png.read_text().startswith("<html><body><p>report</p>")
    with pytest.raises(SystemExit, match="no Chromium found .*apt-get install chromium"):
        report_screenshot.main([str(report), "--browser", str(tmp_path / "none")])


def test_served_gap_walk_steps_as_the_loop_does():
    from domino.tools.served_gap import walk

    # anchor 10 accepts 2 drafts (next anchor 13), 13 accepts 0 (14), 14 accepts 3 (18): no count at 18
    assert walk({10: 2, 11: 5, 13: 0, 14: 3, 15: 1}, 10) == [2, 0, 3]
    assert walk({}, 0) == []


def test_served_gap_teacher_forcing_the_served_condition_is_the_loop(micro_run, tmp_path, capsys):
    """On the micro run (float32): the drafts teacher-forced at the anchors the loop visits accept
    what every served step accepted, step for step, for every checkpoint."""
    import json

    from domino.tools import served_gap

    out = tmp_path / "gap.json"
    served_gap.main(["--run", str(micro_run), "--threads", "1", "--out", str(out)])
    figures = json.loads(out.read_text())
    assert set(figures["checkpoints"]) == {"dflash-noshift", "dflash-shift", "domino"}
    for ck, c in figures["checkpoints"].items():  # an answer's last step may part where the budget cuts it
        assert c["served"]["steps_compared"] > 0, ck
        assert c["served"]["steps_as_walked"] >= 0.97 * c["served"]["steps_compared"], ck
        assert c["served"]["estimate"] == pytest.approx(c["own_answers_loop_anchors"]["estimate"], rel=0.02), ck
    assert "answer tokens outside the draft vocabulary" in capsys.readouterr().out


def test_compare_acceptance_pairs_two_runs_prompt_by_prompt(tmp_path, capsys):
    """Two runs on the same prompts: each trained row's acceptance, and B's over A's paired over the
    prompts (here B accepts one more draft at every step of every prompt: 2 tokens a step
    against 1, +100%); the rows without training are left out; other plain answers are refused."""
    from domino.io import write_json
    from domino.tools import compare_acceptance as ca

    def write(run, accepted, answers):
        folder = tmp_path / run / "results" / "benchmark" / "humaneval"
        folder.mkdir(parents=True)
        prompts = [{"task_id": f"t{i}", "new_token_ids": answers[i], "accepted_per_step": []} for i in range(4)]
        write_json(folder / "baseline.json", {"prompts": prompts}, seal=True)
        write_json(folder / "domino.json", {"prompts": [{**p, "accepted_per_step": [accepted] * (i + 2)}
                                                         for i, p in enumerate(prompts)]}, seal=True)
        write_json(folder / "ngram.json", {"decoder": {"kind": "ngram"}, "prompts": prompts}, seal=True)

    answers = [[1, 2, 3]] * 4
    write("a", 0, answers)
    write("b", 1, answers)
    ca.main([str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "pairs.json")])
    out = capsys.readouterr().out
    assert "domino: A 1.000" in out and "B 2.000" in out and "B/A - 1 +100.0%" in out and "ngram" not in out
    f = json.loads((tmp_path / "pairs.json").read_text())["suites"]["humaneval"]["domino"]
    assert f["prompts"] == 4 and f["a"]["steps"] == 2 + 3 + 4 + 5 and f["b_over_a"]["estimate"] == pytest.approx(1.0)

    write("c", 1, [[1, 2, 3]] * 3 + [[1, 2, 4]])
    with pytest.raises(SystemExit, match="plain greedy's answers differ on 1 prompts"):
        ca.main([str(tmp_path / "a"), str(tmp_path / "c")])


def test_replay_free_replays_the_jobs_model_free_rows_step_for_step(micro_run, tmp_path, capsys):
    """The lookup's and the suffix cache's recorded steps come back from the answers alone (each
    answer's last step aside); other settings and the cost rule replay beside them. A row whose
    recorded steps are not its replay's (here one accepted count changed) is named and fails the run,
    said to be approximate where the row's outputs parted from plain greedy's (bf16)."""
    from domino.io import read_json, write_json
    from domino.tools import replay_free

    folder = micro_run / "results" / "benchmark" / "humaneval"
    assert replay_free.main([str(folder), "--suffix", "max_spec_factor=1.0,min_token_prob=0.1",
                             "--ngram", "max_n=3", "--cost-aware"]) == 0
    out = capsys.readouterr().out
    assert out.count("as recorded") == 2 and "DIFFER" not in out, out
    for row in ("suffix max_spec_factor=1.0,min_token_prob=0.1, cost rule", "ngram max_n=3",
                "suffix (the hybrid's settings), cost rule"):
        assert row in out, row

    with pytest.raises(SystemExit, match="'max_spec' is not one of the suffix settings drafts, max_depth"):
        replay_free.main([str(folder), "--suffix", "max_spec=2"])
    with pytest.raises(SystemExit, match="max_n takes an integer, not '2.5'"):
        replay_free.main([str(folder), "--ngram", "max_n=2.5"])

    copy = tmp_path / "humaneval"
    copy.mkdir()
    for f in folder.glob("*.json"):
        (copy / f.name).write_bytes(f.read_bytes())
    suffix = read_json(copy / "suffix.json", sealed=True)
    steps = next(p["accepted_per_step"] for p in suffix["prompts"] if len(p["accepted_per_step"]) > 1)
    steps[0] += 1
    write_json(copy / "suffix.json", suffix, seal=True)
    assert replay_free.main([str(copy)]) == 1
    out, err = capsys.readouterr()
    line = next(x for x in out.splitlines() if x.startswith("suffix (the job's)"))
    assert line.endswith("DIFFER from the recorded") and "the answers are not its own" in err
    suffix["summary"]["matches_baseline"] = False  # as a bf16 job records an output that parted at a near tie
    suffix["protocol"]["verifier_dtype"] = "bfloat16"
    write_json(copy / "suffix.json", suffix, seal=True)
    assert replay_free.main([str(copy)]) == 1
    assert "the suffix row's outputs parted from plain greedy's (a bfloat16 verifier's" in capsys.readouterr().err


def test_replay_free_takes_a_later_turn_after_every_tasks_earlier_one(tmp_path):
    """Two tasks of two turns: the job decodes both first turns, then both second turns (the suffix
    cache has learnt three answers when it drafts the last), and the replay takes them so."""
    from domino.io import write_json
    from domino.tools.replay_free import load_job, recorded_steps

    def task(i):
        return {"turns": [{"prompt_token_ids": [i, t], "new_token_ids": [10 * i + t], "accepted_per_step": [t]}
                          for t in range(2)]}

    costs = {"verify_seconds": [1.0, 1.5], "drafter_seconds": None, "context_tokens": 4}
    job = tmp_path / "mt-bench"
    job.mkdir()
    write_json(job / "ngram.json", {"decoder": {"kind": "ngram"}, "prompts": [task(1), task(2)]}, seal=True)
    with pytest.raises(SystemExit, match="holds no cost-aware row, so no cost curve"):
        load_job(job)
    write_json(tmp_path / "hybrid.json", {"adaptive": {"costs": costs}, "prompts": []}, seal=True)
    rows, curve, pairs = load_job(job, tmp_path / "hybrid.json")  # another job's curve (--costs)
    assert [p for p, _ in pairs] == [[1, 0], [2, 0], [1, 1], [2, 1]] and [a for _, a in pairs] == [[10], [20], [11], [21]]
    assert recorded_steps(rows["ngram"]) == [[0], [0], [1], [1]] and curve.rows(2) == 1.5
