"""The whole workflow with a verifier that is not Qwen3: a tiny random LlamaForCausalLM with
SmolLM2's tokenizer (no <|MASK|>, no free embedding row, a ChatML template with a default system
turn), through every stage and the exports, under config/smollm2.yaml cut to the micro sizes.

Its verifier runs in bf16, as the profile's does, so the benchmark's lossless check replays every
parting from plain greedy in float32, where the two must agree; the row-count rule
(``benchmark.tie_tolerance: null``) describes each parting by the noise measured where it parts.
"""

import json

import pytest
import torch
import yaml

from conftest import ROOT, copy_repo, run_snakemake
from domino.verifier import gguf

SOURCE = yaml.safe_load((ROOT / "config" / "smollm2.yaml").read_text())["verifier"]["gguf"]
LAYERS = 8


def write_tiny_llama(out):
    """A random Llama verifier with SmolLM2's tokenizer and special ids, saved as a checkpoint."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tok = gguf.load_tokenizer(gguf.locate(SOURCE))
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
                         tie_word_embeddings=True, initializer_range=0.2, bos_token_id=1, eos_token_id=2,
                         pad_token_id=2, architectures=["LlamaForCausalLM"])
    LlamaForCausalLM(config).save_pretrained(out)
    GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=2).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory):
    repo = copy_repo(tmp_path_factory.mktemp("llama-run"))
    verifier = write_tiny_llama(repo / "llama_verifier")
    (repo / "llama.yaml").write_text(json.dumps({
        "verifier": {"source": str(verifier), "name": "tiny-llama", "dtype": "bfloat16"},  # partings replayed, on any CPU
        "drafter": {"aux_layer_ids": None, "draft_vocab_size": 256}}))
    run_snakemake(repo, "all", "--configfile", "config.yaml", "config/smollm2.yaml", "micro.yaml", "llama.yaml")
    return repo


def test_every_stage_runs_with_a_llama_verifier(llama_run):
    r = llama_run / "results"
    drafter = json.loads((r / "train" / "domino" / "checkpoint" / "drafter_config.json").read_text())
    assert drafter["target_model_type"] == "llama"
    assert drafter["aux_layer_ids"] == [1, LAYERS // 2 - 1, LAYERS - 3]  # null: the card's rule
    assert drafter["mask_token_id"] == 16  # <empty_output>: SmolLM2 has no <|MASK|> and no free row
    for name in ("dflash-shift", "dflash-noshift", "domino"):
        export = json.loads((r / "export" / name / "config.json").read_text())
        assert export["speculators_config"]["verifier"]["architectures"] == ["LlamaForCausalLM"]
        assert export["mask_token_id"] == 16
        summary = json.loads((r / "benchmark" / "humaneval" / f"{name}.json").read_text())["summary"]
        assert summary["tie_tolerance"] is None
        partings = summary["near_tie_divergences"]
        for tie in partings:  # each described by the noise measured where it parts
            assert tie["within_noise"] == (tie["gap"] is not None and min(tie["margins"]) <= tie["noise"])
        assert summary["lossless_replay"]["replayed"] == len(partings) and summary["lossless_replay"]["defects"] == 0
    card = (llama_run / "reports" / "model_card.md").read_text()
    assert "\n# tiny-llama-Domino-b8\n" in card  # named from verifier.name: report.model_name is null
    front = card.split("---")[1]
    assert "- llama" in front and "qwen3" not in front
    assert "| Mask token ID | 16 |" in card and "| Auxiliary layers | [1, 3, 5] |" in card


def test_the_loss_mask_closes_each_reply_with_the_templates_end_of_turn(llama_run):
    """The end of turn read from the template (<|im_end|>) is the last masked token of every reply,
    and the default system turn is never masked."""
    rows = [json.loads(line) for line in (llama_run / "results" / "prepare_data" / "train.jsonl").open()]
    for row in rows[:50]:
        ids, mask = row["input_ids"], row["loss_mask"]
        last = max(i for i, m in enumerate(mask) if m)
        assert ids[last] == 2 or last == len(ids) - 1  # <|im_end|>, unless the row was cut inside the reply
        first_user = ids.index(1, 1)  # the second <|im_start|>: the system turn lies before it
        assert not any(mask[:first_user])
