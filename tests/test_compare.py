"""domino.tools.compare: two runs, timing aside; only the differing paths are counted and named."""

import json

import pytest

from domino.tools import compare

CARD = """| Stage | Wall time (s) |
|-------|---------------|
{rows}

| Run | Tokens per step | Step cost (plain steps) | Speedup |
|-----|-----------------|-------------------------|---------|
| Domino | 2.10 | {cost} | {speedup} |
"""


def make_run(root, seconds=1.0, al=1.5, extra=None):
    (root / "results" / "benchmark").mkdir(parents=True)
    (root / "results" / "benchmark" / "domino.json").write_text(json.dumps(
        {"summary": {"acceptance_length": al, "seconds": seconds, "tps": 10 / seconds, "plain_seconds": 2 * seconds,
                     "speedup_interval": [0.9, 1.1]}, "prompts": [{"seconds": seconds, "new_token_ids": [1, 2]}]}))
    (root / "results" / "train.txt").write_text("weights")
    for name in extra or []:
        (root / "results" / name).write_text("x")
    (root / "reports").mkdir()
    (root / "reports" / "model_card.md").write_text(CARD.format(rows=f"| train/domino | {seconds} |", cost=seconds,
                                                                speedup=1 / seconds))
    return root


def test_timing_aside_two_runs_are_identical(tmp_path, capsys):
    a, b = make_run(tmp_path / "a"), make_run(tmp_path / "b", seconds=3.0)
    assert compare.compare_runs(a, b) == []
    with pytest.raises(SystemExit, match="0"):
        compare.main([str(a), str(b)])
    assert capsys.readouterr().out.strip() == "identical: 2 files under results/ and the card's tables, timing aside"


def test_only_the_differing_paths_are_counted_and_named(tmp_path, capsys):
    a, b = make_run(tmp_path / "a"), make_run(tmp_path / "b", al=1.6, extra=["new.txt"])
    diffs = compare.compare_runs(a, b)
    assert diffs == ["results/new.txt only in B", "results/benchmark/domino.json differs"]
    with pytest.raises(SystemExit, match="1"):
        compare.main([str(a), str(b)])
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "DIFFERENT: 2 of 3 files under results/ and the card's tables differ, timing aside"
    assert out[:2] == diffs


def test_a_card_table_value_outside_timing_columns_differs(tmp_path):
    a, b = make_run(tmp_path / "a"), make_run(tmp_path / "b")
    card = b / "reports" / "model_card.md"
    card.write_text(card.read_text().replace("| Domino | 2.10 |", "| Domino | 2.20 |"))
    (diff,) = compare.compare_runs(a, b)
    assert diff.startswith("reports/model_card.md differs: tables differ in 1 rows")


def test_a_directory_that_holds_no_run_is_refused_in_one_line(tmp_path):
    a = make_run(tmp_path / "a")
    with pytest.raises(SystemExit, match=r"nowhere has no results/ folder"):
        compare.main([str(a), str(tmp_path / "nowhere")])
    with pytest.raises(FileNotFoundError, match=r"nowhere has no results/ folder"):  # the library too
        compare.compare_runs(tmp_path / "nowhere", a)


def test_a_card_in_one_run_only_differs(tmp_path):
    a, b = make_run(tmp_path / "a"), make_run(tmp_path / "b")
    (b / "reports" / "model_card.md").unlink()
    assert compare.compare_runs(a, b) == ["reports/model_card.md only in A"]


@pytest.mark.parametrize("key", ["tokens_per_second", "tps", "plain_tps_ci", "seconds", "draft_seconds", "speedup_ci",
                                 "tps_ratio_to_ours", "wall_seconds", "elapsed", "duration_s", "throughput",
                                 "latency_ms", "step_time", "ms", "train_secs", "machine_load", "load_average_before"])
def test_a_timing_field_is_timing(key):
    assert compare.strip_timing({"summary": {key: 1.0, "steps": 3}}) == {"summary": {"steps": 3}}


@pytest.mark.parametrize("key", ["generated_tokens", "items", "accepted_per_step", "acceptance_length", "steps",
                                 "timing_note_free", "max_new_tokens", "conversations", "cut", "loaded_rows"])
def test_a_result_field_is_a_result(key):
    assert compare.strip_timing({key: 1}) == {key: 1}


def test_regenerated_answers_that_differ_only_in_their_rate_are_identical(tmp_path):
    """The regenerate stage's summary records its throughput as tokens_per_second: two runs that
    differ only there (every kill-matrix trial against its reference) are identical."""
    runs = [make_run(tmp_path / "a"), make_run(tmp_path / "b")]
    for run, rate in zip(runs, (41.5, 77.25)):
        (run / "results" / "regenerate").mkdir()
        (run / "results" / "regenerate" / "train.json").write_text(json.dumps(
            {"conversations": 195, "cut": 3, "generated_tokens": 9000, "seconds": 9000 / rate,
             "tokens_per_second": rate}))
    assert compare.compare_runs(*runs) == []
    (runs[1] / "results" / "regenerate" / "train.json").write_text(json.dumps(
        {"conversations": 194, "cut": 3, "generated_tokens": 9000, "seconds": 1.0, "tokens_per_second": 9000.0}))
    assert compare.compare_runs(*runs) == ["results/regenerate/train.json differs"]


def test_the_kill_matrix_runs_a_directory_reference_inside_a_checkout(tmp_path):
    """--reference runs/x, made with snakemake --directory, holds no Snakefile: a --forcerun trial
    lays it over a copy of the checkout, so the documented command finds the workflow."""
    from domino.tools.kill_matrix import copy_run

    reference = tmp_path / "runs" / "x"
    (reference / "results").mkdir(parents=True)
    (reference / "results" / "a.json").write_text("{}")
    (reference / ".snakemake").mkdir()
    trial = copy_run(reference, tmp_path / "trial", [])
    assert (trial / "Snakefile").is_file() and (trial / "workflow").is_dir() and (trial / "config.yaml").is_file()
    assert (trial / "results" / "a.json").read_text() == "{}" and (trial / ".snakemake").is_dir()
    (reference / "Snakefile").write_text("# a run made in its own checkout")
    again = copy_run(reference, tmp_path / "again", [])
    assert (again / "Snakefile").read_text() == "# a run made in its own checkout" and not (again / "workflow").exists()


def test_a_cost_aware_rows_choices_are_timings_and_its_tokens_are_not(tmp_path):
    """A cost-aware row chooses its drafts by the costs its job measured: its steps, acceptance and
    choices may differ between two runs, in its results and in the card; its tokens may not."""
    def run(root, steps, tokens):
        make_run(root)
        (root / "results" / "benchmark" / "hybrid.json").write_text(json.dumps(
            {"adaptive": {"chosen": {"suffix": {"steps": steps}}}, "decoder": {"kind": "hybrid"},
             "summary": {"acceptance_length": 1 + steps / 10, "steps": steps},
             "prompts": [{"accepted_per_step": [steps], "new_token_ids": tokens}]}))
        with open(root / "reports" / "model_card_appendix.md", "w") as f:
            f.write(f"| Model | Accept len |\n|---|---|\n| hybrid: Domino, cost-aware | {steps} |\n| Domino | 1.8 |\n\n"
                    f"## Cost-aware decoding\n\n| Rows verified | 1 |\n|---|---|\n| Milliseconds | {steps} |\n\n"
                    "## Next\n\n| a | b |\n|---|---|\n| x | y |\n")
        return root

    a = run(tmp_path / "a", 3, [1, 2])
    assert compare.compare_runs(a, run(tmp_path / "b", 5, [1, 2])) == []
    assert compare.compare_runs(a, run(tmp_path / "c", 5, [1, 3])) == ["results/benchmark/hybrid.json differs"]
    d = run(tmp_path / "d", 3, [1, 2])
    (d / "reports" / "model_card_appendix.md").write_text(
        (d / "reports" / "model_card_appendix.md").read_text().replace("| Domino | 1.8 |", "| Domino | 1.9 |"))
    assert compare.compare_runs(a, d)[0].startswith("reports/model_card_appendix.md differs")
