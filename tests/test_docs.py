"""Every command line that README.md and docs/*.md show runs as written.

Snakemake lines run with ``-n`` added (in a copy of the checkout); ``python -m domino...``
lines run as written when they are quick (validating a config), otherwise with ``--help``
in place of their arguments (they would train, benchmark or write a model). A documented
command that Snakemake or the entry point refuses fails here.
"""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPORT_COMMAND, ROOT, code_map, copy_repo, own_verifier, run_snakemake

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# entry points that only read and print: run exactly as documented
AS_WRITTEN = ("python -m domino.config",)
# the vLLM environment is optional: its lines are dry-run with a stand-in interpreter (vllm.python);
# the SLURM executor plugin comes with the slurm extra, which the README's test line installs
SLURM = "profiles/slurm"


def _code_lines(text: str) -> list[str]:
    """Command lines of fenced bash/sh blocks and of inline `...` spans, continuations joined.
    Every fenced block is read, whatever its language, so that one in another language (yaml)
    cannot pair its closing fence with the next block's opening one."""
    lines = []
    for lang, block in re.findall(r"```([\w-]*)\n(.*?)```", text, re.S):
        if lang in ("", "bash", "sh", "console"):
            lines += block.replace("\\\n", " ").splitlines()
    lines += re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    return lines


def documented_commands() -> list[tuple[str, str]]:
    """(doc file, command) for every snakemake / python -m domino command, split at &&."""
    found = []
    for doc in DOCS:
        for line in _code_lines(doc.read_text()):
            line = re.sub(r"\s+#\s.*$", "", line.strip())  # a trailing comment
            for part in line.split("&&"):
                cmd = part.strip()
                if cmd.startswith(("snakemake ", "python -m domino")) and "<" not in cmd:
                    found.append((doc.name, cmd))
    return sorted(set(found))


COMMANDS = documented_commands()


def test_the_docs_show_commands():
    """The extraction is not vacuous: the README's quick start and a card-scale run are found."""
    cmds = [c for _, c in COMMANDS]
    assert "snakemake --cores 1 reports/model_card.md" in cmds
    assert any("--configfile config/card.yaml" in c for c in cmds)
    assert any(c.startswith("python -m domino ") for c in cmds)


def test_a_block_in_another_language_hides_no_command():
    text = "```yaml\na: 1\n```\n\nprose\n\n```bash\nsnakemake --cores 1 all\n```\n"
    assert _code_lines(text) == ["snakemake --cores 1 all"]


def _stand_ins(repo: Path) -> None:
    """What the documented commands expect to exist before they run (made small here)."""
    from domino.tools.random_verifier import write_random_verifier

    (repo / "small.yaml").write_text("data: {samples: 500}\nbenchmark: {max_prompts: 32}\n")  # docs/card-scale.md
    (repo / "prompts32.yaml").write_text("benchmark: {max_prompts: 32}\n")  # docs/smollm2.md
    venv = repo / ".venv-vllm" / "bin"  # vllm.python, which must run Python: this interpreter stands in
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)
    # config/own-verifier.yaml's folder: a 4-layer Llama's files, a vocabulary wide enough for the card's
    # draft vocabulary (its free rows give the mask)
    own_verifier(repo / "own_verifier", vocab_size=40_000)
    # Qwen3-0.6B's depth and vocabulary (the card's aux layers and mask id), narrow elsewhere
    write_random_verifier(repo / "runs" / "card-offline" / "random_verifier", seed=0, dtype="float32",
                          hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=16)


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    r = copy_repo(tmp_path_factory.mktemp("docs"))
    _stand_ins(r)
    return r


@pytest.mark.parametrize("doc,cmd", COMMANDS, ids=[f"{d}:{c[:60]}" for d, c in COMMANDS])
def test_documented_command_runs(doc, cmd, repo, request):
    argv = shlex.split(cmd)
    if cmd == REPORT_COMMAND:  # needs a finished run: run as written on the micro run's directory
        path, out = request.getfixturevalue("html_report")
        assert path.stat().st_size > 100_000 and "Missing metadata" not in out.stdout + out.stderr
        return
    if argv[0] == "snakemake":
        if SLURM in cmd:  # the README's test line installs the slurm extra, so its profile is checked
            import snakemake_executor_plugin_slurm  # noqa: F401
        args = argv[1:]
        if "--cores" in args:  # run_snakemake passes --cores 1 itself
            i = args.index("--cores")
            del args[i:i + 2]
        out = run_snakemake(repo, "-n", *args, check=False)
        assert out.returncode == 0, f"{doc}: {cmd}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        return
    module = argv[2]
    args = argv[3:] if cmd.startswith(AS_WRITTEN) else (argv[3:4] if module == "domino" else []) + ["--help"]
    out = subprocess.run([sys.executable, "-m", module, *args], cwd=repo, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, f"{doc}: {cmd}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"


def test_code_map_lists_every_module():
    """The README's code map and ``ls domino/`` agree: every folder and every flat module (or
    file) on one line of its own, a folder alone on its line, and no path that does not exist: a
    module or folder added, moved or removed without its line in the map fails here."""
    pkg = ROOT / "domino"
    entries = sorted([f"{p.name}/" for p in pkg.iterdir() if (p / "__init__.py").is_file()]
                     + [p.name for p in pkg.glob("*.py") if p.name != "__init__.py"] + [p.name for p in pkg.glob("*.yaml")])
    lines = code_map()
    assert sorted(p for paths, _ in lines for p in paths) == entries
    assert all(len(paths) == 1 for paths, _ in lines if any(p.endswith("/") for p in paths))
    named = [p for _, files in lines for p in files]
    assert "card/paths.py" in named and all((pkg / p).exists() for p in named), [p for p in named if not (pkg / p).exists()]


def test_the_hub_upload_lines_upload_what_the_card_links_to(micro_run):
    """The README's ``hf upload`` lines, read against a finished run: each local path exists (the
    export's is the export rule's output), the card goes up as README.md, and every local file
    the card links to is among the uploads. The Hub itself is not reached."""
    from fnmatch import fnmatch

    block = re.search(r"<!-- hf-upload -->\n```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    uploads = [shlex.split(line) for line in block.strip().splitlines()]
    assert uploads and all(a[:2] == ["hf", "upload"] and a[2] == "<user>/<repo>" for a in uploads)
    in_repo = set()
    for argv in uploads:
        local, target = argv[3], argv[4]
        includes = [argv[i + 1] for i, a in enumerate(argv) if a == "--include"]
        if local.startswith("results/export/"):
            assert "results/export/{checkpoint}" in (ROOT / "workflow" / "rules" / "export.smk").read_text()
            continue
        path = micro_run / local
        if path.is_file():
            in_repo.add(path.name if target == "." else target)
        else:
            matched = [p.name for p in path.iterdir() if any(fnmatch(p.name, pat) for pat in includes)]
            assert len(matched) >= len(includes), (local, includes, matched)
            in_repo |= set(matched)
    assert "README.md" in in_repo
    card = (micro_run / "reports" / "model_card.md").read_text()
    links = {m for m in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", card) if "://" not in m}
    assert links and links <= in_repo, links - in_repo
