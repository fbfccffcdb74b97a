"""The report's files: the card, its appendix, the reproduction report, an HTML page of each,
the plots, and the templates that render the Markdown. One home for these names, light to
import: the workflow reads them at every Snakemake call, dry runs included, to declare the report
rule's outputs and inputs."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import NamedTuple

TEMPLATES = Path(__file__).parent / "templates"
PLOTS = {
    "acceptance": "acceptance_per_position.png",
    "conditional": "conditional_acceptance.png",
    "loss": "training_loss.png",
    "teacher_forced": "teacher_forced_vs_served.png",
}

# drawn only when the run has data-size points (``data_size_points``)
DATA_SIZE_PLOT = {"data_size": "data_size.png"}
# drawn only when a checkpoint trains with served validation (``domino.checkpoints.served_validated``)
SERVED_PLOT = {"served": "served_acceptance_curve.png"}
KIND_KEYS = ("projector", "shift_label", "weighting")  # what makes a checkpoint a card row's kind (checkpoints.<name>)


def data_size_points(checkpoints: dict, rows=("dflash-shift", "dflash-noshift", "domino")) -> dict[str, dict]:
    """The ``checkpoints:`` entries that are one of the card's ``rows`` trained on fewer
    conversations: the row's kind and one override, ``train.samples``. {name: {"row", "samples"}}."""
    out = {}
    for name, entry in checkpoints.items():
        extra = {k: v for k, v in entry.items() if k not in KIND_KEYS}
        if name in rows or extra.keys() != {"train"} or set(entry["train"]) != {"samples"}:
            continue
        row = next((r for r in rows if r in checkpoints and all(checkpoints[r].get(k) == entry.get(k)
                                                                for k in KIND_KEYS)), None)
        if row is not None and entry["train"]["samples"] is not None:
            out[name] = {"row": row, "samples": entry["train"]["samples"]}
    return out


def report_plots(checkpoints: dict, served: bool = False) -> dict[str, str]:
    """The plots a run's report draws (key -> file name): ``PLOTS``, ``DATA_SIZE_PLOT`` when the
    run has data-size points, and ``SERVED_PLOT`` when ``served``: a checkpoint trains with served
    validation."""
    return {**PLOTS, **(DATA_SIZE_PLOT if data_size_points(checkpoints) else {}), **(SERVED_PLOT if served else {})}


def template_files(folder: Path = TEMPLATES) -> list[Path]:
    """The card's Jinja2 templates."""
    return sorted(Path(folder).glob("*.j2"))


def template_digest(folder: Path = TEMPLATES) -> str:
    """The sha256 of the templates' names and contents: a param of the report rule, so that
    editing one reruns the report while a run directory, or the checkout beside it, may move
    (an input would name the templates by their absolute paths)."""
    h = hashlib.sha256()
    for path in template_files(folder):
        h.update(f"{path.name}\0{len(path.read_bytes())}\0".encode())
        h.update(path.read_bytes())
    return h.hexdigest()


class CardPaths(NamedTuple):
    """Where the report writes: the card and the reproduction report. Beside the card go its
    appendix (``appendix``), the plots under the names in ``PLOTS``, which the
    card links to, and an HTML page of each Markdown file (``html``)."""

    card: Path
    reproduction: Path

    @classmethod
    def under(cls, out_dir: str | Path) -> "CardPaths":
        d = Path(out_dir)
        return cls(d / "model_card.md", d / "reproduction.md")

    @property
    def appendix(self) -> Path:
        return appendix_path(self.card)

    @property
    def markdown(self) -> list[Path]:
        return [Path(self.card), self.appendix, Path(self.reproduction)]


def appendix_path(card: str | Path) -> Path:
    """The appendix beside a card: ``model_card.md`` -> ``model_card_appendix.md``."""
    card = Path(card)
    return card.with_name(f"{card.stem}_appendix{card.suffix}")


def html_path(markdown: str | Path) -> Path:
    """The HTML page of a Markdown file, beside it: ``model_card.md`` -> ``model_card.html``."""
    return Path(markdown).with_suffix(".html")
