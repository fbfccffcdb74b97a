import json
import os
import sys
from pathlib import Path

from domino.config import ConfigError, trained_runs, validate_config, vllm_runs
from domino.stages import STAGES, stage_config

# Validate before any job is scheduled: a bad value stops here, naming the key.
try:
    _validated = validate_config(config)
except ConfigError as _err:
    sys.exit(f"config error: {_err}")
config.clear()
config.update(_validated)

CHECKPOINTS = list(config["checkpoints"])  # the variants to train, in config order
TRAINED = trained_runs(config["checkpoints"], config["train"]["replicates"])  # the checkpoints, then their seed replicates (train.replicates)
RUNS = ["baseline"] + TRAINED  # every results/benchmark/{run}.json
EMBEDDED = config["verifier"]["source"] == "embedded"
# where every later stage loads the verifier (and its tokenizer) from
VERIFIER = "results/verifier/model" if EMBEDDED else config["verifier"]["source"]
VERIFIER_INPUT = ["results/verifier/model"] if EMBEDDED else []
TOKENIZER = "results/verifier/tokenizer" if EMBEDDED else config["verifier"]["source"]
TOKENIZER_INPUT = ["results/verifier/tokenizer"] if EMBEDDED else []

# vLLM pins its own transformers, so its stages run under another interpreter (vllm.python);
# the checkout goes on PYTHONPATH there so that `-m domino` needs no second install.
VLLM = config["vllm"]
# A relative vllm.python (.venv-vllm/bin/python) is read from the checkout, whatever --directory says.
_VLLM_EXE = VLLM["python"] and (VLLM["python"] if "/" not in VLLM["python"] or os.path.isabs(VLLM["python"])
                                else os.path.join(workflow.basedir, VLLM["python"]))
VLLM_PYTHON = f"PYTHONPATH={workflow.basedir}${{PYTHONPATH:+:$PYTHONPATH}} {_VLLM_EXE}" if VLLM["python"] else None
VLLM_DOMINO = f"{VLLM_PYTHON} -m domino"  # the launcher of the stages that run under vLLM
VLLM_RUNS = vllm_runs(config)  # the plain verifier and the noshift DFlash checkpoints


def stage_params(name):
    """The job's declared config keys and values (domino/stages.py): editing one reruns the job."""
    return lambda wc: stage_config(name, config, dict(wc.items()))


_NAMESPACE = {"input": "input", "output": "output", "param": "params", "wildcard": "wildcards"}


def domino(name, launcher="python -m domino"):
    """The shell command of stage `name`: its config, each of its paths by name, its log."""
    args = [f"--{arg.replace('_', '-')} {{{_NAMESPACE[role.removesuffix('[]')]}.{arg}:q}}"
            for arg, role in STAGES[name].paths.items()]
    launcher = launcher.replace("{", "{{").replace("}", "}}")  # literal text in a shell: template
    return " ".join([launcher, name, "--config {params.config:q}", *args, "--log {log:q}"])


def parent(key, namespace="output"):
    """A directory param: the folder of the rule's file `key` (a checkpoint is a folder of files)."""
    return lambda wc, input, output: str(Path(getattr(output if namespace == "output" else input, key)).parent)


def parents(key):
    """A list param: the folder of each of the rule's input files `key` (one checkpoint per run)."""
    return lambda wc, input: [str(Path(f).parent) for f in getattr(input, key)]


def vllm_outputs(wc=None):
    return expand("results/vllm_benchmark/{run}.json", run=VLLM_RUNS) if VLLM["benchmark"] else []


# One run directory holds one configuration: config.yaml plus the overlays given with
# --configfile. Another set of overlays is refused before any job writes, so that a card-scale
# run never overwrites the default's results: give it a directory of its own (--directory).
RUN_OVERLAYS = sorted(os.path.relpath(f, workflow.basedir) for f in workflow.overwrite_configfiles
                      if os.path.abspath(f) != os.path.join(workflow.basedir, "config.yaml"))
RUN_MARKER = Path(".domino-run.json")  # the overlays of the run this directory holds


# Snakemake's lock (.snakemake/locks/) refuses a second run in a folder where one is running. A
# Snakemake killed without warning (SIGKILL, a lost machine) leaves its lock behind, which would
# refuse the documented rerun too; so each run records its process once it holds the lock, and a
# later run removes a lock only when the process that took it is gone (its record is newer
# than the lock files, and no process with that id and start time is alive).
LOCK_OWNER = Path(".snakemake/domino-lock-owner.json")


def _process_start(pid):
    """The process's start time (Linux /proc), None where it cannot be read."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(owner):
    try:
        os.kill(owner["pid"], 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    start = _process_start(owner["pid"])
    return start is None or start == owner.get("start")


def _clear_stale_lock():
    locks = [p for p in Path(".snakemake/locks").glob("*.lock")]
    if not locks or not LOCK_OWNER.exists():
        return
    try:
        owner = json.loads(LOCK_OWNER.read_text())
    except ValueError:
        return
    if LOCK_OWNER.stat().st_mtime < max(p.stat().st_mtime for p in locks) or _alive(owner):
        return  # the lock is a newer run's (which has not recorded itself yet), or its run is alive
    for p in locks:
        p.unlink(missing_ok=True)
    print(f"removed the lock left by a Snakemake that was killed (pid {owner['pid']}); its incomplete "
          "jobs run again", file=sys.stderr)


_clear_stale_lock()


onstart:
    LOCK_OWNER.write_text(json.dumps({"pid": os.getpid(), "start": _process_start(os.getpid())}))
    if RUN_MARKER.exists() and json.loads(RUN_MARKER.read_text()) != RUN_OVERLAYS:
        sys.exit(f"config error: this directory holds a run with the overlays {json.loads(RUN_MARKER.read_text())}, "
                 f"not {RUN_OVERLAYS}; give this run a directory of its own (snakemake --directory runs/NAME ...), "
                 f"or delete results/ and {RUN_MARKER} to start over here")
    RUN_MARKER.write_text(json.dumps(RUN_OVERLAYS))
