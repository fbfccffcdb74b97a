"""A full temporary folder: a run stops before any job in one line naming the folder, where
Snakemake's scheduler failed with a traceback writing its job-selection problem there."""

import os

from conftest import copy_repo, run_snakemake
from domino.host import TMP_MIN_FREE, temporary_folder_problem


def test_a_full_temporary_folder_is_named(tmp_path):
    full = {str(tmp_path): 0}
    problem = temporary_folder_problem({"TMPDIR": str(tmp_path)}, lambda f: full.get(f, 2**40))
    assert problem == (f"the temporary folder {tmp_path} (TMPDIR) has 0.0 MiB free, less than the 64 MiB that "
                       "Snakemake's scheduler and the stages need there: free some space there, or point TMPDIR at a "
                       "folder with room, and run the same command again")
    assert temporary_folder_problem({"TMPDIR": str(tmp_path)}, lambda f: TMP_MIN_FREE) is None


def test_each_variable_a_tool_reads_is_checked(tmp_path):
    """pulp (Snakemake's scheduler) reads TMP before TMPDIR; Python's tempfile TMPDIR first."""
    roomy, full = tmp_path / "roomy", tmp_path / "full"
    roomy.mkdir(), full.mkdir()
    free = {str(roomy): 2**40, str(full): 2**20}
    problem = temporary_folder_problem({"TMPDIR": str(roomy), "TMP": str(full)}, free.__getitem__)
    assert problem.startswith(f"the temporary folder {full} (TMP) has 1.0 MiB free") and "point TMP at" in problem
    assert temporary_folder_problem({"TMPDIR": str(roomy), "TMP": str(tmp_path / "none")}, free.__getitem__) is None


def test_a_run_with_a_full_temporary_folder_stops_before_any_job_in_one_line(tmp_path):
    """The free-space function reports the TMPDIR full (a sitecustomize in the Snakemake process):
    the run stops before any job, leaves no lock, and a dry run is not stopped."""
    (tmp_path / "repo").mkdir()
    repo = copy_repo(tmp_path / "repo")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    patch = tmp_path / "patch"
    patch.mkdir()
    (patch / "sitecustomize.py").write_text(
        "import shutil\n"
        "_real = shutil.disk_usage\n"
        f"def disk_usage(path):\n"
        f"    u = _real(path)\n"
        f"    return u._replace(free=0) if str(path) == {str(tmp)!r} else u\n"
        "shutil.disk_usage = disk_usage\n")
    env = {"TMPDIR": str(tmp), "PYTHONPATH": os.pathsep.join([str(patch), os.environ.get("PYTHONPATH", "")])}
    out = run_snakemake(repo, "results/verifier/tokenizer", "--configfile", "config.yaml", "micro.yaml", env=env,
                        check=False, timeout=300)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1] == (
        f"error: the temporary folder {tmp} (TMPDIR) has 0.0 MiB free, less than the 64 MiB that Snakemake's "
        "scheduler and the stages need there: free some space there, or point TMPDIR at a folder with room, and run "
        "the same command again")
    assert "Traceback" not in out.stderr and not (repo / "results").exists()
    assert not list((repo / ".snakemake" / "locks").glob("*"))
    dry = run_snakemake(repo, "-n", "results/verifier/tokenizer", "--configfile", "config.yaml", "micro.yaml", env=env,
                        timeout=300)
    assert "tokenizer" in dry.stdout
