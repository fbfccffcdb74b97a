"""The report's files: the card, its appendix, the reproduction report, an HTML page of each,
the plots, and the templates that render the Markdown. One home for these names, light to
import: the workflow reads them at every Snakemake call, dry runs included, to declare the report
rule's outputs and inputs."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

TEMPLATES = Path(__file__).parent / "templates"
PLOTS = {
    "acceptance": "acceptance_per_position.png",
    "conditional": "conditional_acceptance.png",
    "loss": "training_loss.png",
    "teacher_forced": "teacher_forced_vs_served.png",
}


def template_files() -> list[Path]:
    """The card's Jinja2 templates: inputs of the report rule, so that editing one reruns it."""
    return sorted(TEMPLATES.glob("*.j2"))


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
