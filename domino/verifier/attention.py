"""The verifier's attention: transformers' SDPA, with grouped key/value heads left grouped under a
mask on a CPU.

transformers' ``sdpa`` function repeats each key/value head for its query heads (``repeat_kv``:
a copy of the layer's whole cache, every forward) whenever a mask comes with a grouped-query
model on a CPU or CUDA device; without a mask it asks SDPA for grouped heads (``enable_gqa``),
and a one-row query packs the groups instead. So a plain decoding step (one row, no mask) never
pays the copy and a speculative verify forward (1 + B rows after the cache, a causal mask)
always does. torch's CPU SDPA takes a mask and grouped heads together, so ``grouped_sdpa`` asks
it for that in exactly the case the copy would happen on a CPU, and hands every other case to
transformers' own function unchanged. Both give the same logits bit for bit (the test
compares them); the verify forward is cheaper by the copy (``docs/speed.md``).

``GROUPED_SDPA`` is registered with transformers' public ``AttentionInterface``, with the mask
of ``sdpa`` (``AttentionMaskInterface``), so a model loaded with
``attn_implementation=GROUPED_SDPA`` builds exactly the masks ``sdpa`` would.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

GROUPED_SDPA = "domino_grouped_sdpa"


def grouped_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                 is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """query (b, h, q, d), key and value (b, h_kv, k, d), attention_mask (b, 1, q, k) or None;
    returns (b, q, h, d) as transformers' ``sdpa_attention_forward`` does."""
    grouped = getattr(module, "num_key_value_groups", 1) > 1
    if (query.device.type != "cpu" or attention_mask is None or not grouped or dropout
            or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None
            or kwargs.get("output_attentions")):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    # the mask says which keys each row sees (the cache and the rows up to its own), so no is_causal
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(GROUPED_SDPA, grouped_sdpa)
AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)
