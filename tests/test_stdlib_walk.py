"""The python-stdlib corpus reads the standard library only: the skipped trees (installed
packages, tests, GUI demos) are pruned before the walk descends, so a package being installed
beside it cannot break it."""

import os
import sysconfig
from pathlib import Path

from domino.data import corpora as D

FUNCTION = 'def f(a, b):\n    """Add two numbers, the long way round."""\n' + "    total = a\n" * 8 + "    return total + b\n"


def test_the_walk_never_enters_a_skipped_tree(tmp_path, monkeypatch):
    (tmp_path / "json").mkdir()
    (tmp_path / "mod.py").write_text(FUNCTION)
    (tmp_path / "json" / "inner.py").write_text(FUNCTION)
    for skipped in ("site-packages", "dist-packages", "test", "tkinter"):
        (tmp_path / skipped / "pkg").mkdir(parents=True)
        (tmp_path / skipped / "pkg" / "x.py").write_text(FUNCTION)
    listed = []
    real = os.scandir

    def spy(path="."):
        listed.append(Path(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", spy)
    monkeypatch.setattr(D.sysconfig, "get_paths", lambda: {"stdlib": str(tmp_path)})
    records = list(D.python_stdlib_records(10))
    assert [r["id"].split(":")[0] for r in records] == ["json/inner.py", "mod.py"]
    assert sorted(listed) == [tmp_path, tmp_path / "json"]  # no skipped folder was even listed


def test_a_package_vanishing_under_site_packages_breaks_nothing(tmp_path, monkeypatch):
    """A folder of site-packages that disappears while the corpus is read (pip replacing a package)."""
    (tmp_path / "mod.py").write_text(FUNCTION)
    (tmp_path / "site-packages").mkdir()
    real = os.scandir

    def install_in_progress(path="."):
        if "site-packages" in Path(path).parts:
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", install_in_progress)
    monkeypatch.setattr(D.sysconfig, "get_paths", lambda: {"stdlib": str(tmp_path)})
    assert [r["id"] for r in D.python_stdlib_records(10)] == ["mod.py:f:1"]


def test_the_corpus_files_are_the_standard_librarys_as_before():
    """The pruned walk lists exactly the files the filtered recursive glob listed, so the corpus and
    its data_sha256 are unchanged."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "idlelib", "site-packages", "lib2to3", "turtledemo", "tkinter", "ensurepip"}
    assert D.stdlib_files(root) == sorted(p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts))
