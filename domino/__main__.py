"""``python -m domino <stage>``: run one workflow stage without Snakemake.

Every stage takes ``--config`` (a JSON object ``{"declared": [...], "values": {...}}``, the
config keys the stage declares in ``domino/stages.py`` and their values, as the workflow
passes them; ``@file.json`` reads it from a file), its paths by name, and ``--log`` (the
stage's messages also go to that file). ``python -m domino <stage> --help`` lists a stage's paths.

Logging: a module that reports progress has ``logger = logging.getLogger(__name__)`` and adds no
handler; this entry point alone adds them, for the run of one stage (``log_to``): the
``domino.*`` loggers from INFO up go to stderr and to the ``--log`` file. Progress bars (tqdm)
write to the terminal only.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from contextlib import contextmanager
from pathlib import Path

from .stages import STAGES, UndeclaredKey, run_stage

logger = logging.getLogger("domino")  # the package's logger: this module runs as __main__

ROLE_HELP = {"input": "input path", "output": "output path (written atomically)",
             "param": "computed by the rule (a path, or the run names)", "wildcard": "the job's wildcard value"}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m domino", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="stage", required=True, metavar="STAGE",
                           help=", ".join(STAGES))
    for name, stage in STAGES.items():
        keys = ", ".join(stage.reads) + (" (and more in some configs)" if stage.reads_when else "")
        sp = sub.add_parser(name, help=f"reads {keys}", description=f"Stage {name}: reads config keys {keys}.")
        sp.add_argument("--config", required=True, help='{"declared": [...], "values": {...}} as JSON, or @file')
        sp.add_argument("--log", help="also write the stage's messages to this file")
        for arg, role in stage.paths.items():
            many = role.endswith("[]")  # a list: one value per run, in the same order as the others
            sp.add_argument("--" + arg.replace("_", "-"), dest=arg, required=True, nargs="+" if many else None,
                            help=ROLE_HELP[role.removesuffix("[]")] + (" (one per run)" if many else ""))
    return p


def read_config(raw: str) -> dict:
    text = Path(raw[1:]).read_text() if raw.startswith("@") else raw
    cfg = json.loads(text)
    if not isinstance(cfg, dict) or set(cfg) != {"declared", "values"}:
        raise SystemExit('--config must be {"declared": [...], "values": {...}} (see domino/stages.py)')
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


def interrupted_line(stage: str) -> str:
    return (f"domino {stage}: interrupted; what was complete is kept (training keeps its state under "
            "state/); run the same command again to resume")


def main(argv=None) -> None:
    args = parser().parse_args(argv)
    cfg = read_config(args.config)
    paths = {arg: getattr(args, arg) for arg in STAGES[args.stage].paths}
    # under torchrun every rank runs this: rank 0 alone writes the log (others would overwrite it)
    log_path = args.log if os.environ.get("RANK", "0") == "0" else None
    with log_to(log_path):
        try:
            run_stage(args.stage, cfg, paths)
        except KeyboardInterrupt:
            logger.error(interrupted_line(args.stage))
            raise SystemExit(130) from None
        except (ValueError, FileNotFoundError, RuntimeError, UndeclaredKey) as err:
            # one line for the errors we raise on purpose; DOMINO_TRACEBACK=1 shows the traceback
            if os.environ.get("DOMINO_TRACEBACK"):
                raise
            logger.error(f"domino {args.stage}: {type(err).__name__}: {err}")
            raise SystemExit(1) from None


if __name__ == "__main__":
    main()
