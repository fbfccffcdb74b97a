"""``python -m domino <stage>``: run one workflow stage without Snakemake.

Every stage takes ``--config`` (a JSON object ``{"declared": [...], "values": {...}}``, the
config keys the stage declares in ``domino/stages.py`` and their values, as the workflow
passes them; ``@file.json`` reads it from a file; ``@config.yaml``, given once or more, merges
config files as ``--configfile`` does and gives the stage its declared keys of the result), its
paths by name, and ``--log`` (the stage's messages also go to that file).
``python -m domino <stage> --help`` lists a stage's paths.

Logging and errors (``domino.logs``): the ``domino.*`` loggers from INFO up go to stderr and to
the ``--log`` file; a stage that fails ends its log with one line, ``domino <stage>: <Type>:
<message>``, the traceback above it in the log file only (none for a stop asked for, an
exception marked ``resumable``); ``DOMINO_TRACEBACK=1`` lets the
exception through instead.
"""

from __future__ import annotations

import argparse
import logging
import os
import traceback

from .logs import LOG_ONLY, TRACEBACK_HEADER, error_line, interrupted_line, log_to
from .stages import STAGES, ConfigArgumentError, read_config, run_stage

logger = logging.getLogger("domino")  # the package's logger: this module runs as __main__

ROLE_HELP = {"input": "input path", "output": "output path (written atomically)",
             "param": "computed by the rule (a path, or the row names)", "wildcard": "the job's wildcard value"}


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
            many = role.endswith("[]")  # a list: one value per run, in the same order as the others (maybe none)
            sp.add_argument("--" + arg.replace("_", "-"), dest=arg, required=True, nargs="*" if many else None,
                            help=ROLE_HELP[role.removesuffix("[]")] + (" (one per run)" if many else ""))
    return p


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
            if not getattr(err, "resumable", False):  # a stop asked for (training's Interrupted) is no fault
                logger.error("%s\n%s", TRACEBACK_HEADER, traceback.format_exc().rstrip(), extra={LOG_ONLY: True})
            logger.error(error_line(args.stage, err))
            raise SystemExit(1) from None


if __name__ == "__main__":
    main()
