"""A run directory between two Snakemake calls: which overlays made its results, and the lock a
killed Snakemake left behind. The workflow (``workflow/rules/common.smk``) calls these before any
job is planned; each returns the one line to print, or None.

One run directory holds one configuration: ``config.yaml`` plus the overlays given with
``--configfile``, recorded in ``.domino-run.json`` when a run starts. Later overlays are welcome
when they only add jobs (``ADDITIVE``) and refused, by a dry run as well, when they
would change a result that exists.

Snakemake's lock (``.snakemake/locks/``) refuses a second run in a folder where one is running. A
Snakemake killed without warning (SIGKILL, a lost machine) leaves its lock behind, which would
refuse the documented rerun too; so each run records its process once it holds the lock
(``.snakemake/domino-lock-owner.json``), and a later run removes a lock only when the process that
took it is gone: its record is newer than the lock files, and no process with that id and start
time is alive.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .config import load_config
from .host import PLACEMENT_SECTIONS
from .io import DamagedFile, read_json, write_text
from .schema import ConfigError

RUN_MARKER = Path(".domino-run.json")  # the overlays of the run this directory holds
LOCK_OWNER = Path(".snakemake/domino-lock-owner.json")  # the process holding Snakemake's lock


# What an overlay may change in a directory that holds a finished run: it may only add jobs.
ADDITIVE = ("new checkpoints: entries, a higher train.replicates, new benchmark.temperatures, new benchmark.suites, "
            "the vLLM cross-check switched on (vllm.*, the features extracted by transformers)")


def changes_to_results(before: dict, after: dict, path: str = "") -> list[str]:
    """How going from config ``before`` to ``after`` (both validated) would change results that
    exist, one ``"key: old -> new"`` per changed key; empty when ``after`` only adds jobs
    (``ADDITIVE``): a new entry of ``checkpoints:`` trains a new variant, a higher
    ``train.replicates`` new replicates, a new temperature a new sampling job, a new suite a new
    benchmark job (and sampling jobs), the vLLM section
    on a run without vLLM results the vLLM benchmark jobs; the ``PLACEMENT_SECTIONS`` (``slurm``)
    say only where jobs run, so they change nothing here. The benchmark,
    which decodes every trained checkpoint side by side, and the report then run again, as they do for
    any new job."""
    changes = []
    for key in sorted(set(before) | set(after)):
        where = f"{path}{key}"
        if where in PLACEMENT_SECTIONS or (where == "vllm" and _cross_check_added(before, after)):
            continue
        if key not in after:
            changes.append(f"{where}: removed")
        elif key not in before:
            if path != "checkpoints.":
                changes.append(f"{where}: added")
        elif where == "train.replicates":
            if after[key] < before[key]:
                changes.append(f"{where}: {before[key]} -> {after[key]} (fewer replicates)")
        elif where in ("benchmark.temperatures", "benchmark.suites"):
            gone = [t for t in before[key] if t not in after[key]]
            if gone:
                changes.append(f"{where}: {before[key]} -> {after[key]} (drops {gone})")
        elif isinstance(before[key], dict) and isinstance(after[key], dict):
            changes += changes_to_results(before[key], after[key], f"{where}.")
        elif before[key] != after[key]:
            changes.append(f"{where}: {json.dumps(before[key])} -> {json.dumps(after[key])}")
    return changes


def _cross_check_added(before: dict, after: dict) -> bool:
    """Whether going from ``before`` to ``after`` (whole configs) switches the vLLM cross-check on,
    which only adds the vLLM benchmark jobs: no vLLM result exists yet, and vLLM extracts no features."""
    backends = {c.get("features", {}).get("backend") for c in (before, after)}
    return not before.get("vllm", {}).get("benchmark") and backends == {"transformers"}


def run_overlays(configfiles, checkout: str | Path) -> list[str]:
    """The overlays of this call (``--configfile``), relative to the checkout, ``config.yaml``
    itself left out, in the order given: where two overlays set one key the later wins
    (``config/smollm2-quick.yaml`` after ``config/smollm2.yaml``), so the order is part of the run's
    configuration and is what the directory records."""
    checkout = os.path.abspath(checkout)
    return [os.path.relpath(f, checkout) for f in configfiles
            if os.path.abspath(f) != os.path.join(checkout, "config.yaml")]


def start_over(marker: Path) -> str:
    """What to do when this directory's run cannot take the call: the end of every refusal here."""
    return (f"give this run a directory of its own (snakemake --directory runs/NAME ...), "
            f"or delete results/ and {marker} to start over here")


def recorded_overlays(marker: Path, overlays: list[str]) -> list[str]:
    """The overlays the directory's run was made with, in their order. An older record is a bare
    sorted list, its order lost: the files it shares with this call then take this call's order.
    A record that is not one of the two raises ``DamagedFile``, naming it."""
    record = read_json(marker, what="the run record", hint=start_over(marker))
    recorded = record.get("overlays") if isinstance(record, dict) else record
    if not (isinstance(recorded, list) and all(isinstance(f, str) for f in recorded)):
        raise DamagedFile(f"the run record {marker} does not list the overlays its run was made with; "
                          f"{start_over(marker)}")
    if isinstance(record, list) and set(recorded) <= set(overlays):
        return [f for f in overlays if f in recorded]
    return recorded


def overlays_problem(overlays: list[str], config: dict, checkout: str | Path, marker: Path = RUN_MARKER) -> str | None:
    """Why this call's overlays may not run here (``config``: their validated configuration), or
    None: the directory holds no run, a run of the same overlays, or one to which they only add jobs."""
    try:
        recorded = recorded_overlays(marker, overlays) if Path(marker).exists() else overlays
    except DamagedFile as err:
        return str(err)
    if recorded == overlays:
        return None
    try:
        before = load_config([os.path.join(checkout, f) for f in ["config.yaml", *recorded]], checkout=checkout)
    except ConfigError as err:
        return (f"this directory holds a run with the overlays {recorded}, which no longer load ({err}); "
                f"{start_over(marker)}")
    changes = changes_to_results(before, config)
    if not changes:
        return None
    shown = "; ".join(changes[:3]) + (f"; and {len(changes) - 3} more" if len(changes) > 3 else "")
    return (f"this directory holds a run with the overlays {recorded}; the overlays {overlays} would change its "
            f"results ({shown}), and an overlay may only add jobs here ({ADDITIVE}). To change a value of this run, "
            f"edit it in config.yaml or in one of {recorded} and give the overlays it was made with: only the jobs "
            f"that read it run again; to keep this run as it is, {start_over(marker)}")


def process_start(pid: int) -> str | None:
    """The process's start time (Linux /proc), None where it cannot be read."""
    try:
        return Path(os.sep, "proc", str(pid), "stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def alive(owner: dict) -> bool:
    """Whether the process a lock record names still runs: its id is taken, by a process that
    started when the record says (where the start time can be read)."""
    try:
        os.kill(owner["pid"], 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    start = process_start(owner["pid"])
    return start is None or start == owner.get("start")


def clear_stale_lock(owner_file: Path = LOCK_OWNER) -> str | None:
    """Remove Snakemake's lock files when the run that took them is gone; the line that says so,
    or None where nothing was removed (no lock, no record, a record older than the lock, or a
    live run)."""
    locks = list((Path(owner_file).parent / "locks").glob("*.lock"))
    if not locks or not Path(owner_file).exists():
        return None
    try:
        owner = json.loads(Path(owner_file).read_text())
    except ValueError:
        return None
    if Path(owner_file).stat().st_mtime < max(p.stat().st_mtime for p in locks) or alive(owner):
        return None  # the lock is a newer run's (which has not recorded itself yet), or its run is alive
    for p in locks:
        p.unlink(missing_ok=True)
    return (f"removed the lock left by a Snakemake that was killed (pid {owner['pid']}); its incomplete "
            "jobs run again")


def record_start(overlays: list[str], owner_file: Path = LOCK_OWNER, marker: Path = RUN_MARKER) -> None:
    """What a run records once it holds the lock: its process, and the overlays it runs with."""
    Path(owner_file).write_text(json.dumps({"pid": os.getpid(), "start": process_start(os.getpid())}))
    write_text(marker, json.dumps({"overlays": overlays}))  # atomic: a killed run leaves the old record or the new
