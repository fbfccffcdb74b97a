"""Export to the speculators DFlash format: config fields, weight names, atomic files, round trip."""

import json
import os

import pytest
import torch
from safetensors import safe_open

from conftest import tiny_drafter, tiny_verifier
from domino.aux import aux_states
from domino.decode import NeuralDraft
from domino.export import ExportError, export_speculators, from_speculators_name, load_speculators, to_speculators_name

KINDS = {  # the three card rows
    "dflash-shift": dict(projector="dflash", shift_label=True),
    "dflash-noshift": dict(projector="dflash", shift_label=False),
    "domino": dict(projector="domino", shift_label=True),
}
BACKBONE = ["fc.weight", "hidden_norm.weight", "norm.weight", "lm_head.weight", "embed_tokens.weight", "d2t",
            "t2d"] + [f"layers.{i}.{n}.weight" for i in range(2) for n in (
                "input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
                "self_attn.v_proj", "self_attn.o_proj", "self_attn.q_norm", "self_attn.k_norm",
                "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]
DOMINO = ["domino_head.prefix_gru.weight_ih_l0", "domino_head.prefix_gru.weight_hh_l0",
          "domino_head.embed_proj.0.weight", "domino_head.embed_proj.2.weight"]


pytestmark = pytest.mark.usefixtures("one_thread")


def _context(verifier, drafter, n=13, seed=5):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, verifier.config.vocab_size - 1, (n + 1,), generator=g)
    with torch.no_grad():
        aux = aux_states(verifier, ids[None], drafter.cfg.aux_layer_ids)
    return ids, aux


def _draft(drafter, ids, aux):
    n = len(ids) - 1
    session = NeuralDraft(drafter)
    session.reset(n)
    session.add_context(aux[:, :n], 0)
    return drafter.draft(int(ids[n]), n, session.kv, return_logits=True)


@pytest.mark.parametrize("kind", list(KINDS))
def test_round_trip_gives_the_same_draft_logits(verifier, tmp_path, kind):
    drafter = tiny_drafter(verifier, **KINDS[kind])
    ckpt = tmp_path / "checkpoint"
    drafter.save(ckpt)
    config = export_speculators(ckpt, tmp_path / "export", "Qwen/Qwen3-0.6B")
    assert json.loads((tmp_path / "export" / "config.json").read_text()) == config

    back = load_speculators(tmp_path / "export")
    assert back.cfg == drafter.cfg
    ids, aux = _context(verifier, drafter)
    drafts, logits = _draft(drafter, ids, aux)
    drafts2, logits2 = _draft(back, ids, aux)
    assert drafts2 == drafts and len(drafts) == drafter.cfg.drafts_per_step
    torch.testing.assert_close(logits2, logits, rtol=0, atol=0)
    for name, t in drafter.state_dict().items():
        if not name.startswith("rotary_emb."):
            assert torch.equal(back.state_dict()[name], t), name


@pytest.mark.parametrize("kind", list(KINDS))
def test_config_fields_and_weight_names(verifier, tmp_path, kind):
    drafter = tiny_drafter(verifier, **KINDS[kind])
    cfg = drafter.cfg
    drafter.save(tmp_path / "ckpt")
    export_speculators(tmp_path / "ckpt", tmp_path / "out", "Qwen/Qwen3-0.6B")
    c = json.loads((tmp_path / "out" / "config.json").read_text())
    assert c["speculators_model_type"] == "dflash"
    assert c["architectures"] == ["DFlashDraftModel"]
    assert c["projector_type"] == KINDS[kind]["projector"]
    assert c["shift_label"] is KINDS[kind]["shift_label"] and c["sample_from_anchor"] is KINDS[kind]["shift_label"]
    assert c["aux_hidden_state_layer_ids"] == [1, 2, 4]  # speculators convention, unchanged
    assert c["draft_vocab_size"] == 64 and c["block_size"] == 4
    assert c["target_hidden_size"] == verifier.config.hidden_size == 64  # what vLLM sizes fc's input by
    assert c["mask_token_id"] == verifier.config.vocab_size - 1
    assert c["pure_draft_prefix_len"] == cfg.correct_from - 1 == 0  # PR 685: first corrected slot 1 + value
    assert c["domino_repro"]["format_version"] == 3
    assert c["gru_hidden_dim"] == 32 and c["emb_dim"] == 16
    layer = c["transformer_layer_config"]
    assert layer["model_type"] == "qwen3" and layer["num_hidden_layers"] == 2
    assert layer["vocab_size"] == verifier.config.vocab_size and layer["hidden_size"] == 64
    assert layer["num_attention_heads"] == 4 and layer["num_key_value_heads"] == 2 and layer["head_dim"] == 16
    assert layer["rope_theta"] == 10000.0 and layer["rope_parameters"]["rope_theta"] == 10000.0
    sc = c["speculators_config"]
    assert sc["algorithm"] == "dflash" and sc["default_proposal_method"] == "greedy"
    assert sc["verifier"] == {"name_or_path": "Qwen/Qwen3-0.6B", "architectures": ["Qwen3ForCausalLM"]}
    (prop,) = sc["proposal_methods"]
    assert prop["proposal_type"] == "greedy"
    assert prop["speculative_tokens"] == (4 if KINDS[kind]["shift_label"] else 3)

    with safe_open(str(tmp_path / "out" / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert f.get_tensor("d2t").dtype == torch.int64 and f.get_tensor("t2d").dtype == torch.bool
        assert f.get_tensor("lm_head.weight").shape == (64, 64)
        if kind == "domino":
            assert f.get_tensor("domino_head.embed_proj.2.weight").shape == (64, 16)  # draft vocab rows
            assert f.get_tensor("domino_head.prefix_gru.weight_ih_l0").shape == (96, 64)
    expected = set(BACKBONE) | (set(DOMINO) if kind == "domino" else set())
    assert names == expected
    assert not any(n.startswith(("head.", "rotary_emb", "verifier_")) for n in names)


def test_name_mapping_is_a_bijection():
    ours = ["head.gru.weight_ih_l0", "head.gru.weight_hh_l0", "head.down.weight", "head.up.weight",
            "layers.0.self_attn.q_proj.weight", "fc.weight", "d2t"]
    theirs = [to_speculators_name(n) for n in ours]
    assert theirs[:4] == DOMINO
    assert theirs[4:] == ours[4:]
    assert [from_speculators_name(n) for n in theirs] == ours


def test_bfloat16_export_and_verifier_embeddings(verifier, tmp_path):
    drafter = tiny_drafter(verifier, projector="domino")
    drafter.save(tmp_path / "ckpt")
    c = export_speculators(tmp_path / "ckpt", tmp_path / "out", "v", dtype="bfloat16", include_embed_tokens=False)
    assert c["dtype"] == "bfloat16"
    with safe_open(str(tmp_path / "out" / "model.safetensors"), "pt") as f:
        assert "embed_tokens.weight" not in f.keys()
        assert f.get_tensor("fc.weight").dtype == torch.bfloat16
        assert f.get_tensor("d2t").dtype == torch.int64
    with pytest.raises(ExportError, match="embed_tokens"):
        load_speculators(tmp_path / "out")
    back = load_speculators(tmp_path / "out", verifier=verifier)
    assert back.fc.weight.dtype == torch.bfloat16
    assert back.rotary_emb.inv_freq.dtype == torch.float32
    assert torch.equal(back.embed_tokens.weight, verifier.get_input_embeddings().weight.to(torch.bfloat16))
    ids, aux = _context(verifier, drafter)
    _, logits = _draft(drafter, ids, aux)
    _, logits16 = _draft(back, ids, aux.to(torch.bfloat16))
    assert logits16.dtype == torch.bfloat16 and torch.isfinite(logits16).all()
    torch.testing.assert_close(logits16.double(), logits, rtol=0.1, atol=0.5)


def test_public_fields_alone_rebuild_the_drafter(verifier, tmp_path):
    """A config without our extra block (as another tool would write it) still loads."""
    drafter = tiny_drafter(verifier, projector="domino")
    drafter.save(tmp_path / "ckpt")
    export_speculators(tmp_path / "ckpt", tmp_path / "out", "v")
    path = tmp_path / "out" / "config.json"
    c = json.loads(path.read_text())
    del c["domino_repro"]
    path.write_text(json.dumps(c))
    back = load_speculators(tmp_path / "out", attn_implementation="eager")
    c["target_hidden_size"] = 2 * c["transformer_layer_config"]["hidden_size"]  # a drafter of another width
    path.write_text(json.dumps(c))
    with pytest.raises(ExportError, match="target_hidden_size 128 differs from the draft layers' hidden_size 64"):
        load_speculators(tmp_path / "out")
    for f in ("hidden_size", "block_size", "aux_layer_ids", "mask_token_id", "draft_vocab_size", "shift_label",
              "projector", "gru_hidden_size", "bottleneck_size", "correct_from", "num_layers", "rms_norm_eps"):
        assert getattr(back.cfg, f) == getattr(drafter.cfg, f), f
    ids, aux = _context(verifier, drafter)
    torch.testing.assert_close(_draft(back, ids, aux)[1], _draft(drafter, ids, aux)[1], rtol=0, atol=0)


def test_files_are_written_atomically(verifier, tmp_path, monkeypatch):
    drafter = tiny_drafter(verifier, projector="dflash")
    drafter.save(tmp_path / "ckpt")
    out = tmp_path / "out"
    export_speculators(tmp_path / "ckpt", out, "v")
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    # a writer that dies while writing the weights leaves the previous export untouched, no temp files
    import safetensors.torch

    def boom(tensors, metadata=None):
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.torch, "save", boom)
    with pytest.raises(OSError, match="disk full"):
        export_speculators(tmp_path / "ckpt", out, "other-verifier")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not [p for p in os.listdir(out.parent) if p.startswith(".tmp-")]


def test_a_missing_checkpoint_is_refused(tmp_path):
    with pytest.raises(ExportError, match="drafter_config.json"):
        export_speculators(tmp_path / "nothing", tmp_path / "out", "v")
    with pytest.raises(ExportError, match="not a complete export"):
        load_speculators(tmp_path / "out")


def test_cli_stage(verifier, tmp_path):
    from domino.__main__ import main
    from domino.stages import stage_config

    drafter = tiny_drafter(verifier, projector="domino")
    drafter.save(tmp_path / "ckpt")
    training = {"weights_dtype": "bfloat16", "rotary_dtype": "weights", "loss_mask_at": "input", "seed": 0}
    (tmp_path / "summary.json").write_text(json.dumps({"steps": 1, "epochs": 1, "seconds": 0.1, "config": training}))
    config = stage_config("export", {"seed": 0, "threads": 1, "device": "cpu",
                                     "verifier": {"name": "a display name", "dtype": "float32"}})
    det, warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        main(["export", "--config", config, "--verifier", "Qwen/Qwen3-0.6B", "--checkpoint-dir", str(tmp_path / "ckpt"),
              "--summary", str(tmp_path / "summary.json"), "--out", str(tmp_path / "x")])
    finally:  # the CLI's setup is global: give the rest of the session its settings back
        torch.use_deterministic_algorithms(det, warn_only=warn)
    c = json.loads((tmp_path / "x" / "config.json").read_text())
    assert c["dtype"] == "float32" and c["speculators_config"]["verifier"]["name_or_path"] == "Qwen/Qwen3-0.6B"
    assert (tmp_path / "x" / "model.safetensors").exists()
    assert c["domino_repro"]["training"] == training  # the training's conventions travel with the weights


@pytest.mark.speculators
@pytest.mark.parametrize("shift", [False, True])
def test_speculators_loads_the_export(verifier, tmp_path, shift):
    """In an environment with vllm-project/speculators (marked ``speculators``; .ci/run builds
    it): every weight speculators holds equals ours under the exported name, and speculators'
    own training forward gives our draft logits at an anchor."""
    import speculators
    from speculators import SpeculatorModel

    from domino.aux import aux_states

    vdir = tmp_path / "verifier"  # speculators reads the verifier's norm and lm_head from here
    v32 = tiny_verifier().to(torch.float32)
    v32.save_pretrained(vdir)
    drafter = tiny_drafter(v32, projector="dflash", shift_label=shift, attn="sdpa").float()
    drafter.save(tmp_path / "ckpt")
    export_speculators(tmp_path / "ckpt", tmp_path / "out", str(vdir))
    model = SpeculatorModel.from_pretrained(str(tmp_path / "out")).float().eval()
    theirs = model.state_dict()
    ours = {to_speculators_name(n): t for n, t in drafter.state_dict().items() if not n.startswith("rotary_emb.")}
    assert set(ours) <= set(theirs), sorted(set(ours) - set(theirs))
    assert set(theirs) - set(ours) == {"verifier_norm.weight", "verifier_lm_head.weight"}  # training-only
    for name in ours:
        torch.testing.assert_close(theirs[name].to(ours[name].dtype), ours[name], msg=name)
    # one anchor (the only loss-mask position) in a 30-token document
    T, a = 30, 17
    ids = torch.randint(0, v32.config.vocab_size - 1, (1, T), generator=torch.Generator().manual_seed(5))
    aux = aux_states(v32, ids, drafter.cfg.aux_layer_ids)
    loss_mask = torch.zeros(1, T, dtype=torch.long)
    loss_mask[0, a] = 1
    docs = torch.zeros(1, T, dtype=torch.long)
    with torch.no_grad():  # _backbone_forward: speculators' forward up to the draft logits
        _, logits, _, _, rows = model._backbone_forward(aux, ids, loss_mask, torch.zeros(1, T, v32.config.hidden_size),
                                                         docs, max_anchors=1)
        base, _ = drafter.forward_train(ids, torch.arange(T)[None], docs, aux, torch.tensor([[a]]))
    assert rows.tolist() == list(range(a, a + drafter.cfg.block_size))
    torch.testing.assert_close(logits[0], base[0, 0], atol=1e-5, rtol=1e-5)
    del speculators


# -----------------------------------------------------------------------------
# reading as speculators PR 685 does


def _variant(drafter, **changes):
    """The same weights under another config (a window, another first corrected slot)."""
    from dataclasses import replace

    from domino.model import Drafter

    other = Drafter(replace(drafter.cfg, **changes)).to(drafter.fc.weight.dtype).eval()
    other.load_state_dict(drafter.state_dict())
    return other


PR685_NAMES = {"domino_head.prefix_gru.": "head.gru.", "domino_head.embed_proj.0.": "head.down.",
               "domino_head.embed_proj.2.": "head.up."}


def pr685_reader(out_dir, prefix_is_first_corrected_slot=False):
    """A loader written from PR 685's reading of the public fields alone (``domino_repro`` is
    ignored): the Domino head corrects slots from ``1 + pure_draft_prefix_len``, slot k of a
    ``shift_label`` block predicts a+k+1, the draft layers' window is the layer config's
    ``sliding_window``. Weight names are mapped by its own table. The model it fills is
    ours (the forward itself is checked against speculators in test_speculators_loads_the_export).
    ``prefix_is_first_corrected_slot`` reads the field as the first corrected slot itself, as
    SpecForge names it."""
    from safetensors.torch import load_file

    from domino.model import Drafter, DrafterConfig

    c = json.loads((out_dir / "config.json").read_text())
    layer = c["transformer_layer_config"]
    p = c["pure_draft_prefix_len"]
    cfg = DrafterConfig(
        hidden_size=layer["hidden_size"], num_attention_heads=layer["num_attention_heads"],
        num_key_value_heads=layer["num_key_value_heads"], head_dim=layer["head_dim"],
        intermediate_size=layer["intermediate_size"], rms_norm_eps=layer["rms_norm_eps"],
        rope_theta=layer["rope_parameters"]["rope_theta"], max_position_embeddings=layer["max_position_embeddings"],
        target_vocab_size=layer["vocab_size"], target_num_layers=max(c["aux_hidden_state_layer_ids"]),
        num_layers=layer["num_hidden_layers"], block_size=c["block_size"],
        aux_layer_ids=c["aux_hidden_state_layer_ids"], mask_token_id=c["mask_token_id"],
        draft_vocab_size=c["draft_vocab_size"], shift_label=c["shift_label"], projector=c["projector_type"],
        gru_hidden_size=c["gru_hidden_dim"], bottleneck_size=c["emb_dim"], pure_draft_prefix_len=max(0, p),
        correct_from=p if prefix_is_first_corrected_slot else 1 + p, init="pytorch", init_std=0.02,
        sliding_window=layer.get("sliding_window") if layer.get("use_sliding_window") else None,
        # attention.py: non_causal = sliding_window is None or sliding_window_non_causal
        block_causal=bool(layer.get("use_sliding_window")) and not c.get("sliding_window_non_causal", False),
        attn_implementation="eager")
    state = {}
    for name, t in load_file(str(out_dir / "model.safetensors")).items():
        for theirs, ours in PR685_NAMES.items():
            name = ours + name[len(theirs):] if name.startswith(theirs) else name
        state[name] = t
    model = Drafter(cfg).to(state["fc.weight"].dtype)
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all(k.startswith("rotary_emb.") for k in missing), (missing, unexpected)
    return model.eval()


PR685_CASES = {  # the three card rows, then the corrections and the window PR 685 can express
    **{k: (v, {}) for k, v in KINDS.items()},
    "domino-correct-from-2": (dict(projector="domino", shift_label=True), dict(correct_from=2)),
    "domino-correct-from-0": (dict(projector="domino", shift_label=True), dict(correct_from=0)),
    "domino-noshift-correct-from-0": (dict(projector="domino", shift_label=False), dict(correct_from=0)),
    "domino-window-5": (dict(projector="domino", shift_label=True), dict(sliding_window=5)),
    "dflash-noshift-window-5": (dict(projector="dflash", shift_label=False), dict(sliding_window=5)),
    "domino-window-5-causal": (dict(projector="domino", shift_label=True), dict(sliding_window=5, block_causal=True)),
    "dflash-window-5-causal": (dict(projector="dflash", shift_label=True), dict(sliding_window=5, block_causal=True)),
}


@pytest.mark.parametrize("case", list(PR685_CASES))
def test_a_pr685_reader_gets_the_trained_draft_logits(verifier, tmp_path, case):
    kind, changes = PR685_CASES[case]
    drafter = _variant(tiny_drafter(verifier, **kind), **changes)
    drafter.save(tmp_path / "ckpt")
    c = export_speculators(tmp_path / "ckpt", tmp_path / "out", "v")
    expected_prefix = {"domino-correct-from-2": 1, "domino-correct-from-0": -1}.get(case, 0)
    assert c["pure_draft_prefix_len"] == expected_prefix
    ids, aux = _context(verifier, drafter)  # 13 context positions: more than the window
    drafts, logits = _draft(drafter, ids, aux)
    theirs = pr685_reader(tmp_path / "out")
    assert theirs.cfg.sliding_window == drafter.cfg.sliding_window
    assert theirs.cfg.block_causal == drafter.cfg.block_causal
    drafts2, logits2 = _draft(theirs, ids, aux)
    assert drafts2 == drafts
    torch.testing.assert_close(logits2, logits, rtol=0, atol=0)
    ours = load_speculators(tmp_path / "out")  # our own loader still round-trips
    assert ours.cfg == drafter.cfg
    torch.testing.assert_close(_draft(ours, ids, aux)[1], logits, rtol=0, atol=0)
    if case == "domino":  # reading the field as the first corrected slot corrects slot 0 too
        old = _draft(pr685_reader(tmp_path / "out", prefix_is_first_corrected_slot=True), ids, aux)[1]
        assert not torch.allclose(old[0], logits[0])


@pytest.mark.parametrize("version", [2, 4, None])
def test_an_unknown_format_version_is_refused(verifier, tmp_path, version):
    """The domino_repro block is read exactly in the one format this project writes; another
    version is refused, not guessed."""
    drafter = tiny_drafter(verifier, projector="domino")
    drafter.save(tmp_path / "ckpt")
    export_speculators(tmp_path / "ckpt", tmp_path / "out", "v")
    path = tmp_path / "out" / "config.json"
    c = json.loads(path.read_text())
    c["domino_repro"]["format_version"] = version
    path.write_text(json.dumps(c))
    with pytest.raises(ExportError, match=f"format_version {version} is not the one this reader knows"):
        load_speculators(tmp_path / "out")


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("window,block_causal", [(None, False), (5, False), (5, True), (None, True)])
def test_sliding_window_non_causal_says_what_the_block_is(verifier, tmp_path, kind, window, block_causal):
    """true for a bidirectional block, false for a causal one, whatever the window and the model
    kind; the reader without the domino_repro block reads the flag as PR 685 trains it (causal
    only under a window), so it gets every exported model but a causal block without a window."""
    drafter = _variant(tiny_drafter(verifier, **KINDS[kind]), sliding_window=window, block_causal=block_causal)
    drafter.save(tmp_path / "ckpt")
    c = export_speculators(tmp_path / "ckpt", tmp_path / "out", "v")
    assert c["sliding_window_non_causal"] is (not block_causal)
    layer = c["transformer_layer_config"]
    if window is not None:
        assert (layer["sliding_window"], layer["use_sliding_window"], layer["layer_types"]) == (
            5, True, ["sliding_attention"] * 2)
    assert load_speculators(tmp_path / "out").cfg.block_causal is block_causal
    del c["domino_repro"]
    (tmp_path / "out" / "config.json").write_text(json.dumps(c))
    public = load_speculators(tmp_path / "out").cfg
    assert public.sliding_window == window
    assert public.block_causal is (block_causal and window is not None)
