"""Data-parallel training on 2 CPU processes (gloo) follows the single-process loss curve."""

import json
from dataclasses import replace

import pytest
import torch
import torch.multiprocessing as mp

from conftest import RELIABILITY_CFG as CFG, synthetic_features
from domino.model import Drafter
from domino.train.loop import train

DDP_CFG = replace(CFG, rows_per_step=2, epochs=2)


def _worker(rank, world, init_file, init_dir, feats_path, out_dir):
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        d = Drafter.load(init_dir)
        train(d, torch.load(feats_path, weights_only=False), DDP_CFG, out_dir)
    finally:
        dist.destroy_process_group()


def test_two_process_gloo_matches_one_process(tmp_path):
    from conftest import tiny_drafter, tiny_verifier

    torch.set_num_threads(1)
    init = tmp_path / "init"
    tiny_drafter(tiny_verifier(), projector="domino", attn="eager").float().save(init)
    feats = synthetic_features(n_docs=16)
    torch.save(feats, tmp_path / "feats.pt")

    single = tmp_path / "single"
    train(Drafter.load(init), feats, DDP_CFG, single)

    ddp = tmp_path / "ddp"
    mp.spawn(_worker, args=(2, str(tmp_path / "rendezvous"), str(init), str(tmp_path / "feats.pt"), str(ddp)),
             nprocs=2, join=True)

    a = [json.loads(line) for line in (single / "metrics.jsonl").read_text().splitlines()]
    b = [json.loads(line) for line in (ddp / "metrics.jsonl").read_text().splitlines()]
    assert len(a) == len(b) >= 8
    for x, y in zip(a, b):
        for key in ("loss", "base_loss", "final_loss"):
            assert x[key] == pytest.approx(y[key], rel=1e-4, abs=1e-5), (x["step"], key)
        assert x["lambda"] == y["lambda"] and x["lr"] == y["lr"]
    wa = Drafter.load(single / "checkpoint").state_dict()
    wb = Drafter.load(ddp / "checkpoint").state_dict()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-3, atol=1e-4)


def test_rows_per_step_must_split_over_ranks(monkeypatch, tmp_path):
    import domino.train.loop as T

    monkeypatch.setattr(T, "_dist", lambda: (0, 2))
    from conftest import tiny_drafter, tiny_verifier

    d = tiny_drafter(tiny_verifier(), projector="dflash", attn="eager").float()
    with pytest.raises(ValueError, match="multiple"):
        train(d, synthetic_features(), replace(CFG, rows_per_step=3), tmp_path)

