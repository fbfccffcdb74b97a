"""The n-gram lookup rows (``benchmark.ngram``): their config, their place in the card."""

import copy
from pathlib import Path

import pytest

from conftest import load_config_files as load
from domino.card import report
from domino.config import validate_config
from domino.decoders import untrained_rows
from domino.io import write_json
from domino.schema import ConfigError

FIXTURE = Path(__file__).parent / "fixtures" / "results"


def _with(cfg: dict, **ngram) -> dict:
    out = copy.deepcopy(cfg)
    out["benchmark"]["ngram"].update(ngram)
    return validate_config(out)


def _rows(cfg: dict, section: str, **change) -> dict:
    out = copy.deepcopy(cfg)
    out["benchmark"][section].update(change)
    return validate_config(out)


def test_untrained_rows_follow_the_config():
    cfg = load("config.yaml")
    assert untrained_rows(cfg) == ["ngram", "suffix", "domino-adaptive", "hybrid"]
    assert untrained_rows(_with(cfg, then="domino")) == ["ngram", "suffix", "ngram-domino", "domino-adaptive", "hybrid"]
    assert untrained_rows(_with(cfg, enabled=False)) == ["suffix", "domino-adaptive", "hybrid"]
    assert untrained_rows(_with(cfg, then="dflash-noshift"))[2] == "ngram-dflash-noshift"
    assert untrained_rows(_rows(cfg, "suffix", enabled=False)) == ["ngram", "domino-adaptive", "hybrid"]
    assert untrained_rows(_rows(cfg, "cost_aware", checkpoint="dflash-noshift")) == [
        "ngram", "suffix", "dflash-noshift-adaptive", "hybrid"]
    assert untrained_rows(_rows(cfg, "cost_aware", checkpoint=None)) == ["ngram", "suffix"]
    assert untrained_rows(_rows(cfg, "cost_aware", hybrid=False)) == ["ngram", "suffix", "domino-adaptive"]


@pytest.mark.parametrize("change, message", [
    ({"then": "nope"}, "benchmark.ngram.then: 'nope' is no checkpoint"),
    ({"min_n": 3, "max_n": 2}, "benchmark.ngram.min_n: 3 exceeds max_n 2"),
])
def test_a_lookup_that_cannot_run_is_refused(change, message):
    with pytest.raises(ConfigError, match=message):
        _with(load("config.yaml"), **change)


def test_cost_aware_rows_over_no_checkpoint_are_refused():
    with pytest.raises(ConfigError, match="benchmark.cost_aware.checkpoint: 'nope' is no checkpoint"):
        _rows(load("config.yaml"), "cost_aware", checkpoint="nope")


@pytest.mark.parametrize("name", ["ngram", "ngram-domino", "suffix", "hybrid", "domino-adaptive"])
def test_a_checkpoint_named_like_a_row_without_training_is_refused(name):
    cfg = copy.deepcopy(load("config.yaml"))
    cfg["checkpoints"][name] = dict(cfg["checkpoints"]["domino"])
    with pytest.raises(ConfigError, match=f"checkpoints.{name}: .*'ngram' and 'ngram-\\*' the n-gram lookup rows"):
        validate_config(cfg)


def test_the_card_sets_the_lookup_rows_beside_the_drafters(tmp_path):
    """With the lookup rows, the Aggregate, Per-position and Speedup tables hold them after the
    card's three rows, and the card says plainly whether the lookup decodes faster than every
    trained drafter (the fixtures' lookup does), with Domino against it; without, none of it."""
    cfg = _with(load("config.yaml"), then="domino")
    report.build_report(cfg, FIXTURE, tmp_path / "with", repo=tmp_path)
    card = (tmp_path / "with" / "model_card.md").read_text()
    for label in ("n-gram lookup, no training", "n-gram lookup, then Domino", "suffix cache, no training",
                  "Domino, cost-aware", "hybrid: Domino, the free drafts or none, cost-aware"):
        assert card.replace("**", "").count(f"| {label} |") == 3, label  # Aggregate, Per-position, Speedup
    # the fixtures' suffix cache is the fastest row without training
    assert "**The fastest row that needs no training, suffix cache, no training, decodes faster than every" in card
    assert "Domino against it, paired over the same prompts:" in card
    assert "**the earlier answers of the same job**" in card
    assert "- Domino, cost-aware: " in card and "speedup against it;" in card
    assert "The lookup-then-Domino row is not decoded" not in card
    appendix = (tmp_path / "with" / "model_card_appendix.md").read_text()
    assert "## Cost-aware decoding" in appendix and "| Rows verified | 1 | 2 |" in appendix
    assert "| HumanEval | hybrid: Domino, the free drafts or none, cost-aware | the suffix cache |" in appendix
    report.build_report(load("config.yaml"), FIXTURE, tmp_path / "default", repo=tmp_path)
    card = (tmp_path / "default" / "model_card.md").read_text()
    assert "n-gram lookup, then Domino" not in card and "The lookup-then-Domino row is not decoded" in card
    off = _rows(_rows(_with(cfg, enabled=False), "suffix", enabled=False), "cost_aware", checkpoint=None)
    report.build_report(off, FIXTURE, tmp_path / "without", repo=tmp_path)
    card = (tmp_path / "without" / "model_card.md").read_text()
    assert "n-gram lookup" not in card and "suffix cache" not in card and "cost-aware" not in card


def test_a_lookup_that_never_drafted_is_said_not_tabled(tmp_path):
    """A lookup row with no step on any prompt (a verifier whose outputs never repeat, a tiny
    budget) writes acceptance 1 over zero steps, and the card says it drafted nothing instead of
    setting a row of undefined rates beside the drafters."""
    import json
    import shutil

    from domino.bench.summary import acceptance_fields
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
    write_json(path, bench, seal=True)
    report.build_report(load("config.yaml"), root, tmp_path / "card", repo=tmp_path)
    card = (tmp_path / "card" / "model_card.md").read_text()
    assert "| n-gram lookup, no training |" not in card and card.count("| suffix cache, no training |") == 3
    assert 'The row "n-gram lookup, no training" found no match on any prompt, so it drafted nothing' in card
