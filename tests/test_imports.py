"""The walls of ``domino/``, kept by its imports and stated here by module-name prefixes (the rooms
below, which the README's code map describes): no import circle, the algorithm importing nothing
from the pipeline (the stage layer, the card, the tools), the card reading results files and never
models, and nothing outside the tools importing them. Every import counts, those inside functions
and under ``TYPE_CHECKING`` included."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "domino"

# the rooms, each a tuple of module-name prefixes: a prefix names that module and every module under it
ALGORITHM = ("domino.aux", "domino.vocab", "domino.model", "domino.loss", "domino.export", "domino.decode",
             "domino.decoders", "domino.suffix", "domino.adaptive",
             "domino.sampling")
# the verifier families' table is plain data every room reads: plumbing, though it lives in the verifier's folder
PLUMBING = ("domino.schema", "domino.checkpoints", "domino.common", "domino.host", "domino.io", "domino.shapes",
            "domino.stats", "domino.acceptance", "domino.verifier.families")
# the config gate checks a config against what the rooms below it know (suites, decoders, verifier facts)
GATE = ("domino.config", "domino.rundir")
STAGE_LAYER = ("domino.__main__", "domino.stages", "domino.logs")
STAGE_FOLDERS = ("domino.verifier", "domino.data", "domino.train", "domino.bench", "domino.vllm")
CARD = ("domino.card",)
TOOLS = ("domino.tools",)
ROOMS = (ALGORITHM, PLUMBING, GATE, STAGE_LAYER, STAGE_FOLDERS, CARD, TOOLS)
PIPELINE = ("domino.stages", "domino.__main__", "domino.card", "domino.tools")
# what the card may import from the package besides itself: plumbing that reads files and numbers, and the
# registry of the rows without training (light on import: what a decoder is built from loads only when built)
CARD_MAY_IMPORT = ("domino.acceptance", "domino.checkpoints", "domino.common", "domino.config", "domino.decoders",
                   "domino.io", "domino.schema", "domino.stats")


def _longest(module: str, prefixes) -> str | None:
    """The longest of ``prefixes`` that names ``module`` (that module, or one under it), or None."""
    return max((p for p in prefixes if module == p or module.startswith(p + ".")), key=len, default=None)


def room_of(module: str) -> tuple[str, ...] | None:
    """The room of ``module``: the one whose prefix naming it is the longest (``domino.verifier.families``
    is plumbing, the rest of ``domino.verifier`` a stage's folder); None where no prefix names it."""
    best = _longest(module, [p for room in ROOMS for p in room])
    return next((room for room in ROOMS if best in room), None)


def within(module: str, prefixes: tuple[str, ...]) -> bool:
    """One of ``prefixes`` names ``module``, and no longer prefix of a room does."""
    return _longest(module, [*prefixes, *(p for room in ROOMS for p in room)]) in prefixes


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in PKG.rglob("*.py")}


def _module_level(tree: ast.AST):
    """The nodes of ``tree`` outside every function body: what runs when the module is imported."""
    for node in ast.iter_child_nodes(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield node
            yield from _module_level(node)


def _imports(name: str, lazy: bool = True) -> set[str]:
    """The package's modules that module ``name`` imports (``from . import x`` names module x);
    ``lazy`` False: only those imported at module level, none inside a function."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree) if lazy else _module_level(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            found |= {f"{target}.{a.name}" if f"{target}.{a.name}" in MODULES else target for a in node.names}
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: _imports(name) for name in MODULES}
MODULE_LEVEL = {name: _imports(name, lazy=False) for name in MODULES}
# the floors, lowest first: a lazy import (inside a function) never reaches a floor above its own
FLOORS = (PLUMBING, ALGORITHM, STAGE_FOLDERS, GATE, CARD, STAGE_LAYER, TOOLS)
MAX_CHAIN = 8  # the longest import chain, in modules, the importer first, lazy imports counted


def _longest_chain(graph: dict[str, set[str]]) -> list[str]:
    """The longest chain of imports of a graph without circles: module, a module it imports, and
    on, as far as it goes (counted in modules: ``a -> b`` is 2)."""
    memo: dict[str, list[str]] = {}

    def chain(v):
        if v not in memo:
            memo[v] = [v, *max((chain(w) for w in sorted(graph[v])), key=len, default=[])]
        return memo[v]

    return max((chain(v) for v in sorted(graph)), key=len, default=[])


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_import_graph_is_read():
    """Not vacuous: known edges are found, and a circle is found where one is made."""
    assert "domino.model" in GRAPH["domino.bench.job"] and "domino.card.paths" in GRAPH["domino.card.render"]
    assert "domino.data.corpora" in GRAPH["domino.stages"]  # from .data import corpora as data_lib
    assert _circles({**GRAPH, "domino.model": GRAPH["domino.model"] | {"domino.bench.job"}})


def test_every_module_is_in_one_room():
    """A module added outside every room, a prefix naming no module, or one in two rooms fails here."""
    prefixes = [p for room in ROOMS for p in room]
    assert [p for p in prefixes if p not in MODULES] == [] and len(prefixes) == len(set(prefixes))
    assert [m for m in MODULES if m != "domino" and room_of(m) is None] == []
    assert room_of("domino.verifier.families") is PLUMBING and room_of("domino.verifier.facts") is STAGE_FOLDERS


def test_no_import_circle():
    assert _circles(GRAPH) == []


def test_the_longest_import_chain_counting_lazy_imports_is_at_most_8():
    """Every import counts, those inside functions included: a change at the bottom reaches the top
    through at most 8 modules."""
    assert _longest_chain({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"c"}}) == ["a", "b", "c"]
    assert "domino.config" in MODULE_LEVEL["domino.rundir"]
    assert "domino.card.report" in GRAPH["domino.stages"] and "domino.card.report" not in MODULE_LEVEL["domino.stages"]
    chain = _longest_chain(GRAPH)
    assert 2 <= len(_longest_chain(MODULE_LEVEL)) <= len(chain) <= MAX_CHAIN, " -> ".join(chain)


def test_no_import_goes_back_up():
    """Every import, at module level or inside a function, reaches the importer's floor or one below
    (``FLOORS``), never one above: a lower module that needs a fact of a higher one has it moved
    down, not imported late."""
    floor = {m: FLOORS.index(room_of(m)) for m in MODULES if m != "domino"}
    assert floor["domino.verifier.load"] < floor["domino.config"] < floor["domino.stages"]
    assert "domino.bench.suites" in MODULE_LEVEL["domino.config"]  # the gate reads the suites: below it
    up = {m: sorted(d for d in GRAPH[m] if d != "domino" and floor[d] > floor[m]) for m in floor}
    assert not any(up.values()), {m: d for m, d in up.items() if d}


def test_the_algorithm_imports_nothing_from_the_pipeline_the_card_or_the_tools():
    algorithm = [m for m in MODULES if within(m, ALGORITHM)]
    assert {"domino.model", "domino.decode", "domino.loss"} <= set(algorithm)
    bad = {m: sorted(d for d in GRAPH[m] if within(d, PIPELINE)) for m in algorithm}
    assert not any(bad.values()), bad
    # nor from the stages' folders: below the algorithm lies only the plumbing
    bad = {m: sorted(d for d in GRAPH[m] if not within(d, ALGORITHM + PLUMBING)) for m in algorithm}
    assert not any(bad.values()), bad


def test_the_card_reads_results_never_models():
    card = [m for m in MODULES if within(m, CARD)]
    bad = {m: sorted(d for d in GRAPH[m] if d != "domino" and not within(d, CARD + CARD_MAY_IMPORT)) for m in card}
    assert not any(bad.values()), bad
    # and in a fresh interpreter: importing every card module loads neither transformers nor the model
    code = ("import sys\n" + "".join(f"import {m}\n" for m in sorted(card))
            + "print(sorted(m for m in ('transformers', 'domino.model', 'domino.bench.job') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_only_the_tools_import_the_tools():
    bad = {m: sorted(d for d in GRAPH[m] if within(d, TOOLS)) for m in MODULES if not within(m, TOOLS)}
    assert not any(bad.values()), bad


def test_the_workflow_names_the_report_files_without_matplotlib():
    """Every Snakemake call reads the report rule's file names: their module loads no plotting."""
    code = "import sys, domino.card.paths; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.stdout.strip() == "False", out.stdout + out.stderr
    assert "domino.card.paths" in (ROOT / "workflow" / "rules" / "report.smk").read_text()


def test_no_test_module_imports_another():
    """What several test modules share lives in conftest.py; a test module imports no other one
    (running one file alone then collects only that file's tests)."""
    offenders = []
    for path in sorted(Path(__file__).parent.glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0].startswith("test_")]
    assert not offenders, offenders
