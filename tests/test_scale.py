"""domino.card.scale: the run's settings against the published card's, for each shipped scale."""

import pytest
from conftest import load_config_files as load, random_verifier_dir

from domino.card import published, scale

def statement(cfg):
    return scale.scale_statement(cfg, scale.run_settings(cfg), "NVIDIA H200")


def mismatched(s):
    return {c.name for c in s.mismatches}


def test_embedded_default_lists_every_deviation():
    s = statement(load("config.yaml"))
    assert s.verifier_kind == "embedded" and not s.comparable
    assert mismatched(s) == {"verifier", "training data", "samples", "sequence length", "epochs",
                             "learning rate and warmup", "drafter shape", "max new tokens", "verifier dtype"}
    text = s.sentence()
    assert "built and pretrained itself, not Qwen3-0.6B" in text
    assert "sequence length 384 against the card's 4,096" in text
    assert "not comparable with the published card" in text


def test_card_yaml_as_shipped_matches_all_but_hardware():
    s = statement(load("config.yaml", "config/card.yaml"))
    assert s.verifier_kind == "hub" and s.comparable and s.mismatches == []
    text = s.sentence()
    assert "so its figures are comparable with the published card's" in text
    assert f"this run used NVIDIA H200, the published card {published.SETTINGS['hardware']}" in text


def test_card_offline_names_random_weights_and_every_deviation(tmp_path):
    d = random_verifier_dir(tmp_path)
    cfg = load("config.yaml", "config/card.yaml", "config/card-offline.yaml", source=str(d))
    s = statement(cfg)
    assert s.verifier_kind == "random" and not s.comparable
    assert mismatched(s) == {"verifier", "training data", "samples", "benchmark prompts"}
    text = s.sentence()
    assert "a model with random weights" in text and "samples 500 against the card's 5,000" in text
    assert "32 HumanEval prompts against the card's 164 HumanEval prompts" in text
    assert str(tmp_path) not in text


def test_recorded_values_override_the_config():
    cfg = load("config.yaml", "config/card.yaml")
    settings = scale.run_settings(cfg, data_summary={"samples": 4873}, drafter_config={"num_layers": 2},
                                  protocol={"dataset": "HumanEval", "prompts": 164, "max_new_tokens": 256,
                                            "verifier_dtype": "bfloat16"})
    s = scale.scale_statement(cfg, settings, "NVIDIA H200")
    assert mismatched(s) == {"samples", "drafter shape"}
    assert "drafter shape num_layers 2 against the card's num_layers 3" in s.sentence()


def test_a_local_copy_is_not_taken_for_the_hub_weights(tmp_path):
    d = random_verifier_dir(tmp_path)
    (d / scale.RANDOM_WEIGHTS_MARKER).unlink()
    s = statement(load("config.yaml", "config/card.yaml", source=str(d)))
    assert s.verifier_kind == "local" and mismatched(s) == {"verifier"}
    assert "whose weights nothing here checks against the Hub's Qwen/Qwen3-0.6B" in s.sentence()


@pytest.mark.parametrize("name, shown", [("Qwen/Qwen3-0.6B", "Qwen/Qwen3-0.6B"), ("/home/me/models/q3", "q3"),
                                         ("~/q3", "q3"), ("results/random_verifier", "results/random_verifier")])
def test_public_name_drops_local_prefixes(name, shown):
    assert scale.public_name(name) == shown
