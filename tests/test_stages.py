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
from domino.host import PLACEMENT_SECTIONS
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
    assert cfg["data.corpus"] == "python-stdlib"
    with pytest.raises(UndeclaredKey, match=r"config key 'data.samples' is read by this stage but not declared"):
        cfg["data.samples"]
    with pytest.raises(UndeclaredKey, match=r"'threads'"):
        cfg.section("threads")


def test_one_access_style_a_value_by_its_dotted_key_a_section_by_section():
    cfg = StageConfig({"seed": 0, "train": {"lr": 1.0}}, ["seed", "train"])
    with pytest.raises(TypeError, match=r"cfg.section\('train'\)"):
        cfg["train"]
    section = cfg.section("train")
    section["lr"] = 2.0  # a copy: the job's values stay as sent
    assert cfg["train.lr"] == 1.0


def test_what_was_read_is_recorded_and_unread_keys_are_found():
    cfg = StageConfig({"seed": 0, "train": {"lr": 1.0, "epochs": 2}, "device": "cpu"}, ["seed", "train", "device"])
    cfg["train.lr"]
    assert cfg.reads == {"train.lr"}
    assert unread(["seed", "train", "device"], cfg.reads) == ["seed", "device"]
    assert cfg.section("train") == {"lr": 1.0, "epochs": 2}
    assert "train" in cfg.reads


def test_the_report_declares_every_top_level_key_and_gets_the_whole_config():
    """The card prints the run's whole configuration and its hash: the report declares each
    top-level key of the schema (a new section must be added there) but the sections that say
    where jobs run, and the replicate count by name, the one stage given it."""
    schema = yaml.safe_load((ROOT / "domino" / "config.schema.yaml").read_text())
    top = [k for k in STAGES["report"].reads if "." not in k]
    assert sorted(top) == sorted(set(schema["properties"]) - set(PLACEMENT_SECTIONS))
    assert PLACEMENT_SECTIONS and set(PLACEMENT_SECTIONS) <= set(schema["properties"])
    assert "train.replicates" in STAGES["report"].reads
    results_config = {k: v for k, v in CONFIG.items() if k not in PLACEMENT_SECTIONS}
    sent = json.loads(stage_config("report", CONFIG))
    assert sent["values"] == results_config
    cfg = StageConfig(sent["values"], sent["declared"])
    assert {k: cfg.section(k) for k in top} == results_config
    assert unread(sent["declared"], cfg.reads) == []
    for name in STAGES:  # no other stage is given the replicate count, even with its section
        if name not in ("report", "convert_verifier"):  # convert_verifier runs with verifier.source gguf only
            sent = json.loads(stage_config(name, CONFIG, {"checkpoint": "domino", "temperature": "1.0",
                                                          "suite": "humaneval"}))
            assert "replicates" not in sent["values"].get("train", {}), name


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
    def run(*config):
        args = [a for c in config for a in ("--config", c)]
        return subprocess.run([sys.executable, "-m", "domino", "export", *args, "--verifier", "v", "--checkpoint-dir",
                               str(tmp_path), "--summary", str(tmp_path / "s.json"), "--out", str(tmp_path / "x"),
                               "--log", str(tmp_path / "log")],
                              capture_output=True, text=True, cwd=ROOT)

    out = run('{"seed": 0}')
    assert out.returncode != 0 and out.stderr.strip().startswith("--config must be"), out.stderr
    (tmp_path / "config.txt").write_text("seed: 0\n")  # YAML, not JSON, under another suffix
    for config, line in ((f"@{tmp_path / 'config.txt'}", "not JSON (Expecting value: line 1 column 1 (char 0))"),
                         (f"@{tmp_path / 'none.json'}", "cannot be read (No such file or directory)"),
                         ("@tests/micro.yaml", "seed: required key is missing")):
        out = run(config)
        assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert out.stderr.startswith(f"--config {config}: ") and line in out.stderr, out.stderr
    assert "give the base first, --config @config.yaml --config @tests/micro.yaml" in out.stderr


def test_config_files_give_a_stage_its_declared_keys():
    """``--config @config.yaml`` (with overlays after it) gives a stage what the workflow gives it."""
    from domino.stages import read_config

    assert read_config(["@config.yaml"], "train", {"checkpoint": "domino"}) == json.loads(
        stage_config("train", CONFIG, {"checkpoint": "domino"}))
    from domino.config import load_config

    micro = load_config([ROOT / "config.yaml", ROOT / "tests" / "micro.yaml"])
    got = read_config([f"@{ROOT / 'config.yaml'}", f"@{ROOT / 'tests' / 'micro.yaml'}"], "draft_vocab", {})
    assert got == json.loads(stage_config("draft_vocab", micro)) and got["values"]["drafter"]["draft_vocab_size"] == 128


def test_what_snakemake_records_names_each_key():
    """One recorded param per key ("train.lr=0.003"): a one-key edit changes one entry, so a rerun's
    reason names that key; the names are the same for every job of a stage."""
    from domino.stages import RECORDED_CHARS, recorded_keys, recorded_values

    keys = recorded_keys("train", CONFIG)
    assert "train.lr" in keys and "drafter.block_size" in keys and "checkpoints.{checkpoint}" in keys
    assert "train" not in keys and "train.replicates" not in keys  # leaves; the replicate count reaches no job
    before = recorded_values("train", CONFIG, {"checkpoint": "domino"})
    assert list(before) == keys and before["train.lr"] == f"train.lr={CONFIG['train']['lr']}"
    assert before["checkpoints.{checkpoint}"].startswith('checkpoints.domino={"projector":"domino"')
    edited = json.loads(json.dumps(CONFIG))
    edited["train"]["lr"] = 0.002
    after = recorded_values("train", edited, {"checkpoint": "domino"})
    assert {k for k in keys if before[k] != after[k]} == {"train.lr"} and after["train.lr"] == "train.lr=0.002"
    assert recorded_values("train", CONFIG, {"checkpoint": "domino-seed1"}) == before  # a replicate trains as it
    # every value is short, a long one by its hash; together they hold what the job's --config holds
    report = recorded_values("report", CONFIG)
    assert all(len(v) <= len(k) + 1 + RECORDED_CHARS for k, v in report.items())
    assert len(report) > 50 and "train.replicates" in report and "benchmark.max_new_tokens" in report


def test_a_stopped_jobs_own_line_is_found_in_its_log(tmp_path):
    """What the workflow prints last when a run stops: each job log's closing error line, written
    since the run started, without its time stamp; a finished job's last line is not one."""
    import os
    import time

    from domino.logs import TRACEBACK_HEADER, interrupted_line, job_error_lines
    from domino.stages import STAGES

    logs = tmp_path / "logs"
    (logs / "train").mkdir(parents=True)
    (logs / "train" / "domino.log").write_text(f"2026-01-01 00:00:00 53 steps\n2026-01-01 00:00:09 "
                                               f"{interrupted_line('train')}\n")
    (logs / "benchmark.log").write_text("2026-01-01 00:00:00 domino benchmark: ValueError: bad prompt\n")
    (logs / "validate").mkdir()
    (logs / "validate" / "domino.log").write_text("2026-01-01 00:00:00 domino: final accuracy per slot [...]\n")
    (logs / "old.log").write_text("2026-01-01 00:00:00 domino report: ValueError: from an earlier run\n")
    os.utime(logs / "old.log", (1, 1))
    assert job_error_lines(logs, time.time() - 60, STAGES) == ["domino benchmark: ValueError: bad prompt",
                                                               interrupted_line("train")]
    (logs / "benchmark.log").write_text(f"2026-01-01 00:00:00 {TRACEBACK_HEADER}\nTraceback (most recent call last):\n"
                                        "ValueError: bad prompt\n2026-01-01 00:00:00 domino benchmark: ValueError: bad prompt\n")
    assert job_error_lines(logs, time.time() - 60, STAGES)[0] == \
        f"domino benchmark: ValueError: bad prompt (traceback: {logs / 'benchmark.log'})"


def test_a_target_no_rule_makes_is_one_line_naming_the_targets():
    from domino.logs import missing_target_line

    message = ("MissingRuleException:\nNo rule to produce reports/model_crad.md (if you use input functions make "
               "sure that they don't raise unexpected exceptions).")
    assert missing_target_line(message, ["reports/model_card.md", "all"]) == \
        "error: no rule makes reports/model_crad.md (targets: reports/model_card.md, all)"
    assert missing_target_line("Nothing to be done.", ["all"]) is None


def test_an_error_snakemake_prints_with_a_traceback_is_one_line():
    """What the logger plugin (snakemake_logger_plugin_domino) rewrites: Snakemake's message for a
    missing --configfile file names the file; another traceback keeps its last line; a message
    without a traceback is left alone."""
    from snakemake_logger_plugin_domino import traceback_line

    missing = ("Traceback (most recent call last):\n\n  File \".../configfile.py\", line 38, in load_configfile\n"
               "    config = _load_configfile(configpath)\n\nFileNotFoundError: [Errno 2] No such file or "
               "directory: 'config/smolm2.yaml'\n")
    assert traceback_line(missing) == ("config error: --configfile config/smolm2.yaml: no such file (a "
                                             "relative path is read from the directory snakemake starts in)")
    other = "Traceback (most recent call last):\n  File \"x.py\", line 1, in f\nValueError: bad value\n"
    assert traceback_line(other) == "error: ValueError: bad value (snakemake --verbose prints the traceback)"
    assert traceback_line("MissingRuleException:\nNo rule to produce x") is None


def test_the_logger_plugin_imports_without_the_package():
    """Snakemake imports every logger plugin on its path when it starts; one that imported domino
    would stop Snakemake whenever another checkout's older package comes first on the path."""
    code = ("import sys; sys.modules['domino'] = None; import snakemake_logger_plugin_domino as p; "
            "from snakemake_interface_logger_plugins.registry import LoggerPluginRegistry; "
            "print('domino' in LoggerPluginRegistry().plugins)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stdout + out.stderr


def test_every_entry_function_takes_the_config_and_the_declared_paths_by_name():
    import inspect

    for name, stage in STAGES.items():
        params = list(inspect.signature(stage.run).parameters)
        assert params == ["cfg", *stage.paths], (name, params)


def test_reading_the_declarations_imports_no_heavy_library():
    """The Snakefile imports domino.stages to build every rule, and ``python -m domino`` parses
    its arguments from the same declarations: torch, transformers and matplotlib load only when a
    job runs its stage (each entry function imports what it calls)."""
    code = ("import sys, domino.stages, domino.__main__; domino.__main__.parser(); "
            "print(sorted(m for m in ('torch', 'transformers', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


RUN_ONLY = json.dumps({"declared": ["seed", "threads"], "values": {"seed": 0, "threads": 1}})  # a stage's own keys


def _talking_stage(cfg, out):
    """A stage that reports in every way a stage does: module loggers, a warning and a progress bar."""
    import logging
    import warnings

    from tqdm import tqdm

    logging.getLogger("domino.talking").info("a module logger's line")
    logging.getLogger("domino.talking").debug("a debug line")
    logging.getLogger("domino.card.talking").info("a line of a subpackage's logger")
    logging.getLogger("some_library").info("another library's info line")
    warnings.warn("a warning", UserWarning)
    for _ in tqdm(range(3), desc="a progress bar"):
        pass
    with open(out, "w") as fh:
        fh.write("done")


@pytest.fixture
def in_process():
    """``main()`` switches torch's deterministic kernels on for the whole process: back as found."""
    import torch

    det = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    yield
    torch.use_deterministic_algorithms(det[0], warn_only=det[1])


@pytest.mark.parametrize("rank", ["0", "1"])
def test_a_stage_logs_to_the_terminal_and_its_log_file(tmp_path, monkeypatch, capsys, in_process, rank):
    """The messages go to stderr and the --log file (rank 0 alone writes it under torchrun); the
    progress bar to the terminal only; the handlers are gone after the run."""
    import logging

    from domino.__main__ import main
    from domino.stages import Stage

    monkeypatch.setitem(STAGES, "talking", Stage("talking", _talking_stage, ("seed", "threads"), {"out": "output"}))
    monkeypatch.setenv("RANK", rank)
    handlers = list(logging.getLogger().handlers)
    log = tmp_path / "logs" / "talking.log"
    main(["talking", "--config", RUN_ONLY, "--out", str(tmp_path / "out"), "--log", str(log)])
    err = capsys.readouterr().err
    lines = ("a module logger's line", "a line of a subpackage's logger", "a warning")
    assert all(line in err for line in lines) and "a progress bar" in err, err
    assert "a debug line" not in err and "another library's info line" not in err
    assert logging.getLogger().handlers == handlers
    if rank != "0":
        assert not log.exists()
        return
    text = log.read_text()
    assert all(line in text for line in lines) and "a progress bar" not in text, text
    assert "a debug line" not in text and "another library's info line" not in text


def test_an_error_is_one_line_on_the_terminal_and_in_the_log(tmp_path, monkeypatch, capsys, in_process):
    from domino.__main__ import main
    from domino.stages import Stage

    def failing(cfg, out):
        raise ValueError("no such thing")

    monkeypatch.setitem(STAGES, "failing", Stage("failing", failing, ("seed", "threads"), {"out": "output"}))
    monkeypatch.delenv("DOMINO_TRACEBACK", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(SystemExit, match="^1$"):
        main(["failing", "--config", RUN_ONLY, "--out", str(tmp_path / "out"), "--log", str(tmp_path / "failing.log")])
    line = "domino failing: ValueError: no such thing"
    assert capsys.readouterr().err.strip().splitlines()[-1] == line
    assert (tmp_path / "failing.log").read_text().strip().endswith(line)
