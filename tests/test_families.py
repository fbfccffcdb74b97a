"""The verifier families (domino.verifier.families): each built tiny and random from its
transformers config, saved with a tokenizer as a user brings it, either passes the config check
and then loads, gives its hidden states by the aux-id convention, is extracted, decodes
speculatively exactly as plainly and answers batched prompts as one at a time (the regenerate
stage), or is refused by the config check in one line naming the reason."""

import copy
from pathlib import Path

import pytest
import torch
import transformers as T
import yaml

from conftest import tiny_drafter
from domino.aux import AuxCapture, decoder_parts
from domino.config import validate_config
from domino.data.regenerate import generate_batch
from domino.decode import NeuralDraft, decode
from domino.schema import ConfigError
from domino.verifier.families import FAMILIES, VERIFIER_FAMILIES as TESTED
from domino.verifier.load import load_verifier

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = yaml.safe_load((ROOT / "config.yaml").read_text())
TEXTS = ["def add(a, b):\n    return a + b\n", "Hello there, how are you today?", "I am fine, thanks."] * 20
VOCAB, LAYERS = 300, 8
SHAPE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
             num_attention_heads=4, max_position_embeddings=512, initializer_range=0.3)

# family -> its tiny config: the family's own names, its own defaults for everything else
CONFIGS = {
    "GPT-2": lambda: T.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=LAYERS, n_head=4, n_positions=512,
                                  initializer_range=0.3, bos_token_id=1, eos_token_id=1),
    "Phi": lambda: T.PhiConfig(**SHAPE),
    "GPT-NeoX": lambda: T.GPTNeoXConfig(**SHAPE),
    "Qwen2": lambda: T.Qwen2Config(**SHAPE, num_key_value_heads=2),
    "Mistral": lambda: T.MistralConfig(**SHAPE, num_key_value_heads=2, sliding_window=None),
    "Llama": lambda: T.LlamaConfig(**SHAPE, num_key_value_heads=2),
    "Qwen3": lambda: T.Qwen3Config(**SHAPE, num_key_value_heads=2, head_dim=16),
    "Gemma": lambda: T.GemmaConfig(**SHAPE, num_key_value_heads=2, head_dim=16),
}
# the one line the config check prints for each refused configuration
REFUSED = {
    "Phi": "verifier.source: model_type 'phi': its output head adds a bias (lm_head.bias), which the drafter's "
           "frozen copy of the head's rows and the greedy targets of the extraction leave out (allowed: a tested "
           "family: Qwen3, Qwen2, Llama, Mistral, Gemma, GPT-2, GPT-NeoX)",
}
RUNS = [f for f in CONFIGS if f not in REFUSED]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from domino.verifier.embedded import train_tokenizer

    return train_tokenizer(TEXTS, VOCAB, tmp_path_factory.mktemp("tok") / "tokenizer")


def _save(family, config, d, tokenizer):
    torch.manual_seed(0)
    T.AutoModelForCausalLM.from_config(config).save_pretrained(d)
    tokenizer.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("families")
    return {f: _save(f, make(), root / f, tokenizer) for f, make in CONFIGS.items()}


def _checked(source, **over):
    cfg = copy.deepcopy(DEFAULT)
    cfg["verifier"] = {**cfg["verifier"], "source": str(source), "name": "tiny"}
    cfg["drafter"] = {**cfg["drafter"], "aux_layer_ids": None, "mask_token_id": None, "draft_vocab_size": 128}
    for dotted, value in over.items():
        section, key = dotted.split(".")
        cfg[section] = {**cfg[section], key: value}
    return validate_config(cfg)


def test_every_family_is_listed():
    assert set(TESTED.values()) == set(RUNS)


@pytest.mark.parametrize("family", list(REFUSED))
def test_a_refused_family_is_refused_by_the_config_check_in_one_line(folders, family):
    with pytest.raises(ConfigError) as err:
        _checked(folders[family])
    assert str(err.value) == REFUSED[family]


def test_a_mistral_with_a_sliding_window_is_refused(tmp_path, tokenizer):
    d = _save("Mistral", T.MistralConfig(**SHAPE, num_key_value_heads=2, sliding_window=64), tmp_path / "m", tokenizer)
    with pytest.raises(ConfigError, match=r"^verifier.source: sliding_window 64 \(allowed: null, or use_sliding_window "
                                          r"false\)$"):
        _checked(d)


@pytest.mark.parametrize("family", ["GPT-2", "GPT-NeoX"])
def test_a_family_that_keeps_its_norm_elsewhere_trains_with_kl_but_is_not_extracted_by_vllm(folders, family):
    """train.loss kl_div finds the final norm by the families' names (GPT-2's transformer.ln_f):
    the verifier's head over a stored last state gives back the verifier's own logits. The vLLM
    extraction, which reads model.norm, is refused in one line."""
    from domino.train.loop import VerifierHead

    where = {"GPT-2": ("gpt2", "transformer.ln_f"), "GPT-NeoX": ("gpt_neox", "gpt_neox.final_layer_norm")}[family]
    _checked(folders[family], **{"train.loss": "kl_div", "features.last_hidden_state": True})
    with pytest.raises(ConfigError) as err:
        _checked(folders[family], **{"features.backend": "vllm"})
    assert str(err.value) == (f"features.backend: vllm reads the verifier's final norm at model.norm, which "
                              f"model_type {where[0]!r} keeps at {where[1]} (allowed with this verifier: "
                              "features.backend transformers)")
    verifier = load_verifier(str(folders[family]))
    ids = torch.randint(0, VOCAB - 1, (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), AuxCapture(verifier, [LAYERS]) as cap:
        logits = verifier(input_ids=ids).logits[0]
    draft_ids = torch.arange(0, VOCAB, 3)
    torch.testing.assert_close(VerifierHead(verifier, draft_ids)(cap.aux()[0]), logits[:, draft_ids].float())


@pytest.mark.parametrize("family", RUNS)
def test_a_family_that_runs_is_checked_extracted_and_decoded_losslessly(folders, family, tmp_path):
    from domino.data.features import extract, load_features

    cfg = _checked(folders[family])  # the config check reads its layer count by the family's own name
    assert cfg["drafter"]["aux_layer_ids"] == [1, LAYERS // 2 - 1, LAYERS - 3]
    verifier = load_verifier(str(folders[family]))
    assert TESTED[verifier.config.model_type] == family
    parts = decoder_parts(verifier)
    entry = FAMILIES[verifier.config.model_type]  # the family's entry names the modules it has
    base = getattr(verifier, entry.base)
    assert parts["base"] is base and parts["norm"] is getattr(base, entry.norm)
    assert parts["embed"] is getattr(base, entry.embed) and parts["layers"] is getattr(base, entry.layers)
    ids = torch.randint(0, VOCAB - 1, (1, 12), generator=torch.Generator().manual_seed(0))

    # the aux ids: 0 the first layer's input, i < L transformers' hidden_states[i], L before the final norm
    with torch.no_grad():
        out = parts["base"](input_ids=ids, output_hidden_states=True)
        with AuxCapture(verifier, [0, 1, LAYERS - 1, LAYERS]) as cap:
            parts["base"](input_ids=ids)
    H = verifier.config.hidden_size
    aux = cap.aux()[0]
    for k, i in enumerate([0, 1, LAYERS - 1]):
        torch.testing.assert_close(aux[:, k * H:(k + 1) * H], out.hidden_states[i][0])
    torch.testing.assert_close(parts["norm"](aux[:, 3 * H:]), out.last_hidden_state[0])

    # the extraction: aux states, and the verifier's greedy token over the draft vocabulary
    draft_ids = torch.arange(0, VOCAB, 2)
    rows = [{"input_ids": ids[0].tolist(), "loss_mask": [0] * 6 + [1] * 6}, {"input_ids": [5, 6, 7], "loss_mask": [1] * 3}]
    extract(verifier, rows, [1, 2, 3], draft_ids, tmp_path / "f" / "index.json", batch_size=2, shard_samples=1,
            dtype="float32")
    feats = load_features(tmp_path / "f" / "index.json")
    with torch.no_grad():
        logits = verifier(input_ids=ids).logits[0]
    assert torch.equal(feats["target"][:12], logits[:, draft_ids].argmax(-1))
    torch.testing.assert_close(feats["aux"][:12, :H], out.hidden_states[1][0])

    # one speculative decode, in float64 so that no greedy tie can flip: the plain decode's tokens
    verifier = verifier.to(torch.float64)
    drafter = tiny_drafter(verifier, block_size=4, mask_token_id=VOCAB - 1)
    prompt = ids[0, :8].tolist()
    plain = decode(verifier, prompt, 24).new_token_ids
    spec = decode(verifier, prompt, 24, draft=NeuralDraft(drafter))
    assert spec.new_token_ids == plain

    # the regenerate stage's batched answers (left-padded, positions from each row's first token)
    prompts = [ids[0, :3].tolist(), ids[0, :11].tolist(), ids[0, :7].tolist()]
    batched = [answer for answer, _ in generate_batch(verifier, prompts, 10, [], 0)]
    assert batched == [decode(verifier, p, 10).new_token_ids for p in prompts]
