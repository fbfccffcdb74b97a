"""domino.tools: every check run by hand explains itself with --help."""

import importlib
import pkgutil
import subprocess
import sys

import pytest

import domino.tools

TOOLS = sorted(m.name for m in pkgutil.iter_modules(domino.tools.__path__))


def test_the_tools_are_found():
    assert {"bench_decode", "bench_memory", "bench_paired", "compare", "random_verifier"} <= set(TOOLS)


@pytest.mark.parametrize("name", TOOLS)
def test_help_says_what_the_tool_does_and_what_each_argument_is(name):
    """The description is the module's docstring, whole; every argument has a help text."""
    module = importlib.import_module(f"domino.tools.{name}")
    p = module.parser()
    assert p.prog == f"python -m domino.tools.{name}"
    assert p.description == module.__doc__ and len(p.description.strip().splitlines()) >= 3
    for action in p._actions:
        if action.dest != "help":
            assert action.help and len(action.help) > 8, (name, action.dest)


def test_help_prints_the_description_and_the_arguments():
    out = subprocess.run([sys.executable, "-m", "domino.tools.compare", "--help"], capture_output=True, text=True,
                         check=True).stdout
    assert "Every file\nunder ``results/`` must be byte-identical" in out  # the docstring as written
    assert "a workflow run directory (with results/ and reports/)" in out
