"""The workflow's Snakemake logger plugin, named ``domino`` (``logger: [domino]`` in
profiles/default/config.yaml): errors Snakemake prints with a Python traceback become one line,
among them what it fails on before the workflow is read, such as a ``--configfile`` file that does
not exist.

Snakemake reads ``--configfile`` files while it parses its command line, before the Snakefile, so
no code of the workflow runs in time; a logger plugin does, as Snakemake sets up its logger from
the profile first. The plugin writes nothing itself: it adds a filter to Snakemake's logger that
rewrites such a record's message (``traceback_line``) before any handler, the
console's and the log file's, formats it. The full traceback stays in Snakemake's ``--verbose``
output, and ``DOMINO_TRACEBACK=1`` leaves the message as it was.

Snakemake imports every ``snakemake_logger_plugin_*`` module on its path when it starts, named in
a profile or not, and stops if one fails to import: this module imports nothing of ``domino``, so
that another checkout's older package on ``PYTHONPATH`` still runs.
"""

from __future__ import annotations

import logging
import os
import re

from snakemake_interface_logger_plugins.base import LogHandlerBase

SNAKEMAKE_LOGGER = "snakemake.logging"  # the logger Snakemake's messages go through
TRACEBACK = "Traceback (most recent call last):"


def traceback_line(message: str) -> str | None:
    """The one line for an error Snakemake prints with a Python traceback: a missing
    ``--configfile`` file (read before the workflow) named as such, any other error its exception's
    line; None for a message without a traceback (Snakemake's one-line errors and the workflow's
    own stay as they are). ``snakemake --verbose`` still prints the traceback."""
    if TRACEBACK not in message:
        return None
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    last = lines[-1]
    missing = re.match(r"FileNotFoundError: \[Errno 2\] No such file or directory: '(.*)'$", last)
    if missing and "load_configfile" in message:
        return (f"config error: --configfile {missing.group(1)}: no such file (a relative path is read "
                "from the directory snakemake starts in)")
    return f"error: {last} (snakemake --verbose prints the traceback)"


def one_line_errors(record: logging.LogRecord) -> bool:
    """A logger filter: an error record whose message carries a traceback gets its one line
    (``DOMINO_TRACEBACK=1`` leaves every record as Snakemake wrote it)."""
    if not os.environ.get("DOMINO_TRACEBACK") and record.levelno >= logging.ERROR and isinstance(record.msg, str):
        line = traceback_line(record.msg)
        if line:
            record.msg, record.args = line, ()
    return True


class LogHandler(LogHandlerBase):
    """Installs ``one_line_errors`` on Snakemake's logger; handles no record itself."""

    def __post_init__(self) -> None:
        target = logging.getLogger(SNAKEMAKE_LOGGER)
        if one_line_errors not in target.filters:
            target.addFilter(one_line_errors)

    # what Snakemake asks of a handler (abstract in LogHandlerBase): it writes nowhere, and takes
    # Snakemake's default filter and formatter
    writes_to_stream = writes_to_file = has_filter = has_formatter = needs_rulegraph = False

    def emit(self, record: logging.LogRecord) -> None:
        pass
