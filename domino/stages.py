"""The stage layer: every workflow stage, stated once.

A ``Stage`` names the config keys it reads (dotted paths) and the paths it takes, and points
at its entry function. Both sides of the workflow use that one declaration:

* the rule builds its ``params:`` from it (``stage_config``), so editing a key reruns exactly
  the stages that declared it, and its shell command (``workflow/rules/common.smk``);
* ``python -m domino <stage>`` hands the entry function a ``StageConfig`` holding only those
  keys, which refuses to read any other key.

A declared key may name a wildcard, as ``checkpoints.{checkpoint}`` does: a train job
depends on its own checkpoint's entry only, so editing one variant reruns that variant alone.
A key is read when the stage takes a plain value from it, or a whole section; with
``DOMINO_CONFIG_READS`` set to a file, every stage appends what it read there, and a test
compares it with the declarations.

Path roles: ``input`` and ``output`` are the rule's files of that name, ``param`` a value the
rule computes (a path: the verifier may be a hub id; or the row names), ``wildcard`` the rule's
wildcard of that name. A role ending in ``[]`` is a list, one value per row, in the same order
as the other lists of the stage. Every entry function takes the config and its paths by the same names.

The Snakefile imports this module to build every rule, and a job pays only for the libraries
its own stage uses: each entry function imports what it calls, so importing this module loads
neither torch nor transformers.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from .checkpoints import served_validated, split_replicate
from .decoders import SECTIONS as DECODER_SECTIONS
from .schema import section_keys

if TYPE_CHECKING:
    import torch

    from .train.loop import TrainConfig

logger = logging.getLogger(__name__)


class UndeclaredKey(KeyError):
    """A stage read a config key that its declaration does not list."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class Stage:
    name: str  # the rule's name, the CLI's name and the log's name
    run: Callable
    reads: tuple[str, ...]  # dotted config keys; "{wildcard}" stands for the job's wildcard
    paths: dict[str, str] = field(default_factory=dict)  # argument -> input | output | param | wildcard
    reads_when: Callable[[dict], tuple[str, ...]] | None = None  # the config -> keys read only in some configs

    def keys(self, config: dict, wildcards: Mapping[str, str] | None = None) -> list[str]:
        """The declared keys of this job, wildcards filled in; a seed replicate
        (``domino-seed1``) reads the entry of its checkpoint (``checkpoints.domino``)."""
        extra = self.reads_when(config) if self.reads_when else ()
        fill = {k: split_replicate(v)[0] if k == "checkpoint" else v for k, v in (wildcards or {}).items()}
        return [k.format(**fill) for k in (*self.reads, *extra)]


# Keys that say which jobs exist, not what one job computes: a job is given one only when its
# stage declares that key by name (the report does), never as part of a declared section, so
# raising train.replicates adds the replicates' jobs and reruns no training that exists.
JOB_SET_KEYS = ("train.replicates",)


def _under(path: str, declared: list[str]) -> bool:
    """Whether ``path`` is a declared key, lies inside one, or is a section holding one."""
    if path in JOB_SET_KEYS:
        return path in declared
    return any(path == d or path.startswith(d + ".") or d.startswith(path + ".") for d in declared)


def _declared_values(stage: Stage, config: dict, wildcards: Mapping[str, str] | None) -> tuple[list[str], dict]:
    """The job's declared keys, and their values as a nested dict (the job-set keys left out)."""
    declared = stage.keys(config, wildcards)
    values: dict = {}
    for key in declared:
        *parents, last = key.split(".")
        node, source = values, config
        for part in parents:
            node, source = node.setdefault(part, {}), source[part]
        node[last] = copy.deepcopy(source[last])
    for key in JOB_SET_KEYS:
        if key not in declared:
            section, last = key.rsplit(".", 1)
            values.get(section, {}).pop(last, None)
    return declared, values


def stage_config(name: str, config: dict, wildcards: Mapping[str, str] | None = None) -> str:
    """The job's declared keys and their values, as JSON: what ``python -m domino <stage> --config`` takes."""
    declared, values = _declared_values(STAGES[name], config, wildcards)
    return json.dumps({"declared": declared, "values": values}, sort_keys=True)


# What Snakemake records of a job, to rerun it when a value changes: one entry per key, written
# "key=value", so that a rerun's reason names the keys that changed and only those. A value
# longer than RECORDED_CHARS is recorded by its hash, so that the reason stays short.
RECORDED_CHARS = 200


def _recorded(key: str, value) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    if len(text) > RECORDED_CHARS:
        text = "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]
    return f"{key}={text}"


def _leaves(values: dict, prefix: str = "") -> dict:
    """``{"train": {"lr": 0.003}}`` -> ``{"train.lr": 0.003}``; lists and empty sections are leaves."""
    out = {}
    for k, v in values.items():
        if isinstance(v, dict) and v:
            out.update(_leaves(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _split_patterns(name: str, config: dict) -> tuple[Stage, list[str]]:
    """The stage with its wildcard-free keys only, and its keys that name a wildcard."""
    stage = STAGES[name]
    patterns = (*stage.reads, *(stage.reads_when(config) if stage.reads_when else ()))
    fixed = Stage(name, stage.run, tuple(k for k in patterns if "{" not in k), stage.paths)
    return fixed, [k for k in patterns if "{" in k]


def recorded_keys(name: str, config: dict) -> list[str]:
    """The keys ``recorded_values`` gives, the same for every job of the stage: each leaf of the
    declared keys (``train.lr``), and each key naming a wildcard (``checkpoints.{checkpoint}``) whole."""
    fixed, wild = _split_patterns(name, config)
    return [*_leaves(_declared_values(fixed, config, None)[1]), *wild]


def recorded_values(name: str, config: dict, wildcards: Mapping[str, str] | None = None) -> dict[str, str]:
    """What the workflow records of one job's config, by ``recorded_keys``: ``"train.lr=0.003"``,
    ``"checkpoints.domino={...}"``. The job's ``stage_config`` holds the same values."""
    fixed, wild = _split_patterns(name, config)
    out = {k: _recorded(k, v) for k, v in _leaves(_declared_values(fixed, config, None)[1]).items()}
    for pattern in wild:
        key = Stage(name, fixed.run, (pattern,)).keys(config, wildcards)[0]
        node = config
        for part in key.split("."):
            node = node[part]
        out[pattern] = _recorded(key, node)
    return out


class StageConfig:
    """Read-only view of one job's config values that records what the stage reads.

    A value is read by its dotted key, ``cfg["train.lr"]``, and a whole section as a plain dict
    with ``cfg.section("train")``; each counts as read. A key outside the declaration raises
    ``UndeclaredKey``; a section asked for as a value raises ``TypeError``.
    """

    def __init__(self, values: dict, declared: list[str]):
        self._values, self._declared = values, declared
        self.reads: set[str] = set()

    @property
    def declared(self) -> tuple[str, ...]:
        """The job's declared keys (a key some configs declare, ``Stage.reads_when``, is here when declared)."""
        return tuple(self._declared)

    def _lookup(self, key: str):
        if not _under(key, self._declared):
            if key in JOB_SET_KEYS:
                raise UndeclaredKey(f"config key {key!r} says which jobs run; a job is not given it "
                                    "unless its stage declares it by name (domino/stages.py)")
            raise UndeclaredKey(f"config key {key!r} is read by this stage but not declared in "
                                f"domino/stages.py (declared: {', '.join(self._declared)})")
        value = self._values
        for part in key.split("."):
            value = value[part]
        self.reads.add(key)
        return value

    def __getitem__(self, key: str):
        """A plain value by its dotted key."""
        value = self._lookup(key)
        if isinstance(value, dict):
            raise TypeError(f"config key {key!r} is a section: read it with cfg.section({key!r})")
        return value

    def section(self, key: str):
        """Everything under a dotted key, copied: a section as a plain dict (a value as it is)."""
        return copy.deepcopy(self._lookup(key))


def unread(declared: list[str], reads: set[str]) -> list[str]:
    """Declared keys of which nothing was read."""
    def touched(d):
        return any(r == d or r.startswith(d + ".") or d.startswith(r + ".") for r in reads)
    return [d for d in declared if not touched(d)]


def run_stage(name: str, config_json: dict, paths: dict) -> None:
    """Run one stage's entry function on its declared config values and its paths."""
    from .common import setup_process

    declared = config_json["declared"]
    cfg = StageConfig(config_json["values"], declared)
    setup_process(cfg["seed"], cfg["threads"])
    STAGES[name].run(cfg, **paths)
    record = os.environ.get("DOMINO_CONFIG_READS")
    if record:
        with open(record, "a") as fh:
            fh.write(json.dumps({"stage": name, "declared": declared, "read": sorted(cfg.reads)}) + "\n")


# -----------------------------------------------------------------------------
# the stages, in DAG order: declaration above, entry function below

STAGES: dict[str, Stage] = {}
_RUN = ("seed", "threads")  # every stage seeds torch and sets its thread count
_CORPUS = ("data.corpus", "data.samples", "data.hub_dataset", "data.hub_split")


def _mix(config: dict) -> tuple[str, ...]:
    """``data.mix`` is declared only where it holds a part, so a run without one records no new key."""
    return ("data.mix",) if config["data"].get("mix") else ()


def _corpus_records(cfg: StageConfig) -> list[tuple[str, list[dict]]]:
    """Each part's ``(corpus, records)``: ``data.corpus`` first, then ``data.mix``'s parts in order."""
    from .data import corpora as data_lib

    parts = [(cfg["data.corpus"], cfg["data.samples"])]
    if "data.mix" in cfg.declared:
        parts += [(m["corpus"], m["samples"]) for m in cfg.section("data.mix")]
    return [(c, data_lib.load_corpus(c, n, cfg["data.hub_dataset"], cfg["data.hub_split"])) for c, n in parts]


def stage(name: str, reads: tuple[str, ...], paths: dict[str, str], reads_when=None):
    """Register the decorated function as the entry point of stage ``name``."""
    def register(fn):
        STAGES[name] = Stage(name, fn, (*_RUN, *reads), paths, reads_when)
        return fn
    return register


@stage("tokenizer", (*_CORPUS, "verifier.embedded.vocab_size"), {"out": "output"}, reads_when=_mix)
def tokenizer(cfg: StageConfig, out: str) -> None:
    from .verifier import embedded as embedded_lib

    texts = (m["content"] for _, records in _corpus_records(cfg) for r in records for m in r["messages"])
    tok = embedded_lib.train_tokenizer(texts, cfg["verifier.embedded.vocab_size"], out)
    logger.info(f"tokenizer with {len(tok)} tokens written to {out}")


@stage("prepare_data", (*_CORPUS, "data.seq_len", "data.val_fraction", "data.enable_thinking"),
       {"tokenizer": "param", "train": "output", "val": "output", "summary": "output"}, reads_when=_mix)
def prepare_data(cfg: StageConfig, tokenizer: str, train: str, val: str, summary: str) -> None:
    from .data import corpora as data_lib
    from .verifier import load as verifier_lib

    tok = verifier_lib.load_tokenizer(tokenizer)  # a damaged tokenizer is refused before the corpus is read
    parts = _corpus_records(cfg)
    t, v, counts = data_lib.prepare_parts(tok, parts, cfg["data.seq_len"], cfg["data.val_fraction"], cfg["seed"],
                                          _template_kwargs(cfg))
    s = data_lib.write_prepared((t, v), train, val, summary, corpus=cfg["data.corpus"],
                                samples=sum(len(r) for _, r in parts), seq_len=cfg["data.seq_len"],
                                parts=counts if len(parts) > 1 else None)
    logger.info(f"{s['train']} train / {s['val']} val conversations, {s['tokens']} tokens "
                f"({s['assistant_tokens']} assistant)")


_REGENERATE = ("data.seq_len", "data.enable_thinking", "data.temperature", "data.top_p", "data.max_new_tokens",
               "data.generation_batch_size", "data.shard_samples", "data.generation_backend", "data.kept_answers")


@stage("regenerate", ("device", "verifier.dtype", *_CORPUS, *_REGENERATE),
       {"split": "wildcard", "verifier": "param", "data": "input", "out": "output", "summary": "output"},
       reads_when=lambda c: _mix(c) + (("vllm.memory_fraction",) if c["data"]["generation_backend"] == "vllm"
                                       else ()))
def regenerate(cfg: StageConfig, split: str, verifier: str, data: str, out: str, summary: str) -> None:
    from . import common, io
    from .data import corpora as data_lib, regenerate as regenerate_lib
    from .verifier import load as verifier_lib

    device = common.check_device(cfg["device"])
    tok = verifier_lib.load_tokenizer(verifier)
    backend = cfg["data.generation_backend"]
    model = verifier_lib.load_verifier(verifier, cfg["verifier.dtype"], device if backend == "transformers" else "cpu")
    rows = data_lib.read_jsonl(data)
    # the prepared rows name their conversations; the corpus, read again, gives their messages
    messages = {r["id"]: r["messages"] for _, records in _corpus_records(cfg) for r in records}
    missing = [r["id"] for r in rows if r["id"] not in messages]
    if missing:
        raise regenerate_lib.RegenerateError(f"{data}: {len(missing)} conversations (the first {missing[0]!r}) are "
                                             f"not in the corpus {cfg['data.corpus']!r} as configured now; "
                                             "rerun prepare_data")
    kwargs = _template_kwargs(cfg)
    prompts = [regenerate_lib.first_turn_prompt(tok, messages[r["id"]], kwargs) for r in rows]
    stop = verifier_lib.eos_ids(tok, model.config, getattr(model, "generation_config", None))
    pad = tok.pad_token_id if tok.pad_token_id is not None else stop[0]
    rc = regenerate_lib.RegenerateConfig(
        max_new_tokens=cfg["data.max_new_tokens"], batch_size=cfg["data.generation_batch_size"],
        shard_samples=cfg["data.shard_samples"], temperature=cfg["data.temperature"], top_p=cfg["data.top_p"],
        seq_len=cfg["data.seq_len"], seed=cfg["seed"])
    key, answer = regenerate_lib.verifier_key(verifier, cfg["verifier.dtype"]), None
    if backend == "vllm":  # the vLLM environment's interpreter runs this job (workflow/rules/data.smk)
        from .vllm.backend import load_llm, vllm_answers

        # the transformers verifier gave the stop ids; vLLM answers with its own copy
        llm = load_llm(verifier, cfg["verifier.dtype"], max_model_len=model.config.max_position_embeddings,
                       seed=cfg["seed"], memory_fraction=cfg["vllm.memory_fraction"])
        key, model = f"{key}:vllm", None

        def answer(batch, seed):
            return vllm_answers(llm, batch, rc.max_new_tokens, stop, rc.temperature, rc.top_p, seed)
    if cfg["data.kept_answers"]:  # shards answered on another machine, each kept where its key is this run's
        laid = regenerate_lib.seed_parts(cfg["data.kept_answers"], split, out)
        logger.info(f"{laid} {split} shards read from {cfg['data.kept_answers']} (sha256 checked)")
    s = regenerate_lib.regenerate(model, key, rows, prompts, stop, pad, rc, out, desc=f"regenerate {split}",
                                  answer=answer)
    s |= {"split": split, "decoding": "greedy" if rc.temperature == 0 else
          f"sampled at temperature {rc.temperature:g}, top_p {rc.top_p:g}, seed {rc.seed}",
          "max_new_tokens": rc.max_new_tokens, "verifier_dtype": cfg["verifier.dtype"], "turns": "first",
          "backend": backend, "hardware": common.hardware(), "kept_answers": cfg["data.kept_answers"]}
    io.write_json(summary, s, seal=True)  # the card reads it only with its seal
    logger.info(f"{s['conversations']} {split} answers regenerated ({s['decoding']}): {s['answer_tokens']} answer "
                f"tokens, {s['cut']} cut at {rc.max_new_tokens}; {s['generated_tokens']} tokens in "
                f"{s['seconds']:.0f} s")


@stage("verifier", ("verifier.embedded",), {"tokenizer": "input", "train": "input", "out": "output"})
def verifier(cfg: StageConfig, tokenizer: str, train: str, out: str) -> None:
    from .data import corpora as data_lib
    from .verifier import embedded as embedded_lib, load as verifier_lib

    rows = data_lib.read_jsonl(train)
    s = embedded_lib.pretrain_embedded_verifier(rows, verifier_lib.load_tokenizer(tokenizer),
                                                cfg.section("verifier.embedded"), out, cfg["seed"])
    logger.info(f"verifier: {s['parameters']} parameters, loss {s['first_loss']:.3f} -> {s['final_loss']:.3f}")


@stage("convert_verifier", ("verifier.gguf", "verifier.dtype"), {"out": "output"})
def convert_verifier(cfg: StageConfig, out: str) -> None:
    from .verifier import gguf as gguf_lib

    r = gguf_lib.convert(cfg.section("verifier.gguf"), cfg["verifier.dtype"], out)
    logger.info(f"verifier: {r['file']} of {r['distribution']} {r['version']} ({r['architecture']}, "
                f"{r['parameters']} parameters) written to {out} in {r['dtype']}")


@stage("draft_vocab", ("drafter.draft_vocab_size",),
       {"verifier": "param", "train": "input", "vocab": "output", "summary": "output"})
def draft_vocab(cfg: StageConfig, verifier: str, train: str, vocab: str, summary: str) -> None:
    import transformers

    from . import vocab as vocab_lib
    from .data import corpora as data_lib
    from .verifier import load as verifier_lib

    tokenizer = verifier_lib.load_tokenizer(verifier)  # checks the verifier's files first
    model_config = transformers.AutoConfig.from_pretrained(verifier)
    always = verifier_lib.eos_ids(tokenizer, model_config)
    s = vocab_lib.build_draft_vocab(data_lib.read_jsonl(train), model_config.vocab_size,
                                    cfg["drafter.draft_vocab_size"], always, vocab, summary)
    logger.info(f"draft vocab {s['draft_vocab_size']} of {s['target_vocab_size']}: "
                f"covers {s['assistant_token_coverage']:.1%} of assistant tokens, {s['unseen_rows']} rows never seen")


@stage("extract_hidden_states", ("device", "verifier.dtype", "drafter.aux_layer_ids", "features"),
       {"verifier": "param", "vocab": "input", "data": "input", "index": "output"},
       reads_when=lambda c: ("vllm.memory_fraction",) if c["features"]["backend"] == "vllm" else ())
def extract_hidden_states(cfg: StageConfig, verifier: str, vocab: str, data: str, index: str) -> None:
    from . import common, vocab as vocab_lib
    from .data import corpora as data_lib, features as features_lib
    from .verifier import load as verifier_lib

    f, aux, dtype = cfg.section("features"), cfg["drafter.aux_layer_ids"], cfg["verifier.dtype"]
    device = common.check_device(cfg["device"])
    backend = None
    if f["backend"] == "vllm":
        from .vllm.backend import VllmExtractor  # vLLM lives in its own environment

        # transformers keeps a CPU copy for the final norm, the lm_head rows and the shard key
        model = verifier_lib.load_verifier(verifier, dtype, "cpu")
        backend = VllmExtractor(verifier, model, aux, dtype, max_model_len=model.config.max_position_embeddings,
                                memory_fraction=cfg["vllm.memory_fraction"], seed=cfg["seed"], device=device)
    else:
        model = verifier_lib.load_verifier(verifier, dtype, device)
    d2t, _ = vocab_lib.load_vocab(vocab)
    features_lib.extract(model, data_lib.read_jsonl(data), aux, vocab_lib.target_ids(d2t), index, f["batch_size"],
                         f["shard_samples"], f["dtype"], backend=backend, last_hidden_state=f["last_hidden_state"])


@stage("train", ("device", "verifier.name", "drafter", "train", "checkpoints.{checkpoint}"),
       {"checkpoint": "wildcard", "verifier": "param", "vocab": "input", "features": "input",
        "held_out": "input[]", "checkpoint_dir": "param", "metrics": "output", "summary": "output",
        "state_dir": "param"},
       # served validation decodes in the verifier's dtype, as the benchmark does
       reads_when=lambda c: ("verifier.dtype",) if any(served_validated(c, n) for n in c["checkpoints"]) else ())
def train(cfg: StageConfig, checkpoint: str, verifier: str, vocab: str, features: str, held_out: list[str],
          checkpoint_dir: str, metrics: str, summary: str, state_dir: str) -> None:
    """``held_out``: the held-out conversations whose prompts served validation decodes
    (``train.served_prompts`` > 0), else none."""
    import torch

    from . import common, model as model_lib, vocab as vocab_lib
    from .data import features as features_lib
    from .train import loop as train_lib
    from .verifier import load as verifier_lib

    model = verifier_lib.load_verifier(verifier, "float32", "cpu")
    fields = drafter_fields(cfg, checkpoint, verifier_lib.load_tokenizer(verifier), model.config)
    d2t, t2d = vocab_lib.load_vocab(vocab)
    fields["draft_vocab_size"] = len(d2t)  # the vocabulary built (drafter.draft_vocab_size may say "seen")
    dcfg = model_lib.DrafterConfig.from_verifier(model.config, verifier=cfg["verifier.name"], **fields)
    tcfg, autocast = train_config(cfg, checkpoint)
    torch.manual_seed(tcfg.seed)  # the initialisation: a seed replicate draws its own
    drafter = model_lib.Drafter.from_verifier(model, dcfg, d2t, t2d)
    head = train_lib.VerifierHead(model, vocab_lib.target_ids(d2t)) if tcfg.loss == "kl_div" else None
    del model
    # train.samples: a subset of the conversations, the same for every replicate of a checkpoint
    feats = features_lib.load_features(features, samples=overridden(cfg, checkpoint, "train")["samples"],
                                       seed=cfg["seed"])
    outputs = train_lib.TrainOutputs(checkpoint_dir, metrics, summary, state_dir)
    with common.distributed(common.check_device(cfg["device"])) as device:
        served = served_validation(cfg, tcfg, verifier, held_out, device) if tcfg.served_prompts else None
        s = train_lib.train(drafter, feats, tcfg, outputs, device, autocast, verifier_head=head,
                            data=answers_override(cfg, checkpoint), served=served)
    if s.get("rank", 0) == 0:
        logger.info(f"trained {checkpoint}: {s['steps']} steps in {s['seconds']:.1f}s, "
                    f"final loss {s['final_loss']:.4f}")


def served_validation(cfg: StageConfig, tcfg: TrainConfig, verifier: str, held_out: list[str], device):
    """Served validation's verifier, in ``verifier.dtype`` on ``device``, and the prompts of the
    held-out conversations (``domino.train.served.held_out_prompts``); none among them is refused."""
    from .data import corpora as data_lib
    from .train import served as served_lib
    from .verifier import load as verifier_lib

    if len(held_out) != 1:
        raise ValueError(f"train.served_prompts: {tcfg.served_prompts} needs the held-out conversations file, "
                         f"given {len(held_out)}")
    model = verifier_lib.load_verifier(verifier, cfg["verifier.dtype"], device)
    prompts = served_lib.held_out_prompts(data_lib.read_jsonl(held_out[0]), tcfg.served_prompts,
                                          tcfg.served_max_new_tokens, model.config.max_position_embeddings)
    if not prompts:
        raise data_lib.DataError(f"{held_out[0]}: no held-out conversation has an answer whose prompt leaves room "
                                 f"for train.served_max_new_tokens {tcfg.served_max_new_tokens}")
    if len(prompts) < tcfg.served_prompts:
        logger.info(f"served validation: {len(prompts)} held-out prompts of the {tcfg.served_prompts} asked for")
    stops = verifier_lib.eos_ids(verifier_lib.load_tokenizer(verifier), model.config)
    return served_lib.ServedValidation(model, prompts, tcfg.served_max_new_tokens, tuple(stops))


@stage("validate", ("device", "train", "checkpoints.{checkpoint}"),
       {"checkpoint": "wildcard", "checkpoint_dir": "param", "features": "input", "out": "output"})
def validate(cfg: StageConfig, checkpoint: str, checkpoint_dir: str, features: str, out: str) -> None:
    from . import common, io as io_lib, model as model_lib
    from .data import features as features_lib
    from .train import loop as train_lib

    tcfg, autocast = train_config(cfg, checkpoint)
    res = train_lib.validate(model_lib.Drafter.load(checkpoint_dir), features_lib.load_features(features), tcfg,
                             common.check_device(cfg["device"]), autocast)
    io_lib.write_json(out, {**res, "checkpoint": checkpoint}, seal=True)  # the card reads it only with its seal
    acc = [f"{s['final_acc']:.3f}" for s in res["per_slot"]]
    logger.info(f"{checkpoint}: final accuracy per slot {acc}, overall {res['overall']['final_acc']:.3f}")


_BENCHMARK = ("device", "verifier.name", "verifier.dtype", "data.enable_thinking", "benchmark.sources.{suite}",
              "benchmark.max_prompts", "benchmark.max_new_tokens", "benchmark.chat_template", "benchmark.threads",
              "benchmark.answer_tokens")
_DECODED = {"rows": "param[]", "verifier": "param", "checkpoint_dirs": "param[]", "baseline": "output",
            "outs": "output[]"}  # what one benchmark job decodes: each trained row, its checkpoint and its results


@stage("benchmark", (*_BENCHMARK, "benchmark.tie_tolerance", *DECODER_SECTIONS),
       {"suite": "wildcard", **_DECODED, "lookups": "output[]"})
def benchmark(cfg: StageConfig, suite: str, rows: list[str], verifier: str, checkpoint_dirs: list[str],
              baseline: str, outs: list[str], lookups: list[str]) -> None:
    """Greedy: every task of one suite plain, with each trained row's drafter and with the rows that decode
    without training of their own (``domino.decoders``), back to back in this one job."""
    from .decoders import decoder_specs

    bench = {key: cfg.section(f"benchmark.{key}") for key in ("ngram", "suffix", "cost_aware")}
    specs = decoder_specs(bench)
    _decode_all(cfg, suite, rows, verifier, checkpoint_dirs, baseline, outs, temperature=0.0, top_p=1.0,
                tie_tolerance=None if cfg["benchmark.tie_tolerance"] is None else float(cfg["benchmark.tie_tolerance"]),
                lookups=dict(zip(specs, lookups, strict=True)))


def _decode_all(cfg: StageConfig, suite: str, rows: list[str], verifier: str, checkpoint_dirs: list[str],
                baseline: str, outs: list[str], temperature: float, top_p: float, tie_tolerance: float | None,
                lookups: dict | None = None) -> None:
    """The benchmark job of ``benchmark`` and ``sampling``: the lists paired by row, in order;
    ``lookups``: each untrained row's ``domino.decoders.DecoderSpec`` and its results file (greedy only)."""
    from .bench import job as bench_lib

    config = bench_lib.BenchmarkConfig(
        device=cfg["device"], verifier_name=cfg["verifier.name"], verifier_dtype=cfg["verifier.dtype"],
        enable_thinking=cfg["data.enable_thinking"], dataset=cfg[f"benchmark.sources.{suite}"],
        max_prompts=cfg["benchmark.max_prompts"], max_new_tokens=cfg["benchmark.max_new_tokens"],
        chat_template=cfg["benchmark.chat_template"], threads=cfg["benchmark.threads"], seed=cfg["seed"],
        temperature=temperature, top_p=top_p, tie_tolerance=tie_tolerance, suite=suite,
        answer_tokens=cfg["benchmark.answer_tokens"])
    lookups = lookups or {}
    bench_lib.run_benchmark(config, verifier, dict(zip(rows, checkpoint_dirs, strict=True)),
                            {bench_lib.PLAIN: baseline, **dict(zip(rows, outs, strict=True)),
                             **{spec.name: out for spec, out in lookups.items()}}, list(lookups))


@stage("export", ("verifier.dtype",), {"verifier": "param", "checkpoint_dir": "param", "summary": "input",
                                       "out": "output"})
def export(cfg: StageConfig, verifier: str, checkpoint_dir: str, summary: str, out: str) -> None:
    from . import export as export_lib, io as io_lib

    # where the run loads the verifier from goes into the export's config (verifier.name_or_path,
    # what readers load); its dtype is the exported weights' dtype; the training's settings ride along
    training = io_lib.read_json(summary, "training summary").get("config")
    c = export_lib.export_speculators(checkpoint_dir, out, verifier, dtype=cfg["verifier.dtype"],
                                      verifier_architectures=export_lib.verifier_architectures(verifier),
                                      training=training)
    tokens = c["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
    logger.info(f"exported {checkpoint_dir} to {out} (speculators dflash, projector {c['projector_type']}, "
                f"{tokens} speculative tokens, {c['dtype']})")


@stage("sampling", (*_BENCHMARK, "benchmark.top_p"), {"temperature": "wildcard", "suite": "wildcard", **_DECODED})
def sampling(cfg: StageConfig, temperature: str, suite: str, rows: list[str], verifier: str,
             checkpoint_dirs: list[str], baseline: str, outs: list[str]) -> None:
    """The benchmark at temperature T > 0: plain and speculative sampling of every prompt. Their
    tokens differ by design; losslessness is a property of the distribution (tests/test_sampling.py)."""
    _decode_all(cfg, suite, rows, verifier, checkpoint_dirs, baseline, outs, temperature=float(temperature),
                top_p=cfg["benchmark.top_p"], tie_tolerance=0.0)


_VLLM = ("device", "verifier.dtype", "vllm.memory_fraction", "vllm.max_prompts")


@stage("vllm_benchmark_baseline", _VLLM, {"verifier": "param", "ours": "input", "out": "output"})
def vllm_benchmark_baseline(cfg: StageConfig, verifier: str, ours: str, out: str) -> None:
    from .vllm.backend import run_vllm_benchmark  # vLLM lives in its own environment

    run_vllm_benchmark("baseline", verifier, None, None, ours, out, **_served(cfg))


@stage("vllm_benchmark", _VLLM, {"checkpoint": "wildcard", "verifier": "param", "export": "input", "baseline": "input",
                                 "ours": "input", "checkpoint_dir": "param", "out": "output"})
def vllm_benchmark(cfg: StageConfig, checkpoint: str, verifier: str, export: str, baseline: str, ours: str,
                   checkpoint_dir: str, out: str) -> None:
    from .export import check_export

    check_export(export)  # a damaged export is refused before vLLM starts
    from .vllm.backend import run_vllm_benchmark  # vLLM lives in its own environment

    run_vllm_benchmark(checkpoint, verifier, export, baseline, ours, out, checkpoint_dir=checkpoint_dir, **_served(cfg))


@stage("vllm_benchmark_lookup", _VLLM, {"verifier": "param", "baseline": "input", "ours": "input", "out": "output"})
def vllm_benchmark_lookup(cfg: StageConfig, verifier: str, baseline: str, ours: str, out: str) -> None:
    from .decoders import LOOKUP
    from .vllm.backend import run_vllm_benchmark  # vLLM lives in its own environment

    # the lookup's settings are those its benchmark row recorded (ours), as are the prompts
    run_vllm_benchmark(LOOKUP, verifier, None, baseline, ours, out, **_served(cfg))


def _served(cfg: StageConfig) -> dict:
    """What a vLLM benchmark job gives the engine and the loop beside it: the weights' dtype, the
    seed, vLLM's memory share, the device of the project's loop, how many prompts it serves."""
    return {"dtype": cfg["verifier.dtype"], "seed": cfg["seed"], "memory_fraction": cfg["vllm.memory_fraction"],
            "device": cfg["device"], "max_prompts": cfg["vllm.max_prompts"]}


# The card prints the run's whole configuration and its hash: the report reads every top-level
# key but the sections that say where jobs run (domino.host.PLACEMENT_SECTIONS), and the
# replicate count by name (the card's replicates section).
_WHOLE_CONFIG = ("device", "verifier", "data", "drafter", "checkpoints", "features", "train", "benchmark", "vllm",
                 "report")


@stage("report", (*_WHOLE_CONFIG, "train.replicates"), {"results": "param", "stage_benchmarks": "param",
                                                        "card": "output", "reproduction": "output"})
def report_(cfg: StageConfig, results: str, stage_benchmarks: str, card: str, reproduction: str) -> None:
    from .card import report as report_lib
    from .card.paths import CardPaths

    config = {key: cfg.section(key) for key in (*_RUN, *_WHOLE_CONFIG)}
    report_lib.build_report(config, results, CardPaths(card, reproduction), stage_benchmarks)


# -----------------------------------------------------------------------------
# what several stages share


def _template_kwargs(cfg: StageConfig) -> dict:
    """The chat template's ``enable_thinking`` switch, when the config sets it."""
    thinking = cfg["data.enable_thinking"]
    return {} if thinking is None else {"enable_thinking": thinking}


def checkpoint_entry(cfg: StageConfig, name: str) -> dict:
    """The ``checkpoints:`` entry of ``name``: a checkpoint's own, or its seed replicate's checkpoint's."""
    return cfg.section(f"checkpoints.{split_replicate(name)[0]}")


def answers_override(cfg: StageConfig, name: str) -> dict | None:
    """``{"responses": ...}`` where ``name``'s ``checkpoints:`` entry overrides ``data.responses``
    (its features were made from those answers), else None: the run's own answers."""
    data = checkpoint_entry(cfg, name).get("data") or {}
    return {"responses": data["responses"]} if "responses" in data else None


def overridden(cfg: StageConfig, name: str, section: str) -> dict:
    """``drafter`` or ``train`` with the overrides of ``name``'s ``checkpoints:`` entry."""
    return {**cfg.section(section), **checkpoint_entry(cfg, name).get(section, {})}


def train_config(cfg: StageConfig, name: str) -> tuple[TrainConfig, torch.dtype | None]:
    """The ``TrainConfig`` of ``name`` (a checkpoint or its seed replicate) and its autocast dtype
    (None: no autocast). Seed replicate r trains with seed + r: its own initialisation, data order,
    anchors and noise."""
    from . import common
    from .train import loop as train_lib

    t = overridden(cfg, name, "train")
    autocast = common.DTYPES[t["autocast"]] if t["autocast"] else None
    seed = cfg["seed"] + split_replicate(name)[1]
    weighting = checkpoint_entry(cfg, name)["weighting"]
    return train_lib.TrainConfig.from_section(t, seed=seed, weighting=weighting), autocast


# the drafter section's keys that pass to DrafterConfig as they are (the schema lists them); the mask
# token is resolved against the verifier's tokenizer first
DRAFTER_KEYS = tuple(k for k in section_keys("drafter") if k != "mask_token_id")


def drafter_fields(cfg: StageConfig, name: str, tokenizer, model_config) -> dict:
    """The DrafterConfig fields of ``name`` (``from_verifier`` adds the verifier's shapes)."""
    from .verifier import load as verifier_lib

    d = overridden(cfg, name, "drafter")
    kind = checkpoint_entry(cfg, name)
    stop = verifier_lib.eos_ids(tokenizer, model_config)
    return dict({k: d[k] for k in DRAFTER_KEYS}, projector=kind["projector"], shift_label=kind["shift_label"],
                mask_token_id=verifier_lib.mask_token_id(tokenizer, d["mask_token_id"], stop, model_config.vocab_size))


# -----------------------------------------------------------------------------
# a stage's --config argument (python -m domino)


class ConfigArgumentError(ValueError):
    """A ``--config`` argument that cannot be read."""


YAML_SUFFIXES = (".yaml", ".yml")


def read_config(raws: str | list[str], stage: str | None = None, wildcards: dict | None = None) -> dict:
    """The ``--config`` of a stage: ``{"declared": [...], "values": {...}}``, given as JSON (inline
    or ``@file.json``), or built from config files (``@config.yaml``, more than one merged in
    order) as the workflow builds it, for ``stage`` and its ``wildcards``."""
    from .config import load_config
    from .schema import ConfigError

    raws = [raws] if isinstance(raws, str) else list(raws)
    files = [r[1:] for r in raws if r.startswith("@") and r.lower().endswith(YAML_SUFFIXES)]
    if files:
        if len(files) != len(raws) or stage is None:
            raise ConfigArgumentError("--config: give either config files (@config.yaml, repeated for overlays) "
                                      "or one JSON object, not both")
        try:
            return json.loads(stage_config(stage, load_config(files), wildcards or {}))
        except ConfigError as err:
            hint = (f" ({files[0]} may be an overlay: give the base first, --config @config.yaml --config {raws[0]})"
                    if len(files) == 1 and "required key is missing" in str(err) else "")
            raise ConfigArgumentError(f"--config {' '.join(raws)}: {err}{hint}") from None
        except KeyError as err:  # a wildcard naming no entry: --checkpoint no-such-checkpoint
            raise ConfigArgumentError(f"--config {' '.join(raws)}: no {err.args[0]!r} where the stage reads "
                                      f"{sorted((wildcards or {}).items())} (allowed: what the config names)") from None
    if len(raws) != 1:
        raise ConfigArgumentError("--config: one JSON object, or config files (@config.yaml, repeated for overlays)")
    raw = raws[0]
    try:
        text = Path(raw[1:]).read_text() if raw.startswith("@") else raw
    except OSError as err:
        raise ConfigArgumentError(f"--config {raw}: cannot be read ({err.strerror})") from None
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigArgumentError(f"--config {raw if raw.startswith('@') else '...'}: not JSON ({err}); it takes "
                                  '{"declared": [...], "values": {...}} as JSON, or config files as @config.yaml'
                                  ) from None
    if not isinstance(cfg, dict) or set(cfg) != {"declared", "values"}:
        raise ConfigArgumentError('--config must be {"declared": [...], "values": {...}} (see domino/stages.py), '
                                  "or config files as @config.yaml")
    return cfg
