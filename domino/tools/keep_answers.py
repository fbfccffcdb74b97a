"""Keep a finished run's regenerated answers in the repository: ``python -m domino.tools.keep_answers``.

Regenerating the verifier's answers (``data.responses: verifier``) is a study's costliest input on
a CPU, and a run directory does not outlive a change of machine. This tool writes a finished run's
``results/regenerate/{train,val}.jsonl``, each shard with the key that decided its answers, into a
folder (``answers.jsonl.gz``, a few MB, and ``manifest.json``: its sha256, the generating commit,
the verifier's dtype and the CPU units of the machine that answered). A later run given that
folder as ``data.kept_answers`` checks the sha256 and answers only the shards whose key is not its
own (``domino.data.regenerate.seed_parts``).

    python -m domino.tools.keep_answers --run runs/smollm2-quick-answers --out answers/smollm2-quick-float32
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from ..data.regenerate import write_kept
from ..io import read_json, read_jsonl
from . import tool_parser


def commit_of(folder: Path) -> str | None:
    """The commit checked out in ``folder`` (a clone the run ran in), or None outside a git tree."""
    r = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None


def parser():
    p = tool_parser("keep_answers", __doc__)
    p.add_argument("--run", required=True, help="a run directory whose regenerate jobs finished (results/regenerate/)")
    p.add_argument("--out", required=True, help="the folder to write answers.jsonl.gz and manifest.json into")
    p.add_argument("--commit", help="the commit the run's workflow ran at (default: the checkout the run "
                                    "directory lies in; needed where it lies outside one)")
    return p


def main(argv=None) -> None:
    args = parser().parse_args(argv)
    run = Path(args.run)
    commit = args.commit or commit_of(run)
    if commit is None:
        raise SystemExit(f"keep_answers: {run} lies in no git checkout: name the commit its workflow ran at with --commit")
    splits = {}
    for split in ("train", "val"):
        rows = read_jsonl(run / "results" / "regenerate" / f"{split}.jsonl", what="regenerated answers")
        splits[split] = (rows, read_json(run / "results" / "regenerate" / f"{split}.json", "regenerate summary"))
    m = write_kept(args.out, splits, {"commit": commit})
    counts = ", ".join(f"{s}: {v['conversations']} conversations" for s, v in m["splits"].items())
    print(f"kept {counts} in {Path(args.out) / m['file']} ({m['bytes'] / 2**20:.1f} MiB, sha256 {m['sha256'][:12]}...)")


if __name__ == "__main__":
    main()
