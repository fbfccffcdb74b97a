"""``python -m domino <stage>``: run one workflow stage without Snakemake.

Every stage takes ``--config`` (a JSON object ``{"declared": [...], "values": {...}}``, the
config keys the stage declares in ``domino/stages.py`` and their values, as the workflow
passes them; ``@file.json`` reads it from a file; ``@config.yaml``, given once or more, merges
config files as ``--configfile`` does and gives the stage its declared keys of the result), its
paths by name, and ``--log`` (the stage's messages also go to that file).
``python -m domino <stage> --help`` lists a stage's paths.

Logging: a module that reports progress has ``logger = logging.getLogger(__name__)`` and adds no
handler; this entry point alone adds them, for the run of one stage (``log_to``): the
``domino.*`` loggers from INFO up go to stderr and to the ``--log`` file. Progress bars (tqdm)
write to the terminal only.

Errors: a stage that fails ends its log with one line, ``domino <stage>: <Type>: <message>``,
which the workflow prints again when a run stops. The traceback goes to the log file, above
that line, and not to the terminal; ``DOMINO_TRACEBACK=1`` lets the exception through instead.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import traceback
from contextlib import contextmanager
from pathlib import Path

from .stages import STAGES, run_stage

logger = logging.getLogger("domino")  # the package's logger: this module runs as __main__

LOG_ONLY = "domino_log_only"  # a record with this attribute set goes to the log file, not the terminal
ROLE_HELP = {"input": "input path", "output": "output path (written atomically)",
             "param": "computed by the rule (a path, or the run names)", "wildcard": "the job's wildcard value"}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m domino", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="stage", required=True, metavar="STAGE",
                           help=", ".join(STAGES))
    for name, stage in STAGES.items():
        keys = ", ".join(stage.reads) + (" (and more in some configs)" if stage.reads_when else "")
        sp = sub.add_parser(name, help=f"reads {keys}", description=f"Stage {name}: reads config keys {keys}.")
        sp.add_argument("--config", required=True, action="append",
                        help='the declared keys and their values as JSON, {"declared": [...], "values": {...}}, '
                             "as the workflow passes them (snakemake -n -p prints them), or @FILE.json holding "
                             "it; or @config.yaml (repeat it to add overlays: --config @config.yaml "
                             "--config @config/card.yaml), the config files merged and validated")
        sp.add_argument("--log", help="also write the stage's messages to this file")
        for arg, role in stage.paths.items():
            many = role.endswith("[]")  # a list: one value per run, in the same order as the others
            sp.add_argument("--" + arg.replace("_", "-"), dest=arg, required=True, nargs="+" if many else None,
                            help=ROLE_HELP[role.removesuffix("[]")] + (" (one per run)" if many else ""))
    return p


class ConfigArgumentError(ValueError):
    """A ``--config`` argument that cannot be read."""


YAML_SUFFIXES = (".yaml", ".yml")


def read_config(raws: str | list[str], stage: str | None = None, wildcards: dict | None = None) -> dict:
    """The ``--config`` of a stage: ``{"declared": [...], "values": {...}}``, given as JSON (inline
    or ``@file.json``), or built from config files (``@config.yaml``, more than one merged in
    order) as the workflow builds it, for ``stage`` and its ``wildcards``."""
    from .config import ConfigError, load_config
    from .stages import stage_config

    raws = [raws] if isinstance(raws, str) else list(raws)
    files = [r[1:] for r in raws if r.startswith("@") and r.lower().endswith(YAML_SUFFIXES)]
    if files:
        if len(files) != len(raws) or stage is None:
            raise ConfigArgumentError("--config: give either config files (@config.yaml, repeated for overlays) "
                                      "or one JSON object, not both")
        try:
            return json.loads(stage_config(stage, load_config(files), wildcards or {}))
        except ConfigError as err:
            hint = (f" ({files[0]} may be an overlay: give the base first, --config @config.yaml --config {raws[0]})"
                    if len(files) == 1 and "required key is missing" in str(err) else "")
            raise ConfigArgumentError(f"--config {' '.join(raws)}: {err}{hint}") from None
        except KeyError as err:  # a wildcard naming no entry: --checkpoint no-such-checkpoint
            raise ConfigArgumentError(f"--config {' '.join(raws)}: no {err.args[0]!r} where the stage reads "
                                      f"{sorted((wildcards or {}).items())} (allowed: what the config names)") from None
    if len(raws) != 1:
        raise ConfigArgumentError("--config: one JSON object, or config files (@config.yaml, repeated for overlays)")
    raw = raws[0]
    try:
        text = Path(raw[1:]).read_text() if raw.startswith("@") else raw
    except OSError as err:
        raise ConfigArgumentError(f"--config {raw}: cannot be read ({err.strerror})") from None
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigArgumentError(f"--config {raw if raw.startswith('@') else '...'}: not JSON ({err}); it takes "
                                  '{"declared": [...], "values": {...}} as JSON, or config files as @config.yaml'
                                  ) from None
    if not isinstance(cfg, dict) or set(cfg) != {"declared", "values"}:
        raise ConfigArgumentError('--config must be {"declared": [...], "values": {...}} (see domino/stages.py), '
                                  "or config files as @config.yaml")
    return cfg


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


def job_error_lines(logs: str | Path, since: float) -> list[str]:
    """The one-line error that ends each job log under ``logs`` written since ``since`` (a
    ``time.time()``), with its time stamp taken off: the workflow prints them last when a run
    stops (``onerror``), so that an interrupted or failed job's own line is what a user reads
    last, not Snakemake's error block with the job's whole command."""
    error = re.compile(rf"(?:\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d )?(domino (?:{'|'.join(STAGES)}): .*)")
    found = []
    for log in sorted(Path(logs).rglob("*.log")):
        if log.stat().st_mtime < since:
            continue
        lines = log.read_text(errors="replace").strip().splitlines()
        m = error.fullmatch(lines[-1]) if lines else None
        if m:
            found.append(m.group(1))
    return found


def error_line(stage: str, err: BaseException) -> str:
    """The one line a failed stage ends its log with: its message's lines joined, so that a
    multi-line message (a template's syntax error, a library's report) stays one line."""
    message = " ".join(part.strip() for part in str(err).splitlines() if part.strip())
    return f"domino {stage}: {type(err).__name__}: {message}"


def interrupted_line(stage: str) -> str:
    return (f"domino {stage}: interrupted; what was complete is kept (training keeps its state under "
            "state/); run the same command again to resume")


def main(argv=None) -> None:
    args = parser().parse_args(argv)
    paths = {arg: getattr(args, arg) for arg in STAGES[args.stage].paths}
    wildcards = {arg: paths[arg] for arg, role in STAGES[args.stage].paths.items() if role == "wildcard"}
    try:
        cfg = read_config(args.config, args.stage, wildcards)
    except ConfigArgumentError as err:
        raise SystemExit(str(err)) from None
    # under torchrun every rank runs this: rank 0 alone writes the log (others would overwrite it)
    log_path = args.log if os.environ.get("RANK", "0") == "0" else None
    with log_to(log_path):
        try:
            run_stage(args.stage, cfg, paths)
        except KeyboardInterrupt:
            logger.error(interrupted_line(args.stage))
            raise SystemExit(130) from None
        except Exception as err:
            if os.environ.get("DOMINO_TRACEBACK"):
                raise
            logger.error("traceback of the error below:\n%s", traceback.format_exc().rstrip(), extra={LOG_ONLY: True})
            logger.error(error_line(args.stage, err))
            raise SystemExit(1) from None


if __name__ == "__main__":
    main()
