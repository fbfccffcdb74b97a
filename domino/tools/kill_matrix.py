"""Every rule killed mid-way: ``python -m domino.tools.kill_matrix [--config FILE ...]``.

For each rule of the DAG of ``reports/model_card.md`` (the embedded default, or the overlays
given with ``--config``), in a fresh copy of the checkout: start the documented command
(``snakemake --cores 1 reports/model_card.md [--configfile FILE ...]``), SIGKILL its whole
process group (Snakemake and the job) at a seeded random moment while one of that rule's jobs
runs, run the same command again, and compare the finished run with an uninterrupted one
(``domino.tools.compare``, timing aside). Prints one row per rule: kills, kills that landed
while the rule ran, reruns that finished, runs identical to the uninterrupted one.

A job is known to run from Snakemake's own lines (``rule NAME:`` ... ``Finished jobid: N``);
the moment is drawn in the job's duration in the uninterrupted run. With ``--forcerun`` a
trial starts from a copy of the finished uninterrupted run instead of an empty folder, and the
command carries ``--forcerun RULE`` (the README's way to redo one rule and what follows), which
is quicker for the late rules. Exits 1 when a rerun does not finish or differs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import tool_parser
from .compare import compare_runs

ROOT = Path(__file__).resolve().parents[2]  # the checkout: Snakefile, config.yaml, workflow/
CHECKOUT = ("Snakefile", "config.yaml", "workflow", "config", "profiles")
TARGET = "reports/model_card.md"
RULE_LINE = re.compile(r"^(?:local)?rule (\w+):$")
JOBID_LINE = re.compile(r"^\s+jobid: (\d+)$")
FINISHED_LINE = re.compile(r"Finished jobid: (\d+) \(Rule: (\w+)\)")
STAMP_LINE = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")


def copy_checkout(dst: Path, overlays: list[str]) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for name in CHECKOUT:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dst / name)
        elif src.exists():
            shutil.copy2(src, dst / name)
    for f in overlays:
        rel = Path(f)
        src = rel if rel.is_absolute() else ROOT / rel
        target = dst / ("overlays" / Path(rel.name) if rel.is_absolute() else rel)
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    return dst


def copy_run(reference: Path, dst: Path, overlays: list[str]) -> Path:
    """A finished run copied where the documented command runs on it: the run's folder itself
    when it holds the checkout (a run made in the checkout), else (a run made with ``snakemake
    --directory``, which holds only the run's outputs and Snakemake's records) a copy of the
    checkout with the run's folder laid over it."""
    if not (reference / "Snakefile").exists():
        copy_checkout(dst, overlays)
    shutil.copytree(reference, dst, symlinks=True, dirs_exist_ok=True)
    return dst


def command(overlays: list[str], forcerun: str | None = None) -> list[str]:
    """The documented command: the card, with the run's overlays (and a forced rule)."""
    exe = Path(sys.executable).with_name("snakemake")
    cmd = [str(exe) if exe.exists() else "snakemake", "--cores", "1", TARGET]
    if overlays:
        cmd += ["--configfile", *[("overlays/" + Path(f).name) if Path(f).is_absolute() else f for f in overlays]]
    if forcerun:
        cmd += ["--forcerun", forcerun]
    return cmd


def environment() -> dict:
    """The jobs' ``python`` is this interpreter and imports this checkout's ``domino``."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", HF_HUB_OFFLINE="1")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    return env


@dataclass
class Job:
    rule: str
    jobid: int
    start: float
    end: float | None = None


class Watched:
    """A Snakemake run whose output lines are read as they come: which job runs, which finished."""

    def __init__(self, cmd: list[str], cwd: Path, log: Path):
        self.jobs: list[Job] = []
        self.lock = threading.Lock()
        self.log = open(log, "w")
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, cwd=cwd, env=environment(), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        pending = None  # the rule of a "rule NAME:" line whose jobid line has not come yet
        for line in self.proc.stdout:
            self.log.write(line)
            now = time.monotonic() - self.t0
            line = line.rstrip("\n")
            if m := RULE_LINE.match(line):
                pending = m.group(1)
            elif pending and (m := JOBID_LINE.match(line)):
                with self.lock:
                    self.jobs.append(Job(pending, int(m.group(1)), now))
                pending = None
            elif m := FINISHED_LINE.search(line):
                with self.lock:
                    for j in self.jobs:
                        if j.jobid == int(m.group(1)) and j.end is None:
                            j.end = now
        self.log.flush()

    def started(self, rule: str) -> list[Job]:
        with self.lock:
            return [j for j in self.jobs if j.rule == rule]

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.wait()

    def wait(self, timeout: float | None = None) -> int:
        rc = self.proc.wait(timeout)
        self.reader.join(timeout=30)
        self.log.close()
        return rc


@dataclass
class Trial:
    rule: str
    kill: int
    job: int             # which of the rule's jobs (in start order) was killed
    delay_s: float       # seconds after the job started
    landed: bool         # the job was still running when the kill came
    finished: bool       # the rerun of the same command finished
    identical: bool      # ... and its results equal the uninterrupted run's, timing aside
    diffs: list[str] = field(default_factory=list)
    rerun_tail: str = ""


def logged_jobs(run: Path) -> list[Job]:
    """The jobs of a finished run as Snakemake's own log of it tells them (to the second): the
    log under ``.snakemake/log/`` with the most finished jobs."""
    best: list[Job] = []
    for log in sorted((run / ".snakemake" / "log").glob("*.snakemake.log")):
        jobs, now, pending = [], 0.0, None
        for line in log.read_text(errors="replace").splitlines():
            if m := STAMP_LINE.match(line):
                now = time.mktime(time.strptime(" ".join(m.group(1).split()), "%a %b %d %H:%M:%S %Y"))
            elif m := RULE_LINE.match(line):
                pending = m.group(1)
            elif pending and (m := JOBID_LINE.match(line)):
                jobs.append(Job(pending, int(m.group(1)), now))
                pending = None
            elif m := FINISHED_LINE.search(line):
                for j in jobs:
                    if j.jobid == int(m.group(1)) and j.end is None:
                        j.end = now
        done = [j for j in jobs if j.end is not None]
        if len(done) > len(best):
            best = done
    return best


def reference_run(work: Path, overlays: list[str], reference: Path | None) -> tuple[Path, list[Job]]:
    """The uninterrupted run and its jobs' timings: a fresh run, or a finished run dir given
    (its timings from Snakemake's log of it)."""
    if reference is not None:
        jobs = logged_jobs(reference)
        if not jobs or not (reference / TARGET).exists():
            raise SystemExit(f"kill_matrix: --reference {reference} holds no finished run (no {TARGET} or no "
                             "Snakemake log under .snakemake/log/)")
        return reference, jobs
    reference = copy_checkout(work / "reference", overlays)
    w = Watched(command(overlays), reference, work / "reference.log")
    rc = w.wait()
    if rc != 0:
        raise SystemExit(f"kill_matrix: the uninterrupted run failed (rc {rc}); see {work / 'reference.log'}")
    return reference, w.jobs


def trial(rule: str, k: int, jobs: list[Job], reference: Path, work: Path, overlays: list[str], seed: int,
          forcerun: bool, timeout: float, keep: bool) -> Trial:
    rng = random.Random(f"{seed}/{rule}/{k}")
    index = rng.randrange(len(jobs))
    ref_job = jobs[index]
    duration = (ref_job.end or ref_job.start) - ref_job.start
    fraction = rng.uniform(0.05, 0.95)
    cmd = command(overlays, rule if forcerun else None)
    for attempt in range(4):  # a job quicker than in the uninterrupted run: draw earlier
        delay = fraction * duration / (2 ** attempt)
        d = work / f"{rule}-{k}"
        shutil.rmtree(d, ignore_errors=True)
        if forcerun:
            copy_run(reference, d, overlays)
        else:
            copy_checkout(d, overlays)
        w = Watched(cmd, d, work / f"{rule}-{k}.killed.log")
        deadline = time.monotonic() + timeout
        job = None
        while time.monotonic() < deadline and w.proc.poll() is None:
            started = w.started(rule)
            if len(started) > index:
                job = started[index]
                break
            time.sleep(0.05)
        if job is None:
            w.kill()
            return Trial(rule, k, index, 0.0, False, False, False, ["the rule never started"])
        t_kill = w.t0 + job.start + delay
        while time.monotonic() < t_kill and job.end is None and w.proc.poll() is None:
            time.sleep(0.01)
        with w.lock:
            landed = job.end is None and w.proc.poll() is None
        w.kill()
        if landed:
            break
    rerun = subprocess.run(cmd, cwd=d, env=environment(), capture_output=True, text=True, timeout=timeout)
    (work / f"{rule}-{k}.rerun.log").write_text(rerun.stdout + rerun.stderr)
    finished = rerun.returncode == 0 and (d / TARGET).exists()
    diffs = compare_runs(reference, d) if finished else []
    tail = "" if finished else "\n".join((rerun.stdout + rerun.stderr).strip().splitlines()[-15:])
    if not keep and finished and not diffs:
        shutil.rmtree(d, ignore_errors=True)
    return Trial(rule, k, index, round(delay, 2), landed, finished, finished and not diffs, diffs, tail)


def table(trials: list[Trial], rules: list[str]) -> str:
    lines = ["| rule | kills | landed in the rule | reruns finished | identical |", "|---|---|---|---|---|"]
    for r in rules:
        t = [x for x in trials if x.rule == r]
        lines.append(f"| `{r}` | {len(t)} | {sum(x.landed for x in t)} | {sum(x.finished for x in t)} | "
                     f"{sum(x.identical for x in t)} |")
    return "\n".join(lines)


def run_matrix(overlays: list[str], kills_per_rule: int, seed: int, work: Path, rules: list[str] | None = None,
               reference: Path | None = None, forcerun: bool = False, timeout: float = 3600,
               keep: bool = False) -> tuple[list[Trial], list[str]]:
    work.mkdir(parents=True, exist_ok=True)
    reference, jobs = reference_run(work, overlays, reference)
    order = list(dict.fromkeys(j.rule for j in jobs))  # the rules in the order they ran
    unknown = sorted(set(rules or ()) - set(order))
    if unknown:
        raise SystemExit(f"kill_matrix: --rules {', '.join(unknown)} are not in this DAG ({', '.join(order)})")
    chosen = [r for r in order if not rules or r in rules]
    trials = []
    for rule in chosen:
        for k in range(kills_per_rule):
            t = trial(rule, k, [j for j in jobs if j.rule == rule], reference, work, overlays, seed, forcerun,
                      timeout, keep)
            print(f"{rule} kill {k}: job {t.job} at +{t.delay_s}s, landed {t.landed}, finished {t.finished}, "
                  f"identical {t.identical}" + (f" ({'; '.join(t.diffs[:3])})" if t.diffs else ""), flush=True)
            if t.rerun_tail:
                print(t.rerun_tail, flush=True)
            trials.append(t)
    (work / "kill_matrix.json").write_text(json.dumps([asdict(t) for t in trials], indent=2) + "\n")
    return trials, chosen


def parser() -> argparse.ArgumentParser:
    p = tool_parser("kill_matrix", __doc__)
    p.add_argument("--config", nargs="*", default=[], metavar="FILE",
                   help="overlays of config.yaml, as --configfile takes them (default: none, the embedded default)")
    p.add_argument("--kills-per-rule", type=int, default=3, help="kills of each rule, each at its own moment")
    p.add_argument("--seed", type=int, default=0, help="draws the job and the moment of each kill")
    p.add_argument("--rules", nargs="*", help="only these rules (default: every rule of the DAG)")
    p.add_argument("--work", default="runs/kill-matrix", help="where the copies go")
    p.add_argument("--reference", help="a finished run directory of the same config to compare with")
    p.add_argument("--forcerun", action="store_true",
                   help="start each trial from a copy of the finished run with --forcerun RULE")
    p.add_argument("--keep", action="store_true", help="keep every trial's copy (default: only those that fail)")
    return p


def main(argv=None) -> None:
    p = parser()
    a = p.parse_args(argv)
    if a.kills_per_rule < 1:
        raise SystemExit(f"{p.prog}: --kills-per-rule must be at least 1")
    for f in a.config:
        if not (Path(f) if Path(f).is_absolute() else ROOT / f).is_file():
            raise SystemExit(f"{p.prog}: --config {f}: no such file (relative paths are read from {ROOT})")
    work = Path(a.work).resolve()
    trials, rules = run_matrix(a.config, a.kills_per_rule, a.seed, work, a.rules,
                               Path(a.reference).resolve() if a.reference else None, a.forcerun, keep=a.keep)
    print(table(trials, rules))
    bad = [t for t in trials if not t.identical]
    print(f"{len(trials)} kills, {sum(t.finished for t in trials)} reruns finished, "
          f"{sum(t.identical for t in trials)} identical (details: {work / 'kill_matrix.json'})")
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
