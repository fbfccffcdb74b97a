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


def _fixture(name):
    return json.loads((FIXTURE / name).read_text())


def _set(obj, dotted, value):
    *head, last = dotted.split(".")
    for k in head:
        obj = obj[int(k) if k.isdigit() else k]
    obj[int(last) if last.isdigit() else last] = value


@pytest.mark.parametrize("kind,name,field,value,says", [
    ("validate", "validate/domino.json", "per_slot.2.final_acc", 1.7, "1.7 is greater than the maximum of 1"),
    ("validate", "validate/domino.json", "overall.base_acc", -0.1, "-0.1 is less than the minimum of 0"),
    ("validate", "validate/domino.json", "first_trained_accuracy", 1.7, "1.7 is greater than the maximum of 1"),
    ("validate", "validate/domino.json", "anchors", -3, "-3 is less than the minimum of 0"),
    ("benchmark", "benchmark/humaneval/domino.json", "summary.per_position_acceptance.0", 1.7,
     "1.7 is greater than the maximum of 1"),
    ("benchmark", "benchmark/humaneval/domino.json", "summary.acceptance_length", 0.5, "0.5 is less than the minimum of 1"),
    ("benchmark", "benchmark/humaneval/domino.json", "summary.eos_share", 2, "2 is greater than the maximum of 1"),
    ("benchmark", "benchmark/humaneval/domino.json", "summary.steps", -1, "-1 is less than the minimum of 0"),
    ("benchmark", "benchmark/humaneval/domino.json", "prompts.0.accepted_per_step.0", -1,
     "-1 is less than the minimum of 0"),
    ("benchmark", "benchmark/humaneval/domino.json", "prompts.0.seconds", -0.5, "-0.5 is less than the minimum of 0"),
    ("train_summary", "train/domino/summary.json", "steps", -1, "-1 is less than the minimum of 0"),
])
def test_a_value_outside_its_bounds_is_refused_naming_the_file_and_field(kind, name, field, value, says):
    obj = _fixture(name)
    _set(obj, field, value)
    with pytest.raises(ValueError) as err:
        results.check(obj, kind, "x.json")
    assert str(err.value) == f"results file x.json: {field}: {says}"


@pytest.mark.parametrize("field,value,says", [
    ("per_slot.0.slot", 99, "per_slot.0.slot: 99 is outside the block's slots 0..7"),
    ("first_trained_slot", 9, "first_trained_slot: 9 names no slot of per_slot (slots: [0, 1, 2, 3, 4, 5, 6, 7])"),
])
def test_slots_lie_within_the_block(field, value, says):
    obj = _fixture("validate/domino.json")
    _set(obj, field, value)
    with pytest.raises(ValueError) as err:
        results.check(obj, "validate", "x.json")
    assert str(err.value) == f"results file x.json: {says}"


def test_a_step_accepts_at_most_the_drafts_it_proposes():
    obj = _fixture("benchmark/humaneval/domino.json")
    obj["prompts"][1]["accepted_per_step"][0] = 9
    with pytest.raises(ValueError) as err:
        results.check(obj, "benchmark", "x.json")
    assert str(err.value) == ("results file x.json: prompts.1.accepted_per_step: 9 accepted drafts in one step, more "
                              "than the 8 a step proposes (summary.drafts_per_step)")


def test_an_accuracy_of_1_7_stops_the_report_naming_the_file(tmp_path):
    """Read as the report stage reads a run: the file is named, no card prints 170.0%."""
    import shutil

    from domino.io import write_json

    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)
    path = root / "validate" / "domino.json"
    obj = json.loads(path.read_text())
    obj["per_slot"][1]["final_acc"] = 1.7
    write_json(path, obj, seal=True)  # sealed as the stage seals it: the schema speaks
    with pytest.raises(ValueError, match=rf"^results file {path}: per_slot\.1\.final_acc: 1\.7 is greater than "
                                         r"the maximum of 1$"):
        results.load_results(root)


@pytest.mark.parametrize("value,spelt", [(float("nan"), "NaN"), (float("inf"), "Infinity"),
                                         (float("-inf"), "-Infinity")])
def test_nan_and_infinity_are_refused_by_every_schema(value, spelt):
    """Python's JSON reads NaN and Infinity, and NaN passes every bound (each comparison is false):
    every kind of results file refuses them, naming the field."""
    for kind in results.schemas():
        with pytest.raises(ValueError) as err:
            results.check({"summary": {"speedup_ci": [1.0, value]}}, kind, "x.json")
        assert str(err.value) == f"results file x.json: summary.speedup_ci.1: {spelt} is not a finite number", kind


@pytest.mark.parametrize("name,field", [("benchmark/humaneval/domino.json", "summary.speedup"),
                                        ("sampling/T0.6/humaneval/domino.json", "summary.acceptance_length"),
                                        ("validate/domino.json", "per_slot.2.final_acc")])
def test_a_sealed_file_holding_infinity_or_nan_stops_the_report_naming_it(tmp_path, name, field):
    """Sealed as the stage seals it, a file with an infinite speedup (the card would call Domino the
    fastest row) or a NaN (the card would print .nan) is refused by the card, naming file and field."""
    import shutil

    from domino.io import write_json

    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)
    path = root / name
    obj = json.loads(path.read_text())
    _set(obj, field, float("inf") if field == "summary.speedup" else float("nan"))
    write_json(path, obj, seal=True)
    with pytest.raises(ValueError, match=rf"^results file {re.escape(str(path))}: {re.escape(field)}: "
                                         r"(Infinity|NaN) is not a finite number$"):
        results.load_results(root, temperatures=(0, 0.6))


SEALED_FILES = [("benchmark/humaneval/domino.json", "benchmark"), ("sampling/T0.6/humaneval/baseline.json", "sampling"),
                 ("validate/domino.json", "validate"), ("train/domino/summary.json", "train"),
                 ("train/domino/checkpoint/drafter_config.json", "train"), ("prepare_data/summary.json", "prepare_data")]


@pytest.mark.parametrize("name,rule", SEALED_FILES)
def test_a_results_file_without_its_seal_is_refused(tmp_path, name, rule):
    """Every stage seals the files the card reads; one whose content_sha256 was deleted is not
    read unsealed, but refused in one line naming it and the rule that rebuilds it."""
    import shutil

    from domino.io import DamagedFile

    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)
    path = root / name
    obj = json.loads(path.read_text())
    del obj["content_sha256"]
    path.write_text(json.dumps(obj))
    with pytest.raises(DamagedFile) as err:
        results.load_results(root, temperatures=(0, 0.6))
    assert str(err.value) == (f"results file {path} lacks its content_sha256; delete {path} and run the same "
                              f"command again (rule {rule} rebuilds it)")


def test_a_first_trained_slot_naming_no_slot_is_one_line_not_a_stop_iteration():
    from domino.card.render import _first_trained

    obj = _fixture("validate/domino.json")
    obj["first_trained_slot"] = 9
    with pytest.raises(ValueError) as err:
        _first_trained(obj)
    assert str(err.value) == ("validate results of domino: first_trained_slot 9 names no slot of per_slot "
                              "(slots: [0, 1, 2, 3, 4, 5, 6, 7])")


@pytest.mark.parametrize("name,rule", SEALED_FILES[2:])
def test_a_results_file_altered_after_its_seal_is_refused(tmp_path, name, rule):
    """A value changed by hand in a sealed file (the seal kept) is refused naming the file, where
    the card would print the changed value."""
    import shutil

    from domino.io import DamagedFile

    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)
    path = root / name
    text = path.read_text()
    altered = re.sub(r'("(?:steps|train|first_trained_slot|num_layers)": )(\d+)', lambda m: m.group(1) + str(int(m.group(2)) + 1),
                     text, count=1)
    assert altered != text
    path.write_text(altered)
    with pytest.raises(DamagedFile) as err:
        results.load_results(root, temperatures=(0, 0.6))
    assert str(err.value) == (f"results file {path} is damaged (its content does not match its content_sha256); "
                              f"delete {path} and run the same command again (rule {rule} rebuilds it)")


def test_training_metrics_altered_after_training_are_refused(tmp_path):
    """metrics.jsonl is sealed by its summary's metrics_sha256: a loss edited by hand (the line
    still valid JSON, every field in bounds) is refused in one line naming the file and the rule,
    where the card would draw the edited curve."""
    import shutil

    from domino.io import DamagedFile

    root = tmp_path / "results"
    shutil.copytree(FIXTURE, root)
    path = root / "train" / "domino" / "metrics.jsonl"
    assert results.load_results(root, temperatures=(0, 0.6))["metrics"]["domino"]  # intact: read
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[0]["loss"] = rows[0]["loss"] / 2
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    with pytest.raises(DamagedFile) as err:
        results.load_results(root, temperatures=(0, 0.6))
    assert str(err.value) == (f"results file {path} is damaged (its sha256 is not the metrics_sha256 of the "
                              f"summary.json beside it); delete {path} and run the same command again "
                              f"(rule train rebuilds it)")
