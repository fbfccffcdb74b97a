"""``verifier.dtype: auto``: the CPU's matrix units read from /proc/cpuinfo's text, and the dtype
they make fast; the config gate hands every job the dtype chosen, never "auto"."""

import copy

import pytest
import yaml

from domino.config import validate_config
from domino.host import auto_dtype, cpu_units

AVX2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu sse2 avx avx2 fma\n"
SPR = "flags\t\t: avx2 avx512f avx512_bf16 amx_tile amx_bf16 amx_int8\n"
CPX = "flags\t\t: avx2 avx512f avx512_bf16\n"


@pytest.mark.parametrize("text, units, cpu, gpu", [
    (AVX2, ["avx2"], "float32", "bfloat16"),
    (SPR, ["amx_bf16", "avx512_bf16", "avx512f", "avx2"], "bfloat16", "bfloat16"),
    (CPX, ["avx512_bf16", "avx512f", "avx2"], "bfloat16", "bfloat16"),
    ("", [], "float32", "bfloat16"),
])
def test_units_and_the_dtype_they_choose(text, units, cpu, gpu):
    assert cpu_units(text) == units
    assert auto_dtype("cpu", units) == cpu
    assert auto_dtype("cuda:0", units) == gpu


def test_the_gate_hands_jobs_this_machines_dtype():
    with open("config.yaml") as f:
        cfg = yaml.safe_load(f)
    cfg = copy.deepcopy(cfg)
    cfg["verifier"]["dtype"] = "auto"
    out = validate_config(cfg)
    assert out["verifier"]["dtype"] == auto_dtype("cpu", cpu_units()) != "auto"
    with open("config/smollm2.yaml") as f:
        assert yaml.safe_load(f)["verifier"]["dtype"] == "auto"


def test_the_jobs_must_import_the_package_the_workflow_plans_with(tmp_path):
    """Each job runs ``python -m domino``, which imports whatever package its environment finds (an
    editable install of another clone): the workflow's own package, or the same files elsewhere,
    pass; a package whose files differ is refused in one line naming both folders."""
    import shutil
    import sys
    from pathlib import Path

    import domino
    from domino.host import package_digest, package_problem

    installed = Path(domino.__file__).resolve().parent
    assert package_problem(installed, tmp_path, sys.executable) is None
    copy = tmp_path / "clone" / "domino"
    shutil.copytree(installed, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert package_digest(copy) == package_digest(installed)
    assert package_problem(copy, tmp_path / "clone", sys.executable) is None
    (copy / "stages.py").write_text((copy / "stages.py").read_text() + "\n# another version\n")
    problem = package_problem(copy, tmp_path / "clone", sys.executable)
    assert "\n" not in problem and str(copy) in problem and str(installed) in problem
    assert f"pip install -e {tmp_path / 'clone'}" in problem
    assert "cannot import the domino package" in package_problem(copy, tmp_path, "false")


def test_a_run_whose_jobs_would_import_another_package_stops_before_any_job(tmp_path):
    """A checkout with a domino folder of its own that differs from the one its jobs import
    (another clone installed): the run stops in one line before any job, where the jobs would run
    the other clone's stages under this checkout's rules."""
    import shutil
    from pathlib import Path

    import domino
    from conftest import MICRO, copy_repo, run_snakemake

    repo = copy_repo(tmp_path)
    shutil.copytree(Path(domino.__file__).resolve().parent, repo / "domino",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "domino" / "stages.py").write_text((repo / "domino" / "stages.py").read_text() + "\n# changed\n")
    # in a run directory of its own, without PYTHONPATH: the Snakefile imports its checkout's
    # package, the jobs (started in the run directory) the installed one
    out = run_snakemake(repo, "--directory", "runs/other", "reports/model_card.md", *MICRO, check=False,
                        env={"PYTHONPATH": ""})
    assert out.returncode != 0 and not (repo / "runs" / "other" / "results").exists()
    line = next(x for x in (out.stdout + out.stderr).splitlines() if "would import the one at" in x)
    assert line.startswith("error: the workflow plans with the domino package at") and str(repo / "domino") in line
    assert "Traceback" not in out.stdout + out.stderr
