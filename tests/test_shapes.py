"""domino.shapes (Qwen3-0.6B's shape, the one Qwen3 config builder) and the tools' card drafter."""

from pathlib import Path

import yaml
from transformers import Qwen3ForCausalLM

from domino.shapes import QWEN3_0_6B, qwen3_config
from domino.tools import CARD_DRAFTER, card_drafter_config

ROOT = Path(__file__).resolve().parent.parent


def test_qwen3_config_is_qwen3_0_6b_unless_told_otherwise():
    c = qwen3_config()
    assert {k: getattr(c, k) for k in QWEN3_0_6B} == QWEN3_0_6B
    assert c.model_type == "qwen3" and c.architectures == ["Qwen3ForCausalLM"]
    narrow = qwen3_config(hidden_size=32, num_hidden_layers=2, rope_parameters={"rope_type": "default",
                                                                                  "rope_theta": 10000.0})
    assert (narrow.hidden_size, narrow.num_hidden_layers, narrow.rope_parameters["rope_theta"]) == (32, 2, 10000.0)
    assert narrow.vocab_size == QWEN3_0_6B["vocab_size"] and narrow.head_dim == QWEN3_0_6B["head_dim"]
    assert len(narrow.layer_types) == 2  # per-layer fields follow the overridden depth


def test_a_model_built_from_the_config_has_its_shape():
    c = qwen3_config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                     num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    m = Qwen3ForCausalLM(c)
    assert len(m.model.layers) == 2 and m.model.embed_tokens.weight.shape == (64, 32)
    assert m.model.layers[0].self_attn.k_proj.weight.shape == (16, 32)  # 1 KV head of 16
    assert m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr()  # Qwen3-0.6B ties them


def test_card_drafter_is_what_the_card_config_trains():
    """config/card.yaml states the card's drafter for the workflow; the tools' copy agrees with it."""
    card = yaml.safe_load((ROOT / "config" / "card.yaml").read_text())
    assert card["verifier"]["source"] == "Qwen/Qwen3-0.6B"  # the model QWEN3_0_6B describes
    assert {k: card["drafter"][k] for k in CARD_DRAFTER} == CARD_DRAFTER


def test_card_drafter_config_sits_on_qwen3_0_6b():
    cfg = card_drafter_config(projector="domino", shift_label=True)
    assert (cfg.hidden_size, cfg.target_num_layers, cfg.target_vocab_size) == (1024, 28, 151_936)
    assert cfg.projector == "domino" and cfg.num_layers == 3 and cfg.aux_layer_ids == [1, 13, 25]
    assert all(0 <= i <= cfg.target_num_layers for i in cfg.aux_layer_ids)
    assert cfg.rope_theta == 1_000_000.0
    # an override replaces the card's value; a narrower verifier carries its own shape through
    small = card_drafter_config(qwen3_config(hidden_size=64, head_dim=16), num_layers=1, projector="dflash",
                                shift_label=False)
    assert (small.num_layers, small.hidden_size, small.head_dim, small.block_size) == (1, 64, 16, 8)
