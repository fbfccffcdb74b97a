"""The Snakemake DAG: a dry run of the default, one real micro run, and what reruns after an edit."""

import json
import shlex
import sys
from collections import Counter
from pathlib import Path

import pytest

from conftest import DEFAULT_JOBS, MICRO, copy_repo, planned_jobs, run_snakemake

CHECKPOINTS = ["dflash-shift", "dflash-noshift", "domino"]


def test_dry_run_of_the_default(tmp_path):
    repo = copy_repo(tmp_path)
    out = run_snakemake(repo, "-n", "reports/model_card.md")
    jobs = planned_jobs(out)
    assert jobs == DEFAULT_JOBS, jobs


def test_dry_run_with_the_vllm_stages(tmp_path):
    """vllm.benchmark adds the vLLM runs (plain + every export, served through domino's vLLM
    plugin, + the n-gram lookup row through vLLM's ngram method) and the extraction runs under
    the vLLM interpreter; nothing else changes."""
    repo = copy_repo(tmp_path)
    fake = tmp_path / "vllm-env-python"
    fake.symlink_to(sys.executable)  # vllm.python must run Python, checked before any job
    (repo / "vllm.yaml").write_text(
        "verifier: {embedded: {num_attention_heads: 2, num_key_value_heads: 1, head_dim: 64}}\n"
        f"features: {{backend: vllm}}\nvllm: {{python: {fake}, benchmark: true}}\n"
        "benchmark: {suites: [humaneval, mt-bench]}\ndata: {responses: verifier, generation_backend: vllm}\n")
    out = run_snakemake(repo, "-n", "-p", "--configfile", "config.yaml", "vllm.yaml", "--", "reports/model_card.md")
    jobs = planned_jobs(out)
    assert jobs == {**DEFAULT_JOBS, "regenerate": 2, "benchmark": 2, "export": 3, "vllm_benchmark_baseline": 2,
                    "vllm_benchmark": 6, "vllm_benchmark_lookup": 2}, jobs
    text = out.stdout + out.stderr
    assert text.count(f"{fake} -m domino extract_hidden_states") == 2
    assert text.count(f"{fake} -m domino regenerate") == 2  # data.generation_backend: vllm
    assert text.count(f"{fake} -m domino vllm_benchmark") == 10
    assert "ngram-domino" not in text.split("vllm_benchmark")[-1]  # the lookup-then-Domino row has no vLLM method
    for suite in ("humaneval", "mt-bench"):  # every suite served, each from its own benchmark's prompts
        for run in ("baseline", "dflash-shift", "dflash-noshift", "domino", "ngram"):
            assert f"--ours results/benchmark/{suite}/{run}.json" in text
            assert f"--out results/vllm_benchmark/{suite}/{run}.json" in text


@pytest.mark.parametrize("overlay,added", [
    ("config/sampling.yaml", {"sampling": 2}),  # one job per T > 0: 0.6 and 1.0
    ("config/replicates.yaml", {"train": 6, "validate": 6}),  # two more trainings and validations per checkpoint
])
def test_dry_run_of_an_overlay(overlay, added, tmp_path):
    repo = copy_repo(tmp_path)
    out = run_snakemake(repo, "-n", "-p", "--configfile", "config.yaml", overlay, "--", "reports/model_card.md")
    jobs = Counter(DEFAULT_JOBS) + Counter(added)
    assert planned_jobs(out) == dict(jobs), planned_jobs(out)
    if "replicates" in overlay:  # the benchmark job decodes all nine trained runs beside plain greedy
        text = out.stdout + out.stderr
        assert "--rows dflash-shift dflash-noshift domino dflash-shift-seed1" in text
        assert "results/benchmark/humaneval/domino-seed2.json" in text and "results/validate/domino-seed1.json" in text


def test_micro_run_outputs(micro_run):
    r = micro_run / "results"
    base = json.loads((r / "benchmark" / "humaneval" / "baseline.json").read_text())
    assert base["summary"]["prompts"] == 6 and len(base["prompts"]) == 6
    for p in base["prompts"]:
        assert {"task_id", "prompt_token_ids", "new_token_ids", "accepted_per_step", "seconds"} <= set(p)
        assert 1 <= len(p["new_token_ids"]) <= 12
    for ck in CHECKPOINTS:
        b = json.loads((r / "benchmark" / "humaneval" / f"{ck}.json").read_text())
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
        al = json.loads((r / "benchmark" / "humaneval" / f"{ck}.json").read_text())["summary"]["acceptance_length"]
        assert f"{al:.3f}" in card, (ck, al)
    assert (micro_run / "reports" / "reproduction.md").exists()
    # every job wrote its own non-empty log: one per job of the plan (14 on the default's DAG)
    logs = sorted((micro_run / "logs").rglob("*.log"))
    assert len(logs) == sum(DEFAULT_JOBS.values()) and all(p.stat().st_size > 0 for p in logs)
    # the same budget for the three checkpoints
    steps = {json.loads((r / "train" / ck / "summary.json").read_text())["steps"] for ck in CHECKPOINTS}
    assert len(steps) == 1
    # micro.yaml validates Domino served during training: its curve, the step kept, the appendix's plot
    sv = json.loads((r / "train" / "domino" / "summary.json").read_text())["served_validation"]
    assert sv["prompts"] == 3 and sv["keep"] == "best_served" and len(sv["curve"]) >= 2
    assert sv["curve"][-1]["step"] == steps.pop() - 1 and all(e["steps"] > 0 for e in sv["curve"])
    best = max(e["acceptance_length"] for e in sv["curve"])
    assert next(e for e in sv["curve"] if e["step"] == sv["kept_step"])["acceptance_length"] == best
    metrics = [json.loads(x) for x in (r / "train" / "domino" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "served_acceptance" in m] == [e["step"] for e in sv["curve"]]
    assert "served_validation" not in json.loads((r / "train" / "dflash-shift" / "summary.json").read_text())
    assert "![Training loss and served acceptance length against steps](served_acceptance_curve.png)" in \
        (micro_run / "reports" / "model_card_appendix.md").read_text()
    assert (micro_run / "reports" / "served_acceptance_curve.png").exists()


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


def test_a_rebuilt_small_file_that_is_unchanged_leaves_the_card_as_it_is(micro_run, tmp_path):
    """The README's sentence: a file under Snakemake's checksum limit (1 MB), rebuilt byte for byte,
    reruns nothing after it; the same file with other bytes reruns the report."""
    run = _copy_run(micro_run, tmp_path / "run")
    result = run / "results" / "validate" / "domino.json"
    before = result.read_bytes()
    assert len(before) < 1_000_000
    card = ("reports/model_card.md", "--configfile", "config.yaml", "micro.yaml")
    result.unlink()
    run_snakemake(run, str(result.relative_to(run)), "--configfile", "config.yaml", "micro.yaml")
    assert result.read_bytes() == before  # the rebuilt file is the same
    assert "Nothing to be done" in run_snakemake(run, "-n", *card).stdout
    result.write_bytes(before.replace(b"{", b"{ ", 1))  # the same JSON, other bytes, a newer time
    assert planned_jobs(run_snakemake(run, "-n", *card)).get("report") == 1


def test_html_report(html_report):
    """The README's --report command on a finished run: one offline HTML file with the plots, and
    the card, its appendix and the reproduction report as rendered HTML pages (not Markdown links)."""
    path, out = html_report
    html = path.read_text(errors="replace")
    assert len(html) > 100_000
    for name in ("acceptance_per_position.png", "conditional_acceptance.png", "model_card.html",
                 "model_card_appendix.html", "reproduction.html"):
        assert name in html, name
    assert "data:text/markdown" not in html and html.count("data:text/html") == 3
    assert "Missing metadata" not in out.stdout + out.stderr


def _edit(repo, text):
    """What a dry run plans after editing the run's own config (micro.yaml here, config.yaml in the
    README's case): ``text``'s keys merged into it; the file is put back afterwards."""
    import yaml

    from domino.config import merge

    path = repo / "micro.yaml"
    kept = path.read_text()
    try:
        path.write_text(yaml.safe_dump(merge(yaml.safe_load(kept), yaml.safe_load(text))))
        return planned_jobs(run_snakemake(repo, "-n", "reports/model_card.md", "--configfile", "config.yaml",
                                          "micro.yaml"))
    finally:
        path.write_text(kept)


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
    validations, the benchmark job (which decodes every run side by side) and the report; nothing retrains."""
    jobs = _edit(micro_run, "train:\n  replicates: 3\n")
    assert jobs == {"train": 6, "validate": 6, "benchmark": 1, "report": 1}, jobs


def test_a_run_with_other_overlays_is_refused_in_this_directory(micro_run):
    """An overlay that would change a result that exists stops before any job, by the dry run as
    well as the real run, in one line naming the changed key."""
    (micro_run / "other.yaml").write_text("benchmark:\n  max_new_tokens: 10\n")
    card = micro_run / "reports" / "model_card.md"
    before = card.stat().st_mtime_ns
    for dry in (["-n"], []):
        out = run_snakemake(micro_run, *dry, "reports/model_card.md", "--configfile", "config.yaml", "micro.yaml",
                            "other.yaml", check=False)
        text = out.stdout + out.stderr
        assert out.returncode == 1, text[-2000:]
        (line,) = [line for line in text.splitlines() if line.startswith("config error:")]
        assert line.startswith("config error: this directory holds a run with the overlays ['micro.yaml']; the "
                               "overlays ['micro.yaml', 'other.yaml'] would change its results "
                               "(benchmark.max_new_tokens: 12 -> 10)"), line
        assert "snakemake --directory runs/NAME" in line and "Job stats" not in text
    assert card.stat().st_mtime_ns == before
    # and the way back: leaving out an overlay the run was made with is refused too
    (micro_run / ".domino-run.json").write_text('{"overlays": ["micro.yaml", "other.yaml"]}')
    try:
        out = run_snakemake(micro_run, "-n", "reports/model_card.md", "--configfile", "config.yaml", "micro.yaml",
                            check=False)
    finally:
        (micro_run / ".domino-run.json").write_text('{"overlays": ["micro.yaml"]}')
    assert out.returncode == 1 and "(benchmark.max_new_tokens: 10 -> 12)" in out.stdout + out.stderr


def _readme_overlay_line(overlay):
    """The README's command that adds ``overlay`` to the default run, as argv after ``snakemake
    --cores 1``, with the micro config put before the overlay (the micro run was made with it)."""
    from conftest import ROOT

    (line,) = [line for line in (ROOT / "README.md").read_text().splitlines()
               if line.startswith("snakemake ") and line.endswith(f"--configfile {overlay}")]
    argv = shlex.split(line)
    assert argv[:3] == ["snakemake", "--cores", "1"] and "--directory" not in argv, line
    return [*argv[3:-1], "config.yaml", "micro.yaml", overlay]


@pytest.mark.parametrize("overlay,added", [
    ("config/sampling.yaml", {"sampling": 2, "report": 1}),  # one job per T > 0; no training, no greedy benchmark
    # the 11 variants; domino-regenerated's answers, draft vocabulary and features
    ("config/ablations.yaml", {"train": 11, "validate": 11, "benchmark": 1, "report": 1, "regenerate": 2,
                               "draft_vocab_responses": 1, "extract_hidden_states_responses": 2}),
    # the card's three rows on the verifier's answers: one regenerate, vocabulary and extraction per split
    ("config/regenerated-rows.yaml", {"train": 3, "validate": 3, "benchmark": 1, "report": 1, "regenerate": 2,
                                      "draft_vocab_responses": 1, "extract_hidden_states_responses": 2}),
    ("config/replicates.yaml", {"train": 6, "validate": 6, "benchmark": 1, "report": 1}),  # two more seeds each
    ("config/mt-bench.yaml", {"benchmark": 1, "report": 1}),  # MT-Bench's job; HumanEval's stays
])
def test_the_readme_overlays_add_only_their_jobs_to_a_finished_run(micro_run, overlay, added):
    """The README's ablation, sampling and replicates lines, run in the finished run's directory,
    plan the jobs they add (and the benchmark and card that gather them), nothing that exists."""
    out = run_snakemake(micro_run, "-n", *_readme_overlay_line(overlay))
    assert planned_jobs(out) == added, planned_jobs(out)


def _copy_run(src, dst):
    """A finished run's directory, copied with its files' times (Snakemake compares them)."""
    import shutil

    shutil.copytree(src, dst, symlinks=True)
    return dst


def test_an_additive_overlay_runs_in_the_finished_directory(micro_run, tmp_path):
    """The real run of the README's sampling line in a copy of the finished run: accepted, only
    the sampling jobs and the card run, and the directory then holds both overlays."""
    run = _copy_run(micro_run, tmp_path / "run")
    weights = run / "results" / "train" / "domino" / "checkpoint" / "model.safetensors"
    before = weights.stat().st_mtime_ns
    out = run_snakemake(run, *_readme_overlay_line("config/sampling.yaml"))
    text = out.stdout + out.stderr
    assert "localrule sampling:" in text and "localrule train:" not in text and "localrule benchmark:" not in text
    assert weights.stat().st_mtime_ns == before and (run / "results" / "sampling" / "T0.6" / "humaneval" / "domino.json").exists()
    assert json.loads((run / ".domino-run.json").read_text()) == {"overlays": ["micro.yaml", "config/sampling.yaml"]}


def test_a_second_suite_is_decoded_and_reported_beside_humaneval(micro_run, tmp_path):
    """The README's MT-Bench line on a copy of the finished micro run: one benchmark job decodes
    MT-Bench's first questions turn by turn with every checkpoint, HumanEval's results stay as they
    were, and the card and the reproduction report gain their per-suite sections."""
    run = _copy_run(micro_run, tmp_path / "run")
    humaneval = run / "results" / "benchmark" / "humaneval" / "domino.json"
    before = humaneval.read_bytes()
    out = run_snakemake(run, *_readme_overlay_line("config/mt-bench.yaml"))
    text = out.stdout + out.stderr
    assert text.count("localrule benchmark:") == 1 and "localrule train:" not in text
    assert humaneval.read_bytes() == before
    for run_name in ("baseline", *CHECKPOINTS):
        b = json.loads((run / "results" / "benchmark" / "mt-bench" / f"{run_name}.json").read_text())
        assert b["protocol"]["dataset"] == "MT-Bench" and b["summary"]["prompts"] == 6
        assert all(len(p["turns"]) == 2 and p["category"] for p in b["prompts"])
    appendix = (run / "reports" / "model_card_appendix.md").read_text()
    assert "## Benchmark suites" in appendix and "### MT-Bench by category" in appendix
    assert "### Published claims per suite" in (run / "reports" / "reproduction.md").read_text()
    assert (run / "benchmarks" / "benchmark" / "mt-bench.tsv").exists()


def test_a_variant_trained_on_the_verifiers_answers_beside_the_corpus_rows(micro_run, tmp_path):
    """config/ablations.yaml's domino-regenerated row alone, in a copy of the finished micro run:
    the verifier answers both splits once, the row gets a draft vocabulary and features of its own
    (responses-verifier/), trains and validates on them, and its training summary says so; the
    card's rows and their features are left as they were (the card: test_report.py)."""
    import yaml

    run = _copy_run(micro_run, tmp_path / "run")
    row = yaml.safe_load((run / "config" / "ablations.yaml").read_text())["checkpoints"]["domino-regenerated"]
    (run / "answers.yaml").write_text(yaml.safe_dump({"checkpoints": {"domino-regenerated": row}}))
    features = run / "results" / "extract_hidden_states" / "train" / "index.json"
    before = features.read_bytes()
    out = run_snakemake(run, "--cores", "1", "results/validate/domino-regenerated.json", "--configfile", "config.yaml",
                        "micro.yaml", "answers.yaml")
    text = out.stdout + out.stderr
    assert text.count("localrule regenerate:") == 2 and text.count("localrule train:") == 1, text[-3000:]
    assert features.read_bytes() == before
    ours = run / "results" / "extract_hidden_states" / "responses-verifier"
    assert json.loads((ours / "train" / "index.json").read_text())["samples"] > 0 and (ours / "val" / "index.json").exists()
    assert (run / "results" / "draft_vocab" / "responses-verifier" / "vocab.safetensors").exists()
    summaries = {c: json.loads((run / "results" / "train" / c / "summary.json").read_text())
                 for c in ("domino", "domino-regenerated")}
    assert summaries["domino-regenerated"]["data"] == {"responses": "verifier"}
    assert "data" not in summaries["domino"]  # the run's own answers
    assert summaries["domino-regenerated"]["steps"] != summaries["domino"]["steps"]  # other rows to train on


def test_a_seen_draft_vocabulary_trains_a_drafter_of_that_many_rows(micro_run, tmp_path):
    """drafter.draft_vocab_size: seen, edited in a copy of the finished micro run: the draft
    vocabulary is rebuilt with a row for every answer token and no row never seen, and the
    trained checkpoint's head has exactly its rows."""
    import yaml

    run = _copy_run(micro_run, tmp_path / "run")
    cfg = yaml.safe_load((run / "micro.yaml").read_text())
    cfg["drafter"]["draft_vocab_size"] = "seen"
    (run / "micro.yaml").write_text(yaml.safe_dump(cfg))
    fixed = json.loads((run / "results" / "draft_vocab" / "vocab.json").read_text())
    run_snakemake(run, "--cores", "1", "results/validate/domino.json", *MICRO)
    seen = json.loads((run / "results" / "draft_vocab" / "vocab.json").read_text())
    assert seen["unseen_rows"] == 0 and seen["assistant_token_coverage"] == 1.0
    assert seen["draft_vocab_size"] == seen["seen_tokens"] == fixed["seen_tokens"] != fixed["draft_vocab_size"]
    drafter = json.loads((run / "results" / "train" / "domino" / "checkpoint" / "drafter_config.json").read_text())
    assert drafter["draft_vocab_size"] == seen["draft_vocab_size"]
    assert json.loads((run / "results" / "validate" / "domino.json").read_text())


def test_a_one_key_edit_gives_a_short_reason_naming_the_key(micro_run):
    """Snakemake prints the params that changed; each is one key and its value."""
    import yaml

    path = micro_run / "micro.yaml"
    kept = path.read_text()
    try:
        cfg = yaml.safe_load(kept)
        cfg["train"]["lr"] = 0.002
        path.write_text(yaml.safe_dump(cfg))
        out = run_snakemake(micro_run, "-n", "reports/model_card.md", "--configfile", "config.yaml", "micro.yaml")
    finally:
        path.write_text(kept)
    reasons = [line.strip() for line in out.stdout.splitlines() if line.strip().startswith("reason: Params")]
    assert len(reasons) == 3, reasons  # the three train jobs
    for reason in reasons:
        assert reason.endswith("before: 'train.lr=0.003' now: 'train.lr=0.002'"), reason
        assert len(reason) < 200, reason


def test_an_interrupted_job_says_last_what_it_kept(micro_run, tmp_path):
    """Ctrl-C during training: the job's own line, what was kept and how to resume, is the last
    line of the output, after Snakemake's error block and closing lines."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import yaml

    run = _copy_run(micro_run, tmp_path / "run")
    cfg = yaml.safe_load((run / "micro.yaml").read_text())
    cfg["train"]["epochs"] = 200  # long enough to be interrupted mid-way
    (run / "micro.yaml").write_text(yaml.safe_dump(cfg))
    log = run / "logs" / "train" / "domino.log"
    log.unlink()
    env = dict(os.environ, PYTHONWARNINGS="ignore", HF_HUB_OFFLINE="1",
               PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    proc = subprocess.Popen([str(Path(sys.executable).with_name("snakemake")), "--cores", "1",
                             "results/train/domino/checkpoint/model.safetensors", "--configfile", "config.yaml",
                             "micro.yaml"], cwd=run, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)
    try:
        deadline = time.time() + 600
        while not (log.exists() and "packed rows" in log.read_text()) and time.time() < deadline:
            time.sleep(0.5)
        time.sleep(2)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends to the terminal's process group
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = out.strip().splitlines()
    assert proc.returncode != 0 and "Error in rule train:" in out, out[-3000:]
    assert lines[-1].startswith("domino train: Interrupted: interrupted at step "), lines[-6:]
    assert lines[-1].endswith("to resume, rerun the same snakemake command"), lines[-1]
    assert (run / "results" / "train" / "domino" / "state" / "state.pt").exists()


def test_the_readme_export_names_a_verifier_a_reader_can_load(micro_run):
    """The README's export command on the finished run: every export names, as its verifier, a
    directory that loads from the run directory, and states the verifier's hidden size."""
    import re

    from transformers import AutoConfig

    from conftest import ROOT
    from domino.export import load_speculators

    block = re.search(r"^## Exporting the checkpoints\n\n```bash\n(.*?)```", (ROOT / "README.md").read_text(),
                      re.S | re.M).group(1)
    (line,) = block.strip().splitlines()
    argv = shlex.split(line)
    assert argv[:3] == ["snakemake", "--cores", "1"], line
    run_snakemake(micro_run, *argv[3:], "--configfile", "config.yaml", "micro.yaml")
    for ck in CHECKPOINTS:
        export = micro_run / "results" / "export" / ck
        c = json.loads((export / "config.json").read_text())
        where = c["speculators_config"]["verifier"]["name_or_path"]
        assert where == "results/verifier/model", where  # relative to the run directory
        verifier = AutoConfig.from_pretrained(micro_run / where)
        assert verifier.model_type == "qwen3" and c["target_hidden_size"] == verifier.hidden_size == 64
        assert load_speculators(export).cfg.hidden_size == verifier.hidden_size


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


def test_snakemake_lint_finds_only_the_missing_conda_environments(tmp_path):
    """``snakemake --lint``: every finding is the per-rule conda/container one (the environment
    is the package's); no param is a hard-coded path prefix, no rule file mixes rules and
    functions, no absolute path."""
    repo = copy_repo(tmp_path)
    out = run_snakemake(repo, "--lint", *MICRO, check=False)
    text = out.stdout + out.stderr
    findings = [ln.strip()[2:] for ln in text.splitlines() if ln.startswith("    * ")]
    assert len(findings) >= 10, text[-3000:]  # one per rule at least: the check ran
    assert all(f.startswith("Specify a conda environment or container") for f in findings), \
        sorted({f for f in findings if not f.startswith("Specify a conda")})
