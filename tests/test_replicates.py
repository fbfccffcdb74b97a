"""Seed replicates in the card: the pure summary on a hand-computed case, and the rendered section."""

import json
import math
import re
import shutil
import statistics

import pytest

from conftest import CARD_INFO, CKPTS, FIXTURE, LABELS, PROVENANCE, check_num, render_results, table
from domino.card.results import load_results
from domino.card.tables import Ordering, replicate_summary, spread
from domino.io import write_json
from fixtures.make_results import write_replicates

N = 3
REPLICATE_HEADER = ("| Checkpoint | Accept len per replicate | Accept len mean | Accept len spread | "
                    "Speedup per replicate | Speedup mean | Speedup spread |")
ORDERING_LINE = re.compile(r"- (.+) > (.+) in (acceptance length|speedup|teacher-forced acceptance length): (\d+) of "
                           r"(\d+) replicates "
                           r"\((holds in every replicate|not in replicates? ([\d, ]+))\)\.")


def bench(al: float, speedup: float) -> dict:
    return {"summary": {"acceptance_length": al, "speedup": speedup}}


def hand_benches(table_: dict) -> dict:
    """{checkpoint: ([AL per replicate], [speedup per replicate])} -> results by run name."""
    out = {}
    for ckpt, (als, speedups) in table_.items():
        for r, (al, sp) in enumerate(zip(als, speedups)):
            out[ckpt if r == 0 else f"{ckpt}-seed{r}"] = bench(al, sp)
    return out


HAND = hand_benches({
    "dflash-shift": ([1.2, 1.2, 1.2], [0.8, 0.8, 0.8]),
    "dflash-noshift": ([1.4, 1.8, 1.3], [1.0, 1.1, 1.3]),
    "domino": ([1.5, 1.7, 1.6], [0.9, 1.2, 1.2]),
})


def test_replicate_summary_hand_computed():
    s = replicate_summary(HAND, CKPTS, N)
    rows = {r.checkpoint: r for r in s.rows}
    assert [r.checkpoint for r in s.rows] == CKPTS and s.replicates == N
    dom = rows["domino"]
    # ALs 1.5, 1.7, 1.6: mean 1.6, deviations -0.1, +0.1, 0 -> sd sqrt(0.02 / 2) = 0.1
    assert dom.acceptance_length.values == (1.5, 1.7, 1.6)
    assert dom.acceptance_length.mean == pytest.approx(1.6)
    assert dom.acceptance_length.sd == pytest.approx(0.1)
    assert (dom.acceptance_length.low, dom.acceptance_length.high) == (1.5, 1.7)
    # speedups 0.9, 1.2, 1.2: mean 1.1, deviations -0.2, +0.1, +0.1 -> sd sqrt(0.06 / 2)
    assert dom.speedup.mean == pytest.approx(1.1)
    assert dom.speedup.sd == pytest.approx(math.sqrt(0.03))
    assert rows["dflash-shift"].speedup.sd == 0.0
    assert s.orderings == [
        # every pair in list order; the direction is replicate 0's
        Ordering("dflash-noshift", "dflash-shift", "acceptance_length", N, ()),
        Ordering("dflash-noshift", "dflash-shift", "speedup", N, ()),
        Ordering("domino", "dflash-shift", "acceptance_length", N, ()),
        Ordering("domino", "dflash-shift", "speedup", N, ()),
        Ordering("domino", "dflash-noshift", "acceptance_length", N, (1,)),  # 1.7 < 1.8 in replicate 1
        Ordering("dflash-noshift", "domino", "speedup", N, (1,)),  # 1.0 > 0.9, then 1.1 < 1.2
    ]
    assert [o.holds for o in s.orderings] == [3, 3, 3, 3, 2, 2]
    assert [o.in_every_replicate for o in s.orderings] == [True] * 4 + [False] * 2


def test_replicate_summary_pairs_and_ties():
    benches = {**HAND, "dflash-shift-seed2": bench(1.6, 0.8)}  # ties Domino's 1.6 in replicate 2
    s = replicate_summary(benches, CKPTS, N, pairs=[("dflash-shift", "domino")])
    assert s.orderings == [Ordering("domino", "dflash-shift", "acceptance_length", N, (2,)),
                           Ordering("domino", "dflash-shift", "speedup", N, ())]


def test_replicate_summary_refuses_bad_input():
    with pytest.raises(ValueError, match="at least two replicates"):
        replicate_summary(HAND, CKPTS, 1)
    with pytest.raises(ValueError, match="at least two replicates"):
        spread([1.5])
    missing = {k: v for k, v in HAND.items() if k != "domino-seed2"}
    with pytest.raises(ValueError, match="'domino-seed2'"):
        replicate_summary(missing, CKPTS, N)


# ---------------------------------------------------------------- the rendered section

@pytest.fixture(scope="module")
def replicate_results(tmp_path_factory):
    root = tmp_path_factory.mktemp("replicates") / "results"
    shutil.copytree(FIXTURE, root)
    write_replicates(root)
    return root


@pytest.fixture(scope="module")
def replicate_card(replicate_results, tmp_path_factory):
    out = tmp_path_factory.mktemp("replicate_card")
    render_results(replicate_results, out, CARD_INFO, PROVENANCE, replicates=N)
    return (out / "model_card_appendix.md").read_text()  # the section lives in the card's appendix


def file_values(root, ckpt: str, key: str) -> list[float]:
    """``summary[key]`` of replicates 0 .. N-1, read straight from the results files (the validate
    files' counted acceptance length for ``teacher_forced``)."""
    names = [ckpt] + [f"{ckpt}-seed{r}" for r in range(1, N)]
    if key == "teacher_forced":
        return [json.loads((root / "validate" / f"{n}.json").read_text())["acceptance_length"]["final"] for n in names]
    return [json.loads((root / "benchmark" / "humaneval" / f"{n}.json").read_text())["summary"][key] for n in names]


def test_section_table_matches_the_files(replicate_card, replicate_results):
    assert "\n## Seed replicates\n" in replicate_card
    assert f"trained every checkpoint N = {N} times" in replicate_card
    assert "It is not a confidence interval" in replicate_card
    rows = {r[0]: r[1:] for r in table(replicate_card, REPLICATE_HEADER)}
    assert list(rows) == [LABELS[c] for c in CKPTS]
    for ckpt in CKPTS:
        row = rows[LABELS[ckpt]]
        for offset, key, decimals, suffix in ((0, "acceptance_length", 3, ""), (3, "speedup", 2, "×")):
            values = file_values(replicate_results, ckpt, key)
            per_replicate = row[offset].split(", ")
            assert len(per_replicate) == N
            for cell, x in zip(per_replicate, values):
                check_num(cell, x, decimals, suffix)
            check_num(row[offset + 1], statistics.mean(values), decimals, suffix)
            m = re.fullmatch(r"SD (\S+), (\S+)–(\S+)", row[offset + 2])
            assert m, row[offset + 2]
            check_num(m[1], statistics.stdev(values), decimals)
            check_num(m[2], min(values), decimals, suffix)
            check_num(m[3], max(values), decimals, suffix)


TEACHER_FORCED_HEADER = "| Checkpoint | Teacher-forced accept len per replicate | Mean | Spread |"


def test_teacher_forced_table_matches_the_validate_files(replicate_card, replicate_results):
    rows = {r[0]: r[1:] for r in table(replicate_card, TEACHER_FORCED_HEADER)}
    assert list(rows) == [LABELS[c] for c in CKPTS]
    for ckpt in CKPTS:
        values, row = file_values(replicate_results, ckpt, "teacher_forced"), rows[LABELS[ckpt]]
        assert len(set(values)) == N  # the fixtures move it replicate by replicate
        for cell, x in zip(row[0].split(", "), values, strict=True):
            check_num(cell, x, 3)
        check_num(row[1], statistics.mean(values), 3)
        m = re.fullmatch(r"SD (\S+), (\S+)–(\S+)", row[2])
        check_num(m[1], statistics.stdev(values), 3)
        check_num(m[2], min(values), 3)
        check_num(m[3], max(values), 3)


def test_replicate_summary_with_validation_counts_its_teacher_forced_spread():
    validates = {run: {"acceptance_length": {"final": al}} for run, al in (
        ("domino", 1.9), ("domino-seed1", 2.1), ("domino-seed2", 2.0),
        ("dflash-noshift", 1.7), ("dflash-noshift-seed1", 2.2), ("dflash-noshift-seed2", 1.6),
        ("dflash-shift", 1.1), ("dflash-shift-seed1", 1.1), ("dflash-shift-seed2", 1.1))}
    s = replicate_summary(HAND, CKPTS, N, pairs=[("domino", "dflash-noshift")], validates=validates)
    dom = {r.checkpoint: r for r in s.rows}["domino"]
    assert dom.teacher_forced.values == (1.9, 2.1, 2.0) and dom.teacher_forced.sd == pytest.approx(0.1)
    assert s.orderings[-1] == Ordering("domino", "dflash-noshift", "teacher_forced_acceptance_length", N, (1,))
    with pytest.raises(ValueError, match="no validation results for row 'domino-seed2'"):
        replicate_summary(HAND, CKPTS, N, validates={k: v for k, v in validates.items() if k != "domino-seed2"})


def test_orderings_match_the_files(replicate_card, replicate_results):
    by_label = {LABELS[c]: c for c in CKPTS}
    words = {"acceptance length": "acceptance_length", "speedup": "speedup",
             "teacher-forced acceptance length": "teacher_forced"}
    section = replicate_card.split("## Seed replicates")[1].split("\n## ")[0]
    lines = [line for line in section.splitlines() if line.startswith("- ")]
    assert len(lines) == 3 * 3  # three pairs of the card's rows, three figures each
    every = 0
    for line in lines:
        m = ORDERING_LINE.fullmatch(line)
        assert m, line
        hi, lo, key = by_label[m[1]], by_label[m[2]], words[m[3]]
        a, b = file_values(replicate_results, hi, key), file_values(replicate_results, lo, key)
        assert a[0] >= b[0], line  # replicate 0 sets the direction
        fails = [r for r in range(N) if not a[r] > b[r]]
        assert (int(m[4]), int(m[5])) == (N - len(fails), N), line
        assert (m[6] == "holds in every replicate") == (not fails), line
        if fails:
            assert [int(x) for x in m[7].split(", ")] == fails, line
        every += not fails
    assert 0 < every < len(lines)  # the fixtures hold some orderings in every replicate and break one
    assert f"{every} of these {len(lines)} orderings hold in every replicate" in section


def test_single_replicate_card_is_unchanged(replicate_results, tmp_path):
    """N = 1 ignores the replicate files: the card equals the plain fixtures' card, with no section."""
    render_results(replicate_results, tmp_path / "one", CARD_INFO, PROVENANCE)
    render_results(FIXTURE, tmp_path / "plain", CARD_INFO, PROVENANCE)
    for page in ("model_card.md", "model_card_appendix.md"):
        text = (tmp_path / "one" / page).read_text()
        assert "Seed replicates" not in text and "replicate" not in text
        assert text == (tmp_path / "plain" / page).read_text()


def test_missing_replicate_file_names_it(replicate_results, tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(str(FIXTURE / "benchmark" / "humaneval" / "dflash-shift-seed1.json"))):
        load_results(FIXTURE, replicates=N)
    root = tmp_path / "results"
    shutil.copytree(replicate_results, root)
    (root / "benchmark" / "humaneval" / "domino-seed2.json").unlink()
    with pytest.raises(FileNotFoundError, match=re.escape(str(root / "benchmark" / "humaneval" / "domino-seed2.json"))):
        load_results(root, replicates=N)
    with pytest.raises(ValueError, match="replicates must be a whole number >= 1"):
        load_results(FIXTURE, replicates=0)


def test_replicate_protocol_must_match(replicate_results, tmp_path):
    root = tmp_path / "results"
    shutil.copytree(replicate_results, root)
    p = root / "benchmark" / "humaneval" / "domino-seed1.json"
    data = json.loads(p.read_text())
    data["protocol"]["max_new_tokens"] += 1
    write_json(p, data, seal=True)
    with pytest.raises(ValueError, match=r"benchmark \(humaneval\) protocols differ"):
        load_results(root, replicates=N)
