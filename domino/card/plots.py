"""The card's plots, drawn from the results files (``results.load_results``) and the card's rows.

Each plot fits its axes to the data it shows. Conditional acceptance at position i is a ratio of
step counts (steps accepting i+1 drafts over steps accepting i); it is drawn with its 95% Wilson
interval, which takes the steps as independent trials (steps cluster by prompt, so it is narrower
than the card table's prompt bootstrap, and the plot says so). A rate resting on fewer than
``MIN_STEPS`` steps is drawn hollow, in its checkpoint's colour, and a legend entry says so. Titles
wrap to the figure's width. The curriculum weight lambda shares the Domino panel of the loss plot
(the only branch mix it changes), on an axis of its own.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import NamedTuple

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ..acceptance import position_counts
from ..io import atomic_path
from .paths import DATA_SIZE_PLOT, PLOTS, SERVED_PLOT

MIN_STEPS = 100  # below this many steps a conditional ratio's 95% interval is wider than about +-10 pp
FEW_STEPS_LABEL = f"hollow: fewer than {MIN_STEPS} steps"
TITLE_CHARS_PER_INCH = 11  # at a 10-point title, about this many characters fit in an inch


def _title(ax, text: str, fig_width: float, size: float = 10) -> None:
    """A title wrapped to the figure's width, so that no line runs off its edge."""
    width = max(20, int(TITLE_CHARS_PER_INCH * fig_width * 10 / size))
    ax.set_title("\n".join(textwrap.wrap(text, width)), fontsize=size)


def _few_steps_handle() -> Line2D:
    """The legend entry that says what a hollow marker means."""
    return Line2D([], [], linestyle="none", marker="o", markerfacecolor="none", color="0.3", label=FEW_STEPS_LABEL)


class Interval(NamedTuple):
    low: float
    high: float


def wilson_interval(successes: int, trials: int, z: float = 1.96) -> Interval:
    """Wilson score interval of a binomial proportion (95% for z = 1.96); (0, 1) for no trials.
    The interval always holds its point: at a rate of 0 or 1 the bound computed in floating point
    can land a rounding error inside it, so the bounds are clamped to the rate as well as to [0, 1]."""
    if trials <= 0:
        return Interval(0.0, 1.0)
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return Interval(max(0.0, min(p, centre - half)), min(1.0, max(p, centre + half)))


def _accepted_counts(bench: dict) -> list[int]:
    """Per draft position, the steps that accepted it (``domino.acceptance.position_counts``),
    counted from the results file's per-prompt records."""
    counts = [c for p in bench["prompts"] for c in p["accepted_per_step"]]
    return position_counts(counts, len(bench["summary"]["per_position_acceptance"]))


def _behind(steps: int, accepted: list[int]) -> list[int]:
    """The steps each conditional ratio rests on, from the per-position counts: all steps at
    position 0, then the steps that accepted every earlier draft."""
    return [steps, *accepted[:-1]] if accepted else []


def steps_behind_conditional(bench: dict) -> list[int]:
    """How many steps each conditional ratio rests on (``_behind``)."""
    return _behind(bench["summary"]["steps"], _accepted_counts(bench))


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
    _title(ax, "Per-position unconditional acceptance: the share of steps accepting at least i+1 drafts", 7.5)
    ax.set_xlabel("Draft position i (pos_0 = token a+1)")
    ax.set_ylabel("Acceptance rate")
    ax.set_xticks(range(max(len(v) for v in per_pos.values())))
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    return fig


def _yerr(values, lows, highs) -> list[list[float]]:
    """Error bars below and above each value. An interval's bound may sit a rounding error on the
    wrong side of its value (a Wilson bound at a rate of 0 or 1, a bootstrap interval of a skewed
    rate), which matplotlib refuses: such a bar has length 0."""
    return [[max(0.0, v - lo) for v, lo in zip(values, lows)], [max(0.0, hi - v) for v, hi in zip(values, highs)]]


def conditional_plot(res: dict, rows: list[dict]) -> Figure:
    fig = Figure(figsize=(7.5, 6.0))
    ax, ax_n = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [2.2, 1]})
    highs, any_few = [], False
    for j, r in enumerate(rows):
        bench = res["benchmark"][r["name"]]
        counts = _accepted_counts(bench)
        trials = _behind(bench["summary"]["steps"], counts)
        xs = [i + (j - (len(rows) - 1) / 2) * 0.12 for i in range(len(trials))]
        ivs = [wilson_interval(k, n) for k, n in zip(counts, trials)]
        ok = [i for i, n in enumerate(trials) if n >= MIN_STEPS]
        few = [i for i, n in enumerate(trials) if 0 < n < MIN_STEPS]
        colour = f"C{j}"
        ax.errorbar([xs[i] for i in ok], [counts[i] / trials[i] for i in ok], capsize=3, marker="o", color=colour,
                    yerr=_yerr([counts[i] / trials[i] for i in ok], [ivs[i].low for i in ok],
                               [ivs[i].high for i in ok]), label=r["label"])
        if few:  # the checkpoint's colour, hollow: whose rate it is, and that it rests on few steps
            any_few = True
            ax.errorbar([xs[i] for i in few], [counts[i] / trials[i] for i in few], fmt="o", mfc="none",
                        color=colour, capsize=3, label=f"{r['label']}, fewer than {MIN_STEPS} steps",
                        yerr=_yerr([counts[i] / trials[i] for i in few], [ivs[i].low for i in few],
                                   [ivs[i].high for i in few]))
        highs += [ivs[i].high for i in ok + few]
        ax_n.bar(xs, trials, width=0.12, color=colour)
    ax.set_ylim(0, min(1.02, 1.25 * max(highs, default=1.0)))  # room above the data for the legend
    _title(ax, "Conditional acceptance per position with its 95% Wilson interval (steps taken as independent, "
               "not clustered by prompt)", 7.5)
    ax.set_ylabel("P(accept i | accept 0..i-1)")
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    keep = [h for h, label in zip(handles, labels) if "fewer than" not in label]
    ax.legend(handles=keep + ([_few_steps_handle()] if any_few else []), loc="upper right", ncol=2, fontsize=8)
    ax_n.axhline(MIN_STEPS, color="0.6", linestyle="--", linewidth=1)
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
    """One panel per checkpoint. A DFlash checkpoint has one branch (no correction head: base = final =
    total), drawn once; a corrected checkpoint's panel draws the total and both branches, and the
    curriculum weight lambda on a right-hand axis."""
    fig = Figure(figsize=(4.2 * len(rows), 4.0))
    axes = fig.subplots(1, len(rows), sharey=True, squeeze=False)[0]
    window = max(1, min(len(res["metrics"][r["name"]]) for r in rows) // 50)
    for ax, r in zip(axes, rows):
        metrics = res["metrics"][r["name"]]
        corrected = r["projector"] != "dflash"
        # widest first, so curves that coincide stay visible
        curves = ((("loss", "-", 4.0), ("base_loss", "--", 2.0), ("final_loss", ":", 2.0)) if corrected
                  else (("loss", "-", 2.0),))
        for key, style, width in curves:
            pts = [(m["step"], m[key]) for m in metrics if m[key] is not None]
            ax.plot([s for s, _ in pts], _smooth([v for _, v in pts], window), style, linewidth=width,
                    alpha=0.5 if key == "loss" and corrected else 1.0,
                    label=key if corrected else "loss (one branch: no correction head)")
        handles = ax.get_legend_handles_labels()[0]
        if corrected:
            lam = ax.twinx()
            lam.plot([m["step"] for m in metrics], [m["lambda"] for m in metrics], color="0.45", linewidth=1.2,
                     label="lambda (right axis)")
            lam.set_ylim(-0.03, 1.03)
            lam.set_ylabel("lambda: weight of the base loss")
            handles += lam.get_legend_handles_labels()[0]
        ax.set_title(r["label"])
        ax.set_xlabel("Training step")
        ax.grid(alpha=0.3)
        ax.legend(handles=handles, fontsize=8)
    axes[0].set_ylabel("Cross-entropy loss")
    fig.suptitle("Training loss; with a correction head, its base (backbone) and final (corrected) branches"
                 + (f"; moving average of {window} steps" if window > 1 else ""))
    return fig


def teacher_forced_plot(res: dict, rows: list[dict]) -> Figure:
    """Per position, each row's teacher-forced conditional accuracy, counted per anchor (dashed),
    and served conditional acceptance (solid, with its bootstrap interval where recorded; hollow and unjoined where it rests on fewer
    than ``MIN_STEPS`` steps). ``rows[i]["tf"]``: ``tables.TeacherForcedVsServed``;
    ``rows[i]["cond_steps"]``: the steps behind each served rate."""
    fig = Figure(figsize=(7.5, 4.6))
    ax = fig.subplots()
    any_few = False
    for j, r in enumerate(rows):
        t = r["tf"]
        dx = (j - (len(rows) - 1) / 2) * 0.08
        tf = [math.nan if p.teacher_forced is None else p.teacher_forced for p in t.positions]
        tf_line = ax.plot([p.position + dx for p in t.positions], tf, "--s",
                          markersize=4, label=f"{r['label']} teacher-forced (counts AL {t.counted_al:.2f})")[0]
        colour = tf_line.get_color()
        served = [p for p in t.positions if p.served is not None]
        for few, fmt in ((False, "-o"), (True, "o")):
            pts = [p for p in served if (r["cond_steps"][p.position] < MIN_STEPS) == few]
            if not pts:
                continue
            any_few |= few
            yerr = _yerr([p.served.value for p in pts], [p.served.low for p in pts], [p.served.high for p in pts])
            ax.errorbar([p.position + dx for p in pts], [p.served.value for p in pts], yerr=yerr, fmt=fmt,
                        capsize=3, color=colour, mfc="none" if few else colour,
                        label=(f"{r['label']} served, fewer than {MIN_STEPS} steps" if few
                               else f"{r['label']} served (AL {t.served_al.value:.2f})"))
    ax.set_ylim(0, 1.02)
    _title(ax, "Teacher-forced conditional accuracy (dashed) vs served conditional acceptance (solid, 95% interval "
              "over prompts)", 7.5)
    ax.set_xlabel("Draft position i (token a+i+1)")
    ax.set_ylabel("Accuracy / P(accept i | accept 0..i-1)")
    ax.set_xticks(range(max(len(r["tf"].positions) for r in rows)))
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    keep = [h for h, label in zip(handles, labels) if "fewer than" not in label]
    ax.legend(handles=keep + ([_few_steps_handle()] if any_few else []), fontsize=7, ncol=2,
              loc="upper center", bbox_to_anchor=(0.5, -0.14))  # below: the bars reach 1
    return fig


def data_size_plot(section: dict) -> Figure:
    """Acceptance length and speedup over plain greedy against the conversations trained on, one
    line per card row with its 95% intervals over prompts, the fastest row that needs no training
    as a dashed line (on the acceptance panel only where its acceptance length counts every step,
    as the rows' does); ``section``: the card's Training-data size section
    (``render._data_size_section``)."""
    fig = Figure(figsize=(9, 3.8))
    axes = fig.subplots(1, 2)
    sizes = [t["conversations"] for t in section["table"]]
    for ax, key, title in ((axes[0], "al_est", "Acceptance length"), (axes[1], "speedup_est", "Speedup over plain greedy")):
        for j, row in enumerate(section["rows"]):
            pts = [(t["conversations"], t["cells"][j][key]) for t in section["table"] if t["cells"][j] is not None]
            xs, est = [x for x, _ in pts], [e for _, e in pts]
            ax.errorbar(xs, [e.value for e in est], yerr=_yerr([e.value for e in est], [e.low for e in est],
                                                               [e.high for e in est]),
                        marker="o", capsize=3, label=row["label"])
        if section["lookup"] is not None and (key == "speedup_est" or section["lookup"]["comparable"]):
            e = section["lookup"][key]
            ax.axhline(e.value, linestyle="--", color="0.4", label=section["lookup"]["label"])
            ax.axhspan(e.low, e.high, color="0.4", alpha=0.12)
        if key == "speedup_est":
            ax.axhline(1.0, linestyle=":", color="0.6", linewidth=1)
        ax.set_xscale("log")
        ax.set_xticks(sizes, [f"{n:,}" for n in sizes])
        ax.minorticks_off()
        ax.set_xlabel("Training conversations")
        _title(ax, title, 4.5)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    return fig


def served_plot(res: dict, rows: list[dict]) -> Figure:
    """One panel per checkpoint trained with served validation (``rows``: the card's section,
    ``render._served_section``): the training loss per step (faint) and its mean between
    evaluations on the left axis, served acceptance length at each evaluation on the right, the
    step kept marked by a vertical line, and the kept checkpoint's teacher-forced acceptance
    length on the held-out features (the validate stage, measured only there) as a star."""
    width = 5.0 * len(rows)
    fig = Figure(figsize=(width, 5.0))
    axes = fig.subplots(1, len(rows), squeeze=False)[0]
    for ax, r in zip(axes, rows):
        metrics, curve = res["metrics"][r["name"]], r["curve"]
        ax.plot([m["step"] for m in metrics], [m["loss"] for m in metrics], color="0.75", linewidth=0.8,
                label="loss per step")
        ax.plot([e["step"] for e in curve], [e["mean_loss"] for e in curve], "-", color="0.3", linewidth=1.5,
                label="loss, mean since the last evaluation")
        ax.set_xlabel("Training step")
        ax.set_ylabel("Cross-entropy loss")
        al = ax.twinx()
        al.plot([e["step"] for e in curve], [e["acceptance_length"] for e in curve], "-o", color="C0", markersize=4,
                label="served acceptance length (right axis)")
        if r["teacher_forced"] is not None:
            al.plot([r["kept_step"]], [r["teacher_forced"]], "*", color="C1", markersize=11,
                    label="teacher-forced, the kept checkpoint (right axis)")
        al.axvline(r["kept_step"], linestyle="--", color="C3", linewidth=1, label=f"kept: step {r['kept_step']}")
        al.set_ylabel("Acceptance length")
        ax.set_title(r["label"])
        ax.grid(alpha=0.3)
        handles = ax.get_legend_handles_labels()[0] + al.get_legend_handles_labels()[0]
        ax.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    text = "Training loss and served acceptance length on held-out prompts against steps; the step kept marked"
    fig.suptitle("\n".join(textwrap.wrap(text, int(TITLE_CHARS_PER_INCH * width))), fontsize=10)
    fig.subplots_adjust(bottom=0.3, top=0.84, wspace=0.45)
    return fig


def write_plots(res: dict, rows: list[dict], out_dir: Path, data_size: dict | None = None,
                served: list[dict] | None = None) -> list[Path]:
    """Draw the plots into ``out_dir`` (names in ``PLOTS``, ``DATA_SIZE_PLOT`` with a
    Training-data size section ``data_size``, and ``SERVED_PLOT`` with a served validation section
    ``served``); ``rows``: the card's checkpoint rows."""
    draw = {"acceptance": acceptance_plot, "conditional": conditional_plot, "loss": loss_plot,
            "teacher_forced": teacher_forced_plot}
    written = [_save(draw[key](res, rows), Path(out_dir) / name) for key, name in PLOTS.items()]
    if data_size is not None:
        written.append(_save(data_size_plot(data_size), Path(out_dir) / DATA_SIZE_PLOT["data_size"]))
    if served:
        written.append(_save(served_plot(res, served), Path(out_dir) / SERVED_PLOT["served"]))
    return written
