"""A stage's log: where its messages go, and the one line it ends with when it fails.

A module that reports progress has ``logger = logging.getLogger(__name__)`` and adds no handler;
the entry point (``python -m domino``) alone adds them, for the run of one stage (``log_to``):
the ``domino.*`` loggers from INFO up go to stderr and to the ``--log`` file. Progress bars (tqdm)
write to the terminal only.

Errors: a stage that fails ends its log with one line, ``domino <stage>: <Type>: <message>``
(``error_line``), which the workflow prints again when a run stops (``job_error_lines``), naming
the log. The traceback goes to the log file, above that line, and not to the terminal
(``LOG_ONLY``; the workflow's profiles keep Snakemake from printing failed logs). A target no rule
makes is refused in one line too (``missing_target_line``), and so is what Snakemake fails on
before it reads the workflow, such as a ``--configfile`` file that does not exist
(the Snakemake logger plugin the default profile names, ``snakemake_logger_plugin_domino``).
"""

from __future__ import annotations

import logging
import re
import sys
from contextlib import contextmanager
from pathlib import Path

logger = logging.getLogger("domino")  # the package's logger

LOG_ONLY = "domino_log_only"  # a record with this attribute set goes to the log file, not the terminal
TRACEBACK_HEADER = "traceback of the error below:"  # the log's line above a failed stage's traceback


@contextmanager
def log_to(log_path: str | Path | None):
    """Handlers for one stage run: the ``domino.*`` loggers from INFO up, and the warnings of
    libraries that log through the root logger (``warnings.warn`` included), go to stderr and to
    ``log_path`` (overwritten) when given. transformers keeps a handler of its own and does not
    pass its messages up, so they reach the terminal only. On exit the handlers are taken off
    again: a stage run in process (a test) leaves logging as it found it."""
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_path:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_path, mode="w", encoding="utf-8"))
    handlers[0].setFormatter(logging.Formatter("%(message)s"))
    handlers[0].addFilter(lambda record: not getattr(record, LOG_ONLY, False))
    for h in handlers[1:]:
        h.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%Y-%m-%d %H:%M:%S"))
    root = logging.getLogger()
    levels = root.level, logger.level
    for h in handlers:
        root.addHandler(h)
    root.setLevel(logging.WARNING)  # other libraries: warnings and errors only
    logger.setLevel(logging.INFO)
    logging.captureWarnings(True)
    try:
        yield
    finally:
        logging.captureWarnings(False)
        for h in handlers:
            root.removeHandler(h)
            h.close()
        root.setLevel(levels[0])
        logger.setLevel(levels[1])


def job_error_lines(logs: str | Path, since: float, stages) -> list[str]:
    """The one-line error that ends each job log under ``logs`` written since ``since`` (a
    ``time.time()``), with its time stamp taken off: the workflow prints them last when a run
    stops (``onerror``), so that an interrupted or failed job's own line is what a user reads
    last, not Snakemake's error block with the job's whole command. A line whose log holds the
    error's traceback ends ``(traceback: <log>)``. ``stages``: the stage names
    (``domino.stages.STAGES``), passed in: this module sits below the stage layer and imports none of it."""
    stage_names = list(stages)
    error = re.compile(rf"(?:\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d )?(domino (?:{'|'.join(stage_names)}): .*)")
    found = []
    for log in sorted(Path(logs).rglob("*.log")):
        if log.stat().st_mtime < since:
            continue
        text = log.read_text(errors="replace")
        lines = text.strip().splitlines()
        m = error.fullmatch(lines[-1]) if lines else None
        if m:
            found.append(m.group(1) + (f" (traceback: {log})" if TRACEBACK_HEADER in text else ""))
    return found


def missing_target_line(message: str, targets: list[str]) -> str | None:
    """The one line for Snakemake's ``MissingRuleException`` message (``No rule to produce X
    ...``): the target asked for, and ``targets``, what a user asks for; None for another message."""
    m = re.search(r"No rule to produce (.+?)(?: \(if you use input functions|\.?$)", message, re.M)
    if not m:
        return None
    return f"error: no rule makes {m.group(1)} (targets: {', '.join(targets)})"


def error_line(stage: str, err: BaseException) -> str:
    """The one line a failed stage ends its log with: its message's lines joined, so that a
    multi-line message (a template's syntax error, a library's report) stays one line."""
    message = " ".join(part.strip() for part in str(err).splitlines() if part.strip())
    return f"domino {stage}: {type(err).__name__}: {message}"


def interrupted_line(stage: str) -> str:
    return (f"domino {stage}: interrupted; what was complete is kept (training keeps its state under "
            "state/); run the same command again to resume")
