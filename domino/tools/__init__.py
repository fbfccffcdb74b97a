"""Checks a user runs by hand, ``python -m domino.tools.<name>``; the workflow never calls them.
Each prints its use with ``--help``."""

import argparse
import os

from ..config import section_defaults


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and each argument's default after its help."""


def tool_parser(name: str, doc: str) -> argparse.ArgumentParser:
    """The parser of ``python -m domino.tools.<name>``: its module docstring is the description."""
    return argparse.ArgumentParser(prog=f"python -m domino.tools.{name}", description=doc,
                                   formatter_class=_HelpFormatter)


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    """``--threads`` of a tool that times decodes, by default the benchmark job's count (the schema's
    ``benchmark.threads``), so that the tool measures what the benchmark measures. A second
    thread does not pay at the embedded default's shapes: with OpenMP's waiting threads asleep
    (``PASSIVE``, which ``import domino`` selects) every small parallel operation wakes one,
    and two threads made each part of a speculative step 3 to 4.5 times slower there."""
    parser.add_argument("--threads", type=int, default=section_defaults("benchmark")["threads"],
                        help="torch CPU threads (the benchmark job's count)")


def wait_policy() -> str:
    """OpenMP's wait policy in this process, as the environment sets it, for a tool's header."""
    if "OMP_WAIT_POLICY" in os.environ:
        return os.environ["OMP_WAIT_POLICY"]
    if "GOMP_SPINCOUNT" in os.environ:
        return "GOMP_SPINCOUNT=" + os.environ["GOMP_SPINCOUNT"]
    return "libgomp's default"
