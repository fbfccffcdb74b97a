"""End of sequence: every id the verifier's generation config lists, plus the chat template's
end-of-turn token, read from the real Qwen3 tokenizer files the test extras ship."""

import json
import shutil

import pytest
from transformers import AutoTokenizer, GenerationConfig, Qwen3Config

from domino.tools.random_verifier import qwen3_tokenizer_files
from domino.verifier.load import eos_ids

IM_END, ENDOFTEXT = 151645, 151643  # Qwen3's <|im_end|> and <|endoftext|>


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    """Qwen3's tokenizer files, a config.json whose eos is <|im_end|> (as Qwen3-0.6B's), and a
    generation_config.json that lists both ids (as Qwen3-0.6B's does)."""
    try:
        src = qwen3_tokenizer_files()
    except FileNotFoundError as err:
        pytest.skip(str(err))
    d = tmp_path_factory.mktemp("qwen3")
    for f in src.iterdir():
        if f.is_file():
            shutil.copy(f, d / f.name)
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [IM_END, ENDOFTEXT],
                                                          "pad_token_id": ENDOFTEXT}))
    return d


def test_the_tokens_are_qwen3s(qwen3_dir):
    tok = AutoTokenizer.from_pretrained(str(qwen3_dir))
    assert tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"]) == [IM_END, ENDOFTEXT]


def test_every_listed_eos_id_and_the_end_of_turn_token(qwen3_dir):
    tok = AutoTokenizer.from_pretrained(str(qwen3_dir))
    model_config = Qwen3Config(eos_token_id=IM_END)
    assert eos_ids(tok, model_config) == [ENDOFTEXT, IM_END]  # generation_config.json found beside the tokenizer
    assert eos_ids(tok, model_config, GenerationConfig(eos_token_id=ENDOFTEXT)) == [ENDOFTEXT, IM_END]  # an int
    assert eos_ids(tok, Qwen3Config(eos_token_id=None), {"eos_token_id": [ENDOFTEXT]}) == [ENDOFTEXT, IM_END]


def test_without_a_generation_config_the_end_of_turn_token_alone(qwen3_dir, tmp_path):
    """The embedded and random verifiers: eos <|im_end|> in the model config, no extra id."""
    for f in qwen3_dir.iterdir():
        if f.name != "generation_config.json":
            shutil.copy(f, tmp_path / f.name)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    assert eos_ids(tok, Qwen3Config(eos_token_id=IM_END)) == [IM_END]
    assert eos_ids(tok, Qwen3Config(eos_token_id=IM_END), {}) == [IM_END]
