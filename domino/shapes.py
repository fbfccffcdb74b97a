"""The model shapes the tools and tests share, and the one builder of Qwen3 configs.

* ``QWEN3_0_6B``: the fields of Qwen/Qwen3-0.6B's ``config.json`` that shape the model (the
  card's verifier). ``qwen3_config()`` starts from it, so a caller names only what differs.
* ``CARD_DRAFTER``: the card's drafter on top of that verifier, as ``DrafterConfig`` fields
  (``config/card.yaml`` states the same values for the workflow; a test keeps them equal).
  The projector and shift_label are left to the caller: the card trains DFlash and Domino
  drafters alike.

Aux-layer ids follow the convention of ``domino.aux.AuxCapture``.
"""

from __future__ import annotations

from transformers import Qwen3Config

from .model import DrafterConfig

# Qwen/Qwen3-0.6B's config.json, the fields that shape the model
QWEN3_0_6B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                  rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=False,
                  rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0})

# the card's drafter: 3 layers, block 8, aux ids [1, 13, 25] of the 28-layer verifier, a 32,000-token
# draft vocabulary, the Domino head's GRU 1024 / bottleneck 256, <|MASK|> at Qwen3's first unused row
CARD_DRAFTER = dict(num_layers=3, block_size=8, aux_layer_ids=[1, 13, 25], draft_vocab_size=32000,
                    gru_hidden_size=1024, bottleneck_size=256, mask_token_id=151669, correct_from=1)


def qwen3_config(**overrides) -> Qwen3Config:
    """A ``Qwen3ForCausalLM`` config: Qwen3-0.6B's shape with ``overrides`` replacing its fields.

    Any ``Qwen3Config`` argument may be overridden (``vocab_size``, ``initializer_range``,
    ``eos_token_id``, ...); the rope parameters of a narrow test model must be named too, or it
    gets Qwen3-0.6B's ``rope_theta`` of 1e6.
    """
    fields = {**QWEN3_0_6B, "architectures": ["Qwen3ForCausalLM"], **overrides}
    return Qwen3Config(**fields)


def card_drafter_config(verifier_config: Qwen3Config | None = None, **overrides) -> DrafterConfig:
    """The card's drafter over ``verifier_config`` (default: Qwen3-0.6B's), with ``overrides``
    (``projector`` and ``shift_label``, which the caller names, ``attn_implementation``, ...)
    replacing ``CARD_DRAFTER`` or adding fields; a field neither names takes the config schema's
    default."""
    verifier_config = verifier_config if verifier_config is not None else qwen3_config()
    return DrafterConfig.schema_defaults(verifier_config, **{**CARD_DRAFTER, **overrides})
