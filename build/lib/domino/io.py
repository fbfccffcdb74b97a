"""Atomic file output: every file is written under a temporary name and renamed when complete."""

from __future__ import annotations

import hashlib
import json
import os
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path: str | Path):
    """Yield a temporary sibling of ``path``; rename it onto ``path`` only if the block succeeds.

    A killed or failing writer leaves at most a ``.tmp-*`` file, which no stage reads and
    Snakemake never takes as an output.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    try:
        yield tmp
        if tmp.exists():
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


@contextmanager
def atomic_dir(path: str | Path):
    """Yield a temporary sibling directory of ``path``; it replaces ``path`` only if the block
    succeeds, so the directory exists only when complete."""
    import shutil

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        yield tmp
        shutil.rmtree(path, ignore_errors=True)
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_jsonl(path: str | Path, rows, **dumps_kwargs) -> None:
    """One JSON object per line, written atomically."""
    with atomic_path(path) as tmp, open(tmp, "w") as fh:
        for r in rows:
            fh.write(json.dumps(r, **dumps_kwargs) + "\n")


def write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json(path: str | Path, obj) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_json(path: str | Path, what: str = "results file"):
    """Read JSON with an error that names the file when it is missing or malformed."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{what} {path} is missing")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{what} {path} is not valid JSON: {err}") from None


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_jsonl(path: str | Path, keys=(), what: str = "file", error=ValueError, missing=FileNotFoundError) -> list[dict]:
    """JSON objects, one per line; a missing or empty file, a bad line or a missing field raises
    ``missing`` / ``error`` with a message naming the file (and line)."""
    path = Path(path)
    if not path.exists():
        raise missing(f"{what} {path} is missing")
    rows = []
    with open(path) as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise error(f"{what} {path}:{n} is not valid JSON: {err}") from None
            absent = [k for k in keys if not isinstance(row, dict) or k not in row]
            if absent or not isinstance(row, dict):
                raise error(f"{what} {path}:{n} lacks {', '.join(absent) or 'a JSON object'}")
            rows.append(row)
    if not rows:
        raise error(f"{what} {path} holds no rows")
    return rows
