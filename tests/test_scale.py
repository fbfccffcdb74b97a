"""domino.card.scale: the run's settings against the published card's, for each shipped scale."""

import pytest

from conftest import load_config_files as load, random_verifier_dir
from domino.card import published, scale


def statement(cfg):
    return scale.scale_statement(cfg, scale.run_settings(cfg), "NVIDIA H200")


def mismatched(s):
    return {c.name for c in s.mismatches}


def row(s, name):
    """(this run, the card) of the scale table's row ``name``."""
    c = next(c for c in s.checks if c.name == name)
    return c.ours, c.card


def test_embedded_default_lists_every_deviation():
    s = statement(load("config.yaml"))
    assert s.verifier_kind == "embedded" and not s.comparable
    assert mismatched(s) == {"verifier", "training data", "samples", "sequence length", "epochs",
                             "learning rate and warmup", "drafter shape", "max new tokens", "verifier dtype"}
    text = s.sentence()
    assert "built and pretrained itself, not Qwen3-0.6B" in text
    assert row(s, "sequence length") == ("384", "4,096")
    assert "9 of the 11 settings the published card states differ here (verifier, training data" in text
    assert "its absolute figures are not comparable with the card's" in text
    assert len(text) < 700  # the values live in the scale table, not in the sentence


def test_card_yaml_as_shipped_matches_all_but_hardware():
    s = statement(load("config.yaml", "config/card.yaml"))
    assert s.verifier_kind == "hub" and s.comparable and s.mismatches == []
    text = s.sentence()
    assert "so its figures are comparable with the card's" in text
    assert f"(this run: NVIDIA H200; the card: {published.SETTINGS['hardware']}" in text


def test_card_offline_names_random_weights_and_every_deviation(tmp_path):
    d = random_verifier_dir(tmp_path)
    cfg = load("config.yaml", "config/card.yaml", "config/card-offline.yaml", source=str(d))
    s = statement(cfg)
    assert s.verifier_kind == "random" and not s.comparable
    assert mismatched(s) == {"verifier", "training data", "samples", "benchmark prompts"}
    text = s.sentence()
    assert "a model with random weights" in text and row(s, "samples") == ("500", "5,000")
    assert row(s, "benchmark prompts") == ("32 HumanEval prompts", "164 HumanEval prompts")
    assert str(tmp_path) not in text


def test_recorded_values_override_the_config():
    cfg = load("config.yaml", "config/card.yaml")
    settings = scale.run_settings(cfg, data_summary={"samples": 4873}, drafter_config={"num_layers": 2},
                                  protocol={"dataset": "HumanEval", "prompts": 164, "max_new_tokens": 256,
                                            "verifier_dtype": "bfloat16"})
    s = scale.scale_statement(cfg, settings, "NVIDIA H200")
    assert mismatched(s) == {"samples", "drafter shape"}
    assert row(s, "drafter shape") == ("layers 2", "layers 3")


def test_a_local_copy_is_not_taken_for_the_hub_weights(tmp_path):
    d = random_verifier_dir(tmp_path)
    (d / scale.RANDOM_WEIGHTS_MARKER).unlink()
    s = statement(load("config.yaml", "config/card.yaml", source=str(d)))
    assert s.verifier_kind == "local" and mismatched(s) == {"verifier"}
    assert "The verifier is `Qwen/Qwen3-0.6B`, the weights of a local directory as given." in s.sentence()


def test_a_verifier_of_ones_own_is_spoken_of_by_its_name_alone(tmp_path):
    """The statement names the verifier given (verifier.name), and no model it was not given."""
    d = random_verifier_dir(tmp_path)
    (d / scale.RANDOM_WEIGHTS_MARKER).unlink()
    s = statement(load("config.yaml", "config/card.yaml", "config/own-verifier.yaml", source=str(d)))
    verifier = s.sentence().split(". ")[0]
    assert verifier.startswith("The verifier is `own-verifier`, the weights of a local directory")
    assert "Qwen" not in verifier and "Hub" not in verifier


@pytest.mark.parametrize("name, shown", [("Qwen/Qwen3-0.6B", "Qwen/Qwen3-0.6B"), ("/home/me/models/q3", "q3"),
                                         ("~/q3", "q3"), ("results/random_verifier", "results/random_verifier")])
def test_public_name_drops_local_prefixes(name, shown):
    assert scale.public_name(name) == shown


def test_a_per_checkpoint_override_is_given_row_by_row():
    """A setting one card row overrides appears in the scale table with that row's value, and matches
    the card only if every row's does."""
    cfg = load("config.yaml", "config/card.yaml")
    cfg["checkpoints"]["domino"]["train"] = {"lr": 1.0e-3}
    rows = {published.LABELS[n]: scale.run_settings({**cfg, "train": {**cfg["train"], **(
        cfg["checkpoints"][n].get("train") or {})}}) for n in published.CHECKPOINTS}
    s = scale.scale_statement(cfg, scale.run_settings(cfg), "NVIDIA H200", rows)
    assert mismatched(s) == {"learning rate and warmup"}
    assert row(s, "learning rate and warmup") == (
        "DFlash shift, DFlash noshift: lr 0.0006, warmup_steps 50; Domino: lr 0.001, warmup_steps 50",
        "lr 0.0006, warmup_steps 50")
