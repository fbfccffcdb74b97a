"""The Snakemake DAG: a dry run of the default, one real micro run, and what reruns after an edit."""

import json
import shlex
from collections import Counter

import pytest

from conftest import DEFAULT_JOBS, REPORT_COMMAND, copy_repo, planned_jobs, run_snakemake

CHECKPOINTS = ["dflash-shift", "dflash-noshift", "domino"]


def test_dry_run_of_the_default(tmp_path):
    repo = copy_repo(tmp_path)
    out = run_snakemake(repo, "-n", "reports/model_card.md")
    jobs = planned_jobs(out)
    assert jobs == DEFAULT_JOBS, jobs


def test_dry_run_with_the_vllm_stages(tmp_path):
    """vllm.benchmark adds the vLLM runs (plain + the noshift DFlash export: vLLM reads a shifted
    export one slot off, and has no Domino head) and the extraction runs under the vLLM
    interpreter; nothing else changes."""
    repo = copy_repo(tmp_path)
    fake = tmp_path / "vllm-env-python"
    (repo / "vllm.yaml").write_text(
        "verifier: {embedded: {num_attention_heads: 2, num_key_value_heads: 1, head_dim: 64}}\n"
        f"features: {{backend: vllm}}\nvllm: {{python: {fake}, benchmark: true}}\n")
    out = run_snakemake(repo, "-n", "-p", "--configfile", "config.yaml", "vllm.yaml", "--", "reports/model_card.md")
    jobs = planned_jobs(out)
    assert jobs == {**DEFAULT_JOBS, "export": 1, "vllm_benchmark_baseline": 1, "vllm_benchmark": 1}, jobs
    text = out.stdout + out.stderr
    assert text.count(f"{fake} -m domino extract_hidden_states") == 2
    assert text.count(f"{fake} -m domino vllm_benchmark") == 2
    assert "results/vllm_benchmark/dflash-noshift.json" in text
    assert "results/vllm_benchmark/domino.json" not in text
    assert "results/vllm_benchmark/dflash-shift.json" not in text


@pytest.mark.parametrize("overlay,added", [
    ("config/sampling.yaml", {"sampling": 2}),  # one job per T > 0: 0.6 and 1.0
    ("config/replicates.yaml", {"train": 6}),   # two more trainings per checkpoint, the same benchmark job
])
def test_dry_run_of_an_overlay(overlay, added, tmp_path):
    repo = copy_repo(tmp_path)
    out = run_snakemake(repo, "-n", "-p", "--configfile", "config.yaml", overlay, "--", "reports/model_card.md")
    jobs = Counter(DEFAULT_JOBS) + Counter(added)
    assert planned_jobs(out) == dict(jobs), planned_jobs(out)
    if "replicates" in overlay:  # the benchmark job decodes all nine trained runs beside plain greedy
        text = out.stdout + out.stderr
        assert "--runs dflash-shift dflash-noshift domino dflash-shift-seed1" in text
        assert "results/benchmark/domino-seed2.json" in text and "results/validate/domino-seed1.json" not in text


def test_micro_run_outputs(micro_run):
    r = micro_run / "results"
    base = json.loads((r / "benchmark" / "baseline.json").read_text())
    assert base["summary"]["prompts"] == 6 and len(base["prompts"]) == 6
    for p in base["prompts"]:
        assert {"task_id", "prompt_token_ids", "new_token_ids", "accepted_per_step", "seconds"} <= set(p)
        assert 1 <= len(p["new_token_ids"]) <= 12
    for ck in CHECKPOINTS:
        b = json.loads((r / "benchmark" / f"{ck}.json").read_text())
        s = b["summary"]
        for key in ("acceptance_length", "tps", "per_position_acceptance", "conditional_acceptance", "prompts",
                    "new_tokens", "seconds"):
            assert key in s
        assert s["matches_baseline"] is True
        assert [p["new_token_ids"] for p in b["prompts"]] == [p["new_token_ids"] for p in base["prompts"]]
        assert s["acceptance_length"] == pytest.approx(1 + sum(s["per_position_acceptance"]))
        assert len(s["per_position_acceptance"]) == (7 if ck == "dflash-noshift" else 8)
        v = json.loads((r / "validate" / f"{ck}.json").read_text())
        assert len(v["per_slot"]) == 8 and 0 <= v["overall"]["final_acc"] <= 1
        ckpt = r / "train" / ck / "checkpoint"
        assert (ckpt / "model.safetensors").exists() and (ckpt / "drafter_config.json").exists()
        lines = (r / "train" / ck / "metrics.jsonl").read_text().splitlines()
        assert {"loss", "base_loss", "final_loss", "lambda", "lr"} <= set(json.loads(lines[0]))
    card = (micro_run / "reports" / "model_card.md").read_text()
    assert card.startswith("---\n") and "\n## Model Description\n" in card and "\n## Inference Benchmark\n" in card
    for ck in CHECKPOINTS:  # the card prints each checkpoint's measured acceptance length
        al = json.loads((r / "benchmark" / f"{ck}.json").read_text())["summary"]["acceptance_length"]
        assert f"{al:.3f}" in card, (ck, al)
    assert (micro_run / "reports" / "reproduction.md").exists()
    # every job wrote its own non-empty log: one per job of the plan (14 on the default's DAG)
    logs = sorted((micro_run / "logs").rglob("*.log"))
    assert len(logs) == sum(DEFAULT_JOBS.values()) and all(p.stat().st_size > 0 for p in logs)
    # the same budget for the three checkpoints
    steps = {json.loads((r / "train" / ck / "summary.json").read_text())["steps"] for ck in CHECKPOINTS}
    assert len(steps) == 1


def test_every_stage_reads_exactly_the_keys_it_declares(micro_run):
    """A stage that read an undeclared key would have failed the run (``UndeclaredKey``); here, the
    other way round: every declared key is read by some job of its stage, so no declaration makes
    a stage rerun for a key it never uses."""
    from domino.stages import STAGES, unread

    records = [json.loads(line) for line in (micro_run / "config-reads.jsonl").read_text().splitlines()]
    by_stage = {}
    for rec in records:
        by_stage.setdefault(rec["stage"], []).append(rec)
    assert set(by_stage) == set(DEFAULT_JOBS), sorted(by_stage)
    for stage, recs in by_stage.items():
        for rec in recs:  # each job received exactly its declaration
            wildcard_free = [k for k in STAGES[stage].reads if "{" not in k]
            assert set(wildcard_free) <= set(rec["declared"]), (stage, rec)
        # a key is never read when every job that declared it left it unread (a wildcard key such
        # as checkpoints.{checkpoint} is declared by one job each)
        declared_by, unread_by = Counter(), Counter()
        for rec in recs:
            declared_by.update(rec["declared"])
            unread_by.update(unread(rec["declared"], set(rec["read"])))
        never = sorted(k for k, n in unread_by.items() if n == declared_by[k])
        assert never == [], (stage, never)


def test_a_deleted_checkpoint_is_rebuilt_as_the_readme_says(micro_run, tmp_path):
    """Snakemake does not rebuild a missing file whose consumers are up to date (the card's own
    command says "Nothing to be done"); the README's advice, naming the file, plans its training."""
    weights = micro_run / "results" / "train" / "domino" / "checkpoint" / "model.safetensors"
    kept = tmp_path / "model.safetensors"
    weights.rename(kept)
    try:
        card_only = planned_jobs(run_snakemake(micro_run, "-n", "reports/model_card.md", "--configfile", "config.yaml",
                                               "micro.yaml"))
        by_name = planned_jobs(run_snakemake(micro_run, "-n", str(weights.relative_to(micro_run)), "--configfile",
                                             "config.yaml", "micro.yaml"))
    finally:
        kept.rename(weights)
    assert card_only == {}, card_only  # Snakemake's behaviour, which the README describes
    assert by_name == {"train": 1}, by_name


def test_html_report(micro_run):
    """The README's --report command on a finished run: one offline HTML file with the plots."""
    args = shlex.split(REPORT_COMMAND)[3:]  # after "snakemake --cores 1"
    run_snakemake(micro_run, *args, "--configfile", "config.yaml", "micro.yaml")
    html = (micro_run / "reports" / "report.html").read_text(errors="replace")
    assert len(html) > 100_000
    for name in ("acceptance_per_position.png", "conditional_acceptance.png", "model_card.md"):
        assert name in html, name


def _edit(repo, text):
    (repo / "edit.yaml").write_text(text)
    return planned_jobs(run_snakemake(repo, "-n", "reports/model_card.md", "--configfile", "config.yaml",
                                      "micro.yaml", "edit.yaml"))


def test_editing_a_benchmark_value_reruns_only_benchmark_and_report(micro_run):
    assert planned_jobs(run_snakemake(micro_run, "-n", "reports/model_card.md", "--configfile", "config.yaml",
                                      "micro.yaml")) == {}
    jobs = _edit(micro_run, "benchmark:\n  max_new_tokens: 10\n")
    assert jobs == {"benchmark": 1, "report": 1}, jobs


def test_editing_a_training_value_reruns_training_and_what_follows(micro_run):
    jobs = _edit(micro_run, "train:\n  lr: 0.002\n")
    assert jobs == {"train": 3, "validate": 3, "benchmark": 1, "report": 1}, jobs


def test_editing_one_variant_reruns_only_its_jobs(micro_run):
    jobs = _edit(micro_run, "checkpoints:\n  dflash-shift: {train: {lr: 0.002}}\n")
    assert jobs == {"train": 1, "validate": 1, "benchmark": 1, "report": 1}, jobs


def test_more_seed_replicates_train_only_the_new_ones(micro_run):
    """train.replicates 1 -> 3 on a finished run: six new trainings (two per checkpoint), the
    benchmark job (which decodes every run side by side) and the report; nothing retrains."""
    jobs = _edit(micro_run, "train:\n  replicates: 3\n")
    assert jobs == {"train": 6, "benchmark": 1, "report": 1}, jobs


def test_a_run_with_other_overlays_is_refused_in_this_directory(micro_run):
    """One directory holds one configuration: another set of overlays stops before any job."""
    (micro_run / "other.yaml").write_text("benchmark:\n  max_new_tokens: 10\n")
    card = micro_run / "reports" / "model_card.md"
    before = card.stat().st_mtime_ns
    out = run_snakemake(micro_run, "reports/model_card.md", "--configfile", "config.yaml", "micro.yaml", "other.yaml",
                        check=False)
    text = out.stdout + out.stderr
    assert "config error: this directory holds a run with the overlays ['micro.yaml']" in text, text[-2000:]
    assert "snakemake --directory runs/NAME" in text
    assert card.stat().st_mtime_ns == before


def test_two_runs_are_identical_timing_aside(micro_run, tmp_path):
    """A second micro run from a fresh copy gives the same results files and card tables, timing
    aside, although it also built the exports (their timing files must not reach the card)."""
    from domino.tools.compare import compare_runs

    again = copy_repo(tmp_path)
    # the second run builds the exports before its report, the first after it: the card must
    # not depend on what else ran (the export jobs' timing files are there before one report only)
    exports = [f"results/export/{ck}" for ck in CHECKPOINTS]
    run_snakemake(again, *exports, "--configfile", "config.yaml", "micro.yaml")
    run_snakemake(again, "reports/model_card.md", "--configfile", "config.yaml", "micro.yaml")
    run_snakemake(micro_run, *exports, "--configfile", "config.yaml", "micro.yaml")
    assert (again / "benchmarks" / "export").is_dir()
    assert compare_runs(micro_run, again) == []
    # the comparison is not vacuous: a changed weight file is caught
    w = again / "results" / "train" / "domino" / "checkpoint" / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[-1] ^= 1
    w.write_bytes(bytes(data))
    assert any("domino/checkpoint/model.safetensors" in d for d in compare_runs(micro_run, again))
