"""Kept shards of the regenerate stage: each carries the sha256 written when it was complete, and
a rerun answers again, in one line naming it, a kept shard that was damaged since."""

import json
import logging

import pytest
import torch

from conftest import interrupt_at_call, tiny_verifier
from domino.data import regenerate as rg

ROWS = [{"id": f"c{i}"} for i in range(10)]


def _prompts(n=10, seed=1, vocab=96):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab - 1, (int(k),), generator=g).tolist() for k in torch.randint(2, 30, (n,), generator=g)]


def _config():
    return rg.RegenerateConfig(max_new_tokens=12, batch_size=3, shard_samples=4, temperature=0.0, top_p=1.0,
                               seq_len=64, seed=0)


@pytest.fixture(scope="module")
def model():
    return tiny_verifier(dtype=torch.float32)


@pytest.fixture(scope="module")
def whole(model, tmp_path_factory):
    out = tmp_path_factory.mktemp("whole") / "whole.jsonl"
    rg.regenerate(model, "v", ROWS, _prompts(), [5], 0, _config(), out)
    return out.read_bytes()


def _interrupted(model, out, monkeypatch):
    """A run killed in its third batch: shard 0 (two batches) is kept in <out>.parts/."""
    calls = interrupt_at_call(monkeypatch, rg, "generate_batch", 3)
    with pytest.raises(KeyboardInterrupt):
        rg.regenerate(model, "v", ROWS, _prompts(), [5], 0, _config(), out)
    calls["n"] = -100  # no further interruption
    return calls


def _remove_a_line(text):
    lines = text.splitlines(keepends=True)
    return "".join(lines[:1] + lines[2:])


def _change_a_token(text):
    lines = text.splitlines(keepends=True)
    row = json.loads(lines[0])
    row["input_ids"][-1] = (row["input_ids"][-1] + 1) % 96  # still valid JSON, same length
    return json.dumps(row, separators=(",", ":")) + "\n" + "".join(lines[1:])


def _cut_mid_line(text):
    return text[: len(text) // 2 + 3]


def test_a_complete_shard_records_its_sha256(model, tmp_path, monkeypatch):
    out = tmp_path / "out.jsonl"
    _interrupted(model, out, monkeypatch)
    shard, record = out.with_name("out.jsonl.parts") / "shard-00000.jsonl", out.with_name("out.jsonl.parts") / "shard-00000.key"
    from domino.io import sha256_file

    assert record.read_text().splitlines()[1] == f"sha256 {sha256_file(shard)}"


@pytest.mark.parametrize("damage", [_remove_a_line, _change_a_token, _cut_mid_line])
def test_a_damaged_kept_shard_is_answered_again_in_one_line(model, whole, damage, tmp_path, monkeypatch, caplog):
    out = tmp_path / "out.jsonl"
    calls = _interrupted(model, out, monkeypatch)
    shard = out.with_name("out.jsonl.parts") / "shard-00000.jsonl"
    shard.write_text(damage(shard.read_text()))
    with caplog.at_level(logging.WARNING, logger="domino.data.regenerate"):
        s = rg.regenerate(model, "v", ROWS, _prompts(), [5], 0, _config(), out)
    assert out.read_bytes() == whole  # every row, each the verifier's own answer
    assert s["conversations"] == 10
    assert calls["n"] == -100 + 5  # shard 0 answered again (two batches), shards 1 and 2 (two and one)
    lines = [r.getMessage() for r in caplog.records if r.name == "domino.data.regenerate"]
    assert lines == [f"regenerate shard {shard} differs from what was written (its sha256 is not the one recorded "
                     "when it was complete: a line removed, a token id changed or the file cut); answered again"]


def test_an_intact_kept_shard_is_kept_silently(model, whole, tmp_path, monkeypatch, caplog):
    out = tmp_path / "out.jsonl"
    calls = _interrupted(model, out, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="domino.data.regenerate"):
        rg.regenerate(model, "v", ROWS, _prompts(), [5], 0, _config(), out)
    assert out.read_bytes() == whole and calls["n"] == -100 + 3
    assert not [r for r in caplog.records if r.name == "domino.data.regenerate"]


def test_a_shard_without_its_record_of_completion_is_answered_again(model, whole, tmp_path, monkeypatch, caplog):
    """A kept shard whose record holds only a key (written before shards carried their sha256)."""
    out = tmp_path / "out.jsonl"
    calls = _interrupted(model, out, monkeypatch)
    parts = out.with_name("out.jsonl.parts")
    record = parts / "shard-00000.key"
    record.write_text(record.read_text().splitlines()[0])
    with caplog.at_level(logging.WARNING, logger="domino.data.regenerate"):
        rg.regenerate(model, "v", ROWS, _prompts(), [5], 0, _config(), out)
    assert out.read_bytes() == whole and calls["n"] == -100 + 5
    assert [r.getMessage() for r in caplog.records if r.name == "domino.data.regenerate"] == [
        f"regenerate shard {parts / 'shard-00000.jsonl'} has no record of being complete (its .key with the "
        "shard's sha256); answered again"]
