"""Training pieces against hand-built cases: slot labels, anchors, validation accuracy, Muon's
parameter groups, aux-state noise, and what an interrupted run says."""

import signal
from dataclasses import replace

import pytest
import torch

import domino.train.loop as T
from conftest import SlotOracle, synthetic_features, tiny_drafter, tiny_verifier, two_doc_features
from domino.model import Drafter
from domino.schema import AuxNoise
from domino.train.batches import PackedRows, draw_aux_noise, keyed_generator, slot_targets, valid_anchor_mask
from domino.train.loop import Interrupted, TrainConfig, train, validate
from domino.train.optim import build_optimizers, muon_parameter_names
from domino.vocab import target_ids

pytestmark = pytest.mark.usefixtures("one_thread")


# -----------------------------------------------------------------------------
# slot labels and anchors


@pytest.mark.parametrize("shift", [True, False])
def test_slot_k_label_and_loss_mask_position(shift):
    """Slot k of the block at anchor a predicts position t = a + k + shift: its label is the
    verifier's token stored at t - 1, its mask the loss mask at t (and the anchor's validity)."""
    Tn = 12
    batch = {"target": 100 + torch.arange(Tn)[None], "loss_mask": torch.ones(1, Tn, dtype=torch.bool)}
    batch["loss_mask"][0, 5] = False
    anchors = torch.tensor([[2, 6]])
    ok = torch.tensor([[True, False]])  # the second anchor is padding
    tgt, mask = slot_targets(batch, anchors, ok, 3, shift)
    if shift:  # t = 3, 4, 5 and 7, 8, 9
        assert tgt.tolist() == [[[102, 103, 104], [106, 107, 108]]]
        assert mask.tolist() == [[[True, True, False], [False, False, False]]]
    else:  # t = 2, 3, 4 and 6, 7, 8
        assert tgt.tolist() == [[[101, 102, 103], [105, 106, 107]]]
        assert mask.tolist() == [[[True, True, True], [False, False, False]]]


def test_valid_anchors_at_document_boundaries_and_the_row_end():
    # doc 0 at rows 0..4, doc 1 at 5..10, padding at 11..12; block size 2
    doc_ids = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, -1, -1]])
    loss_mask = torch.ones_like(doc_ids, dtype=torch.bool)
    valid = valid_anchor_mask(doc_ids, loss_mask, 2)[0]
    # 0: no context; 4: a+1 leaves doc 0; 5: no context in doc 1; 10: a+1 is padding
    assert valid.nonzero().flatten().tolist() == [1, 2, 3, 6, 7, 8, 9]
    loss_mask[0, 3] = False  # a+1 must be an assistant token
    assert valid_anchor_mask(doc_ids, loss_mask, 2)[0].nonzero().flatten().tolist() == [1, 3, 6, 7, 8, 9]
    # the block size does not narrow the anchors: the slots past the end are masked instead
    assert torch.equal(valid_anchor_mask(doc_ids, loss_mask, 5), valid_anchor_mask(doc_ids, loss_mask, 2))
    # one document filling the row: the last anchor leaves a+1 = T-1 inside the row
    full = valid_anchor_mask(torch.zeros(1, 8, dtype=torch.long), torch.ones(1, 8, dtype=torch.bool), 2)[0]
    assert full.nonzero().flatten().tolist() == [1, 2, 3, 4, 5, 6]
    assert valid_anchor_mask(torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 3, dtype=torch.bool), 2)[0].tolist() \
        == [False, True, False]
    assert not valid_anchor_mask(torch.zeros(1, 2, dtype=torch.long), torch.ones(1, 2, dtype=torch.bool), 2).any()


@pytest.mark.parametrize("shift", [True, False])
def test_the_stop_token_is_an_early_slot_target(shift):
    """An answer's last token (its stop token) is the target of the first drafting slot of the
    anchor just before it: slot 0 of a shifted drafter, slot 1 of noshift; the slots past the
    document's end are masked, whichever document or padding follows."""
    # doc 0 at rows 0..6 (its answer 3..6, 6 = the stop token), doc 1 at 7..9, padding 10..11
    doc_ids = torch.tensor([[0, 0, 0, 0, 0, 0, 0, 1, 1, 1, -1, -1]])
    loss_mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 0, 1, 1, 0, 0]], dtype=torch.bool)
    batch = {"target": 100 + torch.arange(12)[None], "loss_mask": loss_mask, "doc_ids": doc_ids}
    valid = valid_anchor_mask(doc_ids, loss_mask, 4)[0]
    assert valid.nonzero().flatten().tolist() == [2, 3, 4, 5, 8]  # 7: no context in doc 1
    anchors = torch.tensor([[5, 8]])
    tgt, mask = slot_targets(batch, anchors, torch.ones_like(anchors, dtype=torch.bool), 4, shift)
    first = 0 if shift else 1  # the slot that predicts a+1 (noshift's slot 0, the anchor itself, drafts nothing)
    assert mask[0, 0, first:].tolist() == [True] + [False] * (3 - first)
    assert int(tgt[0, 0, first]) == 105  # the verifier's token stored at 5 predicts position 6, the stop token
    # anchor 8 of doc 1: a+1 = 9 is its last token, then padding
    assert mask[0, 1, first:].tolist() == [True] + [False] * (3 - first)


# Two turns of one conversation, one row of 16 positions, as the chat template lays them out:
# user 0-3 (3 = the assistant header), reply 4-7 (7 = its end token), user 8-10, reply 11-13,
# then two template tokens. The loss mask marks the replies.
TWO_TURNS = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0]], dtype=torch.bool)
# block size 3, shifted: anchor -> slot masks under each loss_mask_at, worked out by hand
TWO_TURN_SLOTS = {
    # target: an anchor needs a reply token at a+1; slot k counts where a+k+1 is a reply token
    "target": {3: [1, 1, 1], 4: [1, 1, 1], 5: [1, 1, 0], 6: [1, 0, 0], 10: [1, 1, 1], 11: [1, 1, 0], 12: [1, 0, 0]},
    # input (PR 685): an anchor must itself be a reply token; slot k counts where a+k is one
    "input": {4: [1, 1, 1], 5: [1, 1, 1], 6: [1, 1, 0], 7: [1, 0, 0], 11: [1, 1, 1], 12: [1, 1, 0], 13: [1, 0, 0]},
}


@pytest.mark.parametrize("at", ["target", "input"])
def test_loss_mask_at_on_a_two_turn_conversation(at):
    doc = torch.zeros(1, 16, dtype=torch.long)
    valid = valid_anchor_mask(doc, TWO_TURNS, 3, at)[0]
    expected = TWO_TURN_SLOTS[at]
    assert valid.nonzero().flatten().tolist() == sorted(expected)
    anchors = torch.arange(1, 15)[None]  # every anchor the row's length allows
    batch = {"target": torch.zeros(1, 16, dtype=torch.long), "loss_mask": TWO_TURNS}
    _, mask = slot_targets(batch, anchors, valid[anchors], 3, True, at)
    got = {int(a): m.int().tolist() for a, m in zip(anchors[0], mask[0]) if m.any()}
    assert got == expected
    # without the shift a slot predicts its own position: both settings mask the slots alike
    _, noshift = slot_targets(batch, anchors, torch.ones_like(anchors, dtype=torch.bool), 3, False, at)
    _, ref = slot_targets(batch, anchors, torch.ones_like(anchors, dtype=torch.bool), 3, False, "target")
    assert torch.equal(noshift, ref)


@pytest.mark.parametrize("at", ["target", "input"])
def test_training_and_validation_read_loss_mask_at(at):
    """compute_losses, which training and validation share, draws its anchors and masks its
    slots by train.loss_mask_at: with more anchors than valid positions it supervises exactly
    the hand-counted slots."""
    verifier = tiny_verifier()
    drafter = tiny_drafter(verifier, projector="domino", block_size=3).float()
    batch = {"input_ids": torch.randint(0, 90, (1, 16)), "position_ids": torch.arange(16)[None],
             "doc_ids": torch.zeros(1, 16, dtype=torch.long), "loss_mask": TWO_TURNS,
             "target": torch.zeros(1, 16, dtype=torch.long), "aux": torch.randn(1, 16, 3 * 64), "row_ids": [0]}
    cfg = TrainConfig.schema_defaults(anchors_per_row=32, loss_mask_at=at)
    *_, mask = T.compute_losses(drafter, batch, cfg, (0, 3, 0), torch.device("cpu"))
    assert int(mask.sum()) == sum(map(sum, TWO_TURN_SLOTS[at].values()))  # target 15, input 15
    assert int(mask.any(-1).sum()) == len(TWO_TURN_SLOTS[at])


# -----------------------------------------------------------------------------
# validation


@pytest.mark.parametrize("shift,weighting,counts,first_trained", [
    (True, "classic", [10, 7, 5], None),  # DFlash shift: slot 0 (a+1) has weight 0
    (False, "classic", [7, 10, 7], 1),    # DFlash noshift: slot 1 is a+1
    (True, "shifted", [10, 7, 5], 0),     # Domino: slot 0 is a+1, weight 1
])
def test_validate_per_slot_and_overall_accuracy(shift, weighting, counts, first_trained):
    """Valid anchors (hand-counted): doc A at 2, 3, 5, 6, 7, doc B at 9+1 .. 9+5, the slots past
    a document's end masked (doc A's anchor 7: its a+2 and a+3 lie in doc B). Slot 0 alone is
    right. ``overall`` pools the drafting slots whatever their weight: DFlash shift's untrained
    slot 0 counts, the noshift anchor slot does not."""
    cfg = TrainConfig.schema_defaults(pack_len=16, rows_per_step=1, anchors_per_row=64, gamma=7.0,
                                      weighting=weighting)
    res = validate(SlotOracle(shift, {0}), two_doc_features(), cfg)
    assert [s["count"] for s in res["per_slot"]] == counts
    assert [s["final_acc"] for s in res["per_slot"]] == [1.0, 0.0, 0.0]
    assert [s["base_acc"] for s in res["per_slot"]] == [0.0, 0.0, 0.0]
    assert [s["target"] for s in res["per_slot"]] == (["a+1", "a+2", "a+3"] if shift else ["a", "a+1", "a+2"])
    draft_counts = counts if shift else counts[1:]
    assert res["overall"]["count"] == sum(draft_counts)
    assert res["overall"]["final_acc"] == pytest.approx((counts[0] if shift else 0) / sum(draft_counts))
    assert res["overall"]["base_acc"] == 0.0
    assert res["anchors"] == 10 and res["rows"] == 1
    assert res["first_trained_slot"] == first_trained
    expected_first = None if first_trained is None else [1.0, 0.0, 0.0][first_trained]
    assert res["first_trained_accuracy"] == expected_first


# -----------------------------------------------------------------------------
# optimizers

MATRICES = {"fc.weight", "head.gru.weight_ih_l0", "head.gru.weight_hh_l0", "head.down.weight", "head.up.weight"} | {
    f"layers.{i}.{m}.weight" for i in range(2) for m in (
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}


def test_muon_takes_the_2d_matrices_except_embedding_and_lm_head():
    d = tiny_drafter(tiny_verifier(), projector="domino").float()
    d.embed_tokens.weight.requires_grad_(True)  # trainable here to show the rule, frozen in real runs
    d.lm_head.weight.requires_grad_(True)
    assert set(muon_parameter_names(d)) == MATRICES
    cfg = TrainConfig.schema_defaults(lr=1e-3, optimizer="muon", weight_decay=0.01)
    opts = build_optimizers(d, cfg)
    (muon, muon_scale), (adamw, adamw_scale) = opts.parts
    assert isinstance(muon, torch.optim.Muon) and isinstance(adamw, torch.optim.AdamW)
    names = {id(p): n for n, p in d.named_parameters()}
    assert {names[id(p)] for p in muon.param_groups[0]["params"]} == MATRICES
    rest = {names[id(p)] for p in adamw.param_groups[0]["params"]}
    assert "embed_tokens.weight" in rest and "lm_head.weight" in rest
    assert all(n.endswith("norm.weight") for n in rest - {"embed_tokens.weight", "lm_head.weight"})
    assert len(rest) + len(MATRICES) == sum(p.requires_grad for p in d.parameters())
    g = muon.param_groups[0]
    assert (g["momentum"], g["weight_decay"], g["ns_steps"], g["adjust_lr_fn"]) == (0.95, 0.1, 5, "match_rms_adamw")
    assert adamw.param_groups[0]["weight_decay"] == 0.01
    opts.set_lr(2e-4)
    assert (muon_scale, adamw_scale) == (10.0, 1.0)
    assert muon.param_groups[0]["lr"] == pytest.approx(2e-3) and adamw.param_groups[0]["lr"] == 2e-4


def test_adamw_is_one_optimizer_over_every_trainable_parameter():
    d = tiny_drafter(tiny_verifier(), projector="domino").float()
    (opt, scale), = build_optimizers(d, TrainConfig.schema_defaults(lr=1e-3)).parts
    assert type(opt) is torch.optim.AdamW and scale == 1.0 and len(opt.param_groups) == 1
    assert [id(p) for p in opt.param_groups[0]["params"]] == [id(p) for p in d.parameters() if p.requires_grad]


def _features():
    return synthetic_features(n_docs=6)


CFG = TrainConfig.schema_defaults(epochs=2, lr=3e-3, warmup_steps=1, anchors_per_row=4, pack_len=64,
                                  checkpoint_every=100, optimizer="muon", noise="uniform", noise_scale=0.05)


def test_muon_run_resumes_bitwise(tmp_path):
    init = tmp_path / "init"
    tiny_drafter(tiny_verifier(), projector="domino").float().save(init)
    feats = _features()
    ref = Drafter.load(init)
    s = train(ref, feats, CFG, tmp_path / "ref")
    assert s["complete"] and s["steps"] >= 4
    first = Drafter.load(init)
    assert train(first, feats, CFG, tmp_path / "run", max_steps=2)["steps"] == 2
    again = Drafter.load(init)
    train(again, feats, CFG, tmp_path / "run")
    for k, v in ref.state_dict().items():
        assert torch.equal(again.state_dict()[k], v), k
    assert not torch.equal(ref.fc.weight, Drafter.load(init).fc.weight)  # it did train


def test_train_steps_is_trains_loop_writing_nothing(tmp_path, monkeypatch):
    """train_steps (what bench_memory runs) takes the steps train takes, to the bit, and writes
    no file: a card-sized state file is 1.5 GB."""
    init = tmp_path / "init"
    tiny_drafter(tiny_verifier(), projector="domino").float().save(init)
    feats = _features()
    ref = Drafter.load(init)
    train(ref, feats, CFG, tmp_path / "ref", max_steps=2)
    monkeypatch.chdir(tmp_path / "ref")  # the one folder it could write into unnoticed
    before = sorted(tmp_path.rglob("*"))
    steps = Drafter.load(init)
    assert T.train_steps(steps, feats, CFG, 2)["steps"] == 2
    assert sorted(tmp_path.rglob("*")) == before
    for k, v in ref.state_dict().items():
        assert torch.equal(steps.state_dict()[k], v), k


# -----------------------------------------------------------------------------
# noise


def test_uniform_noise_stays_within_its_bounds():
    x = draw_aux_noise((200_000,), AuxNoise("uniform", 0.05), torch.Generator().manual_seed(0))
    assert x.abs().max() <= 0.05 and x.min() < -0.0499 and x.max() > 0.0499
    assert abs(float(x.mean())) < 1e-3
    assert float(x.std()) == pytest.approx(0.05 / 3 ** 0.5, rel=0.01)  # uniform on [-s, s]: std s / sqrt(3)
    gauss = draw_aux_noise((200_000,), AuxNoise("gaussian", 0.05), torch.Generator().manual_seed(0))
    assert float(gauss.std()) == pytest.approx(0.05, rel=0.01)


def test_noise_on_packed_rows():
    feats = _features()
    rows = PackedRows(feats, 64)
    clean = rows.batch([0, 1])
    assert clean["aux"].dtype == feats["aux"].dtype
    noisy = rows.batch([0, 1], TrainConfig.schema_defaults(noise="uniform", noise_scale=0.05).aux_noise, (0, 2, 7))
    delta = noisy["aux"] - clean["aux"]
    assert 0 < delta.abs().max() <= 0.05
    assert torch.equal(rows.batch([1], AuxNoise("uniform", 0.05), (0, 2, 7))["aux"][0], noisy["aux"][1])  # per row
    # Gaussian noise is scale x randn of the row's own generator
    gauss = rows.batch([1], TrainConfig.schema_defaults(noise="gaussian", noise_scale=0.05).aux_noise, (0, 2, 7))
    expected = clean["aux"][1] + 0.05 * torch.randn(clean["aux"][1].shape, generator=keyed_generator(0, 2, 7, 1))
    assert torch.equal(gauss["aux"][0], expected)
    assert TrainConfig.schema_defaults().aux_noise == AuxNoise("none", 0.0)
    assert TrainConfig.schema_defaults().aux_noise.dtype == "float32"
    assert not TrainConfig.schema_defaults(noise_scale=0.1).aux_noise.active  # noise none: the scale is unused


def test_noise_in_the_storage_dtype_rounds_with_the_states():
    """noise_dtype storage adds the noise in the features' dtype (bf16 here): the row stays bf16
    and equals the stored states plus the bf16-rounded noise, and where |x| >= 8 (bf16 steps of
    1/16 or more) most noise of 0.05 rounds away; float32 keeps all of it."""
    feats = _features()
    feats["aux"] = feats["aux"].to(torch.bfloat16)
    feats["aux"][:, :64] = 10.0
    rows = PackedRows(feats, 64)
    clean = rows.batch([0])["aux"]
    f32 = rows.batch([0], AuxNoise("uniform", 0.05, "float32"), (0, 2, 7))["aux"]
    bf16 = rows.batch([0], AuxNoise("uniform", 0.05, "storage"), (0, 2, 7))["aux"]
    assert f32.dtype == torch.float32 and bf16.dtype == torch.bfloat16
    drawn = draw_aux_noise(clean[0].shape, AuxNoise("uniform", 0.05), keyed_generator(0, 2, 7, 0))
    assert torch.equal(bf16[0], clean[0] + drawn.to(torch.bfloat16))
    assert torch.equal(f32[0], clean[0].float() + drawn)
    n = int(rows.batch([0])["doc_ids"].ge(0).sum())  # the row's real tokens
    big = (slice(0, n), slice(0, 64))
    assert float((bf16[0][big] == clean[0][big]).float().mean()) > 0.5  # rounded away
    assert float((f32[0][big] == clean[0][big].float()).float().mean()) < 0.01
    assert TrainConfig.schema_defaults(noise="uniform", noise_dtype="storage").aux_noise.dtype == "storage"


# -----------------------------------------------------------------------------
# interruption


def test_an_interrupted_run_saves_and_says_how_to_resume(tmp_path, monkeypatch):
    init = tmp_path / "init"
    tiny_drafter(tiny_verifier(), projector="dflash").float().save(init)
    orig = T.compute_losses

    def interrupted_at_step_1(drafter, batch, cfg, step_seed, *a, **k):
        if step_seed[2] == 1:
            signal.raise_signal(signal.SIGINT)  # Ctrl-C while step 1 is under way
        return orig(drafter, batch, cfg, step_seed, *a, **k)

    monkeypatch.setattr(T, "compute_losses", interrupted_at_step_1)
    out = tmp_path / "run"
    cfg = replace(CFG, optimizer="adamw")
    before = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN in a background job
    with pytest.raises(Interrupted, match="^interrupted at step 2 of ") as info:
        train(Drafter.load(init), _features(), cfg, out)
    msg = str(info.value)
    state = out / "state" / "state.pt"
    assert "\n" not in msg and msg.startswith("interrupted at step 2 of ")
    assert str(state) in msg and "rerun the same snakemake command" in msg
    assert torch.load(state, weights_only=True)["step"] == 2
    assert signal.getsignal(signal.SIGINT) is before  # the handler is given back


# -----------------------------------------------------------------------------
# the loss


def _kl_setup(shift):
    """A drafter, features holding last hidden states and targets that are their argmax under the
    verifier's head, and one packed batch with its anchors drawn."""
    verifier = tiny_verifier()
    drafter = tiny_drafter(verifier, shift_label=shift).float()
    head = T.VerifierHead(verifier, target_ids(drafter.d2t))
    feats = _features()
    feats["last"] = torch.randn(len(feats["input_ids"]), 64, generator=torch.Generator().manual_seed(3))
    feats["target"] = head(feats["last"]).argmax(-1)
    batch = PackedRows(feats, 64).batch([0, 1])
    return drafter, head, feats, batch


@pytest.mark.parametrize("shift", [True, False])
def test_kl_loss_reads_the_verifier_state_of_the_position_each_slot_predicts(shift):
    """``train.loss: kl_div`` takes slot k's distribution from the last hidden state at t - 1,
    the position whose greedy token ``ce`` takes: with a verifier head sharpened to one-hot the
    two losses agree, and with the head as it is they do not (a state read one position off
    gives another argmax, and the sharpened KL would then differ from CE by O(1))."""
    drafter, head, _, batch = _kl_setup(shift)
    cfg = replace(CFG, noise="none")
    seed = (0, 1, 2)
    ce = T.compute_losses(drafter, batch, replace(cfg, loss="ce"), seed, torch.device("cpu"))
    sharp = T.VerifierHead.__new__(T.VerifierHead)
    torch.nn.Module.__init__(sharp)
    sharp.norm, sharp.rows = head.norm, head.rows * 1e4
    kl_sharp = T.compute_losses(drafter, batch, replace(cfg, loss="kl_div"), seed, torch.device("cpu"),
                                verifier_head=sharp)
    kl = T.compute_losses(drafter, batch, replace(cfg, loss="kl_div"), seed, torch.device("cpu"), verifier_head=head)
    assert ce[5].sum() > 10  # supervised slots
    for i in (0, 1):  # base and final losses
        assert kl_sharp[i].item() == pytest.approx(ce[i].item(), rel=1e-4)
        assert abs(kl[i].item() - ce[i].item()) > 1e-2
    with pytest.raises(ValueError, match="features.last_hidden_state"):
        T.compute_losses(drafter, batch, replace(cfg, loss="kl_div"), seed, torch.device("cpu"))


def test_kl_training_runs_and_validation_reports_cross_entropy(tmp_path):
    """A ``kl_div`` run trains, records its loss in the summary and reports validation in CE,
    as a ``ce`` run does; features without the last hidden state are refused in one line."""
    drafter, head, feats, _ = _kl_setup(True)
    cfg = replace(CFG, loss="kl_div", noise="none")
    s = train(drafter, feats, cfg, tmp_path / "kl", verifier_head=head)
    assert s["complete"] and s["config"]["loss"] == "kl_div"
    v = validate(drafter, feats, cfg)
    assert v["loss"] == validate(drafter, {k: x for k, x in feats.items() if k != "last"}, replace(cfg, loss="ce"))["loss"]
    without = {k: x for k, x in feats.items() if k != "last"}
    with pytest.raises(ValueError, match="set features.last_hidden_state true and rerun extract_hidden_states"):
        train(drafter, without, cfg, tmp_path / "refused", verifier_head=head)


# -----------------------------------------------------------------------------
# training precision


@pytest.mark.parametrize("rotary", ["float32", "weights"])
def test_bf16_weights_train_and_round_the_rope_frequencies_only_when_asked(tmp_path, rotary):
    """``train.weights_dtype: bfloat16`` trains and saves bf16 weights (PR 685's whole-model cast);
    ``rotary_dtype: weights`` rounds the RoPE frequencies to bf16 for training, ``float32`` keeps
    them exact; either way a loaded checkpoint decodes with exact float32 frequencies."""
    init = tmp_path / "init"
    tiny_drafter(tiny_verifier(), projector="domino").float().save(init)
    exact = Drafter.load(init).rotary_emb.inv_freq.clone()
    rounded = exact.to(torch.bfloat16).float()
    assert not torch.equal(rounded, exact), "the check needs frequencies bf16 cannot hold exactly"
    drafter = Drafter.load(init)
    cfg = replace(CFG, weights_dtype="bfloat16", rotary_dtype=rotary)
    s = train(drafter, _features(), cfg, tmp_path / "run", max_steps=2)
    assert s["steps"] == 2
    trainable = [p for p in drafter.parameters() if p.requires_grad]
    assert trainable and all(p.dtype == torch.bfloat16 for p in trainable)
    assert torch.equal(drafter.rotary_emb.inv_freq, rounded if rotary == "weights" else exact)
    T.set_precision(reloaded := Drafter.load(init), replace(CFG, rotary_dtype="weights"))  # float32 weights
    assert torch.equal(reloaded.rotary_emb.inv_freq, exact)  # rounding to float32 changes nothing
    full = train(Drafter.load(init), _features(), cfg, tmp_path / "full")
    assert full["complete"] and full["config"]["weights_dtype"] == "bfloat16"
    saved = Drafter.load(tmp_path / "full" / "checkpoint")
    assert saved.fc.weight.dtype == torch.bfloat16 and torch.equal(saved.rotary_emb.inv_freq, exact)
