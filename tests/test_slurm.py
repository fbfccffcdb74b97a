"""The micro workflow through profiles/slurm on a real one-node SLURM cluster
(tests/slurm/single_node.sh): every rule one sbatch job, the results equal a local run's, and a
failing rule reported as failed within a bounded wait. Run by CI with ``-m slurm`` (root, and
Debian's slurmctld, slurmd, slurm-client and munge installed)."""

import re
import subprocess
import time
from pathlib import Path

import pytest

from conftest import MICRO, ROOT, copy_repo, copy_run, run_snakemake

pytestmark = pytest.mark.slurm

SCRIPT = ROOT / "tests" / "slurm" / "single_node.sh"
ETC_CONF = Path("/etc/slurm/slurm.conf")  # the link `start` makes (single_node.sh says why)
# the workflow profile that fits the profile to a one-node CPU cluster (it replaces set-resources)
CPU_OVERLAY = ROOT / "tests" / "slurm" / "cpu"
PROFILE = ("--profile", "profiles/slurm", "--workflow-profile", str(CPU_OVERLAY))
SUBMITTED = re.compile(r"Job \d+ has been submitted with SLURM jobid (\d+)")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A one-node cluster for this module; stops exactly the daemons it started."""
    where = tmp_path_factory.mktemp("slurm")
    try:  # a start that fails halfway stops what it started too
        subprocess.run([str(SCRIPT), "start", str(where)], check=True, timeout=120)
        yield where
    finally:
        subprocess.run([str(SCRIPT), "stop", str(where)], check=False, timeout=120)


def script(command, where):
    return subprocess.run([str(SCRIPT), command, str(where)], capture_output=True, text=True, timeout=120)


def test_a_link_left_by_a_killed_cluster_is_replaced(tmp_path):
    """A run killed before its `stop` leaves /etc/slurm/slurm.conf pointing at a cluster whose
    daemons are gone: the next `start` replaces the link instead of refusing. (Runs before the
    module's cluster starts: a test module runs in file order.)"""
    assert ETC_CONF.is_symlink() or not ETC_CONF.exists(), f"{ETC_CONF} is not this script's"
    dead = tmp_path / "killed"
    dead.mkdir()
    (dead / "slurm.conf").write_text("ClusterName=single-node\n")
    gone = subprocess.Popen(["true"])
    gone.wait()
    for name in ("munged", "slurmctld", "slurmd"):
        (dead / f"{name}.pid").write_text(f"{gone.pid}\n")
    ETC_CONF.parent.mkdir(parents=True, exist_ok=True)
    ETC_CONF.unlink(missing_ok=True)  # a link an earlier killed run left is as good a case
    ETC_CONF.symlink_to(dead / "slurm.conf")
    try:
        started = script("start", tmp_path / "next")
        assert started.returncode == 0, started.stderr
        assert "was left by a cluster whose daemons are gone" in started.stderr
        assert ETC_CONF.readlink() == tmp_path / "next" / "slurm.conf"
    finally:
        script("stop", tmp_path / "next")
        if ETC_CONF.is_symlink() and ETC_CONF.readlink() == dead / "slurm.conf":
            ETC_CONF.unlink()
    assert not ETC_CONF.is_symlink()


def test_a_second_cluster_is_refused_before_it_starts_a_daemon(cluster, tmp_path):
    refused = script("start", tmp_path)
    assert refused.returncode == 1
    assert f"another single-node cluster runs from {cluster}" in refused.stderr
    assert not list(tmp_path.glob("*.pid"))  # not even munged
    assert ETC_CONF.readlink() == cluster / "slurm.conf"


@pytest.fixture(scope="module")
def slurm_run(cluster, tmp_path_factory):
    """The micro workflow through the SLURM profile: (run folder, Snakemake's output, wall s)."""
    repo = copy_repo(tmp_path_factory.mktemp("slurm-run"))
    t0 = time.perf_counter()
    out = run_snakemake(repo, *PROFILE, "reports/model_card.md", *MICRO)
    return repo, out, time.perf_counter() - t0


def test_every_rule_is_a_slurm_job_and_the_results_equal_a_local_run(slurm_run, micro_run):
    from domino.tools.compare import compare_runs

    repo, out, wall = slurm_run
    text = out.stdout + out.stderr
    jobs = SUBMITTED.findall(text)
    # every job of the DAG went through sbatch: as many submissions as the run's finished jobs
    finished = re.findall(r"Finished jobid: \d+ \(Rule: (\w+)\)", text)
    assert finished and len(jobs) == len(finished), (len(jobs), finished)
    assert {"extract_hidden_states", "train", "benchmark", "report"} <= set(finished)
    assert compare_runs(micro_run, repo) == []
    print(f"\nSLURM: {len(jobs)} jobs submitted, micro run {wall:.0f} s")


def test_a_failing_rule_is_reported_failed_with_its_log(slurm_run, tmp_path):
    """A truncated benchmark result makes the report rule rerun and refuse it: Snakemake says the
    job failed, names the rule's log, and returns within the bound instead of waiting."""
    repo = copy_run(slurm_run[0], tmp_path / "run")
    result = repo / "results" / "benchmark" / "humaneval" / "domino.json"
    result.write_bytes(result.read_bytes()[: result.stat().st_size // 2])
    t0 = time.perf_counter()
    try:
        out = run_snakemake(repo, *PROFILE, "reports/model_card.md", *MICRO, check=False, timeout=300)
    except subprocess.TimeoutExpired:
        pytest.fail("a failing SLURM job was not reported within 300 s")
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "Error in rule report" in text and "FAILED" in text
    assert "logs/report.log" in text  # the rule's own log, and the job's SLURM log beside it
    assert re.search(r"\.snakemake/slurm_logs/rule_report/\d+\.log", text)
    assert re.search(r"results/benchmark/humaneval/domino\.json", (repo / "logs" / "report.log").read_text())
    print(f"\nSLURM: failure reported after {time.perf_counter() - t0:.0f} s")
