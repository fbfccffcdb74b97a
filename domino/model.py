"""The Domino draft model: a DFlash parallel backbone and the Domino GRU correction head.

Read top to bottom:

1. ``DrafterConfig``  every field the drafter needs, with the conventions that the public
   implementations disagree on written down next to the field.
2. ``DraftAttention`` / ``DraftLayer``  a Qwen3 block whose queries come from the block tokens
   only and whose keys/values come from ``[context ; block]`` (KV injection).
3. ``DominoHead``     bias-free GRU over the tokens before each prediction, plus a low-rank
   SiLU bottleneck whose output is added to the base logits in draft-vocabulary space.
4. ``Drafter``        ties them together: ``forward_train`` (packed rows, many anchors, one
   dense mask) and ``draft`` (one block at inference, with a context cache).

Shapes use these letters::

    R  packed rows in a batch            T  tokens per packed row (or cached context length)
    N  anchors per row                   B  block size
    H  hidden size (= the verifier's)    A  number of auxiliary layers
    Vt target (verifier) vocabulary      Vd draft vocabulary
    G  GRU hidden size                   r  bottleneck size

Conventions:

* ``aux_layer_ids`` follow the speculators/vLLM convention stated in ``domino.aux.AuxCapture``.
* The block is ``[x_a, MASK, ..., MASK]`` at positions ``a .. a+B-1``. With ``shift_label``
  slot ``k`` predicts ``x[a+k+1]`` (B drafts per step); without it slot ``k`` predicts
  ``x[a+k]``, slot 0 is the anchor itself and slots ``1..B-1`` give B-1 drafts.
* Context attention is strictly before the anchor (``p < a``) and inside the anchor's
  document, and with ``sliding_window`` W no further back than ``a - W``
  (``draft_attention_mask``); the block never attends to another block, and within its own
  block slot ``k`` sees every slot (bidirectional) or, with ``block_causal``, slots ``0..k``
  (``in_block_mask``, the one definition training and inference share).
* The Domino correction is added to the base logits in draft-vocabulary space, before draft
  ids are mapped to target ids through ``d2t``; it applies to slots ``k >= correct_from``.

What one training step at the card's shapes needs in memory, worked out and measured:
``docs/memory.md``.

The drafter and its head stay in this one file, longer than the project's other modules, so that
the model reads top to bottom in one place.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3MLP,
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
    apply_rotary_pos_emb,
)

# -----------------------------------------------------------------------------
# 1. Configuration


def first_draft_slot(shift_label: bool) -> int:
    """The first block slot that proposes a token: 0 with shift_label (slot k predicts a+k+1),
    1 without (slot 0 is the anchor itself)."""
    return 0 if shift_label else 1


def drafts_per_step(block_size: int, shift_label: bool) -> int:
    """Tokens a step drafts: B with shift_label, B - 1 without."""
    return block_size - first_draft_slot(shift_label)


@dataclass
class DrafterConfig:
    """Everything that defines a drafter; saved as ``drafter_config.json`` with the weights."""

    # copied from the verifier's config
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    target_vocab_size: int
    target_num_layers: int
    # the drafter's own choices: the config's drafter section (its schema holds the defaults and
    # allowed values) and the checkpoint's projector and shift_label
    num_layers: int
    block_size: int
    aux_layer_ids: list[int]  # speculators convention
    mask_token_id: int
    draft_vocab_size: int
    shift_label: bool
    projector: str  # "dflash" (backbone only) | "domino" (backbone + GRU head)
    gru_hidden_size: int
    bottleneck_size: int
    pure_draft_prefix_len: int  # the card's value, for the record: the model and export use correct_from
    correct_from: int  # first corrected slot (PR 685: 1 + pure_draft_prefix_len); slots below never are
    attn_implementation: str  # "sdpa" | "eager" (dense reference)
    sliding_window: int | None  # None, or W: the block sees the W context rows before its anchor
    block_causal: bool  # slot k sees slots 0..k of its block (PR 685's windowed default); False: all B slots
    init: str  # "pytorch" (module defaults) | "hf" (normal(0, init_std), see Drafter.init_hf)
    init_std: float
    verifier: str = ""  # name or path of the verifier, for the record
    target_model_type: str = ""  # the verifier's model_type ("qwen3", "llama"), for the record and the card's tags

    def __post_init__(self):
        # the config schema checks each value alone; these need the verifier's shapes
        for i in self.aux_layer_ids:
            if not 0 <= i <= self.target_num_layers:
                raise ValueError(
                    f"aux layer id {i} is outside 0..{self.target_num_layers} "
                    "(aux ids as domino.aux.AuxCapture defines them)"
                )
        if not 0 < self.draft_vocab_size <= self.target_vocab_size:
            raise ValueError(
                f"draft_vocab_size must be in 1..{self.target_vocab_size}, got {self.draft_vocab_size}"
            )
        if not 0 <= self.mask_token_id < self.target_vocab_size:
            raise ValueError(f"mask_token_id {self.mask_token_id} is outside the verifier's embedding")

    @property
    def first_draft_slot(self) -> int:
        return first_draft_slot(self.shift_label)

    @property
    def drafts_per_step(self) -> int:
        return drafts_per_step(self.block_size, self.shift_label)

    @classmethod
    def from_verifier(cls, verifier_config, **fields) -> "DrafterConfig":
        rope = getattr(verifier_config, "rope_parameters", None) or {}
        theta = rope.get("rope_theta", getattr(verifier_config, "rope_theta", 10000.0))
        return cls(
            hidden_size=verifier_config.hidden_size,
            num_attention_heads=verifier_config.num_attention_heads,
            num_key_value_heads=verifier_config.num_key_value_heads,
            head_dim=getattr(verifier_config, "head_dim", None)
            or verifier_config.hidden_size // verifier_config.num_attention_heads,
            intermediate_size=verifier_config.intermediate_size,
            rms_norm_eps=verifier_config.rms_norm_eps,
            rope_theta=float(theta),
            max_position_embeddings=verifier_config.max_position_embeddings,
            target_vocab_size=verifier_config.vocab_size,
            target_num_layers=verifier_config.num_hidden_layers,
            target_model_type=getattr(verifier_config, "model_type", "") or "",
            **fields,
        )

    @classmethod
    def schema_defaults(cls, verifier_config, **fields) -> "DrafterConfig":
        """``from_verifier`` with the config schema's drafter defaults under ``fields``: a
        ``DrafterConfig`` for tests and tools (``aux_layer_ids``, ``draft_vocab_size``,
        ``mask_token_id``, ``projector`` and ``shift_label`` have no default and must be given)."""
        from .schema import section_defaults

        return cls.from_verifier(verifier_config, **{**section_defaults("drafter"), **fields})

    def qwen3_config(self) -> Qwen3Config:
        """A Qwen3Config with the drafter's dims, for the transformers building blocks."""
        return Qwen3Config(
            hidden_size=self.hidden_size,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            intermediate_size=self.intermediate_size,
            rms_norm_eps=self.rms_norm_eps,
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
            max_position_embeddings=self.max_position_embeddings,
            vocab_size=self.target_vocab_size,
            num_hidden_layers=self.num_layers,
            hidden_act="silu",
        )


# -----------------------------------------------------------------------------
# 2. KV-injection attention and the draft layer


class DraftAttention(nn.Module):
    """Qwen3 attention whose queries are block tokens and whose keys/values are ``[ctx ; block]``.

    The context keys/values come from the fused auxiliary states through this layer's own
    ``k_proj``/``v_proj`` (and ``k_norm``), the same projections the block tokens use.
    Which keys a query sees is decided by ``mask`` alone (None: every key).
    """

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.n_heads, self.n_kv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * self.hd, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.hd, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.hd, cfg.hidden_size, bias=False)
        self.q_norm = Qwen3RMSNorm(self.hd, eps=cfg.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.hd, eps=cfg.rms_norm_eps)
        self.impl = cfg.attn_implementation

    def _kv(self, x, cos, sin):
        # x (R, S, H) -> k, v (R, n_kv, S, hd), k rotated to its true positions
        R, S, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(R, S, self.n_kv, self.hd)).transpose(1, 2)
        v = self.v_proj(x).view(R, S, self.n_kv, self.hd).transpose(1, 2)
        k, _ = apply_rotary_pos_emb(k, k, cos, sin)
        return k, v

    def context_kv(self, ctx, cos, sin):
        """Keys/values of the context rows: ctx (R, T, H) -> (R, n_kv, T, hd) twice."""
        return self._kv(ctx, cos, sin)

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask=None):
        # x (R, S, H) block tokens; ctx_k/ctx_v (R, n_kv, T, hd); mask (R, 1, S, T+S) bool or None
        R, S, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(R, S, self.n_heads, self.hd)).transpose(1, 2)
        q, _ = apply_rotary_pos_emb(q, q, cos, sin)
        k_blk, v_blk = self._kv(x, cos, sin)
        k = torch.cat([ctx_k, k_blk], dim=2)  # (R, n_kv, T+S, hd)
        v = torch.cat([ctx_v, v_blk], dim=2)
        if self.impl == "eager":
            rep = self.n_heads // self.n_kv
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            scores = q @ k.transpose(-1, -2) / math.sqrt(self.hd)  # (R, h, S, T+S)
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            y = scores.softmax(-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(q.dtype) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return self.o_proj(y.transpose(1, 2).reshape(R, S, self.n_heads * self.hd))


class DraftLayer(nn.Module):
    """Pre-norm Qwen3 block (attention + SwiGLU MLP) with KV injection."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        qcfg = cfg.qwen3_config()
        self.input_layernorm = Qwen3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.self_attn = DraftAttention(cfg)
        self.post_attention_layernorm = Qwen3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.mlp = Qwen3MLP(qcfg)

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, ctx_k, ctx_v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


def in_block_mask(block_size: int, causal: bool, device=None) -> torch.Tensor:
    """(B, B) bool, True = attend: which slots of its own block slot ``q`` (row) sees.

    Bidirectional (``causal`` False): every slot sees all B slots of its block. Causal: slot
    ``q`` sees slots ``0..q`` (itself and the slots before it), never a later slot; this is
    speculators PR 685's block under a sliding window with ``sliding_window_non_causal`` off.
    The one definition of the in-block mask: ``draft_attention_mask`` tiles it for training,
    ``inference_attention_mask`` places it after the context cache at inference."""
    every = torch.ones(block_size, block_size, dtype=torch.bool, device=device)
    return every.tril() if causal else every


def draft_attention_mask(doc_ids: torch.Tensor, anchors: torch.Tensor, block_size: int,
                         sliding_window: int | None = None, block_causal: bool = False) -> torch.Tensor:
    """(R, 1, N*B, T + N*B) bool, True = attend: the keys each block query sees in training.

    doc_ids (R, T) document of each packed row position; anchors (R, N). Keys are the T context
    rows, then the N blocks' B slots. Every slot of the block anchored at row ``a`` sees
    context row ``p`` when ``p`` is in ``a``'s document and ``p < a`` (strictly before the
    anchor), and, with a sliding window ``W``, ``p >= a - W``: the W rows before the anchor,
    the same rows for every slot of the block (speculators' ``kv_pos >= anchor - window``).
    Rows of one document are consecutive positions, so at inference the window is the last W
    entries of the context cache. Within its own block a slot sees the slots ``in_block_mask``
    gives it (all B, or with ``block_causal`` slots 0..k), whatever the window; it never sees
    another block.
    """
    R, T = doc_ids.shape
    N, B = anchors.shape[1], block_size
    p = torch.arange(T, device=doc_ids.device)
    a = anchors[..., None]  # (R, N, 1)
    anchor_doc = doc_ids.gather(1, anchors)  # (R, N)
    ctx = (p < a) & (doc_ids[:, None, :] == anchor_doc[..., None])  # (R, N, T)
    if sliding_window is not None:
        ctx = ctx & (p >= a - sliding_window)
    ctx = ctx[:, :, None, :].expand(R, N, B, T).reshape(R, N * B, T)
    own = torch.arange(N, device=doc_ids.device).repeat_interleave(B)
    blk = own[:, None] == own[None, :]  # (N*B, N*B): a slot sees its own block only
    if block_causal:  # and within it what in_block_mask gives (all of it when bidirectional)
        blk = blk & in_block_mask(B, True, doc_ids.device).repeat(N, N)
    blk = blk.expand(R, N * B, N * B)
    return torch.cat([ctx, blk], dim=-1)[:, None]


def inference_attention_mask(n_context: int, block_size: int, block_causal: bool, device=None) -> torch.Tensor | None:
    """(1, 1, B, n_context + B) bool, True = attend, for one block at inference; None (every key)
    for a bidirectional block. The context cache holds exactly the rows the block may see (the
    document before the anchor, cut to the window), so every slot sees all of it; within the
    block the slots see what ``in_block_mask`` gives them, as in training."""
    if not block_causal:
        return None
    ctx = torch.ones(block_size, n_context, dtype=torch.bool, device=device)
    return torch.cat([ctx, in_block_mask(block_size, True, device)], dim=-1)[None, None]


# -----------------------------------------------------------------------------
# 3. The Domino correction head


class DominoHead(nn.Module):
    """GRU over the tokens before each prediction + low-rank residual on the base logits.

    ``correction = W2 SiLU(W1 [z_k ; s_k])``, with ``z_k`` the backbone output of slot k after
    the final norm and ``s_k`` the GRU state after reading the embeddings of every token
    before slot k's prediction (initial state 0). All layers are bias-free.
    """

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.gru = nn.GRU(cfg.hidden_size, cfg.gru_hidden_size, num_layers=1, bias=False, batch_first=True)
        self.down = nn.Linear(cfg.hidden_size + cfg.gru_hidden_size, cfg.bottleneck_size, bias=False)
        self.up = nn.Linear(cfg.bottleneck_size, cfg.draft_vocab_size, bias=False)

    def correction(self, z, s):
        # z (..., H), s (..., G) -> (..., Vd)
        return self.up(F.silu(self.down(torch.cat([z, s], dim=-1))))

    def teacher_forced_states(self, token_emb, shift_label: bool):
        """GRU states for every slot from the known tokens ``u_j = x[a+j]``.

        token_emb (M, B, H) embeds ``x[a], ..., x[a+B-1]``. Slot k predicts ``x[a+k+shift]``
        so its state has read ``u_0 .. u_{k+shift-1}``: with shift that is the GRU output at
        step k, without shift the output at step k-1 (zeros for slot 0).
        """
        out, _ = self.gru(token_emb)  # (M, B, G): out[:, j] has read u_0..u_j
        if shift_label:
            return out
        return torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], dim=1)

    @staticmethod
    def gru_step(gi_ru, gi_n, gh_ru, gh_n, h):
        """One step of the bias-free GRU for N rows, its products split by gate as PyTorch orders
        them: gi_ru and gh_ru (N, 2G) are the reset and update rows of ``W_ih x`` and ``W_hh h``,
        gi_n and gh_n (N, G) their new-gate rows; h (N, G) -> the next state, as ``nn.GRU``
        computes it."""
        r, u = torch.sigmoid_(gi_ru + gh_ru).chunk(2, dim=1)
        new = torch.tanh_(torch.addcmul(gi_n, r, gh_n))
        return torch.lerp(new, h, u)  # new + u * (h - new)


@dataclass(frozen=True)
class DecodeTables:
    """A Domino head's weights as decoding reads them, with the products it looks up instead of
    computing per slot. One implementation of the decode-time correction (``draft_in_order``)
    serves the project's loop (``Drafter.decode_tables``) and vLLM's plugin
    (``domino.vllm.plugin``), so both round alike in every dtype.

    ``z_weight`` (r, H) is W1's backbone half, ``up`` (r, Vd) W2 transposed, ``anchor_weight``
    (3G, H) the GRU's ``W_ih``; ``state`` (G, r + 3G) is ``[W1_s ; W_hh]^T`` and ``inputs``
    (Vd, 3G) the GRU's ``W_ih e`` of every draft-vocabulary token's embedding, in draft-id order.
    They are copies of the weights as they were when built: a decoding session
    (``domino.decode.NeuralDraft``) builds them once, from the trained weights. The module keeps
    none, so nothing can go stale after an optimizer step or a load, and ``.to()``, ``deepcopy``
    and pickling carry no hidden table.
    """

    z_weight: torch.Tensor
    up: torch.Tensor
    anchor_weight: torch.Tensor
    state: torch.Tensor
    inputs: torch.Tensor

    @classmethod
    @torch.no_grad()
    def from_weights(cls, w_ih, w_hh, w_down, w_up, vocab_emb) -> "DecodeTables":
        """From a bias-free GRU's ``weight_ih_l0`` (3G, H) and ``weight_hh_l0`` (3G, G), the
        bottleneck's weight (r, H + G) over ``[z ; s]``, the up projection's (Vd, r) and the
        draft vocabulary's token embeddings (Vd, H), in draft-id order."""
        H = w_ih.shape[1]
        return cls(z_weight=w_down[:, :H].clone(), up=w_up.t().clone(), anchor_weight=w_ih.clone(),
                   state=torch.cat([w_down[:, H:], w_hh]).t().contiguous(),
                   inputs=F.linear(vocab_emb.to(w_ih.dtype), w_ih))

    @torch.no_grad()
    def draft_in_order(self, z, base, corrected_from: int, anchor_emb, choose):
        """Inference: the draft-vocabulary ids of n consecutive drafting slots of N blocks, one
        slot at a time.

        z (N, n, H) backbone outputs and base (N, n, Vd) logits of each block's drafting slots
        in order; drafting slot i is corrected when ``i >= corrected_from``. The GRU state of
        slot i has read the anchor (``anchor_emb`` (N, H)) and the drafts of slots 0..i-1, in
        order: the state ``DominoHead.teacher_forced_states`` gives slot i in training when those
        drafts are the known tokens. ``choose(logits (N, Vd)) -> (N,)`` picks a slot's ids
        (argmax, or a sampler). Returns ids (N, n) and final logits (N, n, Vd).

        The arithmetic of ``DominoHead.correction`` and of the GRU, arranged so that a slot
        costs a dozen small operations: the bottleneck's input splits as
        ``W1 [z ; s] = W1_z z + W1_s s``, and ``W1_z z`` does not depend on the drafts, so it is
        computed for every slot at once; the state's two products ``W1_s s`` (this slot's
        correction, ``W1_z z`` added in the same call) and ``W_hh s`` (the next GRU step) come
        from one matrix product (``state``), split by gate in one call; a drafted token's
        ``W_ih e`` is looked up in ``inputs``; the GRU step is written out
        (``DominoHead.gru_step``) rather than run through ``torch.gru_cell``, which costs more
        than the rest of the slot at these sizes. The ids stay on the device; the caller reads
        them once per block.
        """
        N, n, H = z.shape
        G, r = self.state.shape[0], self.z_weight.shape[0]
        parts = [r, 2 * G, G]  # a state's product: W1_s s | W_hh s, reset and update rows | W_hh s, new rows
        # one product per slot: [z_part ; 0] + s @ [W1_s ; W_hh]^T = [W1 [z ; s] ; W_hh s], (N, r + 3G)
        z_rows = F.pad(F.linear(z, self.z_weight), (0, 3 * G))  # (N, n, r + 3G)
        zeros = z.new_zeros(N, 3 * G)
        gru_step = DominoHead.gru_step
        h = gru_step(*F.linear(anchor_emb, self.anchor_weight).split(parts[1:], 1),  # read the anchor
                     *zeros.split(parts[1:], 1), zeros[:, :G])
        ids, rows = [], []
        for i in range(n):
            bottleneck, gh_ru, gh_n = torch.addmm(z_rows[:, i], h, self.state).split(parts, 1)
            logits = base[:, i]
            if i >= corrected_from:
                logits = torch.addmm(logits, F.silu(bottleneck), self.up)
            tok = choose(logits)  # (N,)
            ids.append(tok)
            rows.append(logits)
            if i + 1 < n:  # the next slot's state reads this draft
                h = gru_step(*F.embedding(tok, self.inputs).split(parts[1:], 1), gh_ru, gh_n, h)
        return torch.stack(ids, 1), torch.stack(rows, 1)


# -----------------------------------------------------------------------------
# 4. The drafter


class Drafter(nn.Module):
    """DFlash backbone (+ optional Domino head) drafting one block from the verifier's features."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.cfg = cfg
        H, A = cfg.hidden_size, len(cfg.aux_layer_ids)
        # frozen copies of the verifier's embedding and of its lm_head rows for the draft vocab
        self.embed_tokens = nn.Embedding(cfg.target_vocab_size, H)
        self.embed_tokens.weight.requires_grad_(False)
        self.fc = nn.Linear(A * H, H, bias=False)
        self.hidden_norm = Qwen3RMSNorm(H, eps=cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = Qwen3RMSNorm(H, eps=cfg.rms_norm_eps)
        self.lm_head = nn.Linear(H, cfg.draft_vocab_size, bias=False)
        self.lm_head.weight.requires_grad_(False)
        self.rotary_emb = Qwen3RotaryEmbedding(cfg.qwen3_config())
        self.head = DominoHead(cfg) if cfg.projector == "domino" else None
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(cfg.target_vocab_size, dtype=torch.bool))
        if cfg.init == "hf":
            self.init_hf(cfg.init_std)

    def init_hf(self, std: float) -> None:
        """Hugging Face's ``_init_weights`` on the trainable parts: every ``nn.Linear`` weight of
        ``fc``, the draft layers and the Domino head drawn from normal(0, std) (torch's global
        generator, module order), biases zero (there are none); RMSNorm weights stay ones. The
        GRU keeps PyTorch's init, as ``_init_weights`` leaves ``nn.GRU`` alone; the frozen
        embedding and lm_head are overwritten by the verifier's in ``from_verifier``."""
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear) and module is not self.lm_head:
                    module.weight.normal_(0.0, std)
                    if module.bias is not None:
                        module.bias.zero_()

    def _apply(self, fn, *args, **kwargs):
        # RoPE frequencies stay float32 whatever dtype the weights are cast to: in bf16 they
        # would misplace far positions by whole radians
        out = super()._apply(fn, *args, **kwargs)
        dev = self.rotary_emb.inv_freq.device
        if self.rotary_emb.inv_freq.dtype != torch.float32:
            freq, _ = Qwen3RotaryEmbedding.compute_default_rope_parameters(self.cfg.qwen3_config())
            self.rotary_emb.inv_freq = freq.to(dev)
            self.rotary_emb.original_inv_freq = freq.to(dev).clone()
        return out

    # --- building from a verifier ------------------------------------------------------

    @classmethod
    def from_verifier(cls, verifier, cfg: DrafterConfig, d2t: torch.Tensor, t2d: torch.Tensor) -> "Drafter":
        """A fresh drafter whose frozen embedding and lm_head rows are copied from ``verifier``."""
        model = cls(cfg)
        from .vocab import target_ids

        draft_ids = target_ids(d2t)
        with torch.no_grad():
            model.embed_tokens.weight.copy_(verifier.get_input_embeddings().weight.float())
            model.lm_head.weight.copy_(verifier.get_output_embeddings().weight[draft_ids].float())
            model.d2t.copy_(d2t)
            model.t2d.copy_(t2d)
        return model

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    @torch.no_grad()
    def decode_tables(self) -> DecodeTables | None:
        """The Domino head's decoding tables from the weights as they are now; None without a head."""
        if self.head is None:
            return None
        ids = self.draft_to_target(torch.arange(self.cfg.draft_vocab_size, device=self.d2t.device))
        h = self.head
        return DecodeTables.from_weights(h.gru.weight_ih_l0, h.gru.weight_hh_l0, h.down.weight, h.up.weight,
                                         self.embed_tokens.weight[ids])

    # --- the shared pieces ----------------------------------------------------------------

    def fuse_context(self, aux: torch.Tensor) -> torch.Tensor:
        """aux (R, T, A*H) concatenated auxiliary states -> ctx (R, T, H)."""
        return self.hidden_norm(self.fc(aux))

    def context_kv(self, ctx: torch.Tensor, positions: torch.Tensor):
        """Per-layer context keys/values, ctx (R, T, H) at positions (R, T)."""
        cos, sin = self.rotary_emb(ctx, positions)
        return [layer.self_attn.context_kv(ctx, cos, sin) for layer in self.layers]

    def backbone(self, block_ids, block_pos, ctx_kv, mask=None):
        """block_ids/block_pos (R, S) -> z (R, S, H) after the final norm.

        Without ``mask`` (inference: ``ctx_kv`` holds the positions just before the block's
        anchor, in order) a ``sliding_window`` W keeps the last W context entries only, and the
        block sees itself through ``inference_attention_mask``, as ``draft_attention_mask``
        has it in training."""
        W = self.cfg.sliding_window
        if mask is None:
            if W is not None:
                ctx_kv = [(k[:, :, -W:], v[:, :, -W:]) for k, v in ctx_kv]
            n_ctx = ctx_kv[0][0].shape[2] if ctx_kv else 0
            mask = inference_attention_mask(n_ctx, block_ids.shape[1], self.cfg.block_causal, block_ids.device)
        x = self.embed_tokens(block_ids).to(self.fc.weight.dtype)
        cos, sin = self.rotary_emb(x, block_pos)
        for layer, (k, v) in zip(self.layers, ctx_kv):
            x = layer(x, cos, sin, k, v, mask)
        return self.norm(x)

    # --- training ---------------------------------------------------------------------------

    def forward_train(self, input_ids, position_ids, doc_ids, aux, anchors):
        """Teacher-forced forward at N anchors of each packed row.

        input_ids, position_ids, doc_ids: (R, T); aux: (R, T, A*H); anchors: (R, N) long.
        position_ids restart at 0 in each document; doc_ids tell documents apart.
        Returns base and final logits, both (R, N, B, Vd); final is base for ``dflash``.
        """
        cfg = self.cfg
        R, T = input_ids.shape
        N, B = anchors.shape[1], cfg.block_size
        slot = torch.arange(B, device=input_ids.device)
        blk_tok_pos = anchors[..., None] + slot  # (R, N, B) row index of x[a+k]
        blk_tok_pos = blk_tok_pos.clamp(max=T - 1)
        # block input [x_a, MASK, ..., MASK] at true positions pos(a) + k
        block_ids = torch.full((R, N, B), cfg.mask_token_id, dtype=torch.long, device=input_ids.device)
        block_ids[..., 0] = input_ids.gather(1, anchors)
        block_pos = position_ids.gather(1, anchors)[..., None] + slot
        mask = draft_attention_mask(doc_ids, anchors, B, cfg.sliding_window, cfg.block_causal)  # (R, 1, N*B, T+N*B)

        ctx = self.fuse_context(aux)
        z = self.backbone(block_ids.view(R, N * B), block_pos.view(R, N * B),
                          self.context_kv(ctx, position_ids), mask)  # (R, N*B, H)
        base = self.lm_head(z).view(R, N, B, -1)
        if self.head is None:
            return base, base
        # teacher forcing: the GRU reads the ground-truth tokens x[a], x[a+1], ...
        known = self.embed_tokens(input_ids.gather(1, blk_tok_pos.view(R, N * B))).view(R * N, B, -1)
        states = self.head.teacher_forced_states(known.to(z.dtype), cfg.shift_label).view(R, N, B, -1)
        corr = self.head.correction(z.view(R, N, B, -1), states)
        keep = (slot >= cfg.correct_from).to(base.dtype)[:, None]  # (B, 1)
        return base, base + corr * keep

    # --- inference --------------------------------------------------------------------------

    @torch.no_grad()
    def draft(self, anchor: int, anchor_pos: int, ctx_kv, n_slots: int | None = None, return_logits: bool = False,
              pick_token=None, tables: DecodeTables | None = None):
        """Draft one block after ``anchor``, which stands at position ``anchor_pos``.

        ctx_kv: per-layer context keys/values of positions 0..anchor_pos-1 (batch 1).
        Returns the drafted target-vocabulary ids for positions anchor_pos+1, anchor_pos+2, ...
        (B with shift_label, B-1 without), capped at ``n_slots`` drafts if given; with
        ``return_logits`` also the final draft-vocabulary logits of those slots (n, Vd).
        ``pick_token(logits (k, Vd)) -> (k,) long`` chooses the draft-vocabulary ids of k
        consecutive slots (a sampler, say; argmax when None), in slot order: all slots at
        once without a correction head, one slot at a time with it, so that the Domino head
        reads the tokens so chosen. ``tables``: the head's ``decode_tables``, built once by a
        decoding session; built here from the current weights when not given.
        """
        cfg = self.cfg
        dev = self.fc.weight.device
        B = cfg.block_size
        block_ids = torch.full((1, B), cfg.mask_token_id, dtype=torch.long, device=dev)
        block_ids[0, 0] = anchor
        block_pos = torch.arange(anchor_pos, anchor_pos + B, device=dev)[None]
        first = cfg.first_draft_slot
        last = B if n_slots is None else min(B, first + n_slots)
        z = self.backbone(block_ids, block_pos, ctx_kv)[0, first:last]  # (n, H): the drafting slots
        base = self.lm_head(z)  # (n, Vd)
        if self.head is None or cfg.correct_from >= last:
            ids, logits = (base.argmax(-1) if pick_token is None else pick_token(base)), base
        else:
            choose = (lambda rows: rows.argmax(-1)) if pick_token is None else pick_token
            # the correction reads the anchor and then each drafted token, so slots go in order
            ids, logits = (tables or self.decode_tables()).draft_in_order(
                z[None], base[None], cfg.correct_from - first, self.embed_tokens(block_ids[0, :1]).to(z.dtype), choose)
            ids, logits = ids[0], logits[0]
        drafts = self.draft_to_target(ids).tolist()
        return (drafts, logits) if return_logits else drafts

    # --- saving and loading ----------------------------------------------------------------

    def save(self, directory: str | Path) -> None:
        """Write ``drafter_config.json``, sealed (the card reads it only with its seal), and
        ``model.safetensors`` (frozen copies included)."""
        from .io import save_safetensors, write_json

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        save_safetensors(state, directory / "model.safetensors")  # with the sha256 that load checks
        write_json(directory / "drafter_config.json", asdict(self.cfg), seal=True)

    @classmethod
    def load(cls, directory: str | Path, attn_implementation: str | None = None) -> "Drafter":
        from .io import load_safetensors, read_json

        directory = Path(directory)
        fields = read_json(directory / "drafter_config.json", "drafter config")
        if attn_implementation:
            fields["attn_implementation"] = attn_implementation
        state = load_safetensors(directory / "model.safetensors", "drafter checkpoint")
        model = cls(DrafterConfig(**fields)).to(state["fc.weight"].dtype)
        model.load_state_dict(state)
        return model

