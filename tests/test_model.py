"""Alignment of the training forward with the inference drafter, and model plumbing."""

import pytest
import torch

from conftest import tiny_drafter, tiny_verifier
from domino.decode import NeuralDraft
from domino.verifier import aux_states


def _row_with_two_docs(verifier, drafter, a_in_doc, doc0_len=7, doc1_len=30, seed=3):
    """A packed row [doc0 | doc1]; aux states are the verifier's, per document."""
    g = torch.Generator().manual_seed(seed)
    V = verifier.config.vocab_size
    d0 = torch.randint(0, V - 1, (doc0_len,), generator=g)
    d1 = torch.randint(0, V - 1, (doc1_len,), generator=g)
    ids = torch.cat([d0, d1])[None]
    pos = torch.cat([torch.arange(doc0_len), torch.arange(doc1_len)])[None]
    doc = torch.cat([torch.zeros(doc0_len), torch.ones(doc1_len)]).long()[None]
    with torch.no_grad():
        aux = torch.cat([
            aux_states(verifier, d[None], drafter.cfg.aux_layer_ids)
            for d in (d0, d1)
        ], dim=1)
    return ids, pos, doc, aux, doc0_len + a_in_doc


@pytest.mark.parametrize("projector,shift,correct_from", [
    ("dflash", True, 1), ("dflash", False, 1), ("domino", True, 1), ("domino", True, 0), ("domino", False, 1),
])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_training_forward_matches_inference(verifier, projector, shift, correct_from, attn):
    drafter = tiny_drafter(verifier, projector=projector, shift_label=shift, correct_from=correct_from, attn=attn)
    B = drafter.cfg.block_size
    a_in_doc = 11
    ids, pos, doc, aux, a = _row_with_two_docs(verifier, drafter, a_in_doc)

    # inference: context = this document's positions 0 .. a_in_doc-1, the anchor at a_in_doc
    session = NeuralDraft(drafter)
    session.reset(a_in_doc)
    session.add_context(aux[:, a - a_in_doc: a], 0)
    drafts, inf_logits = drafter.draft(int(ids[0, a]), a_in_doc, session.kv, return_logits=True)
    assert len(drafts) == drafter.cfg.drafts_per_step

    # teacher forcing with the drafted tokens as the ground truth after the anchor
    first = drafter.cfg.first_draft_slot
    forced = ids.clone()
    for j, tok in enumerate(drafts):  # drafts[j] stands at position a+1+j in both conventions
        forced[0, a + 1 + j] = tok
    base, final = drafter.forward_train(forced, pos, doc, aux, torch.tensor([[a, 3]]))
    train_logits = final[0, 0, first:]
    torch.testing.assert_close(train_logits, inf_logits, rtol=1e-9, atol=1e-9)
    if projector == "dflash":
        assert torch.equal(base, final)


def test_context_excludes_anchor_and_other_documents(verifier):
    """Changing aux states at or after the anchor, or in another document, leaves the logits alone."""
    drafter = tiny_drafter(verifier, projector="dflash")
    ids, pos, doc, aux, a = _row_with_two_docs(verifier, drafter, 9)
    anchors = torch.tensor([[a]])
    ref, _ = drafter.forward_train(ids, pos, doc, aux, anchors)
    poked = aux.clone()
    poked[0, a:] += 5.0  # the anchor's own state and everything after
    poked[0, :7] -= 3.0  # the other document
    out, _ = drafter.forward_train(ids, pos, doc, poked, anchors)
    torch.testing.assert_close(out, ref)
    poked[0, a - 1] += 1.0  # the last context row does matter
    out, _ = drafter.forward_train(ids, pos, doc, poked, anchors)
    assert not torch.allclose(out, ref)


def test_blocks_do_not_see_each_other(verifier):
    drafter = tiny_drafter(verifier, projector="dflash")
    ids, pos, doc, aux, a = _row_with_two_docs(verifier, drafter, 9)
    alone, _ = drafter.forward_train(ids, pos, doc, aux, torch.tensor([[a]]))
    together, _ = drafter.forward_train(ids, pos, doc, aux, torch.tensor([[a, a + 5, 10]]))
    torch.testing.assert_close(together[:, :1], alone)


def test_save_load_roundtrip(tmp_path, verifier):
    from domino.model import Drafter

    drafter = tiny_drafter(verifier, projector="domino")
    drafter.save(tmp_path / "ckpt")
    again = Drafter.load(tmp_path / "ckpt").to(verifier.dtype)
    for (k, v), (k2, v2) in zip(drafter.state_dict().items(), again.state_dict().items()):
        assert k == k2 and torch.equal(v, v2)
    assert again.cfg == drafter.cfg


def test_frozen_copies_match_verifier(verifier):
    drafter = tiny_drafter(verifier)
    tid = drafter.draft_to_target(torch.arange(drafter.cfg.draft_vocab_size))
    torch.testing.assert_close(drafter.lm_head.weight, verifier.lm_head.weight[tid])
    assert not drafter.embed_tokens.weight.requires_grad and not drafter.lm_head.weight.requires_grad


@pytest.mark.parametrize("bad", [dict(block_size=1), dict(aux_layer_ids=[9]), dict(draft_vocab_size=10_000),
                                 dict(projector="medusa"), dict(mask_token_id=500)])
def test_config_refuses_bad_values(bad):
    from domino.model import DrafterConfig

    v = tiny_verifier()
    base = dict(aux_layer_ids=[1], draft_vocab_size=32, mask_token_id=95)
    base.update(bad)
    with pytest.raises(ValueError):
        DrafterConfig.from_verifier(v.config, **base)


def test_rope_frequencies_stay_float32_when_cast():
    from conftest import tiny_verifier

    v = tiny_verifier(dtype=torch.float32)
    d = tiny_drafter(v, attn="sdpa").float()
    ref = d.rotary_emb.inv_freq.clone()
    d = d.to(torch.bfloat16)
    assert d.rotary_emb.inv_freq.dtype == torch.float32
    torch.testing.assert_close(d.rotary_emb.inv_freq, ref)


def test_aux_id_L_is_the_last_layer_before_the_final_norm(verifier):
    """vLLM's (and speculators') aux id L is the last layer's raw output; transformers' own
    hidden_states[L] is after the final norm. Ids below L are transformers' hidden_states[i]."""
    L = verifier.config.num_hidden_layers
    ids = torch.arange(1, 12)[None]
    with torch.no_grad():
        out = verifier.model(input_ids=ids, output_hidden_states=True)
    H = verifier.config.hidden_size
    aux = aux_states(verifier, ids, [1, L, 0])
    torch.testing.assert_close(aux[..., :H], out.hidden_states[1])
    torch.testing.assert_close(aux[..., 2 * H:], out.hidden_states[0])
    last = aux[..., H:2 * H]
    torch.testing.assert_close(verifier.model.norm(last), out.last_hidden_state)
    assert not torch.allclose(last, out.hidden_states[L])
