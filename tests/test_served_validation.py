"""Served validation during training: the held-out prompts, which evaluation a run keeps and when
it stops, and a tiny training that records the curve, writes the kept step's weights and keeps the
same checkpoint when interrupted and resumed (``domino.train.served``, ``domino.train.loop``)."""

import json
from dataclasses import replace

import pytest
import torch

import domino.train.loop as T
from conftest import interrupt_at_call, synthetic_features, tiny_drafter, tiny_verifier
from domino.model import Drafter
from domino.train.loop import TrainConfig, train
from domino.train.served import (
    ServedValidation,
    evaluated_after,
    evaluation_interval,
    held_out_prompts,
    kept_step,
    stops_early,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def _curve(values, first=1, every=2):
    return [{"step": first + every * i, "acceptance_length": v} for i, v in enumerate(values)]


def test_the_step_kept_by_served_acceptance_and_by_last():
    curve = _curve([1.2, 1.5, 1.4, 1.5, 1.3])  # steps 1, 3, 5, 7, 9
    assert kept_step(curve, "best_served") == 3  # the earliest of the two best
    assert kept_step(curve, "last") == 9
    assert kept_step([], "best_served") is None


def test_patience_counts_evaluations_without_a_new_best():
    assert not stops_early(_curve([1.2, 1.5, 1.4]), 2)
    assert stops_early(_curve([1.2, 1.5, 1.4, 1.5]), 2)  # equal is no new best
    assert not stops_early(_curve([1.2, 1.5, 1.4, 1.6]), 2)
    assert not stops_early(_curve([1.5, 1.0, 1.0, 1.0]), 0)  # 0: never
    assert not stops_early(_curve([1.5, 1.0]), 2)  # not enough evaluations yet


def test_evaluation_steps():
    assert evaluation_interval(0.5, 10) == 5 and evaluation_interval(0.01, 10) == 1
    assert [s for s in range(12) if evaluated_after(s, 5, 12)] == [4, 9, 11]  # every 5 updates, and the last


def test_held_out_prompts_are_the_first_answered_conversations_before_their_answer():
    rows = [{"input_ids": [1, 2, 3, 4], "loss_mask": [0, 0, 1, 1]},
            {"input_ids": [5, 6, 7], "loss_mask": [0, 0, 0]},  # no answer
            {"input_ids": [8, 9, 10, 11, 12, 13], "loss_mask": [0, 0, 0, 0, 0, 1]},  # no room in a context of 8
            {"input_ids": [14, 15, 16], "loss_mask": [0, 1, 1]},
            {"input_ids": [17, 18, 19], "loss_mask": [0, 1, 1]}]
    assert held_out_prompts(rows, 2, budget=4, context=8) == [[1, 2], [14]]
    assert held_out_prompts(rows, 5, budget=4, context=8) == [[1, 2], [14], [17]]


# -----------------------------------------------------------------------------
# a tiny training with served validation after every step


# a served acceptance scripted by the step evaluated, over the real count: step 3 is the best
SCRIPT = {0: 1.1, 1: 1.3, 2: 1.2, 3: 1.6, 4: 1.4, 5: 1.5, 6: 1.2, 7: 1.3, 8: 1.0, 9: 1.0, 10: 1.0, 11: 1.0}
CFG = TrainConfig.schema_defaults(epochs=3, lr=3e-3, warmup_steps=1, anchors_per_row=4, pack_len=64,
                                  checkpoint_every=100, served_prompts=2, served_max_new_tokens=6, served_every=0.01,
                                  keep="best_served")


@pytest.fixture
def served(monkeypatch):
    """A ``ServedValidation`` on the tiny verifier whose acceptance length is ``SCRIPT`` at the step
    just taken (the real decode still runs and counts its steps)."""
    verifier = tiny_verifier()
    taken, real_step = {}, T._train_step

    def step(run):
        row = real_step(run)
        taken["step"] = row["step"]
        return row

    monkeypatch.setattr(T, "_train_step", step)

    class Scripted(ServedValidation):
        def acceptance(self, drafter):
            r = super().acceptance(drafter)
            assert r["tokens"] > 0 and r["steps"] > 0
            return {**r, "acceptance_length": SCRIPT[taken["step"]]}

    return Scripted(verifier, [[3, 5, 7, 9], [11, 13, 2]], CFG.served_max_new_tokens)


def _init(tmp_path):
    init = tmp_path / "init"
    if not init.exists():
        tiny_drafter(tiny_verifier(), projector="domino").float().save(init)
    return init


def _weights_after(tmp_path, feats, served, steps):
    """The weights after ``steps`` updates: the state a run stopped there saved."""
    out = tmp_path / f"after{steps}"
    train(Drafter.load(_init(tmp_path)), feats, CFG, out, max_steps=steps, served=served)
    return torch.load(out / "state" / "state.pt", weights_only=True)["model"]


def test_the_best_served_step_is_kept_and_the_curve_recorded(tmp_path, served):
    feats = synthetic_features(n_docs=6)
    s = train(Drafter.load(_init(tmp_path)), feats, CFG, tmp_path / "run", served=served)
    sv = s["served_validation"]
    total = s["steps"]
    assert total >= 9 and not sv["stopped_early"]
    assert [e["step"] for e in sv["curve"]] == list(range(total))  # every step evaluated
    assert [e["acceptance_length"] for e in sv["curve"]] == [SCRIPT[i] for i in range(total)]
    assert sv["kept_step"] == 3 and sv["keep"] == "best_served" and sv["prompts"] == 2
    assert sv["curve"][3]["epochs"] == pytest.approx(4 * CFG.epochs / total)
    assert all(e["mean_loss"] > 0 and e["steps"] > 0 for e in sv["curve"])
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["served_acceptance"] for m in metrics] == [SCRIPT[i] for i in range(total)]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["served_validation"] == sv
    kept = Drafter.load(tmp_path / "run" / "checkpoint").state_dict()
    after = _weights_after(tmp_path, feats, served, 4)
    assert all(torch.equal(kept[k], v) for k, v in after.items())
    train(Drafter.load(_init(tmp_path)), feats, replace(CFG, keep="last"), tmp_path / "last", served=served)
    last = Drafter.load(tmp_path / "last" / "checkpoint").state_dict()
    assert not torch.equal(kept["fc.weight"], last["fc.weight"])  # not the last step's


def test_an_interrupted_run_keeps_the_same_checkpoint(tmp_path, served, monkeypatch):
    feats = synthetic_features(n_docs=6)
    ref = train(Drafter.load(_init(tmp_path)), feats, CFG, tmp_path / "ref", served=served)
    cfg = replace(CFG, checkpoint_every=2)
    calls = interrupt_at_call(monkeypatch, T, "_evaluate", 6)  # killed during the evaluation after step 5
    with pytest.raises(KeyboardInterrupt):
        train(Drafter.load(_init(tmp_path)), feats, cfg, tmp_path / "run", served=served)
    state = torch.load(tmp_path / "run" / "state" / "state.pt", weights_only=True)
    assert state["step"] == 4 and [e["step"] for e in state["served_curve"]] == [0, 1, 2, 3]
    calls["n"] = -1000
    s = train(Drafter.load(_init(tmp_path)), feats, cfg, tmp_path / "run", served=served)
    strip = lambda c: [{k: v for k, v in e.items() if k != "seconds"} for e in c]  # noqa: E731
    assert strip(s["served_validation"]["curve"]) == strip(ref["served_validation"]["curve"])
    assert s["served_validation"]["kept_step"] == ref["served_validation"]["kept_step"] == 3
    a, b = (Drafter.load(tmp_path / d / "checkpoint").state_dict() for d in ("ref", "run"))
    assert all(torch.equal(a[k], v) for k, v in b.items())


def test_patience_ends_training_after_the_best(tmp_path, served):
    cfg = replace(CFG, patience=2)
    s = train(Drafter.load(_init(tmp_path)), synthetic_features(n_docs=6), cfg, tmp_path / "run", served=served)
    sv = s["served_validation"]
    # the best at step 3 (1.6); steps 4 and 5 fall short of it: training ends after step 5
    assert sv["stopped_early"] and s["steps"] == 6 and [e["step"] for e in sv["curve"]][-1] == 5
    assert sv["kept_step"] == 3
    assert not (tmp_path / "run" / "state" / "state.pt").exists()


def test_served_settings_without_served_validation_are_refused(tmp_path):
    feats = synthetic_features(n_docs=6)
    for over in ({"keep": "best_served"}, {"patience": 2}, {"served_prompts": 2}):
        cfg = replace(CFG, **{"served_prompts": 0, "keep": "last", **over})
        with pytest.raises(ValueError, match="served validation"):
            train(Drafter.load(_init(tmp_path)), feats, cfg, tmp_path / "run")
