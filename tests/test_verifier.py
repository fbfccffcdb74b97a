"""domino.verifier.load: which verifiers load; domino.verifier.embedded: the embedded verifier's shape;
domino.aux: the aux capture's use and the aux-id convention (the speculators and vLLM one)
that the drafter reads."""

import pytest
import torch
from transformers import LlamaConfig

from conftest import tiny_verifier
from domino.aux import AuxCapture, aux_states
from domino.verifier.embedded import build_embedded_verifier, train_tokenizer
from domino.verifier.load import VerifierError, load_tokenizer, load_verifier

TEXTS = ["def add(a, b):\n    return a + b\n", "Hello there, how are you today?", "I am fine, thanks."] * 20
EMBEDDED = {"hidden_size": 32, "intermediate_size": 64, "num_layers": 2, "num_attention_heads": 2,
            "num_key_value_heads": 1, "head_dim": 16, "max_position_embeddings": 256}


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama")
    LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, final_logit_softcapping=30.0).save_pretrained(d)
    return d


@pytest.mark.parametrize("where,dtype,match", [
    ("", "float32", r"verifier.source: final_logit_softcapping 30.0 \(allowed: null"),
    ("nowhere", "float32", r"llama\d*/nowhere' is not a directory; a local verifier is a save_pretrained directory"),
    ("..", "float32", r"has no config.json \(allowed: a save_pretrained directory\)"),
    ("", "float64", r"verifier dtype must be one of \['bfloat16', 'float16', 'float32'\], got 'float64'"),
])
def test_unusable_verifiers_are_refused(llama_dir, where, dtype, match):
    with pytest.raises(VerifierError, match=match):
        load_verifier(str(llama_dir / where), dtype=dtype)


@pytest.mark.parametrize("path", ["results/verifier/model", "runs/card/verifier", "./random_verifier"])
def test_a_missing_local_verifier_is_named_not_read_as_a_hub_id(path, tmp_path, monkeypatch):
    """A relative path that is not there is refused as a missing directory, naming where relative
    paths are read from, never as a malformed hub id; a hub id (org/name) is left to the hub."""
    monkeypatch.chdir(tmp_path)
    for load in (load_verifier, load_tokenizer):
        with pytest.raises(VerifierError, match=rf"'{path}' is not a directory \(relative paths are read from "
                                                rf"{tmp_path}\); a local verifier is a save_pretrained directory"):
            load(path)
    from domino.verifier.load import check_local

    check_local("Qwen/Qwen3-0.6B")  # a hub id: not refused here


def test_embedded_verifier_has_the_configured_shape(tmp_path):
    """The config's ``verifier.embedded`` shape over the tokenizer's vocabulary, tied embeddings,
    rope_theta 1e4, and <|im_end|> as its end of sequence."""
    tok = train_tokenizer(TEXTS, 300, tmp_path)
    model = build_embedded_verifier(tok, EMBEDDED)
    c = model.config
    assert (c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
            c.head_dim, c.max_position_embeddings) == tuple(EMBEDDED.values())
    assert c.vocab_size == len(tok) == 300  # the BPE vocabulary with the ChatML specials and <|MASK|>
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert c.rope_parameters["rope_theta"] == 10000.0
    assert c.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>") and c.pad_token_id == tok.pad_token_id
    assert c.architectures == ["Qwen3ForCausalLM"] and c.model_type == "qwen3"


def test_aux_capture_needs_a_forward_inside_its_block():
    v = tiny_verifier(layers=2)
    L = v.config.num_hidden_layers
    with AuxCapture(v, [0, L]) as cap:
        with pytest.raises(RuntimeError, match="before a verifier forward inside its with-block"):
            cap.aux()
        v.model(input_ids=torch.tensor([[1, 2, 3]]))
        aux = cap.aux()
    H = v.config.hidden_size
    assert aux.shape == (1, 3, 2 * H)
    # the hooks are gone after the block: a later forward leaves the captured states as they were
    v.model(input_ids=torch.tensor([[4, 5, 6]]))
    torch.testing.assert_close(cap.aux(), aux)
    assert not torch.allclose(v.model.embed_tokens(torch.tensor([[4, 5, 6]])), aux[..., :H])


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


@pytest.mark.parametrize("field,value,match", [
    ("sliding_window", 64, r"sliding_window 64 \(allowed: null, or use_sliding_window false\)"),
    ("layer_types", ["full_attention", "sliding_attention"], r"layer_types .*allowed: full_attention in every layer"),
    ("rope_parameters", {"full_attention": {"rope_theta": 1e4}, "sliding_attention": {"rope_theta": 1e4}},
     r"rope_parameters per layer type"),
    ("attn_logit_softcapping", 50.0, r"attn_logit_softcapping 50.0 \(allowed: null"),
    ("rms_norm_eps", None, r"model_type 'llama' has no rms_norm_eps"),
])
def test_what_a_verifier_config_cannot_serve_is_refused_naming_the_field(field, value, match):
    from domino.schema import ConfigError
    from domino.verifier.facts import check_verifier_config

    c = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=1).to_dict()
    check_verifier_config(c)  # a plain Llama config is served
    with pytest.raises(ConfigError, match=match):
        check_verifier_config({**c, field: value})
    check_verifier_config({**c, "sliding_window": 4096, "use_sliding_window": False})  # Qwen2's unused window


def test_a_llama_verifier_loads_and_its_aux_states_are_its_layers(tmp_path):
    """A LlamaForCausalLM verifier loads like a Qwen3 one, and the aux capture reads its decoder
    layers by the same convention (id i: the output of layer i - 1, 0 the embeddings)."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                 num_attention_heads=2, num_key_value_heads=1)).save_pretrained(tmp_path)
    model = load_verifier(str(tmp_path))
    assert type(model).__name__ == "LlamaForCausalLM"
    ids = torch.randint(0, 128, (1, 9))
    hs = model(input_ids=ids, output_hidden_states=True).hidden_states
    assert torch.equal(aux_states(model, ids, [0, 1, 2])[0], torch.cat([hs[0][0], hs[1][0], hs[2][0]], -1))
    last = aux_states(model, ids, [3])[0]  # before the final norm, which hidden_states[3] has applied
    assert not torch.allclose(last, hs[3][0]) and torch.allclose(model.model.norm(last), hs[3][0], atol=1e-6)
