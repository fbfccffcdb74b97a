"""The Snakemake DAG: a dry run of the default, one real micro run, and what reruns after an edit."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECKPOINTS = ["dflash-shift", "dflash-noshift", "domino"]
# what a dry run of the embedded default plans
DEFAULT_JOBS = {"tokenizer": 1, "prepare_data": 1, "verifier": 1, "draft_vocab": 1, "extract_hidden_states": 2,
                "train": 3, "validate": 3, "benchmark_baseline": 1, "benchmark": 3, "report": 1}


def _copy_repo(dst: Path) -> Path:
    for name in ("Snakefile", "config.yaml", "workflow", "config"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dst / name)
    shutil.copy(ROOT / "tests" / "micro.yaml", dst / "micro.yaml")
    return dst


def _snakemake(cwd, *args, check=True):
    # the rules call `python`: make it this interpreter even when its environment is not activated
    env = dict(os.environ, PYTHONWARNINGS="ignore", HF_HUB_OFFLINE="1",
               PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    exe = str(Path(sys.executable).with_name("snakemake"))
    out = subprocess.run([exe, "--cores", "1", *args], cwd=cwd, capture_output=True, text=True, env=env,
                         timeout=1500)
    if check and out.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}")
    return out


def _planned_jobs(out) -> dict:
    """Job counts from a dry run's 'Job stats' table."""
    text = out.stdout + out.stderr
    m = re.search(r"Job stats:\n(.*?)\n\n", text + "\n\n", re.S)
    jobs = {}
    if m:
        for line in m.group(1).splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].isdigit() and parts[0] != "total":
                jobs[parts[0]] = int(parts[1])
    return jobs


def test_dry_run_of_the_default(tmp_path):
    repo = _copy_repo(tmp_path)
    out = _snakemake(repo, "-n", "reports/model_card.md")
    jobs = _planned_jobs(out)
    assert jobs == DEFAULT_JOBS, jobs


def test_dry_run_with_the_vllm_stages(tmp_path):
    """vllm.benchmark adds the vLLM runs (plain + the noshift DFlash export: vLLM reads a shifted
    export one slot off, and has no Domino head) and the extraction runs under the vLLM
    interpreter; nothing else changes."""
    repo = _copy_repo(tmp_path)
    fake = tmp_path / "vllm-env-python"
    (repo / "vllm.yaml").write_text(
        "verifier: {embedded: {num_attention_heads: 2, num_key_value_heads: 1, head_dim: 64}}\n"
        f"features: {{backend: vllm}}\nvllm: {{python: {fake}, benchmark: true}}\n")
    out = _snakemake(repo, "-n", "-p", "--configfile", "config.yaml", "vllm.yaml", "--", "reports/model_card.md")
    jobs = _planned_jobs(out)
    assert jobs == {**DEFAULT_JOBS, "export": 1, "vllm_benchmark_baseline": 1, "vllm_benchmark": 1}, jobs
    text = out.stdout + out.stderr
    assert text.count(f"{fake} -m domino extract") == 2
    assert text.count(f"{fake} -m domino vllm-benchmark") == 2
    assert "results/vllm_benchmark/dflash-noshift.json" in text
    assert "results/vllm_benchmark/domino.json" not in text
    assert "results/vllm_benchmark/dflash-shift.json" not in text


@pytest.fixture(scope="module")
def micro_run(tmp_path_factory):
    repo = _copy_repo(tmp_path_factory.mktemp("micro"))
    _snakemake(repo, "--configfile", "micro.yaml", "--", "reports/model_card.md")
    return repo


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
    assert "## Model Description" in card or "Model Description" in card
    assert (micro_run / "reports" / "reproduction.md").exists()
    # every rule logged
    assert len(list((micro_run / "logs").rglob("*.log"))) == 17
    # the same budget for the three checkpoints
    steps = {json.loads((r / "train" / ck / "summary.json").read_text())["steps"] for ck in CHECKPOINTS}
    assert len(steps) == 1


def _edit(repo, text):
    (repo / "edit.yaml").write_text(text)
    return _planned_jobs(_snakemake(repo, "-n", "--configfile", "micro.yaml", "edit.yaml", "--",
                                    "reports/model_card.md"))


def test_editing_a_benchmark_value_reruns_only_benchmark_and_report(micro_run):
    assert _planned_jobs(_snakemake(micro_run, "-n", "--configfile", "micro.yaml", "--",
                                    "reports/model_card.md")) == {}
    jobs = _edit(micro_run, "benchmark:\n  max_new_tokens: 10\n")
    assert jobs == {"benchmark_baseline": 1, "benchmark": 3, "report": 1}, jobs


def test_editing_a_training_value_reruns_training_and_what_follows(micro_run):
    jobs = _edit(micro_run, "train:\n  lr: 0.002\n")
    assert jobs == {"train": 3, "validate": 3, "benchmark": 3, "report": 1}, jobs


def test_two_runs_are_identical_timing_aside(micro_run, tmp_path):
    """A second micro run from a fresh copy gives the same results files and card tables."""
    from domino.compare import compare_runs

    again = _copy_repo(tmp_path)
    _snakemake(again, "--configfile", "micro.yaml", "--", "reports/model_card.md")
    assert compare_runs(micro_run, again) == []
    # the comparison is not vacuous: a changed weight file is caught
    w = again / "results" / "train" / "domino" / "checkpoint" / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[-1] ^= 1
    w.write_bytes(bytes(data))
    assert any("domino/checkpoint/model.safetensors" in d for d in compare_runs(micro_run, again))
