"""The tree is clean under the linter the project pins (``[tool.ruff]`` in pyproject.toml):
no syntax error, no unused import or variable, no undefined name."""

import subprocess
import sys

from conftest import ROOT


def test_the_tree_is_clean_under_ruff():
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise", "domino", "snakemake_logger_plugin_domino", "tests"],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
