"""Alignment of the training forward with the inference drafter, and model plumbing."""

import pytest
import torch

from conftest import tiny_drafter, tiny_verifier
from domino.aux import aux_states
from domino.decode import NeuralDraft


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
@pytest.mark.parametrize("block_causal", [False, True])
def test_training_forward_matches_inference(verifier, projector, shift, correct_from, attn, block_causal):
    drafter = tiny_drafter(verifier, projector=projector, shift_label=shift, correct_from=correct_from, attn=attn)
    if block_causal:
        drafter = _with(drafter, block_causal=True)
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
    assert train_logits.argmax(-1).tolist() == inf_logits.argmax(-1).tolist()
    if projector == "dflash":
        assert torch.equal(base, final)


def _with(drafter, **changes):
    """The same weights under another config (a causal block, a window)."""
    from dataclasses import replace

    from domino.model import Drafter

    other = Drafter(replace(drafter.cfg, **changes)).to(drafter.fc.weight.dtype).eval()
    other.load_state_dict(drafter.state_dict())
    return other


def test_causal_block_mask_against_a_hand_built_reference():
    """Two blocks of B = 3 at anchors 4 and 2 of one document: each slot sees the context rows
    before its anchor and, with block_causal, slots 0..k of its own block; without it, all three."""
    from domino.model import draft_attention_mask, in_block_mask, inference_attention_mask

    assert in_block_mask(3, True).tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert in_block_mask(3, False).all()
    doc = torch.zeros(1, 6, dtype=torch.long)
    mask = draft_attention_mask(doc, torch.tensor([[4, 2]]), 3, block_causal=True)[0, 0].int().tolist()
    #            context rows 0-5    block 0   block 1
    reference = [[1, 1, 1, 1, 0, 0,  1, 0, 0,  0, 0, 0],
                 [1, 1, 1, 1, 0, 0,  1, 1, 0,  0, 0, 0],
                 [1, 1, 1, 1, 0, 0,  1, 1, 1,  0, 0, 0],
                 [1, 1, 0, 0, 0, 0,  0, 0, 0,  1, 0, 0],
                 [1, 1, 0, 0, 0, 0,  0, 0, 0,  1, 1, 0],
                 [1, 1, 0, 0, 0, 0,  0, 0, 0,  1, 1, 1]]
    assert mask == reference
    bidir = draft_attention_mask(doc, torch.tensor([[4, 2]]), 3)[0, 0].int().tolist()
    assert bidir == [row[:6] + ([1, 1, 1, 0, 0, 0] if q < 3 else [0, 0, 0, 1, 1, 1]) for q, row in enumerate(reference)]
    # inference: the whole cache (the rows the block may see), then the same in-block mask
    inf = inference_attention_mask(4, 3, True)[0, 0].int().tolist()
    assert inf == [[1, 1, 1, 1] + r for r in ([1, 0, 0], [1, 1, 0], [1, 1, 1])]
    assert inference_attention_mask(4, 3, False) is None


def test_a_causal_slot_ignores_the_slots_after_it(verifier):
    """With block_causal the last slot's input can change without moving any earlier slot; a
    bidirectional block's earlier slots move with it."""
    from domino.model import Drafter

    bidir = tiny_drafter(verifier, projector="dflash")
    causal = _with(bidir, block_causal=True)
    ids, pos, doc, aux, a = _row_with_two_docs(verifier, bidir, 9)
    B = bidir.cfg.block_size
    session = NeuralDraft(causal)
    session.reset(9)
    session.add_context(aux[:, a - 9: a], 0)
    blk = torch.full((1, B), bidir.cfg.mask_token_id)
    blk[0, 0] = ids[0, a]
    blk_pos = torch.arange(9, 9 + B)[None]
    poked = blk.clone()
    poked[0, -1] = 5
    for model, earlier_move in ((causal, False), (bidir, True)):
        z = Drafter.backbone(model, blk, blk_pos, session.kv)
        z2 = Drafter.backbone(model, poked, blk_pos, session.kv)
        assert (not torch.allclose(z[0, :-1], z2[0, :-1])) is earlier_move
        assert not torch.allclose(z[0, -1], z2[0, -1])


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


@pytest.mark.parametrize("bad,match", [
    (dict(aux_layer_ids=[9]), "aux layer id 9"), (dict(draft_vocab_size=10_000), "draft_vocab_size"),
    (dict(mask_token_id=500), "mask_token_id"),
])
def test_config_refuses_values_beyond_the_verifier(bad, match):
    """What the config schema cannot know: the verifier's layers, vocabulary and embedding rows."""
    from domino.model import DrafterConfig

    v = tiny_verifier()
    base = dict(aux_layer_ids=[1], draft_vocab_size=32, mask_token_id=95, projector="domino", shift_label=True)
    base.update(bad)
    with pytest.raises(ValueError, match=match):
        DrafterConfig.schema_defaults(v.config, **base)


def test_attention_mask_with_a_sliding_window():
    """Row 7's block (document 1 starts at row 2) with W = 3 sees context rows 4, 5, 6; row 3's
    block sees row 2 only (its document's first row); each block sees its own slots only."""
    from domino.model import draft_attention_mask

    doc = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1, 1, 1]])
    anchors = torch.tensor([[7, 3]])
    B, T = 2, doc.shape[1]
    mask = draft_attention_mask(doc, anchors, B, sliding_window=3)
    assert mask.shape == (1, 1, 4, T + 4)
    ctx = mask[0, 0, :, :T]
    for q, seen in zip(range(4), ([4, 5, 6], [4, 5, 6], [2], [2])):
        assert ctx[q].nonzero().flatten().tolist() == seen, q
    assert mask[0, 0, :, T:].tolist() == [[True, True, False, False]] * 2 + [[False, False, True, True]] * 2
    full = draft_attention_mask(doc, anchors, B)
    assert full[0, 0, 0, :T].nonzero().flatten().tolist() == [2, 3, 4, 5, 6]  # no window: the whole document
    assert torch.equal(draft_attention_mask(doc, anchors, B, sliding_window=100), full)


@pytest.mark.parametrize("projector,shift", [("domino", True), ("dflash", False)])
def test_sliding_window_training_matches_inference(verifier, projector, shift):
    """W = 4 < the 11 context positions: inference keeps the last 4 cached positions, training
    masks the rest, and context further back no longer matters."""
    from dataclasses import replace

    from domino.model import Drafter

    full = tiny_drafter(verifier, projector=projector, shift_label=shift)
    drafter = Drafter(replace(full.cfg, sliding_window=4)).to(verifier.dtype).eval()
    drafter.load_state_dict(full.state_dict())
    ids, pos, doc, aux, a = _row_with_two_docs(verifier, drafter, 11)
    session = NeuralDraft(drafter)
    session.reset(11)
    session.add_context(aux[:, a - 11: a], 0)
    drafts, inf_logits = drafter.draft(int(ids[0, a]), 11, session.kv, return_logits=True)
    forced = ids.clone()
    forced[0, a + 1: a + 1 + len(drafts)] = torch.tensor(drafts)
    _, final = drafter.forward_train(forced, pos, doc, aux, torch.tensor([[a]]))
    torch.testing.assert_close(final[0, 0, drafter.cfg.first_draft_slot:], inf_logits, rtol=1e-9, atol=1e-9)
    poked = aux.clone()
    poked[0, a - 11: a - 4] += 3.0  # the document's context before the window
    torch.testing.assert_close(drafter.forward_train(forced, pos, doc, poked, torch.tensor([[a]]))[1], final)
    assert not torch.allclose(full.forward_train(forced, pos, doc, poked, torch.tensor([[a]]))[1],
                              full.forward_train(forced, pos, doc, aux, torch.tensor([[a]]))[1])


def test_hf_init_draws_trainable_linear_weights_from_a_normal():
    from domino.model import Drafter, DrafterConfig

    v = tiny_verifier(hidden=256)
    kw = dict(num_layers=2, aux_layer_ids=[1, 2], draft_vocab_size=64, mask_token_id=95, projector="domino",
              shift_label=True, gru_hidden_size=64, bottleneck_size=32)
    torch.manual_seed(0)
    torch_init = Drafter(DrafterConfig.schema_defaults(v.config, **kw))
    torch.manual_seed(0)
    hf = Drafter(DrafterConfig.schema_defaults(v.config, init="hf", init_std=0.05, **kw))
    linears = [n for n, m in hf.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"]
    assert "fc" in linears and "head.down" in linears and "layers.1.mlp.down_proj" in linears
    for n in linears:
        w = hf.get_submodule(n).weight.detach()
        assert abs(float(w.mean())) < 0.005 and float(w.std()) == pytest.approx(0.05, rel=0.1), n
    assert float(torch_init.fc.weight.detach().std()) < 0.03  # PyTorch's kaiming-uniform for fan-in 512
    for n in ("head.gru.weight_ih_l0", "hidden_norm.weight", "layers.0.input_layernorm.weight", "lm_head.weight"):
        assert torch.equal(hf.get_parameter(n), torch_init.get_parameter(n)), n  # untouched by hf init


def test_rope_frequencies_stay_float32_when_cast():
    from conftest import tiny_verifier

    v = tiny_verifier(dtype=torch.float32)
    d = tiny_drafter(v, attn="sdpa").float()
    ref = d.rotary_emb.inv_freq.clone()
    d = d.to(torch.bfloat16)
    assert d.rotary_emb.inv_freq.dtype == torch.float32
    torch.testing.assert_close(d.rotary_emb.inv_freq, ref)


def test_the_decoding_tables_follow_the_weights(verifier):
    """The Domino head's products built once for decoding (the GRU input table, the state
    matrix) are rebuilt after an in-place weight update, as an optimizer step makes: drafting
    after the update gives what a drafter loaded with the updated weights gives."""
    drafter = tiny_drafter(verifier, projector="domino", shift_label=True, correct_from=1)
    ids, pos, doc, aux, a = _row_with_two_docs(verifier, drafter, 11)

    def draft(model):
        session = NeuralDraft(model)
        session.reset(11)
        session.add_context(aux[:, a - 11: a], 0)
        return model.draft(int(ids[0, a]), 11, session.kv, return_logits=True)[1]

    before = draft(drafter)
    with torch.no_grad():
        for w in (drafter.head.gru.weight_ih_l0, drafter.head.gru.weight_hh_l0, drafter.head.down.weight):
            w.mul_(1.5)
    after = draft(drafter)
    fresh = _with(drafter)  # the updated weights in a new module: nothing cached
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, draft(fresh), rtol=0, atol=0)


def test_decoding_tables_follow_the_weights_and_live_in_the_session(verifier):
    """The Domino head's decoding tables are built by a session from the weights as they are, and
    kept nowhere on the module: a weight changed without a version bump (a ``.data`` write, as a
    fused optimizer step makes) is seen by the next session and by ``draft`` without tables (a
    session is built after training, from the weights it decodes with); a drafter built under
    ``inference_mode`` decodes; a copy carries no table."""
    import copy
    import pickle

    ids, pos, doc, aux, a = _row_with_two_docs(verifier, tiny_drafter(verifier, projector="domino"), 11)

    def drafts(drafter, session=None):
        session = session or NeuralDraft(drafter)
        session.reset(11)
        session.add_context(aux[:, a - 11: a], 0)
        return session.propose(int(ids[0, a]), 11, drafter.cfg.drafts_per_step), session

    drafter = tiny_drafter(verifier, projector="domino")
    before, session = drafts(drafter)
    with torch.no_grad():
        drafter.head.gru.weight_ih_l0.data.mul_(-3.0)  # no version bump
        drafter.head.down.weight.data.mul_(-3.0)
    after, _ = drafts(drafter)
    assert after != before, "the weight change must move the drafts for this check to mean anything"
    assert drafter.draft(int(ids[0, a]), 11, session.kv) == after  # no tables: from the weights now
    with torch.inference_mode():
        frozen = tiny_drafter(verifier, projector="domino")
        assert drafts(frozen)[0] == drafts(frozen)[0]
    assert not any(isinstance(v, torch.Tensor) for v in vars(copy.deepcopy(drafter)).values())
    assert len(pickle.dumps(drafter)) < 2 * sum(t.numel() * t.element_size() for t in drafter.state_dict().values())


def test_drafting_after_a_fused_adamw_step_equals_a_fresh_module(verifier):
    """A fused optimizer step writes the weights without a version bump: a session built after it
    drafts as a fresh module holding the same weights does."""
    ids, pos, doc, aux, a = _row_with_two_docs(verifier, tiny_drafter(verifier, projector="domino"), 11)
    drafter = tiny_drafter(verifier, projector="domino")
    NeuralDraft(drafter)  # a session before the step: it must not leak into the next one
    opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=0.5, fused=True)
    for p in drafter.parameters():
        if p.requires_grad:
            p.grad = torch.ones_like(p)
    opt.step()
    fresh = tiny_drafter(verifier, projector="domino")
    fresh.load_state_dict(drafter.state_dict())

    def drafts(model):
        session = NeuralDraft(model)
        session.reset(11)
        session.add_context(aux[:, a - 11: a], 0)
        return session.propose(int(ids[0, a]), 11, model.cfg.drafts_per_step)

    assert drafts(drafter) == drafts(fresh)
    assert drafts(fresh) != drafts(tiny_drafter(verifier, projector="domino")), "the step must move the drafts"
