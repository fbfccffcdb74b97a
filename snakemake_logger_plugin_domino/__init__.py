"""The workflow's Snakemake logger plugin, named ``domino`` (``logger: [domino]`` in
profiles/default/config.yaml): errors Snakemake prints with a Python traceback before the workflow
is read, such as a ``--configfile`` file that does not exist, become one line.

Snakemake reads ``--configfile`` files while it parses its command line, before the Snakefile, so
no code of the workflow runs in time; a logger plugin does, as Snakemake sets up its logger from
the profile first. The plugin writes nothing itself: it adds a filter to Snakemake's logger that
rewrites such a record's message (``domino.logs.before_workflow_line``) before any handler, the
console's and the log file's, formats it. The full traceback stays in Snakemake's ``--verbose``
output, and ``DOMINO_TRACEBACK=1`` leaves the message as it was.
"""

from __future__ import annotations

import logging
import os

from snakemake_interface_logger_plugins.base import LogHandlerBase

from domino.logs import before_workflow_line

SNAKEMAKE_LOGGER = "snakemake.logging"  # the logger Snakemake's messages go through


def one_line_errors(record: logging.LogRecord) -> bool:
    """A logger filter: an error record whose message carries a traceback gets its one line
    (``DOMINO_TRACEBACK=1`` leaves every record as Snakemake wrote it)."""
    if not os.environ.get("DOMINO_TRACEBACK") and record.levelno >= logging.ERROR and isinstance(record.msg, str):
        line = before_workflow_line(record.msg)
        if line:
            record.msg, record.args = line, ()
    return True


class LogHandler(LogHandlerBase):
    """Installs ``one_line_errors`` on Snakemake's logger; handles no record itself."""

    def __post_init__(self) -> None:
        target = logging.getLogger(SNAKEMAKE_LOGGER)
        if one_line_errors not in target.filters:
            target.addFilter(one_line_errors)

    def emit(self, record: logging.LogRecord) -> None:
        pass

    @property
    def writes_to_stream(self) -> bool:
        return False

    @property
    def writes_to_file(self) -> bool:
        return False

    @property
    def has_filter(self) -> bool:
        return False

    @property
    def has_formatter(self) -> bool:
        return False

    @property
    def needs_rulegraph(self) -> bool:
        return False
