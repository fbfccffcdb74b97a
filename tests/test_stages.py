"""The stage layer (domino/stages.py, domino/__main__.py): declarations, the config a job gets,
and what a stage may read of it."""

import dataclasses
import json
import subprocess
import sys

import pytest
import yaml

from conftest import ROOT
from domino.config import validate_config
from domino.stages import STAGES, StageConfig, UndeclaredKey, stage_config, train_config, unread

CONFIG = validate_config(yaml.safe_load((ROOT / "config.yaml").read_text()))


def test_a_job_gets_exactly_its_declared_keys():
    sent = json.loads(stage_config("train", CONFIG, {"checkpoint": "domino"}))
    assert "checkpoints.domino" in sent["declared"] and "checkpoints.{checkpoint}" not in sent["declared"]
    assert sent["values"]["checkpoints"] == {"domino": CONFIG["checkpoints"]["domino"]}  # not the others
    assert set(sent["values"]) == {"seed", "threads", "device", "verifier", "drafter", "train", "checkpoints"}
    assert sent["values"]["verifier"] == {"name": CONFIG["verifier"]["name"]}  # one key of the section


def test_editing_one_variant_changes_only_its_own_jobs_params():
    edited = json.loads(json.dumps(CONFIG))
    edited["checkpoints"]["dflash-shift"]["train"] = {"lr": 1.0e-3}
    for ck, changed in (("domino", False), ("dflash-shift", True)):
        before, after = (stage_config("train", c, {"checkpoint": ck}) for c in (CONFIG, edited))
        assert (before != after) is changed, ck


def test_a_seed_replicate_trains_as_its_checkpoint_with_its_own_seed():
    """domino-seed2 gets domino's entry and values; only its seed differs (seed + 2). The replicate
    count reaches no job, so raising it reruns no training that exists."""
    three = json.loads(json.dumps(CONFIG))
    three["train"]["replicates"] = 3
    sent = json.loads(stage_config("train", three, {"checkpoint": "domino-seed2"}))
    assert sent == json.loads(stage_config("train", CONFIG, {"checkpoint": "domino"}))
    assert "replicates" not in sent["values"]["train"]
    cfg = StageConfig(sent["values"], sent["declared"])
    replicate, card_row = train_config(cfg, "domino-seed2")[0], train_config(cfg, "domino")[0]
    assert replicate.seed == CONFIG["seed"] + 2 and dataclasses.replace(replicate, seed=CONFIG["seed"]) == card_row
    with pytest.raises(UndeclaredKey, match="'train.replicates' says which jobs run"):
        StageConfig(three, ["train"])["train.replicates"]


def test_keys_read_only_in_some_configs_are_declared_there_only():
    vllm = json.loads(json.dumps(CONFIG))
    vllm["features"]["backend"] = "vllm"
    assert "vllm.memory_fraction" not in json.loads(stage_config("extract_hidden_states", CONFIG))["declared"]
    assert "vllm.memory_fraction" in json.loads(stage_config("extract_hidden_states", vllm))["declared"]


def test_reading_an_undeclared_key_raises_naming_it():
    cfg = StageConfig({"seed": 0, "data": {"corpus": "python-stdlib"}}, ["seed", "data.corpus"])
    assert cfg["data.corpus"] == "python-stdlib" and cfg["data"]["corpus"] == "python-stdlib"
    with pytest.raises(UndeclaredKey, match=r"config key 'data.samples' is read by this stage but not declared"):
        cfg["data"]["samples"]
    with pytest.raises(UndeclaredKey, match=r"'threads'"):
        cfg.get("threads", 2)  # a default does not hide an undeclared key


def test_what_was_read_is_recorded_and_unread_keys_are_found():
    cfg = StageConfig({"seed": 0, "train": {"lr": 1.0, "epochs": 2}, "device": "cpu"}, ["seed", "train", "device"])
    cfg["train.lr"]
    assert cfg.reads == {"train.lr"}
    assert unread(["seed", "train", "device"], cfg.reads) == ["seed", "device"]
    assert cfg.section("train") == {"lr": 1.0, "epochs": 2}
    assert "train" in cfg.reads


def test_the_report_reads_the_whole_config():
    sent = json.loads(stage_config("report", CONFIG))
    assert sent == {"declared": ["*"], "values": CONFIG}
    assert StageConfig(sent["values"], sent["declared"]).section("*") == CONFIG


def test_every_stage_has_a_rule_of_the_same_name():
    rules = "\n".join(p.read_text() for p in (ROOT / "workflow" / "rules").glob("*.smk"))
    for name in STAGES:
        assert f"rule {name}:" in rules and f'domino("{name}"' in rules, name


def test_cli_help_lists_every_stage_and_a_stage_its_paths():
    out = subprocess.run([sys.executable, "-m", "domino", "--help"], capture_output=True, text=True, check=True)
    assert all(name in out.stdout for name in STAGES)
    out = subprocess.run([sys.executable, "-m", "domino", "train", "--help"], capture_output=True, text=True,
                         check=True)
    for flag in ("--config", "--checkpoint-dir", "--metrics", "--summary", "--state-dir", "--log"):
        assert flag in out.stdout, flag


def test_a_bad_config_argument_is_refused_in_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "domino", "export", "--config", '{"seed": 0}', "--checkpoint-dir",
                          str(tmp_path), "--out", str(tmp_path / "x"), "--log", str(tmp_path / "log")],
                         capture_output=True, text=True)
    assert out.returncode != 0 and out.stderr.strip().startswith("--config must be"), out.stderr


def test_every_entry_function_takes_the_config_and_the_declared_paths_by_name():
    import inspect

    for name, stage in STAGES.items():
        params = list(inspect.signature(stage.run).parameters)
        assert params == ["cfg", *stage.paths], (name, params)


def test_reading_the_declarations_imports_no_heavy_library():
    """The Snakefile imports domino.stages to build every rule: torch, transformers and matplotlib
    load only when a job runs its stage."""
    code = ("import sys, domino.stages; "
            "print(sorted(m for m in ('torch', 'transformers', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
