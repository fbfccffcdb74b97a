"""domino.card.plots: the interval, the step counts behind conditional rates, fitted axes, one lambda line."""

import json
from pathlib import Path

import pytest

from domino.card import plots, render

FIXTURE = Path(__file__).parent / "fixtures" / "results"


@pytest.fixture(scope="module")
def res():
    return render.load_results(FIXTURE)


def rows(res):
    return [render._checkpoint_row(res, c) for c in res["validate"]]


def test_wilson_interval_hand_computed():
    # 5 of 10 at z = 1.96: centre 0.5, half-width 1.96 * sqrt(0.025 + 0.009604) / 1.38416 = 0.26341
    low, high = plots.wilson_interval(5, 10)
    assert low == pytest.approx(0.23659, abs=1e-5) and high == pytest.approx(0.76341, abs=1e-5)
    assert plots.wilson_interval(0, 0) == (0.0, 1.0)
    assert plots.wilson_interval(0, 20).low == 0.0 and plots.wilson_interval(20, 20).high == 1.0


def test_steps_behind_conditional():
    s = {"steps": 200, "per_position_acceptance": [0.5, 0.1, 0.0]}
    assert plots.steps_behind_conditional(s) == [200, 100, 20]
    assert plots.steps_behind_conditional({"steps": 10, "per_position_acceptance": []}) == []


def test_axes_fit_the_data(res):
    top = max(a for r in res["benchmark"].values() for a in r["summary"]["per_position_acceptance"])
    assert plots.acceptance_plot(res, rows(res)).axes[0].get_ylim() == pytest.approx((0, 1.15 * top))
    ax, ax_steps = plots.conditional_plot(res, rows(res)).axes
    assert ax_steps.get_yscale() == "log" and ax_steps.get_ylabel() == "Steps behind the ratio"
    greyed = [c for c in ax.containers if c.get_label() == f"fewer than {plots.MIN_STEPS} steps"]
    assert len(greyed) == 1  # the fixture has rates resting on few steps


def test_one_lambda_line_when_the_schedule_is_shared(res, tmp_path):
    fig = plots.lambda_plot(res, rows(res))
    assert len(fig.axes[0].get_lines()) == 1 and "shared by every checkpoint" in fig.axes[0].get_title()
    longer = {**res, "metrics": {**res["metrics"], "domino": res["metrics"]["domino"] + [
        {**res["metrics"]["domino"][-1], "step": 6}]}}
    fig = plots.lambda_plot(longer, rows(res))
    assert len(fig.axes[0].get_lines()) == 2
    assert "2 lines because the checkpoints trained for different numbers of steps" in fig.axes[0].get_title()


def test_teacher_forced_vs_served_plot(res, tmp_path):
    card_rows = rows(res)
    ax = plots.teacher_forced_plot(res, card_rows).axes[0]
    dashed = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert len(dashed) == 3  # one teacher-forced line per checkpoint
    domino = next(line for line in dashed if line.get_label().startswith("Domino teacher-forced"))
    v = json.loads((FIXTURE / "validate" / "domino.json").read_text())
    assert list(domino.get_ydata()) == [s["final_acc"] for s in v["per_slot"]]  # slot k drafts a+k+1 (shifted)
    assert f"implies AL {card_rows[2]['tf'].implied_al:.2f}" in domino.get_label()
    served = [c for c in ax.containers if c.get_label().endswith(")") and "served" in c.get_label()]
    assert len(served) == 3 and all(c.has_yerr for c in served)  # every served rate with its interval
    noshift = next(line for line in dashed if line.get_label().startswith("DFlash noshift"))
    assert len(noshift.get_xdata()) == 7  # noshift drafts 7 tokens: a+1..a+7, slots 1..7
    path = plots._save(plots.teacher_forced_plot(res, card_rows), tmp_path / "tf.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
