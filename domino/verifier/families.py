"""The verifier families: the decoder-only causal LMs of transformers whose hidden states the
drafter reads, one entry each in ``FAMILIES`` (by ``model_type``), and nothing else of a family
anywhere in the package: adding a family is one entry here.

An entry holds the family's name, where its causal LM keeps the decoder's parts (the base model,
and on it the embedding, the decoder layers and the final norm: what ``domino.aux`` hooks, the
loader checks and ``train.loss: kl_div`` reads), the names its config gives the shape fields the
drafter reads (GPT-2's ``n_layer`` is ``num_hidden_layers``), and, for a family refused before any
job, why. Tested (tests/test_families.py: the config check, the hidden-state capture, the
extraction and a lossless speculative decode on a tiny random model of each): every family not
refused. Another family is tried as it comes: its config.json is read by the names below, and
loading it refuses a model whose decoder parts are not found (``domino.verifier.load.check_causal_lm``).

Plain data, no imports: the config gate (through ``domino.verifier.facts``), the algorithm
(``domino.aux``), the loader and training all read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Family:
    """One verifier family. ``base``: the base model's attribute on the causal LM (where vLLM reads
    the final norm: ``{base}.{norm}``); ``embed``, ``layers``, ``norm``: the embedding, the decoder
    layers and the final norm (RMSNorm or LayerNorm) on the base model; ``shape_names``: a shape
    field the drafter reads -> the family's own name for it; ``mlp_ratio``: the MLP size, where the
    config leaves it null, as a multiple of the hidden size (None: the config must give it);
    ``refused``: why the family is refused before any job, None for a family tested."""

    name: str
    base: str = "model"
    embed: str = "embed_tokens"
    layers: str = "layers"
    norm: str = "norm"
    shape_names: dict[str, str] = field(default_factory=dict)
    mlp_ratio: int | None = None
    refused: str | None = None


FAMILIES = {
    "qwen3": Family("Qwen3"),
    "qwen2": Family("Qwen2"),
    "llama": Family("Llama"),
    "mistral": Family("Mistral"),
    "gemma": Family("Gemma"),
    "gpt2": Family("GPT-2", base="transformer", embed="wte", layers="h", norm="ln_f",
                   shape_names={"num_hidden_layers": "n_layer", "hidden_size": "n_embd", "num_attention_heads": "n_head",
                                "max_position_embeddings": "n_positions", "intermediate_size": "n_inner",
                                "rms_norm_eps": "layer_norm_epsilon"}, mlp_ratio=4),
    "gpt_neox": Family("GPT-NeoX", base="gpt_neox", embed="embed_in", norm="final_layer_norm",
                       shape_names={"rms_norm_eps": "layer_norm_eps"}),
    "phi": Family("Phi", norm="final_layernorm", shape_names={"rms_norm_eps": "layer_norm_eps"},
                  refused="its output head adds a bias (lm_head.bias), which the drafter's frozen copy of the head's "
                          "rows and the greedy targets of the extraction leave out"),
}


def _distinct(names) -> tuple[str, ...]:
    """``names`` once each, in the order of their first appearance."""
    return tuple(dict.fromkeys(names))


# read from FAMILIES, never written out again: the tested families (model_type -> name), the refused
# ones (model_type -> why)
VERIFIER_FAMILIES = {t: f.name for t, f in FAMILIES.items() if f.refused is None}
REFUSED_FAMILIES = {t: f.refused for t, f in FAMILIES.items() if f.refused is not None}
# the shape fields the drafter reads, and the other names the families give them
SHAPE_ALIASES = {key: _distinct(f.shape_names[key] for f in FAMILIES.values() if key in f.shape_names)
                 for key in _distinct(k for f in FAMILIES.values() for k in f.shape_names)}
# where each family keeps its final norm, from the causal LM (another family: model.norm)
FINAL_NORM_AT = {t: f"{f.base}.{f.norm}" for t, f in FAMILIES.items()}
# the decoder's parts under the base model, by every name a family gives them, looked up in this order
EMBEDDINGS = _distinct(f.embed for f in FAMILIES.values())
LAYERS = _distinct(f.layers for f in FAMILIES.values())
FINAL_NORMS = _distinct(f.norm for f in FAMILIES.values())
