"""The draft vocabulary (domino/vocab.py): which rows it keeps, and the "seen" size."""

import json

import pytest
import torch

from domino import vocab


def test_the_most_frequent_tokens_by_a_hand_count_ties_to_the_smaller_id():
    counts = torch.tensor([0, 5, 0, 2, 2, 1, 0, 0])
    assert vocab.select_draft_vocab(counts, 3).tolist() == [1, 3, 4]
    assert vocab.select_draft_vocab(counts, 3, always=(7,)).tolist() == [1, 3, 7]  # the stop token first
    # a size above the tokens seen fills its tail with ids never seen, by id
    assert vocab.select_draft_vocab(counts, 6).tolist() == [0, 1, 2, 3, 4, 5]


def test_seen_keeps_every_answer_token_and_the_stop_tokens_and_nothing_else():
    counts = torch.tensor([0, 5, 0, 2, 2, 1, 0, 0])
    assert vocab.seen_size(counts) == 4 and vocab.seen_size(counts, always=(7,)) == 5
    assert vocab.seen_size(counts, always=(1,)) == 4  # a stop token the answers hold counts once
    assert counts.tolist() == [0, 5, 0, 2, 2, 1, 0, 0]  # the counts are left as they were


@pytest.mark.parametrize("size, rows, unseen", [("seen", 4, 0), (6, 6, 2), (3, 3, 0)])
def test_build_writes_the_rows_it_kept_and_how_many_were_never_a_target(tmp_path, size, rows, unseen):
    data = [{"input_ids": [0, 1, 1, 3, 2], "loss_mask": [0, 1, 1, 1, 0]},  # 1, 1, 3 are answers
            {"input_ids": [4, 5, 4, 7], "loss_mask": [1, 0, 0, 1]}]  # 4 and the stop token 7 are
    # answers too; 0, 2, 5 are prompt tokens
    s = vocab.build_draft_vocab(data, 8, size, (7,), tmp_path / "v.safetensors", tmp_path / "v.json")
    d2t, t2d = vocab.load_vocab(tmp_path / "v.safetensors")
    assert s == json.loads((tmp_path / "v.json").read_text())
    assert s["draft_vocab_size"] == rows == len(d2t) == int(t2d.sum()) and s["unseen_rows"] == unseen
    assert s["seen_tokens"] == 4
    if size == "seen":
        assert vocab.target_ids(d2t).tolist() == [1, 3, 4, 7] and s["assistant_token_coverage"] == 1.0
    if size == 3:  # 1 (twice), then the stop token, then 3 (the smaller of the two ids seen once)
        assert vocab.target_ids(d2t).tolist() == [1, 3, 7] and s["assistant_token_coverage"] == pytest.approx(0.8)
