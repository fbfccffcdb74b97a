"""The n-gram lookup rows (``benchmark.ngram``): their config, their place in the card."""

import copy
from pathlib import Path

import pytest

from conftest import load_config_files as load
from domino.card import report
from domino.config import ConfigError, validate_config
from domino.runs import lookup_runs

FIXTURE = Path(__file__).parent / "fixtures" / "results"


def _with(cfg: dict, **ngram) -> dict:
    out = copy.deepcopy(cfg)
    out["benchmark"]["ngram"].update(ngram)
    return validate_config(out)


def test_lookup_runs_follow_the_config():
    cfg = load("config.yaml")
    assert lookup_runs(cfg) == ["ngram", "ngram-domino"]
    assert lookup_runs(_with(cfg, then=None)) == ["ngram"]
    assert lookup_runs(_with(cfg, enabled=False)) == []
    assert lookup_runs(_with(cfg, then="dflash-noshift")) == ["ngram", "ngram-dflash-noshift"]


@pytest.mark.parametrize("change, message", [
    ({"then": "nope"}, "benchmark.ngram.then: 'nope' is no checkpoint"),
    ({"min_n": 3, "max_n": 2}, "benchmark.ngram.min_n: 3 exceeds max_n 2"),
])
def test_a_lookup_that_cannot_run_is_refused(change, message):
    with pytest.raises(ConfigError, match=message):
        _with(load("config.yaml"), **change)


@pytest.mark.parametrize("name", ["ngram", "ngram-domino"])
def test_a_checkpoint_named_like_a_lookup_row_is_refused(name):
    cfg = copy.deepcopy(load("config.yaml"))
    cfg["checkpoints"][name] = dict(cfg["checkpoints"]["domino"])
    with pytest.raises(ConfigError, match=f"checkpoints.{name}: .*'ngram' and 'ngram-\\*' the n-gram lookup rows"):
        validate_config(cfg)


def test_the_card_sets_the_lookup_rows_beside_the_drafters(tmp_path):
    """With the lookup rows, the Aggregate, Per-position and Speedup tables hold them after the
    card's three rows, and the card says plainly whether the lookup decodes faster than every
    trained drafter (the fixtures' lookup does), with Domino against it; without, none of it."""
    cfg = load("config.yaml")
    report.build_report(cfg, FIXTURE, tmp_path / "with", repo=tmp_path)
    card = (tmp_path / "with" / "model_card.md").read_text()
    for label in ("n-gram lookup, no training", "n-gram lookup, then Domino"):
        assert card.count(f"| {label} |") == 3, label  # Aggregate, Per-position, Speedup
    assert "**The n-gram lookup, which needs no training, decodes faster than every trained drafter here:**" in card
    assert "Domino against the lookup, paired over the same prompts:" in card
    report.build_report(_with(cfg, enabled=False), FIXTURE, tmp_path / "without", repo=tmp_path)
    card = (tmp_path / "without" / "model_card.md").read_text()
    assert "n-gram lookup" not in card


def test_a_lookup_that_never_drafted_is_said_not_tabled(tmp_path):
    """A lookup row with no step on any prompt (a verifier whose outputs never repeat, a tiny
    budget) writes acceptance 1 over zero steps, and the card says it drafted nothing instead of
    setting a row of undefined rates beside the drafters."""
    import json
    import shutil

    from domino.bench.run import acceptance_fields
    from domino.bench.timing import PromptTiming
    from domino.decode import DecodeResult

    timings = [PromptTiming(DecodeResult([5, 6]), DecodeResult([5, 6], []), True) for _ in range(3)]
    fields = acceptance_fields(timings, 10, seed=0)
    assert fields["steps"] == 0 and fields["acceptance_length"] == 1.0 and fields["per_position_acceptance"] == [0.0] * 10
    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)
    path = root / "benchmark" / "humaneval" / "ngram.json"
    bench = json.loads(path.read_text())
    for record in bench["prompts"]:
        record["accepted_per_step"] = []
    bench["summary"].update(fields)
    path.write_text(json.dumps(bench))
    report.build_report(load("config.yaml"), root, tmp_path / "card", repo=tmp_path)
    card = (tmp_path / "card" / "model_card.md").read_text()
    assert "| n-gram lookup, no training |" not in card and card.count("| n-gram lookup, then Domino |") == 3
    assert 'The lookup row "n-gram lookup, no training" found no match on any prompt, so it drafted nothing' in card
