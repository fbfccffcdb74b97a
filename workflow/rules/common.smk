import atexit
import json
import os
import re
import sys
import time
from pathlib import Path

from domino.config import validate_config
from domino.host import package_problem, slurm_resources, temporary_folder_problem, vllm_launcher
from domino.io import folder_digests
from domino.schema import ConfigError
from domino.verifier.facts import hub_problem
from domino.decoders import untrained_rows, vllm_rows
from domino.checkpoints import responses_of, served_validated, split_replicate, trained_checkpoints
from domino.logs import job_error_lines, missing_target_line
from domino.rundir import clear_stale_lock, overlays_problem, record_start, run_overlays
from domino.stages import STAGES, recorded_keys, recorded_values, stage_config

# Validate before any job is scheduled: a bad value stops here, naming the key.
try:
    _validated = validate_config(config, checkout=workflow.basedir)  # a relative verifier folder: run dir, then checkout
except ConfigError as _err:
    sys.exit(f"config error: {_err}")
config.clear()
config.update(_validated)

CHECKPOINTS = list(config["checkpoints"])  # the variants to train, in config order
TRAINED = trained_checkpoints(config["checkpoints"], config["train"]["replicates"])  # the checkpoints, then their seed replicates (train.replicates)
LOOKUPS = untrained_rows(config)  # the rows of domino.decoders (lookup, suffix cache, cost-aware): decoded, never trained
ROWS = ["baseline"] + TRAINED + LOOKUPS  # every results/benchmark/{suite}/{row}.json
SUITES = config["benchmark"]["suites"]  # one benchmark job each; HumanEval's results are the card's main tables
EMBEDDED = config["verifier"]["source"] == "embedded"
GGUF = config["verifier"]["source"] == "gguf"  # converted once into results/verifier/model (domino.verifier.gguf)
# where every later stage loads the verifier (and its tokenizer) from
VERIFIER = "results/verifier/model" if EMBEDDED or GGUF else config["verifier"]["source"]
VERIFIER_INPUT = ["results/verifier/model"] if EMBEDDED or GGUF else []
TOKENIZER = "results/verifier/tokenizer" if EMBEDDED else VERIFIER
# A local verifier folder (verifier.source a directory): the sha256 of each of its files, read at
# every start (a file is hashed again only when its size or time changed), is the param of rule
# verifier_digests, whose output is an input of every job that reads the folder; replacing its
# weights or its tokenizer reruns them and what depends on them, and a dry run says so.
LOCAL_VERIFIER = not (EMBEDDED or GGUF) and Path(VERIFIER).expanduser().is_dir()
VERIFIER_FILES = folder_digests(VERIFIER, ".snakemake/domino-verifier-digests.json") if LOCAL_VERIFIER else {}
VERIFIER_DIGESTS = ["results/verifier/source.sha256.json"] if LOCAL_VERIFIER else []
# the conversations the drafter trains on (data.responses): the prepared corpus, or the same
# conversations answered by the verifier (rule regenerate)
CONVERSATIONS = {"corpus": "results/prepare_data/{split}.jsonl", "verifier": "results/regenerate/{split}.jsonl"}
RESPONSES = config["data"]["responses"]
TRAINING_DATA = CONVERSATIONS[RESPONSES]
# A checkpoint that overrides data.responses (an ablation of the answers) trains on the other
# answers' own draft vocabulary and features, under responses-<responses>/; the run's own answers
# keep the plain paths.


def responses_dir(checkpoint):
    """'' for the run's own answers, else 'responses-<responses>/': the draft vocabulary's and the
    features' subfolder of a checkpoint (or seed replicate) that trains on other answers."""
    responses = responses_of(config, split_replicate(checkpoint)[0])
    return "" if responses == RESPONSES else f"responses-{responses}/"


def features_of(split):
    """The features of ``split`` that the job's checkpoint trains or is validated on."""
    return lambda wc: f"results/extract_hidden_states/{responses_dir(wc.checkpoint)}{split}/index.json"


def held_out_of(wc):
    """The held-out conversations whose prompts the job's checkpoint is validated on, served
    (train.served_prompts > 0): the split's answers it trains on; else none."""
    name = split_replicate(wc.checkpoint)[0]
    return [CONVERSATIONS[responses_of(config, name)].format(split="val")] if served_validated(config, name) else []


def vocab_of(wc):
    """The draft vocabulary the job's checkpoint trains with."""
    return f"results/draft_vocab/{responses_dir(wc.checkpoint)}vocab.safetensors"
TOKENIZER_INPUT = ["results/verifier/tokenizer"] if EMBEDDED else VERIFIER_INPUT

# Where each job is submitted on SLURM (config section slurm, docs/card-scale.md): every rule's
# resources, slurm.gpu_partition for the rules that profiles/slurm gives a GPU; a local run ignores them.
SLURM = slurm_resources(config["slurm"])
SLURM_GPU = slurm_resources(config["slurm"], gpu=True)

# vLLM pins its own transformers, so its stages run under another interpreter (vllm.python);
# the checkout goes on PYTHONPATH there so that `-m domino` needs no second install.
VLLM = config["vllm"]
# A relative vllm.python (.venv-vllm/bin/python) is read from the checkout, whatever --directory says;
# both paths are quoted for the shell (domino.host.vllm_launcher).
# The launcher of the stages that run under vLLM; without vllm.python no such job is planned (the
# config check refuses a vLLM stage without it), and the rules' text still needs a command.
VLLM_DOMINO = vllm_launcher(VLLM["python"], workflow.basedir) if VLLM["python"] else "false vllm.python is null"
VLLM_ROWS = vllm_rows(config)  # the plain verifier, every checkpoint, the n-gram lookup row


def stage_params(name):
    """A rule's config params (domino/stages.py): ``config``, the job's declared keys and values as
    JSON for its command, and one recorded param per key, ``"train.lr=0.003"``, so that editing a
    value reruns exactly the jobs that declared it and the dry run's reason names that key.
    ``config`` is a function of the job's output, which Snakemake does not record (it would print
    the whole JSON twice as the reason); the recorded params hold the same values."""
    def recorded(key):
        return lambda wildcards: recorded_values(name, config, dict(wildcards.items()))[key]

    keys = recorded_keys(name, config)
    names = [re.sub(r"\W", "_", key) for key in keys]
    assert len(set(names)) == len(names), f"two config keys of stage {name} share a param name"
    return {"config": lambda wildcards, output: stage_config(name, config, dict(wildcards.items())),
            **{f"key_{n}": recorded(key) for n, key in zip(names, keys)}}


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


def verifier_path(wc, input):
    """The verifier param: this run's own checkpoint, read off the rule's named input `verifier`
    (so that the path follows the input where the file system is not shared), or the hub id."""
    return input.verifier[0] if VERIFIER_INPUT else VERIFIER


def tokenizer_path(wc, input):
    """The tokenizer param of data preparation: the rule's named input `tokenizer`, or the hub id."""
    return input.tokenizer[0] if TOKENIZER_INPUT else TOKENIZER


def train_launcher():
    """One process, or torchrun data parallelism when train.nproc_per_node > 1."""
    n = config["train"]["nproc_per_node"]
    return "python -m domino" if n == 1 else f"torchrun --standalone --nproc_per_node {n} -m domino"


TEMPERATURES = [f"{t:g}" for t in config["benchmark"]["temperatures"] if t > 0]  # benchmark.temperatures, T > 0


def sampling_outputs(wc=None):
    return expand("results/sampling/T{temperature}/{suite}/{row}.json", temperature=TEMPERATURES, suite=SUITES,
                  row=["baseline"] + CHECKPOINTS)


def results_dir(wc, input):
    """The report's results folder, read off its input (results/prepare_data/summary.json)."""
    return str(Path(input.summary).parent.parent)


def vllm_outputs(wc=None):
    return expand("results/vllm_benchmark/{suite}/{row}.json", suite=SUITES, row=VLLM_ROWS) if VLLM["benchmark"] else []


# One run directory holds one configuration (domino/rundir.py): config.yaml plus the overlays given
# with --configfile. Other overlays are welcome when they only add jobs (the sampling, replicates
# and ablations overlays on a finished run) and refused, by a dry run as well, when they would
# change a result that exists: a card-scale run never overwrites the default's results.
RUN_OVERLAYS = run_overlays(workflow.overwrite_configfiles, workflow.basedir)
_problem = overlays_problem(RUN_OVERLAYS, config, workflow.basedir)
if _problem:
    sys.exit(f"config error: {_problem}")
# A lock left by a Snakemake killed without warning is removed once its process is gone.
_removed = clear_stale_lock()
if _removed:
    print(_removed, file=sys.stderr)


# What a user asks for (the README's targets): a target no rule makes is refused in one line that
# lists them, where Snakemake prints its MissingRuleException. Snakemake reports it through its
# logger, after reading this file, so a filter on that logger rewrites the message.
USER_TARGETS = ["reports/model_card.md", "all", "results/validate/<checkpoint>.json", "results/export/<checkpoint>",
                "results/train/<checkpoint>/checkpoint/model.safetensors", f"with <checkpoint> one of {', '.join(TRAINED)}",
                "or a rule's name after --until (snakemake --list-rules)"]


def _one_line_for_a_missing_target(record):
    if getattr(record, "exception", None) == "MissingRuleException":
        line = missing_target_line(str(record.msg), USER_TARGETS)
        if line:
            record.msg, record.args = line, ()
    return True


from snakemake.logging import logger as _snakemake_logger  # noqa: E402

_snakemake_logger.addFilter(_one_line_for_a_missing_target)


# A run (not a dry run: onstart runs only before jobs) whose temporary folder is full stops here
# in one line naming it, where Snakemake's scheduler would fail with a traceback writing there;
# so does one whose verifier is a hub id neither cached nor on a hub that answers (a dry run
# needs no network, so it is not asked); so does one whose jobs would import another checkout's
# domino package (an editable install of another clone), which would run that code under this workflow.
onstart:
    _tmp = temporary_folder_problem() or package_problem(Path(sys.modules["domino"].__file__).parent, workflow.basedir)
    if _tmp:
        sys.exit(f"error: {_tmp}")
    _hub = None if EMBEDDED or GGUF or LOCAL_VERIFIER else hub_problem(VERIFIER)
    if _hub:
        sys.exit(f"config error: {_hub}")
    record_start(RUN_OVERLAYS)


# When a run stops (a failed job, Ctrl-C), each stopped job's own line (domino/logs.py: what
# failed, or what an interruption kept and how to resume) is the last thing printed: after
# Snakemake's error block, which repeats the job's whole command, and after its closing lines
# (printed at exit, as Snakemake's last words come after this hook).
STARTED = time.time()


onerror:
    lines = job_error_lines("logs", STARTED, STAGES)
    if lines:
        atexit.register(print, "\n" + "\n".join(lines), file=sys.stderr, flush=True)
