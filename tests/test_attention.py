"""The verifier's attention (domino.verifier.attention): the same logits as transformers' sdpa, bit for bit,
without repeating the key/value heads under a mask on a CPU."""

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache
from transformers.integrations import sdpa_attention

from conftest import tiny_verifier
from domino.decode import cache_kwarg
from domino.verifier.attention import GROUPED_SDPA
from domino.verifier.load import load_verifier


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The same float32 weights loaded twice: by load_verifier, and with transformers' sdpa."""
    d = tmp_path_factory.mktemp("verifier")
    tiny_verifier(dtype=torch.float32).save_pretrained(d)
    ours = load_verifier(str(d))
    stock = AutoModelForCausalLM.from_pretrained(d, attn_implementation="sdpa").eval()
    assert ours.config._attn_implementation == GROUPED_SDPA and stock.config._attn_implementation == "sdpa"
    return ours, stock


@pytest.fixture
def repeats(monkeypatch):
    """How many times transformers' sdpa repeats key/value heads."""
    calls = []
    stock = sdpa_attention.repeat_kv
    monkeypatch.setattr(sdpa_attention, "repeat_kv", lambda *a: calls.append(1) or stock(*a))
    return calls


def forward_after_cache(model, context, rows, repeats):
    """Logits of ``rows`` new tokens after a cache of ``context``, as a verify (rows > 1) or a plain
    step (rows == 1) computes them, and how many times that forward repeated heads."""
    cache, ck = DynamicCache(config=model.config), cache_kwarg(model)
    with torch.no_grad():
        model(input_ids=context, **{ck: cache}, use_cache=True)
        before = len(repeats)
        return model(input_ids=rows, **{ck: cache}, use_cache=True).logits, len(repeats) - before


@pytest.mark.parametrize("rows", [1, 2, 9])
def test_same_logits_as_sdpa_after_a_cache(pair, repeats, rows):
    ours, stock = pair
    g = torch.Generator().manual_seed(rows)
    context, new = torch.randint(0, 96, (1, 40), generator=g), torch.randint(0, 96, (1, rows), generator=g)
    theirs, stock_repeats = forward_after_cache(stock, context, new, repeats)
    mine, our_repeats = forward_after_cache(ours, context, new, repeats)
    assert torch.equal(mine, theirs)
    # several rows after a cache carry a mask: sdpa repeats the heads in every layer, grouped_sdpa
    # never; one row has no mask and neither repeats
    assert stock_repeats == (2 * stock.config.num_hidden_layers if rows > 1 else 0)  # keys and values
    assert our_repeats == 0


def test_same_logits_as_sdpa_on_a_padded_batch(pair, repeats):
    ours, stock = pair
    ids = torch.randint(0, 96, (2, 24), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :7] = 0  # left padding
    with torch.no_grad():
        a = ours(input_ids=ids, attention_mask=mask).logits
        n = len(repeats)
        b = stock(input_ids=ids, attention_mask=mask).logits
    assert n == 0 and len(repeats) > 0
    assert torch.equal(a[0], b[0]) and torch.equal(a[1, 7:], b[1, 7:])
