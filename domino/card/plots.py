"""The card's plots, drawn from the results files (``card.load_results``) and the card's rows.

Each plot fits its axes to the data it shows. Conditional acceptance at position i is a ratio of
step counts (steps accepting i+1 drafts over steps accepting i); it is drawn with its 95% Wilson
interval, which takes the steps as independent trials (steps cluster by prompt, so it is narrower
than the card table's prompt bootstrap, and the plot says so), and a ratio resting on fewer than
``MIN_STEPS`` steps is greyed.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..io import atomic_path

PLOTS = {
    "acceptance": "acceptance_per_position.png",
    "conditional": "conditional_acceptance.png",
    "loss": "training_loss.png",
    "lambda": "lambda_schedule.png",
    "teacher_forced": "teacher_forced_vs_served.png",
}
MIN_STEPS = 100  # below this many steps a conditional ratio's 95% interval is wider than about +-10 pp
FEW_STEPS_COLOR = "0.6"


class Interval(NamedTuple):
    low: float
    high: float


def wilson_interval(successes: int, trials: int, z: float = 1.96) -> Interval:
    """Wilson score interval of a binomial proportion (95% for z = 1.96); (0, 1) for no trials."""
    if trials <= 0:
        return Interval(0.0, 1.0)
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return Interval(max(0.0, centre - half), min(1.0, centre + half))


def _accepted_counts(summary: dict) -> list[int]:
    """Steps with at least i+1 accepted drafts, i = 0..drafts-1 (per-position rates times steps)."""
    return [round(a * summary["steps"]) for a in summary["per_position_acceptance"]]


def steps_behind_conditional(summary: dict) -> list[int]:
    """How many steps each conditional ratio rests on: all steps at position 0, then the steps that
    accepted every earlier draft."""
    return [summary["steps"], *_accepted_counts(summary)[:-1]] if summary["per_position_acceptance"] else []


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight", metadata={"Software": None})
    return path


def acceptance_plot(res: dict, rows: list[dict]) -> Figure:
    fig = Figure(figsize=(7.5, 4.2))
    ax = fig.subplots()
    width = 0.8 / len(rows)
    per_pos = {r["name"]: res["benchmark"][r["name"]]["summary"]["per_position_acceptance"] for r in rows}
    for j, r in enumerate(rows):
        ax.bar([i + (j - (len(rows) - 1) / 2) * width for i in range(len(per_pos[r["name"]]))], per_pos[r["name"]],
               width, label=f"{r['label']} (AL {r['al']:.3f})")
    top = max((a for v in per_pos.values() for a in v), default=0.0)
    ax.set_ylim(0, min(1.0, 1.15 * top) or 1.0)
    ax.set_title("Per-position unconditional acceptance (share of steps accepting ≥ i+1 drafts)")
    ax.set_xlabel("Draft position i (pos_0 = token a+1)")
    ax.set_ylabel("Acceptance rate")
    ax.set_xticks(range(max(len(v) for v in per_pos.values())))
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    return fig


def conditional_plot(res: dict, rows: list[dict]) -> Figure:
    fig = Figure(figsize=(7.5, 6.0))
    ax, ax_n = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [2.2, 1]})
    highs = []
    for j, r in enumerate(rows):
        s = res["benchmark"][r["name"]]["summary"]
        counts, trials = _accepted_counts(s), steps_behind_conditional(s)
        xs = [i + (j - (len(rows) - 1) / 2) * 0.12 for i in range(len(trials))]
        ivs = [wilson_interval(k, n) for k, n in zip(counts, trials)]
        ok = [i for i, n in enumerate(trials) if n >= MIN_STEPS]
        few = [i for i, n in enumerate(trials) if 0 < n < MIN_STEPS]
        line = ax.errorbar([xs[i] for i in ok], [counts[i] / trials[i] for i in ok], capsize=3, marker="o",
                           yerr=[[counts[i] / trials[i] - ivs[i].low for i in ok],
                                 [ivs[i].high - counts[i] / trials[i] for i in ok]], label=r["label"])
        if few:
            first_grey = not any(h.get_label().startswith("fewer") for h in ax.containers)
            ax.errorbar([xs[i] for i in few], [counts[i] / trials[i] for i in few], fmt="o", mfc="none",
                        color=FEW_STEPS_COLOR, ecolor=FEW_STEPS_COLOR, capsize=3,
                        label=f"fewer than {MIN_STEPS} steps" if first_grey else None,
                        yerr=[[counts[i] / trials[i] - ivs[i].low for i in few],
                              [ivs[i].high - counts[i] / trials[i] for i in few]])
        highs += [ivs[i].high for i in ok + few]
        ax_n.bar(xs, trials, width=0.12, color=line.lines[0].get_color())
    ax.set_ylim(0, min(1.02, 1.2 * max(highs, default=1.0)))  # room above the data for the legend
    ax.set_title(f"Conditional acceptance per position, 95% Wilson interval (steps taken as independent, "
                 f"not clustered by prompt); grey: fewer than {MIN_STEPS} steps", fontsize=9)
    ax.set_ylabel("P(accept i | accept 0..i-1)")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", ncol=2, fontsize=8)
    ax_n.axhline(MIN_STEPS, color=FEW_STEPS_COLOR, linestyle="--", linewidth=1)
    ax_n.set_yscale("log")
    ax_n.set_ylabel("Steps behind the ratio")
    ax_n.set_xlabel("Draft position i")
    ax_n.grid(axis="y", alpha=0.3)
    return fig


def _smooth(values: list[float], window: int) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def loss_plot(res: dict, rows: list[dict]) -> Figure:
    fig = Figure(figsize=(4.2 * len(rows), 4.0))
    axes = fig.subplots(1, len(rows), sharey=True, squeeze=False)[0]
    window = max(1, min(len(res["metrics"][r["name"]]) for r in rows) // 50)
    for ax, r in zip(axes, rows):
        metrics = res["metrics"][r["name"]]
        # widest first, so curves that coincide (the dflash branches) stay visible
        for key, style, width in (("loss", "-", 4.0), ("base_loss", "--", 2.0), ("final_loss", ":", 2.0)):
            pts = [(m["step"], m[key]) for m in metrics if m[key] is not None]
            ax.plot([s for s, _ in pts], _smooth([v for _, v in pts], window), style, linewidth=width,
                    alpha=0.5 if key == "loss" else 1.0, label=key)
        ax.set_title(r["label"])
        ax.set_xlabel("Training step")
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0].set_ylabel("Cross-entropy loss")
    fig.suptitle("Training loss: total, base (backbone) and final (corrected) branches"
                 + (f"; moving average of {window} steps" if window > 1 else ""))
    return fig


def lambda_schedules(res: dict, rows: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """Distinct lambda schedules, each named by the checkpoints that share it (joined by ", ")."""
    by_schedule: dict[tuple, list[str]] = {}
    for r in rows:
        key = tuple((m["step"], m["lambda"]) for m in res["metrics"][r["name"]])
        by_schedule.setdefault(key, []).append(r["label"])
    return {", ".join(labels): list(key) for key, labels in by_schedule.items()}


def lambda_plot(res: dict, rows: list[dict]) -> Figure:
    fig = Figure(figsize=(7.5, 4.2))
    ax = fig.subplots()
    schedules = lambda_schedules(res, rows)
    for name, points in schedules.items():
        ax.plot([s for s, _ in points], [v for _, v in points], linewidth=2, label=name)
    values = [v for points in schedules.values() for _, v in points]
    pad = 0.05 * ((max(values) - min(values)) or 1.0)
    ax.set_ylim(min(values) - pad, max(values) + pad)
    if len(schedules) == 1:
        ax.set_title("Curriculum weight lambda: one schedule, shared by every checkpoint")
    else:
        steps = {len(p) for p in schedules.values()}
        why = "the checkpoints trained for different numbers of steps" if len(steps) > 1 else "their schedules differ"
        ax.set_title(f"Curriculum weight lambda: {len(schedules)} lines because {why}")
    ax.set_xlabel("Training step")
    ax.set_ylabel("lambda (weight of the base loss)")
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def teacher_forced_plot(res: dict, rows: list[dict]) -> Figure:
    """Per position, each row's teacher-forced accuracy (dashed) and served conditional acceptance
    (solid, with its bootstrap interval where recorded); ``rows[i]["tf"]``: ``tables.TeacherForcedVsServed``."""
    fig = Figure(figsize=(7.5, 4.6))
    ax = fig.subplots()
    for j, r in enumerate(rows):
        t = r["tf"]
        dx = (j - (len(rows) - 1) / 2) * 0.08
        tf_line = ax.plot([p.position + dx for p in t.positions], [p.teacher_forced for p in t.positions], "--s",
                          markersize=4, label=f"{r['label']} teacher-forced (implies AL {t.implied_al:.2f})")[0]
        served = [p for p in t.positions if p.served is not None]
        yerr = [[p.served.value - p.served.low for p in served], [p.served.high - p.served.value for p in served]]
        ax.errorbar([p.position + dx for p in served], [p.served.value for p in served], yerr=yerr, fmt="-o",
                    capsize=3, color=tf_line.get_color(), label=f"{r['label']} served (AL {t.served_al.value:.2f})")
    ax.set_ylim(0, 1.02)
    ax.set_title("Teacher-forced accuracy (dashed) vs served conditional acceptance (solid, 95% interval)",
                 fontsize=9)
    ax.set_xlabel("Draft position i (token a+i+1)")
    ax.set_ylabel("Accuracy / P(accept i | accept 0..i-1)")
    ax.set_xticks(range(max(len(r["tf"].positions) for r in rows)))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.14))  # below: the bars reach 1
    return fig


def write_plots(res: dict, rows: list[dict], out_dir: Path) -> list[Path]:
    """Draw the plots into ``out_dir`` (names in ``PLOTS``); ``rows``: the card's checkpoint rows."""
    draw = {"acceptance": acceptance_plot, "conditional": conditional_plot, "loss": loss_plot,
            "lambda": lambda_plot, "teacher_forced": teacher_forced_plot}
    return [_save(draw[key](res, rows), Path(out_dir) / name) for key, name in PLOTS.items()]
