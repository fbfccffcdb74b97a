"""domino.rundir: the overlays a run directory was made with, and a lock left by a killed Snakemake,
each decided here without Snakemake (the workflow's own tests run them through it)."""

import json
import os
import subprocess
import sys
import time

import pytest

from conftest import ROOT, load_config_files
from domino.rundir import alive, clear_stale_lock, overlays_problem, process_start, record_start, run_overlays


def test_the_overlays_are_named_relative_to_the_checkout_without_config_yaml(tmp_path):
    files = [str(tmp_path / "config.yaml"), str(tmp_path / "config" / "sampling.yaml"), "micro.yaml"]
    assert run_overlays(files, tmp_path) == ["config/sampling.yaml", os.path.relpath(os.path.abspath("micro.yaml"), tmp_path)]


def test_the_overlays_order_is_recorded_and_merged_as_given(tmp_path, monkeypatch):
    """config/smollm2-quick.yaml after config/smollm2.yaml sets 800 conversations over 2,000: a
    directory made so takes a later overlay that adds jobs, and refuses the same two overlays the
    other way round, which would undo the quick profile's settings."""
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / ".domino-run.json"
    made = ["config/smollm2.yaml", "config/smollm2-quick.yaml"]
    files = [str(ROOT / "config.yaml"), *(str(ROOT / f) for f in made)]
    assert run_overlays(files, ROOT) == made  # the order given, not sorted
    record_start(made, tmp_path / "owner.json", marker)
    added = [*made, "config/replicates.yaml"]
    assert overlays_problem(added, load_config_files("config.yaml", *added), ROOT, marker) is None
    swapped = made[::-1]
    problem = overlays_problem(swapped, load_config_files("config.yaml", *swapped), ROOT, marker)
    assert "data.samples: 800 -> 2000" in problem, problem
    # a directory recorded before the order was kept (a sorted list) takes the later overlay too
    marker.write_text(json.dumps(sorted(made)))
    assert overlays_problem(added, load_config_files("config.yaml", *added), ROOT, marker) is None


@pytest.mark.parametrize("damage", ['{"overlays": ["config/smollm2.yaml"', '{"overlays": "config/smollm2.yaml"}', '7'])
def test_a_damaged_run_record_is_one_line_naming_it(tmp_path, damage):
    marker = tmp_path / ".domino-run.json"
    marker.write_text(damage)
    problem = overlays_problem([], load_config_files("config.yaml"), ROOT, marker)
    assert problem.startswith(f"the run record {marker} ") and "\n" not in problem, problem
    assert problem.endswith(f"or delete results/ and {marker} to start over here"), problem


def test_a_directory_takes_its_own_overlays_and_those_that_only_add_jobs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / ".domino-run.json"
    default = load_config_files("config.yaml")
    assert overlays_problem([], default, ROOT, marker) is None  # a directory without a run
    marker.write_text(json.dumps({"overlays": []}))
    assert overlays_problem([], default, ROOT, marker) is None
    sampling = load_config_files("config.yaml", "config/sampling.yaml")
    assert overlays_problem(["config/sampling.yaml"], sampling, ROOT, marker) is None  # adds jobs only
    card_depth = load_config_files("config.yaml", "config/card-depth.yaml")
    problem = overlays_problem(["config/card-depth.yaml"], card_depth, ROOT, marker)
    assert problem.startswith("this directory holds a run with the overlays []; the overlays "
                              "['config/card-depth.yaml'] would change its results (")
    assert problem.endswith(f"or delete results/ and {marker} to start over here")
    marker.write_text(json.dumps({"overlays": ["gone.yaml"]}))
    assert overlays_problem([], default, ROOT, marker).startswith(
        "this directory holds a run with the overlays ['gone.yaml'], which no longer load (")


def _locked(tmp_path, owner: dict, owner_first: bool):
    """A .snakemake folder with one lock file and a lock record, the older of the two first."""
    snake = tmp_path / ".snakemake"
    (snake / "locks").mkdir(parents=True)
    files = [snake / "domino-lock-owner.json", snake / "locks" / "0.input.lock"]
    for i, f in enumerate(files if owner_first else files[::-1]):
        f.write_text(json.dumps(owner) if f.suffix == ".json" else "")
        os.utime(f, (time.time() + i, time.time() + i))
    return snake


@pytest.mark.parametrize("case", ["dead", "alive", "record older than the lock"])
def test_a_lock_is_removed_only_when_the_run_that_took_it_is_gone(tmp_path, case):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    pid = os.getpid() if case == "alive" else dead.pid
    owner = {"pid": pid, "start": process_start(pid)}
    snake = _locked(tmp_path, owner, owner_first=case == "record older than the lock")
    assert alive(owner) is (case == "alive")
    message = clear_stale_lock(snake / "domino-lock-owner.json")
    if case == "dead":
        assert message == (f"removed the lock left by a Snakemake that was killed (pid {pid}); its incomplete "
                           "jobs run again")
        assert not list((snake / "locks").iterdir())
    else:
        assert message is None and list((snake / "locks").iterdir())


def test_a_process_id_taken_again_by_another_process_is_not_the_lock_holder():
    me = {"pid": os.getpid(), "start": process_start(os.getpid())}
    assert alive(me) and not alive({**me, "start": "0"})


def test_a_started_run_records_its_process_and_its_overlays(tmp_path):
    owner, marker = tmp_path / "owner.json", tmp_path / "run.json"
    record_start(["config/sampling.yaml"], owner, marker)
    assert json.loads(owner.read_text()) == {"pid": os.getpid(), "start": process_start(os.getpid())}
    assert json.loads(marker.read_text()) == {"overlays": ["config/sampling.yaml"]}
