"""The results files' JSON Schemas (domino/card/results_schemas.yaml): the fixtures the card
tests read obey them, and docs/results.md shows exactly their fields."""

import json
import re
from pathlib import Path

import pytest

from domino.card import results

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "results"
MARKED = re.compile(r"<!-- fields: (\w+) -->\n(.*?)\n<!-- /fields -->", re.S)


def test_docs_show_every_schema_field_and_no_other():
    doc = (ROOT / "docs" / "results.md").read_text()
    shown = dict(MARKED.findall(doc))
    assert sorted(shown) == sorted(results.schemas()), "docs/results.md needs one field table per results file"
    for kind, table in shown.items():
        assert table == results.field_table(kind), f"regenerate docs/results.md's {kind} table: " \
                                                   f"python -m domino.card.results {kind}"


def test_every_field_says_what_it_is():
    for kind in results.schemas():
        for field, _, _, meaning in results.field_rows(kind):
            assert meaning, f"{kind}: {field} has no description"


@pytest.mark.parametrize("kind,pattern", [("validate", "validate/*.json"), ("benchmark", "benchmark/*/*.json"),
                                          ("benchmark", "sampling/*/*/*.json"), ("train_summary", "train/*/summary.json"),
                                          ("drafter_config", "train/*/checkpoint/drafter_config.json")])
def test_the_fixtures_obey_their_schemas(kind, pattern):
    paths = sorted(FIXTURE.glob(pattern))
    assert paths, pattern
    for p in paths:
        results.check(json.loads(p.read_text()), kind, p)


def test_a_field_the_card_requires_is_named_when_missing():
    bench = json.loads((FIXTURE / "benchmark" / "humaneval" / "domino.json").read_text())
    del bench["prompts"][3]["accepted_per_step"]
    with pytest.raises(ValueError, match=r"x\.json lacks field prompts\.3\.accepted_per_step$"):
        results.check(bench, "benchmark", "x.json")
    bench = json.loads((FIXTURE / "benchmark" / "humaneval" / "domino.json").read_text())
    bench["summary"]["tps_ci"] = [1.0]
    with pytest.raises(ValueError, match=r"x\.json: summary\.tps_ci: .*too short"):
        results.check(bench, "benchmark", "x.json")
