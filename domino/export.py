"""Export a trained drafter in the speculators format (``config.json`` + ``model.safetensors``).

vLLM loads DFlash drafters from checkpoints in vllm-project/speculators' format: a
``config.json`` whose ``speculators_model_type`` is ``"dflash"`` (speculators'
``DFlashSpeculatorConfig`` with its ``speculators_config`` block) and a safetensors file whose
names follow speculators' ``DFlashDraftModel`` state dict. This module writes that format from
our own checkpoint (``drafter_config.json`` + ``model.safetensors``, see ``Drafter.save``) and
reads it back (``load_speculators``), so a round trip is tested without speculators. The
shift is written under both names speculators has used for it, ``shift_label`` and
``sample_from_anchor`` (slot k is trained on ``x[a+k+1]``, all B slots draft).

Weight names: the backbone's are ours unchanged (our module names match speculators'); the
Domino head maps ``head.gru -> domino_head.prefix_gru``, ``head.down -> domino_head.embed_proj.0``
and ``head.up -> domino_head.embed_proj.2`` (PR 685's head: ``GRU(H, G, bias=False)`` and
``Linear(H+G, r) -> SiLU -> Linear(r, V)`` over ``[hidden ; gru_out]``, as ours).
``embed_tokens.weight`` is written by default, so the export is self-contained (vLLM uses it
when present). vLLM renames ``d2t``, skips ``t2d`` and reads ``draft_vocab_size``,
``target_hidden_size`` (the verifier's hidden size, which is the drafter's), ``mask_token_id``
and ``aux_hidden_state_layer_ids`` (speculators convention) from the config.

``speculators_config.verifier.name_or_path`` is where a reader loads the verifier from: ``vllm
serve EXPORT`` serves that model with the export as its drafter, and speculators attaches it.
The export stage writes the path the workflow loaded the verifier from: the hub id, or a local
directory as the run names it (``results/verifier/model`` for the embedded verifier), which is
relative to the run directory: a reader started there finds it.

Checked for the DFlash exports: speculators 0.9.0 loads every tensor under its name and its
training forward gives our draft logits (``tests/test_export.py``, in speculators' own
environment). vLLM 0.32 serves all three exports, the Domino head included, through
``domino.vllm.plugin`` with the drafts and the acceptance our loop has
(``tests/test_vllm_plugin.py``, ``tests/test_vllm_backend.py``).

Where the public format cannot say exactly what our model is:

* ``pure_draft_prefix_len`` is written as speculators PR 685 (the card's trainer) reads it:
  the first corrected slot is ``1 + pure_draft_prefix_len``, so the field is our
  ``correct_from - 1`` (0 for the card's ``correct_from`` 1). Without ``shift_label`` slot 0
  is the anchor, never a draft, so ``correct_from`` 0 drafts as 1 does and is written as 0; a
  shifted ``correct_from`` 0 is written as -1 (right for a reader that adds, refused loudly by
  one that requires >= 0). Our reader takes the exact values from the ``domino_repro`` block.
* ``sliding_window`` is written into ``transformer_layer_config``, and
  ``sliding_window_non_causal`` says what the block is: true for a bidirectional block, false
  for a causal one (``block_causal``). vLLM-family readers take ``causal = not
  sliding_window_non_causal``; speculators PR 685 makes a block causal only under a window
  (``attention.py``: ``non_causal = sliding_window is None or sliding_window_non_causal``), so a
  causal block without a window, which this project can train, reads as bidirectional there.
  Our public reader follows PR 685, the trainer whose checkpoints carry no ``domino_repro``
  block (``_public_block_causal``).
* Our Domino correction lives in the draft vocabulary (``embed_proj.2`` has
  ``draft_vocab_size`` rows); speculators' config and the vLLM Domino port expect the target
  vocabulary there, so a Domino export with a pruned vocabulary loads in neither as they stand.
* ``speculators_version`` is not written (speculators fills its own in).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import torch

from .common import DTYPES
from .io import atomic_dir, load_safetensors, read_json, rebuild_hint, save_safetensors, write_json
from .model import Drafter, DrafterConfig
from .schema import section_defaults

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
EXTRA_KEY = "domino_repro"  # our own block: what the public fields cannot say exactly
FORMAT_VERSION = 3  # of the domino_repro block: the one version read, another is refused

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


def verifier_architectures(verifier: str) -> tuple[str, ...]:
    """The verifier's own ``architectures`` (``LlamaForCausalLM`` for SmolLM2), read from its
    ``config.json``: a local directory's, or a hub id's from the local cache (no network is asked);
    Qwen3's are assumed when neither holds one (the card's verifier)."""
    try:
        from transformers import AutoConfig

        archs = AutoConfig.from_pretrained(verifier, local_files_only=True).architectures
    except (OSError, ValueError):
        archs = None
    return tuple(archs or ("Qwen3ForCausalLM",))


def speculators_config(cfg: DrafterConfig, verifier_name: str, dtype: torch.dtype,
                       verifier_architectures=("Qwen3ForCausalLM",), training: dict | None = None) -> dict:
    """The ``config.json`` of a drafter in the speculators DFlash format. ``verifier_name`` becomes
    ``speculators_config.verifier.name_or_path``, which readers load the verifier from (``vllm
    serve EXPORT`` serves it, speculators attaches it): a hub id, or a directory, where a relative
    one is read from the reader's working directory."""
    dtype_name = str(dtype).removeprefix("torch.")
    return {
        "architectures": ["DFlashDraftModel"],
        "speculators_model_type": "dflash",
        "transformer_layer_config": _transformer_layer_config(cfg),
        "draft_vocab_size": cfg.draft_vocab_size,
        "block_size": cfg.block_size,
        "target_hidden_size": cfg.hidden_size,  # the verifier's: the drafter's hidden size is the verifier's
        "aux_hidden_state_layer_ids": list(cfg.aux_layer_ids),  # speculators convention
        "mask_token_id": cfg.mask_token_id,
        "projector_type": cfg.projector,
        "shift_label": cfg.shift_label,
        "sample_from_anchor": cfg.shift_label,
        "pure_draft_prefix_len": pr685_prefix_len(cfg),  # first corrected slot - 1 (module docstring)
        "emb_dim": cfg.bottleneck_size,
        "gru_hidden_dim": cfg.gru_hidden_size,
        "sliding_window_non_causal": not cfg.block_causal,  # what the block is (module docstring)
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
            # how the checkpoint was trained (its summary.json's config): the conventions where the
            # card's trainer differs (docs/conventions.md) travel with the weights
            **({"training": dict(training)} if training else {}),
        },
    }


def export_speculators(checkpoint_dir: str | Path, out_dir: str | Path, verifier_name: str,
                       dtype: str | None = None, include_embed_tokens: bool = True,
                       verifier_architectures=("Qwen3ForCausalLM",), training: dict | None = None) -> dict:
    """Write ``out_dir/model.safetensors`` then ``out_dir/config.json`` from a ``Drafter.save`` dir.

    ``dtype`` (float32 | bfloat16 | float16) casts the floating-point weights; None keeps the
    checkpoint's. ``d2t`` stays int64 and ``t2d`` bool. ``training``: the settings the checkpoint
    was trained with (its ``summary.json`` ``config``), recorded under ``domino_repro.training``. The folder is written under a temporary
    name and renamed when both files are complete; the weights carry their sha256, which
    ``load_speculators`` and ``check_export`` check. Returns the config.
    """
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
    config = speculators_config(cfg, verifier_name, target_dtype, verifier_architectures, training)
    with atomic_dir(out_dir) as tmp:  # the folder appears complete or not at all
        save_safetensors(tensors, tmp / WEIGHTS_NAME, metadata={"format": "pt"})
        write_json(tmp / CONFIG_NAME, config)
    return config


def check_export(out_dir: str | Path) -> dict:
    """An export's config and weights, checked intact (a damaged file is refused naming it);
    returns the config."""
    out_dir = Path(out_dir)
    hint = rebuild_hint(out_dir)
    config = read_json(out_dir / CONFIG_NAME, "export config", hint=hint)
    load_safetensors(out_dir / WEIGHTS_NAME, "exported weights", hint)
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

    Exact when the file carries our ``domino_repro`` block (``FORMAT_VERSION``; another version
    is refused); otherwise rebuilt from the public fields alone as PR 685 reads them
    (``_public_drafter_config``).
    """
    if config.get("speculators_model_type") != "dflash":
        raise ExportError(f"speculators_model_type is {config.get('speculators_model_type')!r}, expected 'dflash'")
    extra = config.get(EXTRA_KEY)
    if extra is None:
        return _public_drafter_config(config)
    version = extra.get("format_version")
    if version != FORMAT_VERSION or "drafter_config" not in extra:
        raise ExportError(f"{EXTRA_KEY}.format_version {version!r} is not the one this reader knows "
                          f"({FORMAT_VERSION}), or its drafter_config is missing: export the checkpoint again "
                          "with this version of the project")
    return DrafterConfig(**extra["drafter_config"])


def _public_drafter_config(config: dict) -> DrafterConfig:
    """The public fields as PR 685 reads them: the first corrected slot is
    ``1 + pure_draft_prefix_len``; ``target_num_layers`` is unknown and set to the largest aux id.
    The head's sizes default to PR 685's; what the format does not carry (the attention kernel,
    the initialisation, which the loaded weights replace) takes the config schema's default."""
    layer = config["transformer_layer_config"]
    target_hidden = config.get("target_hidden_size")
    if target_hidden not in (None, layer["hidden_size"]):
        raise ExportError(f"target_hidden_size {target_hidden} differs from the draft layers' hidden_size "
                          f"{layer['hidden_size']}: this drafter reads the verifier's states at its own width")
    rope = layer.get("rope_parameters") or {}
    aux = list(config["aux_hidden_state_layer_ids"])
    shift = config.get("shift_label")
    if shift is None:
        shift = config.get("sample_from_anchor", config.get("projector_type") == "domino")
    defaults = section_defaults("drafter")
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
        block_causal=_public_block_causal(config),
        attn_implementation=defaults["attn_implementation"],
        init=defaults["init"],
        init_std=defaults["init_std"],
        verifier=(config.get("speculators_config") or {}).get("verifier", {}).get("name_or_path") or "",
    )


def _public_sliding_window(config: dict) -> int | None:
    """The draft layers' window from the public fields; None for full attention. Refused where
    this drafter cannot follow: a window on some layers only."""
    layer = config["transformer_layer_config"]
    window = layer.get("sliding_window")
    types = layer.get("layer_types") or []
    sliding = [t == "sliding_attention" for t in types] or [bool(layer.get("use_sliding_window"))]
    if window is None or not any(sliding):
        return None
    if not all(sliding):
        raise ExportError(f"layer_types {types} mix full and sliding-window attention; this drafter has one "
                          "window for every draft layer")
    return int(window)


def _public_block_causal(config: dict) -> bool:
    """Whether the block is causal, as PR 685 trains it: causal under a sliding window unless
    ``sliding_window_non_causal`` (default false), bidirectional without a window."""
    return _public_sliding_window(config) is not None and not config.get("sliding_window_non_causal", False)


def load_speculators(out_dir: str | Path, verifier=None, attn_implementation: str | None = None) -> Drafter:
    """Our reader of an export: a ``Drafter`` with the exported weights, in their dtype.

    ``verifier`` (a loaded causal LM) supplies ``embed_tokens`` when the export left it out.
    """
    out_dir = Path(out_dir)
    cpath, wpath = out_dir / CONFIG_NAME, out_dir / WEIGHTS_NAME
    if not cpath.exists() or not wpath.exists():
        raise ExportError(f"{out_dir} is not a complete export (needs {CONFIG_NAME} and {WEIGHTS_NAME})")
    hint = rebuild_hint(out_dir)
    config = read_json(cpath, "export config", hint=hint)
    cfg = drafter_config_from_speculators(config)
    if attn_implementation:
        cfg.attn_implementation = attn_implementation
    tensors = load_safetensors(wpath, "exported weights", hint)
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
