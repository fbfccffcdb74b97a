"""The published Qwen3-0.6B-Domino-b8 card, stated once: its settings and its figures.

Copied from the card's own text (its front matter, Model Description, Inference Benchmark and
Training sections). ``scale.py`` compares a run's settings with ``SETTINGS``; the reproduction
report sets this run's figures beside ``FIGURES``. ``config/card.yaml`` configures a run with
these settings; a test keeps the two in step.

Conventions: accuracies and acceptance rates are fractions; per-position acceptance rows are
``[pos_0, pos_1, pos_2, pos_3, pos_4+]``.
"""

from __future__ import annotations

NAME = "Qwen3-0.6B-Domino-b8"
CHECKPOINTS = ("dflash-shift", "dflash-noshift", "domino")  # the card's three rows, in its order
LABELS = {"dflash-shift": "DFlash shift", "dflash-noshift": "DFlash noshift", "domino": "Domino",
          "baseline": "Plain greedy (verifier only)"}

# What the card states about how it was made. Drafter shape entries use drafter_config.json names.
SETTINGS = {
    "verifier": "Qwen/Qwen3-0.6B",
    "corpus": "sharegpt-hub",
    "hub_dataset": "Aeala/ShareGPT_Vicuna_unfiltered",  # what speculators loads as "sharegpt"
    "samples": 5000,
    "seq_len": 4096,
    "epochs": 2,
    "lr": 6e-4,
    "warmup_steps": 50,
    "gamma": 7.0,
    "loss": "ce",  # "position-weighted cross-entropy" (train.loss)
    "lambda0": 1.0,
    "lambda_ratio": 0.5,
    "drafter": {
        "num_layers": 3, "hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 8,
        "block_size": 8, "aux_layer_ids": [1, 13, 25], "draft_vocab_size": 32000, "target_vocab_size": 151936,
        "target_num_layers": 28, "gru_hidden_size": 1024, "bottleneck_size": 256, "pure_draft_prefix_len": 0,
        "mask_token_id": 151669,
    },
    "benchmark_dataset": "HumanEval",
    "prompts": 164,
    "max_new_tokens": 256,
    "verifier_dtype": "bfloat16",
    "hardware": "a single RTX 4060 Laptop GPU (8 GB)",
    "backend": "patched vLLM",
}

# The card's tables, as printed.
FIGURES = {
    "acceptance_length": {"dflash-shift": 1.070, "dflash-noshift": 1.079, "domino": 1.378},
    "tps": {"dflash-shift": 47.3, "dflash-noshift": 45.1, "domino": 53.1},
    "per_position": {
        "dflash-shift": [0.065, 0.004, 0.001, 0.000, 0.0],
        "dflash-noshift": [0.076, 0.003, 0.000, 0.0, 0.0],
        "domino": [0.319, 0.049, 0.008, 0.002, 0.0],
    },
    "first_trained_accuracy": {"dflash-shift": None, "dflash-noshift": 0.215, "domino": 0.410},
    "domino_conditional": [0.319, 0.152, 0.165, 0.234, 0.298, 0.412, 0.714, 0.800],
    "validation": {
        "base_acc": [0.410, 0.318, 0.278, 0.257, 0.243, 0.231, 0.224, 0.215],
        "final_acc": [0.410, 0.318, 0.278, 0.257, 0.243, 0.231, 0.224, 0.215],
        "overall": {"base_acc": 0.121, "final_acc": 0.272},
    },
}

# The card's relative claims, as it states them: "vs DFlash noshift" in its Aggregate table, and
# the ratio of a+1 acceptance in the text under its per-position table (Domino pos_0 against
# DFlash noshift pos_1, "9.7x stronger backbone (31.9% vs 3.3%)"). ``published`` is the claim as a
# relative difference A / B - 1 (a ratio r as r - 1); ``claims.py`` sets this run's figure beside it.
CLAIMS = (
    {"a": "domino", "b": "dflash-noshift", "figure": "acceptance_length", "quantity": "acceptance length",
     "kind": "relative", "published": 0.277, "stated": "+27.7% accept"},
    {"a": "domino", "b": "dflash-noshift", "figure": "tps", "quantity": "TPS",
     "kind": "relative", "published": 0.178, "stated": "+17.8% TPS"},
    {"a": "domino", "b": "dflash-noshift", "figure": "first_draft_acceptance",
     "quantity": "acceptance of the token a+1", "kind": "ratio", "published": 9.7 - 1.0,
     "stated": "9.7× (31.9% vs 3.3%)"},
)

# The card's trainer, where the card is silent on a convention that changes the model: speculators
# PR 685 ("Domino head for DFlash", vllm-project/speculators) at this commit. config/card.yaml
# follows it; docs/conventions.md sets each beside this project's default.
TRAINER = "speculators PR 685"
TRAINER_COMMIT = "a29950c2"
# config key -> (PR 685's value, where it is set: file and lines at TRAINER_COMMIT)
TRAINER_CONVENTIONS = {
    "drafter.block_causal": (
        True, "src/speculators/models/dflash/attention.py:43 and 96-97 (non_causal = sliding_window is None "
              "or sliding_window_non_causal), with scripts/train.py:1131-1136 (--sliding-window-non-causal, "
              "off by default) and every draft layer windowed"),
    "train.loss": (
        "kl_div", "scripts/train.py:884-892 (--loss-fn kl_div by default) and src/speculators/models/dflash/"
                  "metrics.py:18 (_DEFAULT_LOSS_CONFIG), the targets from src/speculators/models/dflash/"
                  "core.py:378-387 (verifier_lm_head(verifier_norm(last hidden state)))"),
    "train.loss_mask_at": (
        "input", "src/speculators/models/dflash/core.py:406 (loss_mask[:, anchored_block_indices], slot k "
                 "at a+k) and src/speculators/models/dflash/utils.py:44-45 (select_anchors: loss_mask[a])"),
    "train.weights_dtype": (
        "bfloat16", "src/speculators/train/trainer.py:273 (self.model.to(hidden_states_dtype)), with "
                    "scripts/train.py:908-910 (--hidden-states-dtype bfloat16 by default)"),
    "train.rotary_dtype": (
        "weights", "src/speculators/train/trainer.py:273 (the whole-model cast rounds the rotary inv_freq buffer)"),
    "train.noise_dtype": (
        "storage", "src/speculators/train/data.py:188-191 (hidden states cast to bf16), then 211-213 (the "
                   "noise transform, src/speculators/train/noise_transforms.py:23-25)"),
}
