"""Where profiles/slurm submits each job, without a cluster: the config section ``slurm`` reaches
every job's resources (the dry run prints them), the GPU rules take ``slurm.gpu_partition``, a
value that is not a name is refused in one line, and the section changes no result of a run
directory. The runs through a real cluster are tests/test_slurm.py's (``-m slurm``)."""

import copy
import re

import pytest
import yaml

from conftest import MICRO, ROOT, copy_repo, run_snakemake
from domino.config import validate_config
from domino.host import slurm_resources
from domino.rundir import changes_to_results
from domino.schema import ConfigError

DEFAULT = yaml.safe_load((ROOT / "config.yaml").read_text())
PROFILE = yaml.safe_load((ROOT / "profiles" / "slurm" / "config.yaml").read_text())
GPU_RULES = {rule for rule, res in PROFILE["set-resources"].items() if res.get("gpu")}


def test_null_keys_are_left_to_the_profile_and_the_plugin():
    assert slurm_resources({"account": None, "partition": None, "gpu_partition": None}, gpu=True) == {}
    both = {"account": "lab-1", "partition": "cpu", "gpu_partition": "gpu"}
    assert slurm_resources(both) == {"slurm_account": "lab-1", "slurm_partition": "cpu"}
    assert slurm_resources(both, gpu=True) == {"slurm_account": "lab-1", "slurm_partition": "gpu"}
    assert slurm_resources({**both, "gpu_partition": None}, gpu=True)["slurm_partition"] == "cpu"


@pytest.mark.parametrize("key,value", [("account", "lab;rm -rf ~"), ("partition", "$(id)"),
                                       ("gpu_partition", "gpu a100"), ("account", "")])
def test_a_value_that_is_not_a_name_is_refused_in_one_line(key, value):
    cfg = copy.deepcopy(DEFAULT)
    cfg["slurm"] = {key: value}
    with pytest.raises(ConfigError) as info:
        validate_config(cfg)
    assert str(info.value).startswith(f"slurm.{key}:") and "\n" not in str(info.value)


def test_the_section_changes_no_result_of_a_run_directory():
    before = validate_config(DEFAULT)
    after = validate_config({**DEFAULT, "slurm": {"account": "lab-1", "gpu_partition": "gpu"}})
    assert changes_to_results(before, after) == []


def test_the_gpu_rules_of_the_workflow_are_the_profiles():
    """The rules that take ``SLURM_GPU`` (and the rules made from them with ``use rule``) are the
    rules profiles/slurm gives a GPU, so a GPU partition never goes without a GPU, nor the reverse."""
    gpu = set()
    for smk in sorted((ROOT / "workflow" / "rules").glob("*.smk")):
        rule = None
        for line in smk.read_text().splitlines():
            m = re.match(r"\s*rule (\w+):", line)
            rule = m.group(1) if m else rule
            if "**SLURM_GPU" in line:
                gpu.add(rule)
            m = re.match(r"use rule (\w+) as (\w+)", line)
            if m and m.group(1) in gpu:
                gpu.add(m.group(2))
    assert gpu == GPU_RULES


def _resources(out) -> dict:
    """rule -> the set of its jobs' slurm_* resources, read off a dry run's job blocks."""
    found = {}
    for rule, res in re.findall(r"^rule (\w+):\n(?:    .*\n)*?    resources: (.*)$", out.stdout + out.stderr, re.M):
        slurm = tuple(sorted(kv for kv in res.split(", ") if kv.startswith("slurm_")))
        found.setdefault(rule, set()).add(slurm)
    return found


def test_the_account_and_partitions_reach_every_job(tmp_path):
    repo = copy_repo(tmp_path)
    given = run_snakemake(repo, "-n", "--profile", "profiles/slurm", "reports/model_card.md",
                          "--config", "slurm={account: lab-1, partition: cpu, gpu_partition: gpu.a100}", *MICRO)
    planned = _resources(given)
    assert {"tokenizer", "train", "benchmark", "report"} <= set(planned)
    for rule, jobs in planned.items():
        partition = "gpu.a100" if rule in GPU_RULES else "cpu"
        assert jobs == {("slurm_account=lab-1", f"slurm_partition={partition}")}, rule
    # without the section, nothing is passed: the plugin's own guess applies
    unset = _resources(run_snakemake(repo, "-n", "--profile", "profiles/slurm", "reports/model_card.md", *MICRO))
    assert set(unset) == set(planned) and all(jobs == {()} for jobs in unset.values())
