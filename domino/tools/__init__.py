"""Checks a user runs by hand, ``python -m domino.tools.<name>``; the workflow never calls them.
Each prints its use with ``--help``."""

import argparse


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and each argument's default after its help."""


def tool_parser(name: str, doc: str) -> argparse.ArgumentParser:
    """The parser of ``python -m domino.tools.<name>``: its module docstring is the description."""
    return argparse.ArgumentParser(prog=f"python -m domino.tools.{name}", description=doc,
                                   formatter_class=_HelpFormatter)
