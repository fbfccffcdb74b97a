"""Model card, plots and reproduction report, rendered from the results files only.

Input contract: docs/results.md. Every number in the card comes from those files (or from the
``card_info`` / ``provenance`` dicts the workflow passes); formatting lives in the Jinja
filters below, so a missing value raises instead of rendering empty.
"""

from __future__ import annotations

from pathlib import Path

from huggingface_hub import EvalResult, ModelCardData
from jinja2 import Environment, FileSystemLoader, StrictUndefined
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from domino import io
from domino.io import atomic_path, read_json, write_text

CHECKPOINTS = ("dflash-shift", "dflash-noshift", "domino")
LABELS = {"dflash-shift": "DFlash shift", "dflash-noshift": "DFlash noshift", "domino": "Domino",
          "baseline": "Plain greedy (verifier only)"}
COMPARE_TO = "dflash-noshift"  # the seed card's "vs DFlash noshift" column
HUB_DATASETS = {"HumanEval": "openai/openai_humaneval"}
TEMPLATES = Path(__file__).parent / "templates"

CARD_INFO_KEYS = (
    "model_name", "verifier", "dataset",
    "samples", "seq_len", "epochs", "lr", "warmup_steps", "lr_schedule", "lambda0", "lambda_ratio",
    "gamma", "optimizer", "anchors_per_row", "training_hardware", "scale", "license", "datasets",
)
PROVENANCE_KEYS = ("git_commit", "config_sha256", "packages", "hardware", "stage_seconds")
SCALES = ("embedded", "card")

# Published figures of the seed card (Qwen3-0.6B-Domino-b8, RTX 4060, patched vLLM), copied from
# its tables. Per-position rows are [pos_0, pos_1, pos_2, pos_3, pos_4+]; accuracies are fractions.
SEED_CARD = {
    "acceptance_length": {"dflash-shift": 1.070, "dflash-noshift": 1.079, "domino": 1.378},
    "tps": {"dflash-shift": 47.3, "dflash-noshift": 45.1, "domino": 53.1},
    "per_position": {
        "dflash-shift": [0.065, 0.004, 0.001, 0.000, 0.0],
        "dflash-noshift": [0.076, 0.003, 0.000, 0.0, 0.0],
        "domino": [0.319, 0.049, 0.008, 0.002, 0.0],
    },
    "first_trained_accuracy": {"dflash-shift": None, "dflash-noshift": 0.215, "domino": 0.410},
    "domino_conditional": [0.319, 0.152, 0.165, 0.234, 0.298, 0.412, 0.714, 0.800],
    "validation": {
        "base_acc": [0.410, 0.318, 0.278, 0.257, 0.243, 0.231, 0.224, 0.215],
        "final_acc": [0.410, 0.318, 0.278, 0.257, 0.243, 0.231, 0.224, 0.215],
        "overall": {"base_acc": 0.121, "final_acc": 0.272},
    },
}

PLOTS = {
    "acceptance": "acceptance_per_position.png",
    "conditional": "conditional_acceptance.png",
    "loss": "training_loss.png",
    "lambda": "lambda_schedule.png",
}

_VALIDATE_KEYS = ("projector", "shift_label", "first_trained_slot", "first_trained_accuracy", "per_slot", "overall", "anchors")
_VLLM_KEYS = ("acceptance_length", "tps", "speedup", "prompts", "same_tokens_as_ours", "ours_acceptance_length",
              "ours_tps")
_SUMMARY_KEYS = ("acceptance_length", "tps", "per_position_acceptance", "conditional_acceptance",
                 "drafts_per_step", "speedup", "matches_baseline")
_METRIC_KEYS = ("step", "loss", "base_loss", "final_loss", "lambda")
_DRAFTER_KEYS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "num_layers", "block_size",
                 "aux_layer_ids", "draft_vocab_size", "target_vocab_size", "target_num_layers", "projector",
                 "gru_hidden_size", "bottleneck_size", "shift_label", "pure_draft_prefix_len", "correct_from",
                 "mask_token_id")


def _require(obj, keys, path: Path, what: str = "results file"):
    if not isinstance(obj, dict):
        raise ValueError(f"{what} {path}: expected a JSON object, got {type(obj).__name__}")
    missing = [k for k in keys if k not in obj]
    if missing:
        raise ValueError(f"{what} {path} lacks field(s) {', '.join(missing)}")
    return obj


def read_jsonl(path: str | Path, keys=(), what: str = "results file") -> list[dict]:
    return io.read_jsonl(path, keys, what)


def load_results(results_dir: Path, checkpoints=CHECKPOINTS, vllm_runs=()) -> dict:
    """Read every results file the card needs (docs/results.md); raise naming any bad file.

    ``vllm_runs`` (optional, ``vllm.benchmark``): the runs served by vLLM, read from
    ``results/vllm_benchmark/{run}.json``; "baseline" must be among them."""
    root = Path(results_dir)
    out = {"validate": {}, "benchmark": {}, "metrics": {}, "train_summary": {}, "drafter_config": {}, "vllm": {}}
    for ckpt in checkpoints:
        p = root / "validate" / f"{ckpt}.json"
        out["validate"][ckpt] = _require(read_json(p), _VALIDATE_KEYS, p)
        _require(out["validate"][ckpt]["overall"], ("base_acc", "final_acc"), p)
        for slot in out["validate"][ckpt]["per_slot"]:
            _require(slot, ("slot", "target", "base_acc", "final_acc"), p)
        train = root / "train" / ckpt
        out["metrics"][ckpt] = read_jsonl(train / "metrics.jsonl", _METRIC_KEYS)
        p = train / "summary.json"
        out["train_summary"][ckpt] = _require(read_json(p), ("steps", "epochs", "seconds"), p)
        p = train / "checkpoint" / "drafter_config.json"
        out["drafter_config"][ckpt] = _require(read_json(p), _DRAFTER_KEYS, p)
    for run in ("baseline", *checkpoints):
        p = root / "benchmark" / f"{run}.json"
        bench = _require(read_json(p), ("protocol", "summary"), p)
        _require(bench["summary"], _SUMMARY_KEYS, p)
        # keep protocol and summary; the per-prompt token lists are not needed here
        out["benchmark"][run] = {"protocol": bench["protocol"], "summary": bench["summary"], "path": str(p)}
    protocols = {run: b["protocol"] for run, b in out["benchmark"].items()}
    if any(p != protocols["baseline"] for p in protocols.values()):
        paths = ", ".join(b["path"] for b in out["benchmark"].values())
        raise ValueError(f"benchmark protocols differ between {paths}; the card needs one protocol")
    if vllm_runs and "baseline" not in vllm_runs:
        raise ValueError("the vLLM cross-check needs its plain-greedy baseline run")
    for run in vllm_runs:
        p = root / "vllm_benchmark" / f"{run}.json"
        bench = _require(read_json(p), ("protocol", "summary"), p)
        _require(bench["summary"], _VLLM_KEYS, p)
        out["vllm"][run] = {"protocol": bench["protocol"], "summary": bench["summary"]}
    return out


# ---------------------------------------------------------------- formatting filters

def _num(x):
    if x is None or isinstance(x, bool) or not isinstance(x, (int, float)):
        raise ValueError(f"expected a number, got {x!r}")
    return x


def f3(x):
    return f"{_num(x):.3f}"


def f2(x):
    return f"{_num(x):.2f}"


def f1(x):
    return f"{_num(x):.1f}"


def pct(x):
    """Fraction -> percent with one decimal."""
    return f"{100 * _num(x):.1f}%"


def signed_pct(x):
    """Relative change (fraction) -> signed percent, e.g. +27.7%."""
    return f"{100 * _num(x):+.1f}%"


def signed_pp(x):
    """Difference of two fractions -> signed percentage points."""
    return f"{100 * _num(x):+.1f} pp"


def signed(x, decimals=3):
    return f"{_num(x):+.{decimals}f}"


def thousands(x):
    return f"{_num(x):,}"


def sci(x):
    """Learning-rate style: 0.0006 -> 6e-4."""
    mant, exp = f"{_num(x):e}".split("e")
    mant = mant.rstrip("0").rstrip(".")
    return f"{mant}e{int(exp)}"


def plain(x):
    """Shortest exact form of a float (1.0, 0.5, 0.75)."""
    return repr(float(_num(x)))


def g(x):
    """Compact general form (7.0 -> 7, 0.05 -> 0.05)."""
    return f"{_num(x):g}"


def times(x):
    return f"{_num(x):.2f}×"


def _env() -> Environment:
    env = Environment(loader=FileSystemLoader(str(TEMPLATES)), undefined=StrictUndefined,
                      keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True, autoescape=False)
    env.filters.update(f3=f3, f2=f2, f1=f1, pct=pct, signed_pct=signed_pct, signed_pp=signed_pp,
                       signed=signed, thousands=thousands, sci=sci, plain=plain, g=g, times=times)
    return env


# ---------------------------------------------------------------- context

def _pos_columns(per_pos: list[float]) -> list[float | None]:
    """[pos_0, pos_1, pos_2, pos_3, pos_4+]; pos_4+ is the SUM over positions >= 4; None if not drafted."""
    head = [per_pos[i] if i < len(per_pos) else None for i in range(4)]
    return head + [sum(per_pos[4:])]


def _conditional(summary: dict) -> list[float | None]:
    """Conditional acceptance, None where the previous position was never accepted (undefined)."""
    per_pos, cond = summary["per_position_acceptance"], summary["conditional_acceptance"]
    return [c if i == 0 or per_pos[i - 1] > 0 else None for i, c in enumerate(cond)]


def _context(res: dict, card_info: dict, provenance: dict) -> dict:
    missing = [k for k in CARD_INFO_KEYS if k not in card_info]
    if missing:
        raise ValueError(f"card_info lacks {', '.join(missing)}")
    missing = [k for k in PROVENANCE_KEYS if k not in provenance]
    if missing:
        raise ValueError(f"provenance lacks {', '.join(missing)}")
    if card_info["scale"] not in SCALES:
        raise ValueError(f"card_info scale must be one of {SCALES}, got {card_info['scale']!r}")
    ckpts = list(res["validate"])
    for needed in ("domino", COMPARE_TO):
        if needed not in ckpts:
            raise ValueError(f"the card needs the {needed!r} checkpoint; got {ckpts}")
    cfg = res["drafter_config"]["domino"]  # the verifier's shape, as the drafter was built for it

    bench = {run: b["summary"] for run, b in res["benchmark"].items()}
    ref = bench[COMPARE_TO]
    rows = []
    for ckpt in ckpts:
        s, v = bench[ckpt], res["validate"][ckpt]
        first = None
        if v["first_trained_slot"] is not None:
            slot = next(p for p in v["per_slot"] if p["slot"] == v["first_trained_slot"])
            first = {"slot": slot["slot"], "target": slot["target"], "accuracy": v["first_trained_accuracy"]}
        rows.append({
            "name": ckpt, "label": LABELS.get(ckpt, ckpt), "bold": ckpt == "domino",
            "projector": v["projector"], "shift": v["shift_label"], "first": first,
            "al": s["acceptance_length"], "tps": s["tps"], "speedup": s["speedup"],
            "matches_baseline": s["matches_baseline"], "drafts": s["drafts_per_step"],
            "near_ties": len(s.get("near_tie_divergences") or []), "tie_tolerance": s.get("tie_tolerance"),
            "is_ref": ckpt == COMPARE_TO,
            "d_al": s["acceptance_length"] / ref["acceptance_length"] - 1,
            "d_tps": s["tps"] / ref["tps"] - 1,
            "pos": _pos_columns(s["per_position_acceptance"]),
            "cond": _conditional(s),
            "steps": res["train_summary"][ckpt]["steps"],
            "epochs": res["train_summary"][ckpt]["epochs"],
            "train_seconds": res["train_summary"][ckpt]["seconds"],
        })
    by = {r["name"]: r for r in rows}
    dom, noshift = by["domino"], by[COMPARE_TO]
    a1_ratio = dom["pos"][0] / noshift["pos"][0] if noshift["pos"][0] else None
    return {
        "info": card_info, "prov": provenance, "cfg": cfg, "rows": rows, "domino": dom,
        "noshift": noshift, "a1_ratio": a1_ratio,
        "baseline": bench["baseline"], "baseline_label": LABELS["baseline"],
        "protocol": res["benchmark"]["baseline"]["protocol"],
        "val": res["validate"]["domino"], "plots": PLOTS,
        "any_missing_pos": any(p is None for r in rows for p in r["pos"]),
        "any_undefined_cond": any(c is None for c in dom["cond"]),
        "total_seconds": sum(provenance["stage_seconds"].values()),
        "scale_sentence": scale_sentence(card_info, cfg),
        "same_budget": len({(r["steps"], r["epochs"]) for r in rows}) == 1,
        "vllm": _vllm_rows(res["vllm"]),
    }


def _vllm_rows(vllm: dict) -> dict | None:
    """The vLLM cross-check table: each served run beside the project's own loop."""
    if not vllm:
        return None
    rows = [{"label": LABELS.get(run, run), **b["summary"]}
            for run, b in vllm.items()]
    return {"backend": vllm["baseline"]["protocol"]["backend"], "rows": rows}


def scale_sentence(info: dict, cfg: dict) -> str:
    """One plain statement of what scale the run was made at (``cfg``: a drafter_config.json)."""
    model = f"{cfg['target_num_layers']} layers, hidden size {cfg['hidden_size']}"
    if info["scale"] == "embedded":
        return (f"This is an embedded-scale run. The verifier is a small Qwen3-architecture model ({model}) "
                f"that the workflow builds and pretrains itself; it is not Qwen3-0.6B, and the run is far "
                f"smaller than the published card's. Its figures show that the pipeline works end to end; "
                f"they are not comparable with the published card's numbers.")
    return (f"This is a card-scale run: the verifier is `{info['verifier']}` ({model}) and data and training "
            f"follow the published card's settings, so the figures can be set beside the published ones "
            f"(TPS also depends on the hardware).")


def _front_matter(ctx: dict) -> str:
    info, protocol = ctx["info"], ctx["protocol"]
    evals = [
        EvalResult(
            task_type="text-generation", task_name="Speculative decoding",
            dataset_type=HUB_DATASETS.get(protocol["dataset"], protocol["dataset"]),
            dataset_name=protocol["dataset"], dataset_split="test",
            metric_type="acceptance_length", metric_name=f"Acceptance length ({r['label']})",
            metric_value=round(float(r["al"]), 3),
        )
        for r in ctx["rows"]
    ]
    data = ModelCardData(
        model_name=info["model_name"], language="en", license=info["license"], base_model=info["verifier"],
        pipeline_tag="text-generation", library_name="domino",
        tags=["speculative-decoding", "domino", "dflash", "qwen3", "draft-model"],
        datasets=list(info["datasets"]), eval_results=evals,
    )
    return f"---\n{data.to_yaml()}\n---\n\n"


def _reproduction_rows(ctx: dict) -> dict:
    """Published vs measured, grouped by table. Each row: label, published, measured, kind."""
    rows = {r["name"]: r for r in ctx["rows"]}
    ck = [c for c in CHECKPOINTS if c in rows]
    aggregate = [(f"Accept len, {LABELS[c]}", SEED_CARD["acceptance_length"][c], rows[c]["al"], "f3") for c in ck]
    aggregate += [(f"TPS, {LABELS[c]}", SEED_CARD["tps"][c], rows[c]["tps"], "f1") for c in ck]
    aggregate += [(f"First trained prediction accuracy, {LABELS[c]}", SEED_CARD["first_trained_accuracy"][c],
                   rows[c]["first"]["accuracy"] if rows[c]["first"] else None, "pct")
                  for c in ck if SEED_CARD["first_trained_accuracy"][c] is not None]
    names = ["pos_0", "pos_1", "pos_2", "pos_3", "pos_4+"]
    per_pos = [(f"{LABELS[c]} {n}", SEED_CARD["per_position"][c][i], rows[c]["pos"][i], "f3")
               for c in ck for i, n in enumerate(names)]
    cond = ctx["domino"]["cond"]
    conditional = [(f"Position {i}", p, cond[i] if i < len(cond) else None, "pct")
                   for i, p in enumerate(SEED_CARD["domino_conditional"])]
    val = {s["slot"]: s for s in ctx["val"]["per_slot"]}
    seed_val = SEED_CARD["validation"]
    validation = []
    for i in range(len(seed_val["base_acc"])):
        for key, name in (("base_acc", "Base acc"), ("final_acc", "Final acc")):
            validation.append((f"Position {i} {name}", seed_val[key][i], val[i][key] if i in val else None, "pct"))
    for key, name in (("base_acc", "Base acc"), ("final_acc", "Final acc")):
        validation.append((f"Overall {name}", seed_val["overall"][key], ctx["val"]["overall"][key], "pct"))
    tables = {"aggregate": aggregate, "per_position": per_pos, "conditional": conditional, "validation": validation}
    missing = any(row[2] is None for rows_ in tables.values() for row in rows_)
    return {**tables, "missing": missing}


# ---------------------------------------------------------------- plots

def _save(fig: Figure, path: Path) -> None:
    FigureCanvasAgg(fig)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight", metadata={"Software": None})


def _smooth(values: list[float], window: int) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def _plots(res: dict, ctx: dict, out_dir: Path) -> list[Path]:
    rows, written = ctx["rows"], []

    fig = Figure(figsize=(7.5, 4.2))
    ax = fig.subplots()
    width = 0.8 / len(rows)
    for j, r in enumerate(rows):
        per_pos = res["benchmark"][r["name"]]["summary"]["per_position_acceptance"]
        ax.bar([i + (j - (len(rows) - 1) / 2) * width for i in range(len(per_pos))], per_pos, width,
               label=f"{r['label']} (AL {f3(r['al'])})")
    ax.set_title("Per-position unconditional acceptance (share of steps accepting ≥ i+1 drafts)")
    ax.set_xlabel("Draft position i (pos_0 = token a+1)")
    ax.set_ylabel("Acceptance rate")
    ax.set_ylim(0, 1)
    ax.set_xticks(range(max(len(res["benchmark"][r["name"]]["summary"]["per_position_acceptance"]) for r in rows)))
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    written.append(out_dir / PLOTS["acceptance"])
    _save(fig, written[-1])

    fig = Figure(figsize=(7.5, 4.2))
    ax = fig.subplots()
    for r in rows:
        xs = [i for i, c in enumerate(r["cond"]) if c is not None]
        ax.plot(xs, [r["cond"][i] for i in xs], marker="o", label=r["label"])
    ax.set_title("Conditional acceptance per position (given all earlier drafts accepted)")
    ax.set_xlabel("Draft position i")
    ax.set_ylabel("P(accept i | accept 0..i-1)")
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3)
    ax.legend()
    written.append(out_dir / PLOTS["conditional"])
    _save(fig, written[-1])

    fig = Figure(figsize=(4.2 * len(rows), 4.0))
    axes = fig.subplots(1, len(rows), sharey=True, squeeze=False)[0]
    window = max(1, min(len(res["metrics"][r["name"]]) for r in rows) // 50)
    for ax, r in zip(axes, rows):
        metrics = res["metrics"][r["name"]]
        steps = [m["step"] for m in metrics]
        # widest first, so curves that coincide (the dflash branches) stay visible
        for key, style, width in (("loss", "-", 4.0), ("base_loss", "--", 2.0), ("final_loss", ":", 2.0)):
            pts = [(s, m[key]) for s, m in zip(steps, metrics) if m[key] is not None]
            ax.plot([s for s, _ in pts], _smooth([v for _, v in pts], window), style, linewidth=width,
                    alpha=0.5 if key == "loss" else 1.0, label=key)
        ax.set_title(r["label"])
        ax.set_xlabel("Training step")
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0].set_ylabel("Cross-entropy loss")
    fig.suptitle("Training loss: total, base (backbone) and final (corrected) branches"
                 + (f"; moving average of {window} steps" if window > 1 else ""))
    written.append(out_dir / PLOTS["loss"])
    _save(fig, written[-1])

    fig = Figure(figsize=(7.5, 4.2))
    ax = fig.subplots()
    for r, style, width in zip(rows, ("-", "--", ":", "-."), (5.0, 3.0, 2.0, 1.5)):
        metrics = res["metrics"][r["name"]]
        ax.plot([m["step"] for m in metrics], [m["lambda"] for m in metrics], style, linewidth=width,
                label=r["label"])
    ax.set_title("Base-anchored curriculum weight lambda")
    ax.set_xlabel("Training step")
    ax.set_ylabel("lambda (weight of the base loss)")
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    ax.legend()
    written.append(out_dir / PLOTS["lambda"])
    _save(fig, written[-1])
    return written


# ---------------------------------------------------------------- entry point

def render_card(results_dir, out_dir, card_info: dict, provenance: dict, vllm_runs=()) -> list[Path]:
    """Write model_card.md, reproduction.md and the PNG plots into out_dir; return their paths."""
    out_dir = Path(out_dir)
    res = load_results(Path(results_dir), vllm_runs=vllm_runs)
    ctx = _context(res, card_info, provenance)
    env = _env()
    card = _front_matter(ctx) + env.get_template("model_card.md.j2").render(**ctx)
    repro = env.get_template("reproduction.md.j2").render(seed=_reproduction_rows(ctx), **ctx)
    written = _plots(res, ctx, out_dir)
    write_text(out_dir / "model_card.md", card)
    write_text(out_dir / "reproduction.md", repro)
    return [out_dir / "model_card.md", out_dir / "reproduction.md", *written]
