"""A local verifier folder's files are an input of the jobs that read it: replacing its weights
reruns them (a dry run says so), where Snakemake said "Nothing to be done"."""

import json
import os

import torch
from transformers import Qwen3ForCausalLM

from conftest import copy_repo, run_snakemake
from domino.io import folder_digests
from domino.shapes import qwen3_config

TEXTS = ["def add(a, b):\n    return a + b\n", "Hello there, how are you today?", "I am fine, thanks."] * 20
TARGET = "results/draft_vocab/vocab.safetensors"


def _weights(folder, seed):
    torch.manual_seed(seed)
    cfg = qwen3_config(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=1024,
                       tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    Qwen3ForCausalLM(cfg).save_pretrained(folder)


def test_the_digests_are_the_files_and_a_file_is_hashed_again_only_when_it_changed(tmp_path):
    d = tmp_path / "v"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / ".cache").mkdir()
    (d / ".cache" / "x").write_text("hub bookkeeping")
    cache = tmp_path / "cache.json"
    first = folder_digests(d, cache)
    assert list(first) == ["config.json"]
    (d / "sub").mkdir()
    (d / "sub" / "m.py").write_text("x = 1")
    assert list(folder_digests(d, pattern="*.py")) == ["sub/m.py"]  # a pattern keeps its matches, at any depth
    (d / "sub" / "m.py").unlink()
    (d / "sub").rmdir()
    key = str((d / "config.json").resolve())
    stored = json.loads(cache.read_text())
    stored[key][4] = "0" * 64  # a digest taken for the same size and time is reused, not recomputed
    cache.write_text(json.dumps(stored))
    assert folder_digests(d, cache)["config.json"] == "0" * 64
    (d / "config.json").write_text('{"a": 1}')
    assert folder_digests(d, cache)["config.json"] not in ("0" * 64, first["config.json"])


def test_replacing_a_local_verifiers_weights_reruns_what_read_them(tmp_path):
    from domino.verifier.embedded import train_tokenizer

    (tmp_path / "repo").mkdir()
    repo = copy_repo(tmp_path / "repo")
    folder = repo / "byo"
    _weights(folder, 0)
    train_tokenizer(TEXTS, 300, tmp_path / "tok").save_pretrained(folder)
    (repo / "byo.yaml").write_text(json.dumps({"verifier": {"source": "byo", "name": "byo"},
                                               "drafter": {"mask_token_id": None}}))
    args = ("--configfile", "config.yaml", "micro.yaml", "byo.yaml", "--", TARGET)
    run_snakemake(repo, *args)
    assert json.loads((repo / "results" / "verifier" / "source.sha256.json").read_text()) == folder_digests(folder)
    assert "Nothing to be done" in run_snakemake(repo, "-n", *args).stdout

    stat = (folder / "model.safetensors").stat()
    _weights(folder, 1)  # other weights, the file's time put back as it was
    os.utime(folder / "model.safetensors", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    dry = run_snakemake(repo, "-n", *args).stdout
    assert "Nothing to be done" not in dry
    digests = folder_digests(folder)
    assert f"now: 'model.safetensors sha256 {digests['model.safetensors']}'" in dry  # the reason names the file
    for rule in ("verifier_digests", "prepare_data", "draft_vocab"):
        assert f"rule {rule}:" in dry or f"localrule {rule}:" in dry, (rule, dry[-3000:])
    run_snakemake(repo, *args)
    assert "Nothing to be done" in run_snakemake(repo, "-n", *args).stdout
