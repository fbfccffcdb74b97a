"""The card's verifier shape and the one builder of Qwen3 configs.

``QWEN3_0_6B``: the fields of Qwen/Qwen3-0.6B's ``config.json`` that shape the model (the
card's verifier). ``qwen3_config()`` starts from it, so a caller names only what differs. The
card's drafter on top of it is the tools' (``domino.tools.CARD_DRAFTER``).
"""

from __future__ import annotations

from transformers import Qwen3Config

# Qwen/Qwen3-0.6B's config.json, the fields that shape the model
QWEN3_0_6B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                  rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=False,
                  rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0})


def qwen3_config(**overrides) -> Qwen3Config:
    """A ``Qwen3ForCausalLM`` config: Qwen3-0.6B's shape with ``overrides`` replacing its fields.

    Any ``Qwen3Config`` argument may be overridden (``vocab_size``, ``initializer_range``,
    ``eos_token_id``, ...); the rope parameters of a narrow test model must be named too, or it
    gets Qwen3-0.6B's ``rope_theta`` of 1e6.
    """
    fields = {**QWEN3_0_6B, "architectures": ["Qwen3ForCausalLM"], **overrides}
    return Qwen3Config(**fields)
