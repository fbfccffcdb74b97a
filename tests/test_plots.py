"""domino.card.plots: the interval, the step counts behind conditional rates, fitted axes, few-step rates, titles, loss panels."""

import json
from pathlib import Path

import pytest

from domino.card import plots, render
from domino.card.results import load_results

FIXTURE = Path(__file__).parent / "fixtures" / "results"


@pytest.fixture(scope="module")
def res():
    return load_results(FIXTURE)


def rows(res):
    return [render._checkpoint_row(res, c) for c in res["validate"]]


def test_wilson_interval_hand_computed():
    # 5 of 10 at z = 1.96: centre 0.5, half-width 1.96 * sqrt(0.025 + 0.009604) / 1.38416 = 0.26341
    low, high = plots.wilson_interval(5, 10)
    assert low == pytest.approx(0.23659, abs=1e-5) and high == pytest.approx(0.76341, abs=1e-5)
    assert plots.wilson_interval(0, 0) == (0.0, 1.0)
    assert plots.wilson_interval(0, 20).low == 0.0 and plots.wilson_interval(20, 20).high == 1.0


def test_wilson_interval_always_holds_its_point():
    """Every n up to 400, every count: the rate lies inside [low, high] within [0, 1], so no
    error bar is negative. Unclamped, the bound at k = n lands below the rate for 109 values of n
    and at k = 0 above it for 37."""
    for n in range(1, 401):
        for k in range(n + 1):
            low, high = plots.wilson_interval(k, n)
            assert 0.0 <= low <= k / n <= high <= 1.0, (k, n, low, high)
    # the edge cases the clamp is for: all and none accepted give a bar of length 0 on that side
    assert plots.wilson_interval(7, 7).high == 1.0 and plots.wilson_interval(0, 7).low == 0.0


def test_steps_behind_conditional():
    """Counted from the per-prompt records: 200 steps, 100 accepting at least one draft, 20 at
    least two, none three."""
    prompts = [{"accepted_per_step": [1] * 40 + [0] * 60}, {"accepted_per_step": [2] * 20 + [1] * 40 + [0] * 40}]
    bench = {"summary": {"steps": 200, "per_position_acceptance": [0.5, 0.1, 0.0]}, "prompts": prompts}
    assert plots.steps_behind_conditional(bench) == [200, 100, 20]
    assert plots._accepted_counts(bench) == [100, 20, 0]
    empty = {"summary": {"steps": 10, "per_position_acceptance": []}, "prompts": [{"accepted_per_step": [0] * 10}]}
    assert plots.steps_behind_conditional(empty) == []


def test_axes_fit_the_data(res):
    top = max(a for r in res["benchmark"].values() for a in r["summary"]["per_position_acceptance"])
    assert plots.acceptance_plot(res, rows(res)).axes[0].get_ylim() == pytest.approx((0, 1.15 * top))
    ax, ax_steps = plots.conditional_plot(res, rows(res)).axes
    assert ax_steps.get_yscale() == "log" and ax_steps.get_ylabel() == "Steps behind the ratio"


def test_few_step_rates_are_hollow_in_their_checkpoints_colour(res):
    """A rate resting on fewer than MIN_STEPS steps keeps its checkpoint's colour, drawn hollow, and the
    legend says what hollow means (the fixture has such rates)."""
    card_rows = rows(res)
    ax = plots.conditional_plot(res, card_rows).axes[0]
    few = [c for c in ax.containers if "fewer than" in c.get_label()]
    assert few, "the fixture has rates resting on few steps"
    for c in few:
        label = c.get_label().split(",")[0]
        whole = next(x for x in ax.containers if x.get_label() == label)
        marker = c.lines[0]
        assert marker.get_markerfacecolor() == "none"
        assert marker.get_color() == whole.lines[0].get_color()  # whose rate it is
    assert plots.FEW_STEPS_LABEL in [t.get_text() for t in ax.get_legend().get_texts()]
    # the served rates of the teacher-forced plot: hollow, unjoined, where they rest on few steps
    ax = plots.teacher_forced_plot(res, card_rows).axes[0]
    few = [c for c in ax.containers if "fewer than" in c.get_label()]
    assert few and all(c.lines[0].get_markerfacecolor() == "none" and c.lines[0].get_linestyle() == "None"
                       for c in few)
    for r in card_rows:
        drawn = [c for c in ax.containers if c.get_label().startswith(f"{r['label']} served")]
        n_drawn = sum(len(c.lines[0].get_xdata()) for c in drawn)
        assert n_drawn == sum(p.served is not None for p in r["tf"].positions)
        n_few = sum(len(c.lines[0].get_xdata()) for c in drawn if "fewer than" in c.get_label())
        assert n_few == sum(p.served is not None and r["cond_steps"][p.position] < plots.MIN_STEPS
                            for p in r["tf"].positions)


def test_titles_fit_the_figure(res, tmp_path):
    """No title line is wider than its figure."""
    card_rows = rows(res)
    for draw in (plots.acceptance_plot, plots.conditional_plot, plots.teacher_forced_plot, plots.loss_plot):
        fig = draw(res, card_rows)
        plots._save(fig, tmp_path / "x.png")  # lays the figure out
        renderer = fig.canvas.get_renderer()
        width = fig.get_window_extent(renderer).width
        titles = [ax.title for ax in fig.axes] + ([fig._suptitle] if fig._suptitle else [])
        for t in titles:
            assert t.get_window_extent(renderer).width <= width, (draw.__name__, t.get_text())


def test_loss_panels_draw_what_they_name(res):
    """A DFlash panel draws one curve (no correction head) and says so; Domino's draws the total, both
    branches and lambda on a right-hand axis, the curriculum the losses follow."""
    card_rows = rows(res)
    fig = plots.loss_plot(res, card_rows)
    panels = {ax.get_title(): ax for ax in fig.axes if ax.get_title()}
    for r in card_rows:
        ax = panels[r["label"]]
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        if r["projector"] == "dflash":
            assert len(ax.get_lines()) == 1 and labels == ["loss (one branch: no correction head)"]
        else:
            assert labels == ["loss", "base_loss", "final_loss", "lambda (right axis)"]
    twins = [ax for ax in fig.axes if ax.get_ylabel() == "lambda: weight of the base loss"]
    assert len(twins) == 1
    lam = twins[0].get_lines()[0]
    assert list(lam.get_ydata()) == [m["lambda"] for m in res["metrics"]["domino"]]
    assert "lambda" not in plots.PLOTS  # no plot of its own


def test_teacher_forced_vs_served_plot(res, tmp_path):
    card_rows = rows(res)
    ax = plots.teacher_forced_plot(res, card_rows).axes[0]
    dashed = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert len(dashed) == 3  # one teacher-forced line per checkpoint
    domino = next(line for line in dashed if line.get_label().startswith("Domino teacher-forced"))
    v = json.loads((FIXTURE / "validate" / "domino.json").read_text())
    # the conditional accuracy counted per anchor; slot k drafts a+k+1 (shifted)
    assert list(domino.get_ydata()) == [s["final_conditional_acc"] for s in v["per_slot"]]
    assert f"counts AL {v['acceptance_length']['final']:.2f}" in domino.get_label()
    served = [c for c in ax.containers if c.get_label().endswith(")") and "served" in c.get_label()]
    assert len(served) == 3 and all(c.has_yerr for c in served)  # every served rate with its interval
    noshift = next(line for line in dashed if line.get_label().startswith("DFlash noshift"))
    assert len(noshift.get_xdata()) == 7  # noshift drafts 7 tokens: a+1..a+7, slots 1..7
    path = plots._save(plots.teacher_forced_plot(res, card_rows), tmp_path / "tf.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
