"""A hub id as the verifier: found in the Hugging Face cache, or refused as a run starts, in one
line, when the hub cannot give it; a dry run needs no network and is not asked."""

import json
import os
import subprocess
import sys

from conftest import ROOT, copy_repo, run_snakemake

HUB_PROBLEM = "from domino.verifier.facts import hub_problem; print(hub_problem({!r}, timeout=3))"


def _hub_problem(src, env):
    out = subprocess.run([sys.executable, "-c", HUB_PROBLEM.format(src)], capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, **env), timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def _cache_with(cache, repo_id):
    """A Hugging Face cache holding ``repo_id``'s config.json at main, as a download leaves it."""
    folder = cache / f"models--{repo_id.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text("0" * 40)
    (folder / "snapshots" / ("0" * 40)).mkdir(parents=True)
    (folder / "snapshots" / ("0" * 40) / "config.json").write_text(json.dumps({"model_type": "qwen3"}))


def test_a_cached_hub_id_passes_and_one_the_hub_cannot_give_is_named(tmp_path):
    _cache_with(tmp_path, "org/cached")
    offline = {"HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    assert _hub_problem("org/cached", offline) == "None"
    assert _hub_problem("org/absent", offline) == (
        f"verifier.source: 'org/absent' is not a folder, and not in the Hugging Face cache ({tmp_path}), and "
        "HF_HUB_OFFLINE is set (allowed: a folder, or a hub id downloaded first: hf download org/absent)")
    unreachable = {"HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:9"}
    problem = _hub_problem("org/absent", unreachable)
    assert problem.startswith("verifier.source: 'org/absent' is not a folder, and not in the Hugging Face cache")
    assert "the hub (http://127.0.0.1:9) could not be reached" in problem and problem.endswith(
        "(allowed: a folder, or a hub id downloaded first: hf download org/absent)")
    assert _hub_problem("org/cached", unreachable) == "None"  # the cache answers without the hub


def test_a_run_whose_hub_verifier_cannot_be_had_stops_before_any_job(tmp_path):
    (tmp_path / "repo").mkdir()
    repo = copy_repo(tmp_path / "repo")
    env = {"HF_HUB_CACHE": str(tmp_path / "cache")}  # run_snakemake sets HF_HUB_OFFLINE
    args = ("reports/model_card.md", "--configfile", "config.yaml", "config/card.yaml")
    out = run_snakemake(repo, *args, env=env, check=False, timeout=300)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        f"config error: verifier.source: 'Qwen/Qwen3-0.6B' is not a folder, and not in the Hugging Face cache "
        f"({tmp_path / 'cache'}), and HF_HUB_OFFLINE is set (allowed: a folder, or a hub id downloaded first: "
        "hf download Qwen/Qwen3-0.6B)")
    assert not (repo / "results").exists() and not list((repo / ".snakemake" / "locks").glob("*"))
    assert "prepare_data" in run_snakemake(repo, "-n", *args, env=env, timeout=300).stdout  # a dry run plans it
