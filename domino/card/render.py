"""Model card and reproduction report, rendered from the results files only.

Input contract: the results files' schemas (``results.py``, docs/results.md). Every number in
the card comes from those files (or from the ``card_info`` / ``provenance`` dicts the report
stage passes, ``report.py``); formatting lives in the Jinja filters of ``filters.py``, so a
missing value raises instead of rendering empty. The published card's figures live in
``published.py``, the scale statement in ``scale.py``, the plots in ``plots.py``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import EvalResult, ModelCard, ModelCardData
from huggingface_hub.utils import HFValidationError, validate_repo_id

from ..decoders import KINDS
from ..io import write_text
from .claims import claim_rows, claims_scope, differences_clause, withheld
from .filters import environment
from .html import write_html
from .paths import DATA_SIZE_PLOT, PLOTS, SERVED_PLOT, TEMPLATES, CardPaths, html_path
from .plots import MIN_STEPS, steps_behind_conditional, write_plots
from .published import (
    CHECKPOINTS,
    FIGURES as SEED_CARD,
    LABELS,
    NAME as SEED_NAME,
    SETTINGS as SEED_SETTINGS,
    TRAINER,
    TRAINER_COMMIT,
    TRAINER_CONVENTIONS,
)
from .results import MAIN_SUITE
from .scale import ScaleStatement
from .tables import (
    TEACHER_FORCED,
    Estimate,
    category_rows,
    compare,
    conditional_estimates,
    estimate,
    position_estimates,
    replicate_summary,
    tail_estimate,
    teacher_forced_vs_served,
)

COMPARE_TO = "dflash-noshift"  # the seed card's "vs DFlash noshift" column
HUB_DATASETS = {"HumanEval": "openai/openai_humaneval"}

CARD_INFO_KEYS = (
    "model_name", "verifier", "base_model", "dataset",
    "samples", "seq_len", "epochs", "lr", "warmup_steps", "lr_schedule", "lambda0", "lambda_ratio",
    "loss", "optimizer", "precision", "noise", "attention_window", "block_attention", "loss_mask", "init", "anchors_per_row",
    "training_hardware", "scale", "license", "datasets", "row_differences", "overrides",
)
PROVENANCE_KEYS = ("git_commit", "config_sha256", "packages", "hardware", "python", "stage_seconds")

# ---------------------------------------------------------------- context

@dataclass(frozen=True)
class StepCost:
    """Where a speculative step's time goes, against plain decoding's time per token.

    A plain step yields one token, so ``speedup = tokens_per_step / cost_in_plain_steps``, the
    speculative token rate over the plain one: the recorded paired speedup (a ratio of token
    rates); acceptance length can exceed tokens per step a little where the token budget cut a
    step's accepted drafts short."""
    tokens_per_step: float       # new tokens / speculative steps
    cost_in_plain_steps: float   # (seconds / steps) / plain seconds per token
    draft_share: float           # drafting seconds / total seconds
    verify_share: float          # verification seconds / total seconds
    other_share: float           # the rest: acceptance checks, cache bookkeeping
    speedup: float               # tokens_per_step / cost_in_plain_steps
    floor_in_plain_steps: float | None = None  # the drafter's and verifier's forwards alone (summary.floor)


def step_cost(summary: dict, plain_seconds_per_token: float) -> StepCost:
    """``summary``: a speculative row's benchmark summary (``steps``, ``new_tokens``, ``seconds``,
    ``draft_seconds``, ``verify_seconds``, and ``floor`` where the benchmark measured it)."""
    if summary["steps"] <= 0 or summary["seconds"] <= 0 or plain_seconds_per_token <= 0:
        raise ValueError(f"step cost needs positive steps, seconds and plain time, got {summary['steps']}, "
                         f"{summary['seconds']}, {plain_seconds_per_token}")
    per_step = summary["seconds"] / summary["steps"]
    draft, verify = summary["draft_seconds"] / summary["seconds"], summary["verify_seconds"] / summary["seconds"]
    tokens = summary["new_tokens"] / summary["steps"]
    cost = per_step / plain_seconds_per_token
    f = summary.get("floor")
    floor = (f["drafter_forward_seconds"] + f["verify_forward_seconds"]) / plain_seconds_per_token if f else None
    return StepCost(tokens, cost, draft, verify, 1.0 - draft - verify, tokens / cost, floor)


def _plain_seconds_per_token(res: dict, row: str) -> float:
    """Plain decoding's seconds per token: the row's ``plain_seconds`` (the plain decodes of its
    job) over those decodes' own tokens, which ``baseline.json``'s ``new_tokens`` counts (the
    one benchmark job writes the baseline file from the same plain decodes, docs/results.md)."""
    return res["benchmark"][row]["summary"]["plain_seconds"] / res["benchmark"]["baseline"]["summary"]["new_tokens"]


def _pos_estimates(bench: dict) -> list[Estimate | None]:
    """[pos_0, pos_1, pos_2, pos_3, pos_4+] with intervals (the recorded ones for pos_0..pos_3, a
    derived one for pos_4+, the SUM over positions >= 4); None for a position not drafted, and for
    every position of a row that sent no draft (a cost-aware row that decoded plainly)."""
    if bench["summary"]["steps"] == 0:
        return [None] * 5
    per_pos = position_estimates(bench["summary"], sum(1 for p in bench["prompts"] if p["accepted_per_step"]))
    return [per_pos[i] if i < len(per_pos) else None for i in range(4)] + [tail_estimate(bench, 4)]


def _first_trained(v: dict) -> dict | None:
    if v["first_trained_slot"] is None:
        return None
    slot = next((p for p in v["per_slot"] if p["slot"] == v["first_trained_slot"]), None)
    if slot is None:  # results.check refuses such a file as it is read; this names it for any other caller
        raise ValueError(f"validate results of {v.get('checkpoint', 'a checkpoint')}: first_trained_slot "
                         f"{v['first_trained_slot']} names no slot of per_slot "
                         f"(slots: {sorted(p['slot'] for p in v['per_slot'])})")
    return {"slot": slot["slot"], "target": slot["target"], "accuracy": v["first_trained_accuracy"]}


def _checkpoint_row(res: dict, ckpt: str) -> dict:
    bench, ref_bench = res["benchmark"][ckpt], res["benchmark"][COMPARE_TO]
    s, v = bench["summary"], res["validate"][ckpt]
    train = res["train_summary"][ckpt]
    vs_ref = None if ckpt == COMPARE_TO else compare(bench, ref_bench)
    pos_est, cond_est = _pos_estimates(bench), conditional_estimates(bench)
    tf = teacher_forced_vs_served(v, bench, cond_est)
    return {
        "al_est": estimate(s, "acceptance_length"), "al_prompt_mean": estimate(s, "acceptance_length_per_prompt_mean"),
        "tps_est": estimate(s, "tps"), "speedup_est": estimate(s, "speedup"),
        "pos_est": pos_est, "cond_est": cond_est, "vs_ref": vs_ref,
        "first_slot_acc": tf.positions[0].marginal, "tf": tf,  # position 0 drafts a+1
        "name": ckpt, "label": LABELS.get(ckpt, ckpt),
        "projector": v["projector"], "shift": v["shift_label"], "first": _first_trained(v),
        "al": s["acceptance_length"], "tps": s["tps"], "matches_baseline": s["matches_baseline"],
        "near_ties": len(s["near_tie_divergences"]), "tie_tolerance": s["tie_tolerance"],
        "replay": s.get("lossless_replay"),
        "is_ref": ckpt == COMPARE_TO, "comparable": True,  # a trained drafter's acceptance length counts every step
        "pos": [None if e is None else e.value for e in pos_est],
        "cond": [None if e is None else e.value for e in cond_est],
        "cond_steps": steps_behind_conditional(bench),
        "cost": step_cost(s, _plain_seconds_per_token(res, ckpt)),
        "steps": train["steps"], "epochs": train["epochs"], "train_seconds": train["seconds"],
    }


def lookup_label(bench: dict) -> str:
    """How the card names a row without training of its own: its results file's ``decoder`` label
    (``domino.decoders``), its checkpoint's label filled in; a file written before the registry
    names an n-gram lookup row by its ``lookup``."""
    if "decoder" in bench:
        c = bench["decoder"]["checkpoint"]
        return bench["decoder"]["label"].replace("{checkpoint}", LABELS.get(c, c) if c else "")
    then = bench["lookup"]["then"]
    return "n-gram lookup, no training" if then is None else f"n-gram lookup, then {LABELS.get(then, then)}"


def is_free(bench: dict) -> bool:
    """A row that drafts without a trained checkpoint (the bar a trained drafter must clear)."""
    return bench["decoder"]["free"] if "decoder" in bench else bench["lookup"]["then"] is None


def decoder_kind(bench: dict) -> str:
    """A row's kind in the registry (``domino.decoders.KINDS``): its results file's ``decoder``
    record; a file written before the registry is an n-gram lookup row, with a checkpoint or not."""
    if "decoder" in bench:
        return bench["decoder"]["kind"]
    return "ngram" if bench["lookup"]["then"] is None else "ngram-then"


def description(bench: dict) -> str | None:
    """How a row without training of its own drafts, in the card's words (``Kind.describe`` from
    the row's settings), or None where its kind says nothing."""
    kind = KINDS[decoder_kind(bench)]
    if kind.describe is None:
        return None
    settings = bench["decoder"]["settings"] if "decoder" in bench else bench["lookup"]
    return kind.describe(settings)


def comparable_acceptance(bench: dict) -> bool:
    """Whether a row without training of its own has an acceptance length of the trained drafters'
    definition, over every step (``Kind.every_step``): the card compares acceptance only between
    such rows, and a row whose acceptance length leaves out its plain steps with none."""
    return KINDS[decoder_kind(bench)].every_step


def fastest(rows: list[dict]) -> dict:
    """The row of highest speedup over plain greedy (its point estimate)."""
    return max(rows, key=lambda r: r["speedup_est"].value)


def in_bold(*tables: list[dict]) -> list[list[dict]]:
    """Each table's rows, copied, with ``bold`` set on the fastest of them all (``fastest``; every
    row of that speedup on a tie): the one row the card's tables print in bold, whichever it is."""
    top = fastest([r for rows in tables for r in rows])["speedup_est"].value
    return [[{**r, "bold": r["speedup_est"].value == top} for r in rows] for rows in tables]


def shown(bench: dict) -> bool:
    """Whether a row without training of its own has a row in the tables: one that drafted at all,
    and every cost-aware row (sending nothing is its plain fallback, which its speed shows)."""
    return bench["summary"]["steps"] > 0 or KINDS[decoder_kind(bench)].cost_aware


def _lookup_row(res: dict, row: str) -> dict:
    """An n-gram lookup row of the HumanEval tables: what the Aggregate, Per-position and Speedup
    tables read of a checkpoint's row, and Domino against it (paired)."""
    bench = res["lookup"][MAIN_SUITE][row]
    s = bench["summary"]
    plain_per_token = s["plain_seconds"] / res["benchmark"]["baseline"]["summary"]["new_tokens"]
    return {"name": row, "label": lookup_label(bench), "is_ref": False,
            "al_est": estimate(s, "acceptance_length"), "tps_est": estimate(s, "tps"),
            "speedup_est": estimate(s, "speedup"), "pos_est": _pos_estimates(bench),
            "vs_ref": compare(bench, res["benchmark"][COMPARE_TO]),
            "domino_vs": compare(res["benchmark"]["domino"], bench),
            "matches_baseline": s["matches_baseline"], "near_ties": len(s["near_tie_divergences"]),
            "tie_tolerance": s["tie_tolerance"], "replay": s.get("lossless_replay"),
            "cost": step_cost(s, plain_per_token) if s["steps"] else None, "lookup": bench.get("lookup"),
            "kind": decoder_kind(bench), "free": is_free(bench), "comparable": comparable_acceptance(bench),
            "description": description(bench), "adaptive": _adaptive(bench), "bench": bench}


def replaced_sentences(benches: list[dict], labels: dict) -> list[str]:
    """The card's sentence for each decoder kind a shown row makes unnecessary (``Kind.replaces``)
    whose own row was not decoded beside it, its checkpoint's label filled in."""
    kinds = {decoder_kind(b) for b in benches}
    out = []
    for b in benches:
        kind = KINDS.get(decoder_kind(b))
        rep = kind.replaces if kind else None
        if rep and rep[0] not in kinds:
            ck = b.get("decoder", {}).get("checkpoint")
            out.append(rep[1].format(checkpoint=labels.get(ck, ck)))
    return out


def _adaptive(bench: dict) -> dict | None:
    """A cost-aware row's choices, in the card's words: per source the share of steps and tokens
    a step; the cost curve in milliseconds and as a multiple of one row."""
    a = bench.get("adaptive")
    if a is None:
        return None
    steps = sum(c["steps"] for c in a["chosen"].values()) or 1
    words = {"none": "nothing (a plain step)", "drafter": "the trained drafter", "suffix": "the suffix cache",
             "ngram": "the n-gram lookup"}
    verify = a["costs"]["verify_seconds"]
    return {"chosen": [{"source": words.get(k, k), "share": c["steps"] / steps,
                        "tokens": c["tokens"] / c["steps"] if c["steps"] else 0.0} for k, c in a["chosen"].items()],
            "drafter_runs": a["drafter_runs"], "requests": a.get("requests"), "plain_requests": a.get("plain_requests"),
            "verify_ms": [1e3 * v for v in verify], "verify_ratio": [v / verify[0] for v in verify],
            "drafter_ms": None if a["costs"]["drafter_seconds"] is None else 1e3 * a["costs"]["drafter_seconds"],
            "context_tokens": a["costs"]["context_tokens"], "calibration": a["calibration"]}


def _lookup_verdict(rows: list[dict], lookups: list[dict]) -> dict | None:
    """The fastest row that needs no training (the lookup, the suffix cache) against the trained
    rows: whether it decodes faster than every one of them (point estimates of the speedup over
    plain greedy), Domino against it, and each cost-aware row against it, paired."""
    free = [r for r in lookups if r["free"]]
    if not free:
        return None
    alone, best = fastest(free), fastest(rows)
    return {"row": alone, "faster_than_all": alone["speedup_est"].value > best["speedup_est"].value,
            "best": best, "domino_vs": alone["domino_vs"],
            "cost_aware": [{"row": r, "vs": compare(r["bench"], alone["bench"])} for r in lookups if r["adaptive"]]}


def _check_inputs(res: dict, card_info: dict, provenance: dict, changes: dict) -> None:
    missing = [k for k in CARD_INFO_KEYS if k not in card_info]
    if missing:
        raise ValueError(f"card_info lacks {', '.join(missing)}")
    missing = [k for k in PROVENANCE_KEYS if k not in provenance]
    if missing:
        raise ValueError(f"provenance lacks {', '.join(missing)}")
    if not isinstance(card_info["scale"], ScaleStatement):
        raise ValueError(f"card_info scale must be a scale.ScaleStatement, got {card_info['scale']!r}")
    missing = [c for c in CHECKPOINTS if c not in res["validate"]]
    if missing:
        raise ValueError(f"the card needs its rows' checkpoint(s) {', '.join(missing)}; "
                         f"got {', '.join(res['validate'])}")
    undescribed = [c for c in res["validate"] if c not in CHECKPOINTS and c not in changes]
    if undescribed:
        raise ValueError(f"the Ablations table needs what {', '.join(undescribed)} change(s) relative to Domino "
                         "(render_card's changes)")


def _validation_column_note() -> dict:
    """What the published per-position "Base acc" column is, computed from its own figures."""
    v = SEED_CARD["validation"]
    return {"equal_columns": v["base_acc"] == v["final_acc"], "positions": len(v["base_acc"]),
            "column_mean": statistics.mean(v["base_acc"]), "overall": v["overall"]}


def _trainer_sources() -> dict:
    """Where the card's trainer sets each convention the Training table sets this run beside
    (``published.TRAINER_CONVENTIONS``): the trainer, its commit, and per config key its choice and
    the files and lines that make it, which the appendix cites."""
    return {"trainer": TRAINER, "commit": TRAINER_COMMIT,
            "rows": [{"key": k, "choice": v, "source": src} for k, (v, src) in TRAINER_CONVENTIONS.items()]}


def _domino_vs_dflash(res: dict, by_name: dict) -> list[dict]:
    """Domino against each DFlash row of the card: paired relative differences (the one against
    DFlash noshift is Domino's row's ``vs_ref``)."""
    dom = res["benchmark"]["domino"]
    return [{"label": f"Domino vs {by_name[c]['label']}", "vs": by_name[c]["label"],
             "cmp": by_name["domino"]["vs_ref"] if c == COMPARE_TO else compare(dom, res["benchmark"][c])}
            for c in CHECKPOINTS if by_name[c]["projector"] == "dflash"]


def _ablation_rows(res: dict, by_name: dict, order: list[str], changes: dict) -> list[dict] | None:
    """Every configured variant, in ``order``, beside Domino; None without an extra variant."""
    if len(order) == len(CHECKPOINTS):
        return None
    dom = res["benchmark"]["domino"]
    return [{**by_name[c], "changes": "(reference)" if c == "domino" else changes.get(c) or "—",
             "vs_domino": None if c == "domino" else compare(res["benchmark"][c], dom).acceptance_length}
            for c in order]


def _other_answers(by_name: dict, order: list[str], changes: dict) -> str | None:
    """The training steps of the variants that train on other answers (``data.responses``)
    against Domino's, "domino-regenerated 65 against Domino's 53"; None without one."""
    others = [c for c in order if "data.responses" in (changes.get(c) or "")]
    if not others:
        return None
    steps = ", ".join(f"{by_name[c]['label']} {by_name[c]['steps']:,}" for c in others)
    return f"{steps} against Domino's {by_name['domino']['steps']:,}"


def training_conversations(res: dict) -> int:
    """The conversations the card's rows trained on: the regenerated training split's when the
    run trains on the verifier's answers, else the prepared one's."""
    regenerated = res.get("regenerate") or {}
    return regenerated["train"]["conversations"] if "train" in regenerated else res["data"]["train"]


def _served_section(res: dict, labels: dict, names: list[str]) -> list[dict]:
    """Per checkpoint of ``names`` that trained with served validation (its summary's
    ``served_validation``), in that order: its curve, the step kept and the served acceptance
    length there and at the last evaluation, and its teacher-forced acceptance length on the
    held-out features (the validate stage's, of the kept checkpoint)."""
    out = []
    for name in names:
        sv = res["train_summary"][name].get("served_validation")
        if not sv:
            continue
        kept = next(e for e in sv["curve"] if e["step"] == sv["kept_step"])
        tf = ((res["validate"].get(name) or {}).get("acceptance_length") or {}).get("final")
        out.append({"name": name, "label": labels.get(name, name), "curve": sv["curve"], "keep": sv["keep"],
                    "kept_step": sv["kept_step"], "kept_epochs": kept["epochs"], "kept_al": kept["acceptance_length"],
                    "last_step": sv["curve"][-1]["step"], "last_al": sv["curve"][-1]["acceptance_length"],
                    "best_al": max(e["acceptance_length"] for e in sv["curve"]), "evaluations": len(sv["curve"]),
                    "stopped_early": sv["stopped_early"], "prompts": sv["prompts"],
                    "max_new_tokens": sv["max_new_tokens"], "every_steps": sv["every_steps"],
                    "teacher_forced": tf, "plot": SERVED_PLOT["served"]})
    return out


def _data_size_section(res: dict, by_name: dict, points: dict, lookups: list[dict]) -> dict | None:
    """Acceptance and speed against the conversations trained on (``points``: the variants that
    are a card row on fewer of them, ``paths.data_size_points``; the card's rows are the largest
    point): per size, each row's acceptance length and speedup over plain, its training time and
    steps, and Domino against DFlash noshift, paired; the fastest row that needs no
    training as a line. None without a point."""
    if not points:
        return None
    total = training_conversations(res)
    rows = [r for r in CHECKPOINTS if any(p["row"] == r for p in points.values())]
    names = {(r, total): r for r in rows}
    for name, p in points.items():
        names.setdefault((p["row"], min(p["samples"], total)), name)
    table = []
    for n in sorted({size for _, size in names}):
        cells = {r: by_name[names[(r, n)]] if (r, n) in names else None for r in rows}
        both = cells.get("domino") is not None and cells.get(COMPARE_TO) is not None
        table.append({"conversations": n, "cells": [cells[r] for r in rows],
                      "domino_vs": compare(res["benchmark"][cells["domino"]["name"]],
                                           res["benchmark"][cells[COMPARE_TO]["name"]]) if both else None})
    free = [r for r in lookups if r["free"]]
    alone = fastest(free) if free else None
    return {"rows": [{"name": r, "label": LABELS[r]} for r in rows], "table": table, "total": total,
            "lookup": alone, "plot": DATA_SIZE_PLOT["data_size"]}


def _trainer_rows(ctx: dict, trainer: dict) -> list[dict]:
    """The Ablations rows of the variants that take the card's trainer's conventions (``trainer``:
    name -> those settings in words), each with its acceptance length against Domino's."""
    rows = {r["name"]: r for r in ctx["ablations"] or []}
    return [{"label": rows[name]["label"], "settings": settings, "al": rows[name]["al_est"],
             "vs_domino": rows[name]["vs_domino"]} for name, settings in trainer.items() if name in rows]


def _answers_section(res: dict, by_name: dict, twins: dict) -> list[dict] | None:
    """The card's rows against their twins on other answers (``report.answer_twins``), one table
    per direction ("corpus" -> "verifier"): each twin's acceptance length and speed against its
    row's, paired over the prompts, and their training steps; with the Domino and DFlash noshift
    twins both present, Domino against DFlash noshift on the twins' answers beside the rows'.
    None without a twin."""
    if not twins:
        return None
    groups = {}
    for name, t in twins.items():
        row = t["row"]
        groups.setdefault((t["row_answers"], t["answers"]), []).append({
            "label": by_name[row]["label"], "twin": by_name[name]["label"], "row_al": by_name[row]["al_est"],
            "twin_al": by_name[name]["al_est"], "vs": compare(res["benchmark"][name], res["benchmark"][row]),
            "row_steps": by_name[row]["steps"], "twin_steps": by_name[name]["steps"], "row": row, "name": name})
    out = []
    for (a, b), rows in groups.items():
        rows.sort(key=lambda r: CHECKPOINTS.index(r["row"]))
        twin_of = {r["row"]: r["name"] for r in rows}
        pair = None
        if "domino" in twin_of and COMPARE_TO in twin_of:
            pair = {"rows": by_name["domino"]["vs_ref"],
                    "twins": compare(res["benchmark"][twin_of["domino"]], res["benchmark"][twin_of[COMPARE_TO]])}
        out.append({"row_answers": a, "answers": b, "rows": rows, "domino_vs_noshift": pair})
    return out


def _suite_name(benches: dict) -> str:
    """A suite's name on the card, as its results record it (``protocol.dataset``)."""
    return benches["baseline"]["protocol"]["dataset"]


def _sampling_rows(res: dict, order: list[str], temperatures) -> dict | None:
    """Per suite, temperature and checkpoint (in ``order``): AL, per-position acceptance and
    paired speedup, T = 0 from the greedy results; None when only greedy decoding was run."""
    if not res["sampling"]:
        return None
    out = []
    for suite, greedy in res["suites"].items():
        decoded = ([(0.0, greedy)] if 0 in temperatures else []) + [(t, res["sampling"][t][suite])
                                                                  for t in sorted(res["sampling"])]
        for t, benches in decoded:
            for c in order:
                b = benches[c]
                out.append({"suite": _suite_name(greedy), "temperature": t, "label": LABELS.get(c, c),
                            "al": estimate(b["summary"], "acceptance_length"), "pos": _pos_estimates(b),
                            "speedup": estimate(b["summary"], "speedup")})
    decoding = {t: by_suite[MAIN_SUITE]["baseline"]["protocol"]["decoding"] for t, by_suite in res["sampling"].items()}
    return {"rows": out, "decoding": decoding, "suites": len(res["suites"])}


def _suite_section(res: dict, scope: str) -> list[dict] | None:
    """Per suite of ``benchmark.suites`` (HumanEval first): the card's three rows with acceptance
    length, speedup and paired differences against DFlash noshift, the published claims measured
    on it, and per category (a suite whose tasks carry one) Domino's acceptance length against
    DFlash noshift's; None when HumanEval is the only suite."""
    if len(res["suites"]) == 1:
        return None
    out = []
    for suite, benches in res["suites"].items():
        rows = []
        for c in CHECKPOINTS:
            s = benches[c]["summary"]
            rows.append({"label": LABELS[c], "al": estimate(s, "acceptance_length"), "speedup": estimate(s, "speedup"),
                         "vs_ref": None if c == COMPARE_TO else compare(benches[c], benches[COMPARE_TO]),
                         "near_ties": len(s["near_tie_divergences"]), "comparable": True})
        lookups = [{"label": lookup_label(b), "al": estimate(b["summary"], "acceptance_length"),
                    "speedup": estimate(b["summary"], "speedup"), "vs_ref": compare(b, benches[COMPARE_TO]),
                    "near_ties": len(b["summary"]["near_tie_divergences"]), "domino_vs": compare(benches["domino"], b),
                    "free": is_free(b), "comparable": comparable_acceptance(b), "bench": b}
                   for b in res.get("lookup", {}).get(suite, {}).values() if shown(b)]
        free = [r for r in lookups if r["free"]]
        best_free = max(free, key=lambda r: r["speedup"].value) if free else None
        for r in lookups:
            r["vs_best_free"] = None if best_free is None or r["free"] else compare(r["bench"], best_free["bench"])
            r["best_free_label"] = None if best_free is None else best_free["label"]
        protocol = benches["baseline"]["protocol"]
        out.append({"suite": suite, "name": _suite_name(benches), "prompts": protocol["prompts"],
                    "turns": protocol.get("turns", 1), "rows": rows, "lookups": lookups,
                    "earlier": protocol.get("earlier_turn_answers"), "max_new_tokens": protocol["max_new_tokens"],
                    "claims": claim_rows(benches, LABELS, scope),
                    "plain": benches["baseline"]["summary"],
                    "categories": category_rows({c: benches[c] for c in CHECKPOINTS}, "domino", COMPARE_TO)})
    return out


def _tf_table(rows: list[dict]) -> list[dict]:
    """Per drafted position: each row's (teacher-forced accuracy, served conditional acceptance);
    None where the checkpoint drafts no such position."""
    depth = max(len(r["tf"].positions) for r in rows)
    return [{"position": i, "target": f"a+{i + 1}",
             "cells": [r["tf"].positions[i] if i < len(r["tf"].positions) else None for r in rows]}
            for i in range(depth)]


REPLICATE_METRIC_WORDS = {"acceptance_length": "acceptance length", "speedup": "speedup",
                          TEACHER_FORCED: "teacher-forced acceptance length"}


def _replicate_section(res: dict, order: list[str], replicates: int) -> dict | None:
    """The Seed replicates section: every checkpoint's spread across seeds (in ``order``), and the
    orderings among the card's three rows and of each further variant against Domino; None for a
    single replicate."""
    if replicates == 1:
        return None
    main = list(dict.fromkeys(("domino", COMPARE_TO, *CHECKPOINTS)))
    pairs = [(a, b) for i, a in enumerate(main) for b in main[i + 1:]]
    pairs += [("domino", c) for c in order[len(CHECKPOINTS):]]
    summary = replicate_summary({**res["benchmark"], **res["replicates"]}, order, replicates, pairs,
                                {**res["validate"], **res["replicate_validate"]})
    orderings = [{"higher": LABELS.get(o.higher, o.higher), "lower": LABELS.get(o.lower, o.lower),
                  "metric": REPLICATE_METRIC_WORDS[o.metric], "holds": o.holds, "every": o.in_every_replicate,
                  "fails": list(o.fails)} for o in summary.orderings]
    return {"n": replicates, "orderings": orderings, "every": sum(o["every"] for o in orderings),
            "rows": [{"label": LABELS.get(r.checkpoint, r.checkpoint), "al": r.acceptance_length,
                      "speedup": r.speedup, "teacher_forced": r.teacher_forced} for r in summary.rows]}


def _context(res: dict, card_info: dict, provenance: dict, changes: dict | None = None) -> dict:
    """``changes``: for each variant beyond the card's three, what it changes relative to Domino
    (``report.variant_changes``). ``res["replicate_count"]`` N > 1 adds the Seed replicates
    section from ``res["replicates"]``."""
    changes = changes or {}
    temperatures, replicates = res["temperatures"], res["replicate_count"]
    _check_inputs(res, card_info, provenance, changes)
    by_name = {c: _checkpoint_row(res, c) for c in res["validate"]}
    order = [*CHECKPOINTS, *(c for c in by_name if c not in CHECKPOINTS)]  # the card's rows, then config order
    rows = [by_name[c] for c in CHECKPOINTS]  # the seed tables keep the card's three rows
    lookups = [_lookup_row(res, row) for row, b in res.get("lookup", {}).get(MAIN_SUITE, {}).items()
               if shown(b)]  # then the rows without training of their own that drafted at all, and the cost-aware ones
    rows, lookups = in_bold(rows, lookups)
    dom, noshift = by_name["domino"], by_name[COMPARE_TO]
    protocol = res["benchmark"]["baseline"]["protocol"]
    scope = claims_scope(card_info["scale"])
    return {
        "claims": claim_rows(res["benchmark"], LABELS, scope), "claims_scope": scope,
        "claims_differ": differences_clause(card_info["scale"], protocol["backend"]),
        "withheld": withheld(scope, res["benchmark"], LABELS),
        "info": card_info, "prov": provenance, "rows": rows, "domino": dom, "noshift": noshift,
        "lookup_rows": lookups, "lookup_verdict": _lookup_verdict(rows, lookups),
        "cost_aware": [{"suite": _suite_name(res["suites"][suite]), "label": lookup_label(b), **_adaptive(b)}
                       for suite, benches in res.get("lookup", {}).items() for b in benches.values() if "adaptive" in b],
        "replaced": replaced_sentences([r["bench"] for r in lookups], LABELS),
        "lookup_silent": [lookup_label(b) for b in res.get("lookup", {}).get(MAIN_SUITE, {}).values()
                          if not shown(b)],
        "domino_vs": _domino_vs_dflash(res, by_name), "ablations": _ablation_rows(res, by_name, order, changes),
        "other_answers": _other_answers(by_name, order, changes),
        "sampling": _sampling_rows(res, order, temperatures), "suites": _suite_section(res, scope),
        "boot": res["benchmark"]["domino"]["summary"]["bootstrap"],
        "tf_table": _tf_table(rows), "all_rows": [by_name[c] for c in order],
        "baseline_row": {"tps": estimate(res["benchmark"]["baseline"]["summary"], "tps")},
        "machine_load": res["benchmark"]["baseline"]["summary"].get("machine_load"),
        "cfg": res["drafter_config"]["domino"],  # the verifier's shape, as the drafter was built for it
        "a1_ratio": dom["pos"][0] / noshift["pos"][0] if noshift["pos"][0] else None,
        "baseline": res["benchmark"]["baseline"]["summary"], "baseline_label": LABELS["baseline"],
        "protocol": res["benchmark"]["baseline"]["protocol"],
        "val": res["validate"]["domino"], "plots": PLOTS, "min_steps": MIN_STEPS,
        "any_missing_pos": any(p is None for r in rows for p in r["pos"]),
        "any_undefined_cond": any(c is None for c in dom["cond"]),
        "any_few_steps": any(n < MIN_STEPS for n in dom["cond_steps"]),
        "total_seconds": sum(provenance["stage_seconds"].values()),
        "scale": card_info["scale"], "scale_sentence": card_info["scale"].sentence(),
        "same_budget": len({(r["steps"], r["epochs"]) for r in by_name.values()}) == 1,
        "vllm": _vllm_rows(res), "seed_name": SEED_NAME, "seed_validation": _validation_column_note(),
        "published": SEED_SETTINGS, "replicates": _replicate_section(res, order, replicates),
        "trainer_sources": _trainer_sources(),
    }


def _vllm_rows(res: dict) -> dict | None:
    """The vLLM cross-check: per suite (HumanEval first), each served row beside the project's
    own loop, with the benchmark's task count and turns; None when vLLM served nothing."""
    if not res["vllm"]:
        return None
    from .tables import vllm_row

    tables = []
    for suite, served in res["vllm"].items():
        protocol = res["suites"][suite]["baseline"]["protocol"]
        tables.append({"name": _suite_name(res["suites"][suite]), "benchmark_prompts": protocol["prompts"],
                       "turns": protocol.get("turns", 1),
                       "rows": [{"label": f"{lookup_label(b)} (vLLM's ngram)" if "lookup" in b else LABELS.get(row, row),
                                 **vllm_row(b["summary"])} for row, b in served.items()]})
    return {"backend": res["vllm"][MAIN_SUITE]["baseline"]["protocol"]["backend"], "tables": tables,
            "lookup": any("lookup" in b for served in res["vllm"].values() for b in served.values())}


# ---------------------------------------------------------------- front matter

def _front_matter(ctx: dict) -> str:
    """YAML front matter: ``base_model`` only for a Hub verifier, ``datasets`` only when Hub data was read."""
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
        model_name=info["model_name"], language="en", license=info["license"], base_model=info["base_model"],
        pipeline_tag="text-generation",  # no library_name: no Hub library loads these weights as they are
        tags=["speculative-decoding", "domino", "dflash", *([info["verifier_type"]] if info.get("verifier_type") else []),
              "draft-model"],
        datasets=list(info["datasets"]) or None, eval_results=evals,
    )
    return f"---\n{data.to_yaml()}\n---\n\n"


def check_front_matter(card_text: str) -> ModelCardData:
    """Validate a card's metadata offline with huggingface_hub: it parses (eval results included,
    errors not ignored), ``base_model`` and every ``datasets`` entry are well-formed Hub ids, and
    the license and model-index are present. Returns the parsed metadata; raises ValueError."""
    try:
        data = ModelCard(card_text, ignore_metadata_errors=False).data
    except ValueError as err:
        raise ValueError(f"card front matter does not parse as Hub metadata: {err}") from None
    ids = [("base_model", data.base_model)] if data.base_model is not None else []
    ids += [("datasets", d) for d in data.datasets or []]
    for key, value in ids:
        try:
            validate_repo_id(value)
        except HFValidationError as err:
            raise ValueError(f"card front matter {key}: {value!r} is not a Hub id ({err})") from None
    if not data.license or not data.eval_results:
        raise ValueError("card front matter lacks a license or eval results")
    return data


# ---------------------------------------------------------------- reproduction report

def _reproduction_rows(ctx: dict) -> dict:
    """Published vs measured, grouped by table. Each row: label, published, measured, kind.

    The published per-position "Base acc" column is its final branch's accuracy (see
    ``_validation_column_note``), so each position is set beside this run's final accuracy."""
    rows = {r["name"]: r for r in ctx["rows"]}
    aggregate = [(f"Accept len, {LABELS[c]}", SEED_CARD["acceptance_length"][c], rows[c]["al"], "f3")
                 for c in CHECKPOINTS]
    aggregate += [(f"TPS, {LABELS[c]}", SEED_CARD["tps"][c], rows[c]["tps"], "f1") for c in CHECKPOINTS]
    aggregate += [(f"First trained prediction accuracy, {LABELS[c]}", SEED_CARD["first_trained_accuracy"][c],
                   rows[c]["first"]["accuracy"] if rows[c]["first"] else None, "pct")
                  for c in CHECKPOINTS if SEED_CARD["first_trained_accuracy"][c] is not None]
    names = ["pos_0", "pos_1", "pos_2", "pos_3", "pos_4+"]
    per_pos = [(f"{LABELS[c]} {n}", SEED_CARD["per_position"][c][i], rows[c]["pos"][i], "f3")
               for c in CHECKPOINTS for i, n in enumerate(names)]
    cond = ctx["domino"]["cond"]
    conditional = [(f"Position {i}", p, cond[i] if i < len(cond) else None, "pct")
                   for i, p in enumerate(SEED_CARD["domino_conditional"])]
    val = {s["slot"]: s for s in ctx["val"]["per_slot"]}
    seed_val = SEED_CARD["validation"]
    validation = [(f"Position {i} accuracy", published, val[i]["final_acc"] if i in val else None, "pct")
                  for i, published in enumerate(seed_val["base_acc"])]
    validation += [(f"Overall {name}", seed_val["overall"][key], ctx["val"]["overall"][key], "pct")
                   for key, name in (("base_acc", "Base acc"), ("final_acc", "Final acc"))]
    tables = {"aggregate": aggregate, "per_position": per_pos, "conditional": conditional, "validation": validation}
    missing = any(row[2] is None for rows_ in tables.values() for row in rows_)
    return {**tables, "missing": missing}


# ---------------------------------------------------------------- entry point

def render_card(res: dict, out: CardPaths | str | Path, card_info: dict, provenance: dict,
                changes: dict | None = None, trainer: dict | None = None,
                answers: dict | None = None, data_size: dict | None = None) -> list[Path]:
    """Write the card, its appendix, the reproduction report, the PNG plots and an HTML page of
    each Markdown file; return their paths. ``res``: the run's results (``results.load_results``),
    whose checkpoints beyond the card's three rows go into the Ablations table, each described by
    ``changes[name]`` (what it changes relative to Domino); a sampling temperature adds the
    speculative-sampling table, seed replicates the Seed replicates section. ``out`` is a
    ``CardPaths`` or a folder (``model_card.md`` and ``reproduction.md`` in it). ``trainer``: the
    variants that take the card's trainer's conventions (``report.trainer_variants``), which the
    reproduction report sets beside Domino. ``answers``: the variants that are a card row trained on
    other answers (``report.answer_twins``), which the Training answers section sets beside their rows.
    ``data_size``: the variants that are a card row trained on fewer conversations
    (``paths.data_size_points``), which the Training-data size section and its plot set beside the rows.
    The front matter is validated (``check_front_matter``) before anything is written."""
    out = out if isinstance(out, CardPaths) else CardPaths.under(out)
    ctx = _context(res, card_info, provenance, changes)
    ctx["trainer_rows"] = _trainer_rows(ctx, trainer or {})
    by_name = {r["name"]: r for r in ctx["all_rows"]}
    ctx["answers"] = _answers_section(res, by_name, answers or {})
    ctx["data_size"] = _data_size_section(res, by_name, data_size or {}, ctx["lookup_rows"])
    ctx["served"] = _served_section(res, {n: r["label"] for n, r in by_name.items()}, list(by_name))
    ctx.update(card=Path(out.card).name, appendix=out.appendix.name, reproduction=Path(out.reproduction).name)
    env = environment(TEMPLATES)
    card = _front_matter(ctx) + env.get_template("model_card.md.j2").render(**ctx)
    check_front_matter(card)
    appendix = env.get_template("model_card_appendix.md.j2").render(**ctx)
    repro = env.get_template("reproduction.md.j2").render(seed=_reproduction_rows(ctx), **ctx)
    written = write_plots(res, ctx["rows"], Path(out.card).parent, ctx["data_size"], ctx["served"])
    pages = []
    for path, text in zip(out.markdown, (card, appendix, repro)):
        write_text(path, text)
        pages.append(write_html(text, html_path(path)))
    return [*out.markdown, *written, *pages]
