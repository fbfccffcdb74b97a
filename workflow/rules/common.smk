import json
import sys

from domino.config import ConfigError, load_schema, validate_config, vllm_runs

# Validate before any job is scheduled: a bad value stops here, naming the key.
try:
    _validated = validate_config(config, load_schema(workflow.source_path("../schemas/config.schema.yaml")))
except ConfigError as _err:
    sys.exit(f"config error: {_err}")
config.clear()
config.update(_validated)

CHECKPOINTS = ["dflash-shift", "dflash-noshift", "domino"]
RUNS = ["baseline"] + CHECKPOINTS
EMBEDDED = config["verifier"]["source"] == "embedded"
# where every later stage loads the verifier (and its tokenizer) from
VERIFIER = "results/verifier/model" if EMBEDDED else config["verifier"]["source"]
VERIFIER_INPUT = ["results/verifier/model"] if EMBEDDED else []
TOKENIZER = "results/verifier/tokenizer" if EMBEDDED else config["verifier"]["source"]
TOKENIZER_INPUT = ["results/verifier/tokenizer"] if EMBEDDED else []


def stage_params(*sections):
    """The config sections a stage uses, as one JSON string: editing any of them reruns it."""
    keep = {"seed": config["seed"], "threads": config["threads"]}
    for s in sections:
        keep[s] = config[s]
    return json.dumps(keep, sort_keys=True)


# vLLM pins its own transformers, so its stages run under another interpreter (vllm.python);
# the checkout goes on PYTHONPATH there so that `-m domino` needs no second install.
VLLM = config["vllm"]
VLLM_PYTHON = f"PYTHONPATH=$PWD${{PYTHONPATH:+:$PYTHONPATH}} {VLLM['python']}" if VLLM["python"] else None
VLLM_RUNS = vllm_runs(config)  # the plain verifier and the noshift DFlash checkpoints


def vllm_outputs(wc=None):
    return expand("results/vllm_benchmark/{run}.json", run=VLLM_RUNS) if VLLM["benchmark"] else []
