"""Model card renderer: seed-card tables, numbers parsed back, errors naming files, HF parsing, plots."""

import json
import re
import shutil

import pytest
from huggingface_hub import ModelCard

from conftest import (
    CARD_INFO,
    CKPTS,
    FIXTURE,
    LABELS,
    PROVENANCE,
    check_ci,
    check_num,
    embedded_scale,
    fixture,
    render_results,
    table,
    tables,
)
from domino import stats
from domino.card import claims, filters, plots, published, render, scale
from domino.card.results import load_results
from domino.decoders import KINDS
from domino.io import write_json
from domino.stats import compare_checkpoints, implied_acceptance_length
from domino.tools import compare

# Header rows of the published card's tables (the figures of domino/card/published.py come from
# the same card), which the rendered card repeats.
SEED_HEADERS = [
    "| Parameter | Value |",
    "| Checkpoint | Projector | Shift | First trained prediction |",
    "| Model | Accept len | TPS | vs DFlash noshift |",
    "| Model | pos_0 | pos_1 | pos_2 | pos_3 | pos_4+ |",
    "| Position | 0 | 1 | 2 | 3 | 4 | 5 | 6 | 7 |",
    "| Position | Base acc | Final acc |",
]
# First-column labels of the seed's two Parameter/Value tables, in order.
SEED_MODEL_ROWS = ["Verifier", "Verifier layers", "Draft layers", "Auxiliary layers", "Block size",
                   "Draft vocab size", "Target vocab size", "Projector", "GRU hidden dim", "Bottleneck dim",
                   "Shift label", "Pure draft prefix len", "Mask token ID"]
SEED_TRAINING_ROWS = ["Dataset", "Sequence length", "Epochs", "LR", "Base-anchored curriculum", "Loss",
                      "Teacher forcing", "Hardware"]
# rows this card adds to the seed's Training table: what the published card does not state
EXTRA_TRAINING_ROWS = ["Optimizer", "Training precision", "Noise on auxiliary states", "Draft attention", "Attention within the block",
                       "Loss mask of a block slot", "Initialisation"]
SPEED_HEADER = "| Run | TPS | Speedup | Output identical to plain greedy |"
BASELINE_LABEL = "Plain greedy (verifier only)"



# a printed estimate with its interval: "2.156 [2.022, 2.308]", "+36.8% [+23.8%, +52.9%]", "1.31× [1.23×, 1.40×]"
PRINTED_CI = re.compile(r"([+-]?[\d,]+\.\d+)(%|×)? \[([+-]?[\d,]+\.\d+)(?:%|×)?, ([+-]?[\d,]+\.\d+)(?:%|×)?\]")


def printed_intervals(text):
    return [tuple(float(m[i].replace(",", "")) for i in (1, 3, 4)) for m in PRINTED_CI.finditer(text)]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """(folder, paths written, the card and its appendix as one text, the reproduction report)."""
    out = tmp_path_factory.mktemp("card")
    paths = render_results(FIXTURE, out, CARD_INFO, PROVENANCE)
    text = (out / "model_card.md").read_text() + "\n" + (out / "model_card_appendix.md").read_text()
    return out, paths, text, (out / "reproduction.md").read_text()


def test_seed_tables_present(rendered):
    _, _, text, _ = rendered
    lines = text.splitlines()
    for header in SEED_HEADERS:
        assert header in lines, header
    # every table of the seed card sits on the main card, in the seed's order (its two
    # Parameter/Value tables first and sixth), and none is repeated in the appendix
    card = (rendered[0] / "model_card.md").read_text()
    headers = [h for h, _ in tables(card)]
    seed_order = [SEED_HEADERS[0], *SEED_HEADERS[1:5], SEED_HEADERS[0], SEED_HEADERS[5]]
    found = [h for h in headers if h in SEED_HEADERS]
    assert [h for i, h in enumerate(found) if h not in found[:i] or h == SEED_HEADERS[0]] == seed_order, headers
    appendix = (rendered[0] / "model_card_appendix.md").read_text()
    assert not [h for h, _ in tables(appendix) if h in SEED_HEADERS[1:]]
    model_rows, training_rows = [rows for h, rows in tables(text) if h == "| Parameter | Value |"]
    assert [r[0] for r in model_rows] == SEED_MODEL_ROWS
    assert [r[0] for r in training_rows if r[0] not in EXTRA_TRAINING_ROWS] == SEED_TRAINING_ROWS
    cited = [source for _, source in published.TRAINER_CONVENTIONS.values()]  # PR 685's code, quoted
    assert "{{" not in text and "None" not in re.sub("|".join(map(re.escape, cited)), "",
                                                      text.replace("None (pos0 masked)", ""))


def test_model_and_training_tables(rendered):
    _, _, text, _ = rendered
    cfg = fixture("train/domino/checkpoint/drafter_config.json")
    model_rows, training_rows = [dict(rows) for h, rows in tables(text) if h == "| Parameter | Value |"]
    assert model_rows["Verifier"] == f"`{CARD_INFO['verifier']}`"
    assert model_rows["Draft layers"] == (f"{cfg['num_layers']}, hidden={cfg['hidden_size']}, "
                                          f"{cfg['num_attention_heads']} attn heads, {cfg['num_key_value_heads']} KV heads")
    assert model_rows["Auxiliary layers"] == str(cfg["aux_layer_ids"])
    assert model_rows["Block size"] == str(cfg["block_size"])
    assert model_rows["Draft vocab size"] == f"{cfg['draft_vocab_size']:,}"
    assert model_rows["Target vocab size"] == f"{cfg['target_vocab_size']:,}"
    assert model_rows["GRU hidden dim"] == str(cfg["gru_hidden_size"])
    assert model_rows["Bottleneck dim"] == str(cfg["bottleneck_size"])
    assert model_rows["Mask token ID"] == str(cfg["mask_token_id"])
    assert training_rows["Dataset"] == "ShareGPT, 5,000 samples"
    assert training_rows["Sequence length"] == "4,096"
    assert training_rows["LR"] == "6e-4, linear schedule, 50 warmup steps"
    for row, key in zip(EXTRA_TRAINING_ROWS, ("optimizer", "precision", "noise", "attention_window", "block_attention",
                                              "loss_mask", "init")):
        assert training_rows[row] == CARD_INFO[key]
    assert "settings the published card does not state say" in text
    assert training_rows["Base-anchored curriculum"] == "lambda_base 1.0 → 0, decay ratio 0.5"
    assert training_rows["Loss"] == CARD_INFO["loss"]


def test_benchmark_numbers(rendered):
    _, _, text, _ = rendered
    files = {c: fixture(f"benchmark/humaneval/{c}.json") for c in ["baseline", *CKPTS]}
    bench = {c: f["summary"] for c, f in files.items()}

    ckpt_rows = {r[0]: r for r in table(text, SEED_HEADERS[1])}
    assert ckpt_rows["DFlash shift"][1:] == ["dflash", "True", "None (pos0 masked)"]
    for c in ("dflash-noshift", "domino"):
        v = fixture(f"validate/{c}.json")
        m = re.fullmatch(r"pos(\d+) \((a\+\d+), (.+)\)", ckpt_rows[LABELS[c]][3])
        assert int(m[1]) == v["first_trained_slot"] and m[2] == "a+1"
        check_num(m[3], 100 * v["first_trained_accuracy"], 1, "%")

    agg = {r[0]: r for r in table(text, SEED_HEADERS[2])}
    for c in CKPTS:
        row, s = agg[LABELS[c]], bench[c]
        check_ci(row[1], s["acceptance_length"], s["acceptance_length_ci"], 3)
        check_ci(row[2], s["tps"], s["tps_ci"], 1)
        if c == "dflash-noshift":
            assert row[3] == "baseline"
        else:  # paired relative differences, as compare_checkpoints computes them on the same prompts
            cmp = compare_checkpoints(files[c], files["dflash-noshift"], seed=0)
            m = re.fullmatch(r"(.+) accept, (.+) speedup", row[3])
            for cell, iv in ((m[1], cmp.acceptance_length), (m[2], cmp.speedup)):
                check_ci(cell, iv.estimate, (iv.low, iv.high), 1, "%", scale=100)

    both = {r[0]: r for r in table(text, "| Model | Accept len (pooled) | Accept len (per-prompt mean) |")}
    for c in CKPTS:
        s = bench[c]
        check_ci(both[LABELS[c]][1], s["acceptance_length"], s["acceptance_length_ci"], 3)
        check_ci(both[LABELS[c]][2], s["acceptance_length_per_prompt_mean"],
                 s["acceptance_length_per_prompt_mean_ci"], 3)
    assert s["acceptance_length"] != s["acceptance_length_per_prompt_mean"]  # the two definitions differ here
    assert text.count("**Acceptance length** (pooled") == 1 and text.count("**per-prompt mean acceptance length**") == 1

    speed = {r[0]: r for r in table(text, SPEED_HEADER)}
    assert list(speed) == [BASELINE_LABEL, *(LABELS[c] for c in CKPTS)]
    check_ci(speed[BASELINE_LABEL][1], bench["baseline"]["tps"], bench["baseline"]["tps_ci"], 1)
    for c in CKPTS:
        s = bench[c]
        check_ci(speed[BASELINE_LABEL][1], s["plain_tps"], s["plain_tps_ci"], 1)  # the plain decodes are shared
        check_ci(speed[LABELS[c]][1], s["tps"], s["tps_ci"], 1)
        check_ci(speed[LABELS[c]][2], s["speedup"], s["speedup_ci"], 2, "×")
        assert speed[LABELS[c]][3] == "yes"

    per_pos = {r[0]: r for r in table(text, SEED_HEADERS[3])}
    for c in CKPTS:
        a, a_ci = bench[c]["per_position_acceptance"], bench[c]["per_position_acceptance_ci"]
        for i in range(4):
            if a[i] == 0:  # nothing accepted: the count and its upper bound
                assert re.fullmatch(r"0 of [\d,]+ steps \(95% upper bound over \d+ prompts: 0\.\d{3}\)",
                                    per_pos[LABELS[c]][1 + i])
            else:
                check_ci(per_pos[LABELS[c]][1 + i], a[i], a_ci[i], 3)
        tail = per_pos[LABELS[c]][5]
        if sum(a[4:]) == 0:
            assert tail.startswith("0 of "), tail
        else:
            check_num(tail.split(" [")[0], sum(a[4:]), 3)  # pos_4+ is the sum

    cond_row, ci_row, steps_row = table(text, SEED_HEADERS[4])
    assert cond_row[0] == "Conditional acceptance" and steps_row[0] == "Steps behind the rate"
    assert ci_row[0] == "95% interval" and ci_row[-1] == "—"
    s = bench["domino"]
    assert steps_row[1:] == [f"{s['steps']:,}"] + [f"{round(a * s['steps']):,}" for a in s["per_position_acceptance"][:-1]]
    a, cond = bench["domino"]["per_position_acceptance"], bench["domino"]["conditional_acceptance"]
    for i, cell in enumerate(cond_row[1:]):
        if i > 0 and a[i - 1] == 0:
            assert cell == "0 of 0 steps" and ci_row[1 + i] == "—"  # no step reached the position
        elif cond[i] == 0:
            assert re.fullmatch(r"0 of [\d,]+ steps", cell) and ci_row[1 + i].startswith("≤ "), (cell, ci_row[1 + i])
        else:
            check_num(cell, 100 * cond[i], 1, "%")
    assert "0 of 0 steps" in cond_row  # the fixture exercises a position no step reached


def test_validation_table(rendered):
    _, _, text, _ = rendered
    v = fixture("validate/domino.json")
    rows = table(text, SEED_HEADERS[5])
    assert [r[0] for r in rows] == [str(s["slot"]) for s in v["per_slot"]] + ["Overall"]
    assert "| **Overall** |" in text
    for row, s in zip(rows, v["per_slot"] + [v["overall"]]):
        check_num(row[1], 100 * s["base_acc"], 1, "%")
        check_num(row[2], 100 * s["final_acc"], 1, "%")


def test_additions(rendered):
    out, _, text, repro = rendered
    for png in plots.PLOTS.values():
        assert f"]({png})" in text
    statement = CARD_INFO["scale"].sentence()
    card, appendix = (out / "model_card.md").read_text(), (out / "model_card_appendix.md").read_text()
    assert f"**Scale.** {statement}" in card and "](model_card_appendix.md#scale-of-this-run)" in card
    # the settings side by side, written once: in the appendix; the reproduction report links to it
    scale_rows = {r[0]: r for r in table(appendix, "| Setting | This run | Published card | Same |")}
    assert [c.name for c in CARD_INFO["scale"].checks] == list(scale_rows)[:-1]
    assert statement not in repro and "](model_card_appendix.md#scale-of-this-run)" in repro
    assert "| Setting | This run |" not in repro
    assert "| Python | CPython 3.12.3 |" in text
    assert f"`{PROVENANCE['git_commit']}`" in text and PROVENANCE["config_sha256"] in text
    stages = {r[0]: r[1] for r in table(text, "| Stage | Wall time (s) |")}
    assert list(stages) == [*PROVENANCE["stage_seconds"], "Total"]  # in the order given
    check_num(stages["train"], 456.78, 1)
    check_num(stages["Total"], 12.34 + 456.78, 1)
    assert {r[0]: r[1] for r in table(text, "| Package | Version |")} == PROVENANCE["packages"]


def test_reproduction_report(rendered):
    _, _, _, repro = rendered
    bench = {c: fixture(f"benchmark/humaneval/{c}.json")["summary"] for c in CKPTS}
    rows = {r[0]: r[1:] for _, t in tables(repro) for r in t}
    published_figures = published.FIGURES
    for c in CKPTS:
        published_cell, measured, diff = rows[f"Accept len, {LABELS[c]}"]
        assert published_cell == f"{published_figures['acceptance_length'][c]:.3f}"
        check_num(measured, bench[c]["acceptance_length"], 3)
        assert float(diff) == pytest.approx(float(measured) - float(published_cell), abs=1e-9)
        published_cell, measured, diff = rows[f"TPS, {LABELS[c]}"]
        assert published_cell == f"{published_figures['tps'][c]:.1f}"
        assert float(diff) == pytest.approx(float(measured) - float(published_cell), abs=1e-9)
    assert rows["Overall Base acc"][0] == "12.1%" and rows["Overall Final acc"][0] == "27.2%"
    # the published per-position column is its final accuracy: paired with ours, per position
    per_slot = fixture("validate/domino.json")["per_slot"]
    for s in per_slot:
        published_cell, measured, _ = rows[f"Position {s['slot']} accuracy"]
        assert published_cell == f"{100 * published.FIGURES['validation']['final_acc'][s['slot']]:.1f}%"
        check_num(measured, 100 * s["final_acc"], 1, "%")
    assert "averages to 27.2%, its overall final accuracy (27.2%)" in " ".join(repro.split())
    v = fixture("validate/domino.json")["overall"]
    check_num(rows["Overall Final acc"][1], 100 * v["final_acc"], 1, "%")
    assert rows["Overall Final acc"][2] == f"{100 * v['final_acc'] - 27.2:+.1f} pp"
    assert rows["Domino pos_0"][0] == "0.319"
    assert rows["Position 7"][1:] == ["—", "—"]  # undefined conditional rate in the fixture


def test_card_parses_as_hf_model_card(rendered):
    _, _, text, _ = rendered
    parsed = render.check_front_matter(text)
    assert parsed.base_model is None and "base_model" not in text.split("\n---\n")[0]  # not a Hub verifier
    parsed = ModelCard(text)
    assert parsed.data.license == "apache-2.0"
    assert parsed.data.library_name is None and "library_name" not in text  # no Hub library loads these weights
    assert parsed.data.pipeline_tag == "text-generation"
    assert "speculative-decoding" in parsed.data.tags
    assert parsed.data.to_dict()["model-index"][0]["name"] == CARD_INFO["model_name"]
    values = {e.metric_name: e.metric_value for e in parsed.data.eval_results}
    for c in CKPTS:
        al = fixture(f"benchmark/humaneval/{c}.json")["summary"]["acceptance_length"]
        assert values[f"Acceptance length ({LABELS[c]})"] == round(al, 3)
    assert {e.dataset_type for e in parsed.data.eval_results} == {"openai/openai_humaneval"}


def test_plots_written(rendered):
    out, paths, _, _ = rendered
    pages = [out / "model_card.md", out / "model_card_appendix.md", out / "reproduction.md"]
    assert set(paths) == {*pages, *(p.with_suffix(".html") for p in pages), *(out / p for p in plots.PLOTS.values())}
    for name in plots.PLOTS.values():
        data = (out / name).read_bytes()
        assert len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(out.glob(".tmp-*"))


def test_dirty_commit_and_missing_stage_times(tmp_path):
    render_results(FIXTURE, tmp_path, CARD_INFO, {**PROVENANCE, "stage_seconds": {}, "git_commit": "0123abc+dirty"})
    text = (tmp_path / "model_card.md").read_text()
    assert "| Git commit | `0123abc+dirty` (the checkout had uncommitted changes) |" in text
    assert "Stage wall times were not recorded for this run." in (tmp_path / "model_card_appendix.md").read_text()


def test_speed_explained(rendered):
    """Step cost in plain steps and time shares, from the benchmark totals; speedup = tokens per step / cost."""
    text = rendered[2]
    rows = {r[0]: r for r in table(text, "| Run | Tokens per step | Accept len | Step cost (plain steps) "
                                         "| Floor (plain steps) | Drafting share | Verifying share | Other share | Speedup |")}
    base = fixture("benchmark/humaneval/baseline.json")["summary"]
    for c in CKPTS:
        s = fixture(f"benchmark/humaneval/{c}.json")["summary"]
        assert s["plain_seconds"] == base["seconds"]  # one job: every run shares the baseline's plain decodes
        plain = s["plain_seconds"] / base["new_tokens"]  # seconds per token of those plain decodes
        row = rows[LABELS[c]]
        check_num(row[1], s["new_tokens"] / s["steps"], 2)
        check_num(row[3], s["seconds"] / s["steps"] / plain, 2)
        if s.get("floor"):
            f = s["floor"]
            check_num(row[4], (f["drafter_forward_seconds"] + f["verify_forward_seconds"]) / plain, 2)
        else:
            assert row[4] == "—"
        check_num(row[5], 100 * s["draft_seconds"] / s["seconds"], 1, "%")
        check_num(row[6], 100 * s["verify_seconds"] / s["seconds"], 1, "%")
        check_num(row[8], s["speedup"], 2, "×")  # the derivation reproduces the measured speedup
    assert re.search(r"so its speedup is [\d.]+ ÷\s+[\d.]+ = [\d.]+×", text)


def test_step_cost_hand_computed():
    # 100 tokens in 40 steps taking 2 s (0.5 s drafting, 1.2 s verifying); plain decoding 0.025 s per token
    c = render.step_cost({"steps": 40, "new_tokens": 100, "seconds": 2.0, "draft_seconds": 0.5,
                        "verify_seconds": 1.2}, 0.025)
    assert c.tokens_per_step == 2.5 and c.cost_in_plain_steps == pytest.approx(2.0)  # 0.05 s / 0.025 s
    assert (c.draft_share, c.verify_share) == (0.25, 0.6) and c.other_share == pytest.approx(0.15)
    assert c.speedup == pytest.approx(1.25) and c.floor_in_plain_steps is None
    # the floor: drafter 0.01 s + verifier 0.02 s alone, in plain steps of 0.025 s
    floor = {"drafter_forward_seconds": 0.01, "verify_forward_seconds": 0.02, "plain_forward_seconds": 0.02}
    c = render.step_cost({"steps": 40, "new_tokens": 100, "seconds": 2.0, "draft_seconds": 0.5,
                          "verify_seconds": 1.2, "floor": floor}, 0.025)
    assert c.floor_in_plain_steps == pytest.approx(1.2)
    with pytest.raises(ValueError, match="positive steps"):
        render.step_cost({"steps": 0, "new_tokens": 0, "seconds": 1.0, "draft_seconds": 0, "verify_seconds": 0}, 0.1)


def test_step_cost_uses_the_shared_plain_time():
    s = fixture("benchmark/humaneval/domino.json")["summary"]
    row = render._checkpoint_row(load_results(FIXTURE), "domino")
    assert row["cost"].speedup == pytest.approx(s["plain_seconds"] / s["seconds"])  # the paired speedup


@pytest.mark.parametrize("field", ["plain_seconds", "draft_seconds", "verify_seconds", "steps", "new_tokens"])
def test_missing_summary_field_names_it(results_copy, field):
    p = results_copy / "benchmark" / "humaneval" / "domino.json"
    b = json.loads(p.read_text())
    del b["summary"][field]
    write_json(p, b, seal=True)
    with pytest.raises(ValueError, match=rf"{re.escape(str(p))} lacks field summary\.{field}$"):
        load_results(results_copy)


def test_front_matter_rejects_a_path_as_base_model():
    text = "---\nlicense: apache-2.0\nbase_model: results/verifier/model\n---\n# x\n"
    with pytest.raises(ValueError, match="base_model: 'results/verifier/model' is not a Hub id"):
        render.check_front_matter(text)


@pytest.fixture
def results_copy(tmp_path):
    dst = tmp_path / "results"
    shutil.copytree(FIXTURE, dst)
    return dst


@pytest.mark.parametrize("rel", ["validate/domino.json", "benchmark/humaneval/baseline.json", "train/dflash-shift/metrics.jsonl",
                                 "train/domino/summary.json", "train/domino/checkpoint/drafter_config.json"])
def test_missing_file_names_it(results_copy, rel):
    (results_copy / rel).unlink()
    with pytest.raises(FileNotFoundError, match=re.escape(str(results_copy / rel))):
        load_results(results_copy)


@pytest.mark.parametrize("rel, content", [
    ("benchmark/humaneval/domino.json", "{not json"),
    ("validate/dflash-noshift.json", '{"checkpoint": "dflash-noshift"}'),  # valid JSON, fields missing
    ("train/domino/metrics.jsonl", '{"step": 0, "loss": 1.0, "base_loss": 1.0, "final_loss": 1.0, "lambda": 1.0}\n{oops\n'),
    ("train/domino/metrics.jsonl", ""),
])
def test_malformed_file_names_it(results_copy, rel, content):
    (results_copy / rel).write_text(content)
    with pytest.raises(ValueError, match=re.escape(str(results_copy / rel))):
        load_results(results_copy)


def test_missing_values_raise(tmp_path):
    info = dict(CARD_INFO)
    del info["loss"]
    with pytest.raises(ValueError, match="card_info lacks loss"):
        render_results(FIXTURE, tmp_path, info, PROVENANCE)
    with pytest.raises(ValueError, match="card_info scale must be a scale.ScaleStatement"):
        render_results(FIXTURE, tmp_path, {**CARD_INFO, "scale": "card"}, PROVENANCE)
    with pytest.raises(ValueError, match="expected a number, got None"):
        filters.f3(None)
    assert not (tmp_path / "model_card.md").exists()


def test_verifier_behaviour_line(rendered):
    text = rendered[2]
    s = fixture("benchmark/humaneval/baseline.json")["summary"]
    assert f"on {100 * s['eos_share']:.1f}% of the" in text
    assert f"{100 * s['repeated_4gram_share']:.1f}% of their 4-grams repeat" in text


def _vllm_result(run, al, ours_al, tps, speedup, same):
    summary = {"acceptance_length": al, "tps": tps, "speedup": speedup, "prompts": 164, "same_tokens_as_ours": same,
               "ours_acceptance_length": ours_al, "ours_tps": 500.0, "tps_ratio_to_ours": tps / 500.0,
               "tps_ratio_to_ours_ci": [tps / 520.0, tps / 480.0]}
    if run != "baseline":
        summary.update(speedup_ci=[speedup - 0.05, speedup + 0.05], same_counts_as_ours=same - 1,
                       per_position_acceptance=[0.5, 0.25, 0.125, 0.0625, 0.03],
                       ours_per_position_acceptance=[0.5, 0.25, 0.12, 0.06, 0.03])
    return {"row": run, "protocol": {"backend": "vLLM 0.32.0"}, "summary": summary}


def test_vllm_cross_check_on_the_first_prompts(results_copy, tmp_path):
    """With vllm.max_prompts vLLM serves the benchmark's first N prompts, and the card says so."""
    d = results_copy / "vllm_benchmark" / "humaneval"
    d.mkdir(parents=True)
    runs = ("baseline", "dflash-shift", "dflash-noshift", "domino")
    for run in runs:
        result = _vllm_result(run, 1.2, 1.2, 150.0, 0.7, 8)
        result["summary"]["prompts"] = 8
        write_json(d / f"{run}.json", result, seal=True)
    render_results(results_copy, tmp_path, CARD_INFO, PROVENANCE, vllm_rows=list(runs))
    text = (tmp_path / "model_card_appendix.md").read_text()
    n = fixture("benchmark/humaneval/baseline.json")["protocol"]["prompts"]
    assert f"vLLM served the first 8 of the benchmark's {n} prompts (`vllm.max_prompts`)" in text
    assert "| 8 of 8 |" in text


def test_vllm_cross_check_table(results_copy, tmp_path):
    """With vllm.benchmark the card gains one table: a row per served run, vLLM's numbers beside this loop's."""
    d = results_copy / "vllm_benchmark" / "humaneval"
    d.mkdir(parents=True)
    rows = {"baseline": (1.0, 1.0, 212.5, 1.0, 164), "dflash-shift": (1.2, 1.21, 150.0, 0.7, 163),
            "dflash-noshift": (1.3561, 1.3596, 160.04, 0.7532, 162), "domino": (1.5, 1.5, 170.0, 0.8, 164)}
    for run, vals in rows.items():
        write_json(d / f"{run}.json", _vllm_result(run, *vals), seal=True)
    render_results(results_copy, tmp_path / "with", CARD_INFO, PROVENANCE, vllm_rows=list(rows))
    text = (tmp_path / "with" / "model_card_appendix.md").read_text()
    assert "## Cross-check: served by vLLM 0.32.0" in text
    assert ("| DFlash noshift | 1.356 | 1.360 | 0.50 / 0.25 / 0.12 / 0.06 | 0.50 / 0.25 / 0.12 / 0.06 | 160.0 | "
            "0.75× [0.70×, 0.80×] | 0.32× [0.31×, 0.33×] | 162 of 164 | 161 of 164 |") in text
    assert ("| Plain greedy (verifier only) | 1.000 | 1.000 | — / — / — / — | — / — / — / — | 212.5 | 1.00× [1.00×, 1.00×] "
            "| 0.42× [0.41×, 0.44×] | 164 of 164 | — |") in text
    table = text.split("## Cross-check")[1].split("\n## ")[0]
    assert "| Domino | 1.500 | 1.500 |" in table and "| DFlash shift | 1.200 | 1.210 |" in table
    assert "`ngram` method" not in table  # said only where the lookup row is served
    lookup = _vllm_result("ngram", 2.4, 2.9, 300.0, 1.5, 160)
    write_json(d / "ngram.json", {**lookup, "lookup": {"max_n": 2, "min_n": 1, "drafts": 10, "then": None}}, seal=True)
    render_results(results_copy, tmp_path / "lookup", CARD_INFO, PROVENANCE, vllm_rows=[*rows, "ngram"])
    table = (tmp_path / "lookup" / "model_card_appendix.md").read_text().split("## Cross-check")[1].split("\n## ")[0]
    assert "| n-gram lookup, no training (vLLM's ngram) | 2.400 | 2.900 |" in table
    assert "served by vLLM's own `ngram` method" in " ".join(table.split())
    # without the option the section is absent, even with the files on disk
    render_results(results_copy, tmp_path / "without", CARD_INFO, PROVENANCE)
    assert "Cross-check" not in (tmp_path / "without" / "model_card_appendix.md").read_text()
    (d / "dflash-noshift.json").unlink()
    with pytest.raises(FileNotFoundError, match="dflash-noshift.json"):
        load_results(results_copy, vllm_rows=list(rows))


def test_near_tie_divergences_are_named_in_the_speed_table(results_copy, tmp_path):
    p = results_copy / "benchmark" / "humaneval" / "domino.json"
    b = json.loads(p.read_text())
    b["summary"].update(matches_baseline=False, tie_tolerance=0.25,
                        near_tie_divergences=[{"task_id": "HumanEval/7", "position": 40, "tokens": [1, 2], "gap": 0.1}])
    write_json(p, b, seal=True)
    render_results(results_copy, tmp_path, CARD_INFO, PROVENANCE)
    text = (tmp_path / "model_card.md").read_text()
    assert re.search(r"\| Domino \| [^|]+ \| [\d.]+× \[[^|]+\] \| all but 1 near-ties \(logit gap ≤ 0\.25\) \|",
                     text.replace("**", ""))  # bold: the fastest row


def test_every_printed_interval_contains_its_point(rendered, tmp_path):
    texts = [rendered[2]]
    ablation = render_results(FIXTURE, tmp_path, CARD_INFO, PROVENANCE, checkpoints=[*CKPTS, *VARIANTS],
                                changes=VARIANTS, temperatures=[0, 0.6])
    texts.append(ablation[0].read_text() + ablation[1].read_text())  # the card and its appendix
    for text in texts:
        found = printed_intervals(text)
        assert len(found) > 60, len(found)  # not vacuous: every AL, TPS, speedup and position has one
        bad = [(v, lo, hi) for v, lo, hi in found if not lo <= v <= hi]
        assert bad == []


def test_domino_vs_each_dflash_row(rendered):
    text = rendered[2]
    files = {c: fixture(f"benchmark/humaneval/{c}.json") for c in CKPTS}
    rows = {r[0]: r for r in table(text, "| Comparison | Accept len difference | Speedup difference |")}
    assert list(rows) == ["Domino vs DFlash shift", "Domino vs DFlash noshift"]
    for c in ("dflash-shift", "dflash-noshift"):
        cmp = compare_checkpoints(files["domino"], files[c], seed=0)
        row = rows[f"Domino vs {LABELS[c]}"]
        check_ci(row[1], cmp.acceptance_length.estimate, (cmp.acceptance_length.low, cmp.acceptance_length.high), 1,
                 "%", scale=100)
        check_ci(row[2], cmp.speedup.estimate, (cmp.speedup.low, cmp.speedup.high), 1, "%", scale=100)
        verdict = "its interval excludes zero" if cmp.acceptance_length.excludes_zero() else "its interval includes zero"
        assert (f"- Domino's acceptance length differs from {LABELS[c]}'s by "
                f"{100 * cmp.acceptance_length.estimate:+.1f}% ({verdict}") in text
    # on the fixtures Domino's gain over both rows excludes zero, and DFlash shift vs noshift does not
    assert "includes zero" not in text.split("| Comparison |")[1].split("### Speedup")[0]
    shift_vs_noshift = compare_checkpoints(files["dflash-shift"], files["dflash-noshift"], seed=0).acceptance_length
    assert shift_vs_noshift.low < 0 < shift_vs_noshift.high


def positions_apart(bench: dict, teacher_forced: list[float]) -> list[int]:
    """Drafted positions whose served conditional acceptance has a 95% interval (prompts resampled
    with the file's bootstrap settings) that leaves out the teacher-forced accuracy."""
    boot, s = bench["summary"]["bootstrap"], bench["summary"]
    accepted = [p["accepted_per_step"] for p in bench["prompts"]]
    out = []
    for i in range(len(s["conditional_acceptance"])):
        if i > 0 and s["per_position_acceptance"][i - 1] == 0:
            continue  # undefined rate
        reached = [sum(c >= i for c in p) for p in accepted]  # steps that drafted position i
        passed = [sum(c >= i + 1 for c in p) for p in accepted]
        if sum(passed) == 0:  # nothing accepted: up to the exact bound over the prompts that reached it
            low, high = 0.0, stats.zero_upper_bound(sum(n > 0 for n in reached), boot["level"])
        else:
            iv = stats.ratio_of_sums(passed, reached, boot["resamples"], boot["seed"], boot["level"])
            low, high = iv.low, iv.high
        if not low <= teacher_forced[i] <= high:
            out.append(i)
    return out


def test_teacher_forced_vs_served(rendered):
    text = rendered[2]
    header = ("| Position | Target | " + " | ".join(f"{LABELS[c]} teacher-forced marginal | {LABELS[c]} teacher-forced "
                                                   f"conditional | {LABELS[c]} served" for c in CKPTS) + " |")
    rows = table(text, header)
    assert [r[1] for r in rows] == [f"a+{i + 1}" for i in range(8)]
    for j, c in enumerate(CKPTS):
        v, s = fixture(f"validate/{c}.json"), fixture(f"benchmark/humaneval/{c}.json")["summary"]
        marginal = {slot["target"]: slot["final_acc"] for slot in v["per_slot"]}
        conditional = {slot["target"]: slot["final_conditional_acc"] for slot in v["per_slot"]}
        for i, row in enumerate(rows):
            m_cell, tf_cell, served_cell = row[2 + 3 * j], row[3 + 3 * j], row[4 + 3 * j]
            if i >= s["drafts_per_step"]:
                assert (m_cell, tf_cell, served_cell) == ("—", "—", "—")  # DFlash noshift drafts 7 tokens
                continue
            check_num(m_cell, 100 * marginal[f"a+{i + 1}"], 1, "%")
            check_num(tf_cell, 100 * conditional[f"a+{i + 1}"], 1, "%")
            if i > 0 and s["per_position_acceptance"][i - 1] == 0:
                assert served_cell == "0 of 0 steps"  # no step reached the position
            elif s["conditional_acceptance"][i] == 0:
                assert re.fullmatch(r"0 of [\d,]+ steps \(95% upper bound over \d+ prompts: [\d.]+%\)",
                                    served_cell), served_cell
            else:
                check_num(served_cell.split(" [")[0], 100 * s["conditional_acceptance"][i], 1, "%")
    # the acceptance length teacher forcing counts per anchor (validate's), not a product of the
    # marginal accuracies, which treats the slots as independent
    v, s = fixture("validate/domino.json"), fixture("benchmark/humaneval/domino.json")["summary"]
    acc = [slot["final_conditional_acc"] for slot in v["per_slot"]]
    counted = v["acceptance_length"]["final"]
    assert counted == pytest.approx(implied_acceptance_length(acc), abs=1e-4)
    assert counted != pytest.approx(implied_acceptance_length([slot["final_acc"] for slot in v["per_slot"]]), abs=1e-3)
    al = {r[0]: r for r in table(text, "| Model | Accept len teacher-forced (counted) | Accept len served "
                                       "| Served − teacher-forced |")}
    check_num(al["Domino"][1], counted, 3)
    assert al["Domino"][3] == f"{s['acceptance_length'] - counted:+.3f} ({100 * (s['acceptance_length'] / counted - 1):+.1f}%)"
    assert "implied" not in text.split("## Teacher-forced vs served")[1].split("## ")[0]
    # the sentence: the first position whose served interval leaves out the teacher-forced conditional accuracy,
    # and of those positions the one with the widest gap, from intervals bootstrapped here from the per-prompt records
    apart = positions_apart(fixture("benchmark/humaneval/domino.json"), acc)
    first, widest = apart[0], max(apart, key=lambda i: abs(s["conditional_acceptance"][i] - acc[i]))
    c0, cw = s["conditional_acceptance"][first], s["conditional_acceptance"][widest]
    sentence = next(line for line in text.splitlines() if line.startswith("- Domino: "))
    assert f"first part at position {first} (served {100 * c0:.1f}% [" in sentence
    assert f"over prompts against {100 * acc[first]:.1f}%)" in sentence
    assert f"widest at position {widest}, {100 * (cw - acc[widest]):+.1f} pp" in sentence
    assert f"teacher forcing counts an acceptance length of {counted:.3f} against {s['acceptance_length']:.3f} served" \
        in sentence
    assert f"]({plots.PLOTS['teacher_forced']})" in text


VARIANTS = {"domino-cf0": "drafter.correct_from 0",
            "dflash-noshift-muon": "projector dflash, shift_label false, weighting classic, train.optimizer muon"}


@pytest.fixture(scope="module")
def ablation_card(tmp_path_factory):
    out = tmp_path_factory.mktemp("ablation")
    render_results(FIXTURE, out, CARD_INFO, PROVENANCE, checkpoints=[*CKPTS, *VARIANTS],
                     changes={**VARIANTS, "dflash-shift": "x", "dflash-noshift": "y"}, temperatures=[0, 0.6])
    return (out / "model_card.md").read_text() + "\n" + (out / "model_card_appendix.md").read_text()


ABLATION_HEADER = ("| Variant | What it changes vs Domino | Accept len | Accept len vs Domino | pos_0 | Speedup "
                   "| a+1 validation accuracy |")
SAMPLING_HEADER = "| Temperature | Model | Accept len | pos_0 | pos_1 | pos_2 | pos_3 | pos_4+ | Speedup |"


def test_ablation_table(ablation_card, rendered):
    rows = {r[0]: r for r in table(ablation_card, ABLATION_HEADER)}
    assert list(rows) == ["DFlash shift", "DFlash noshift", "Domino", *VARIANTS]
    assert rows["Domino"][1:4:2] == ["(reference)", "—"] and rows["DFlash shift"][1] == "x"
    dom = fixture("benchmark/humaneval/domino.json")
    for name, changes in VARIANTS.items():
        row, b, v = rows[name], fixture(f"benchmark/humaneval/{name}.json"), fixture(f"validate/{name}.json")
        s = b["summary"]
        assert row[1] == changes
        check_ci(row[2], s["acceptance_length"], s["acceptance_length_ci"], 3)
        iv = compare_checkpoints(b, dom, seed=0).acceptance_length
        check_ci(row[3], iv.estimate, (iv.low, iv.high), 1, "%", scale=100)
        check_ci(row[4], s["per_position_acceptance"][0], s["per_position_acceptance_ci"][0], 3)
        check_ci(row[5], s["speedup"], s["speedup_ci"], 2, "×")
        check_num(row[6], 100 * next(x["final_acc"] for x in v["per_slot"] if x["target"] == "a+1"), 1, "%")
    # the seed tables keep the card's three rows; the training table lists every variant
    assert [r[0] for r in table(ablation_card, SEED_HEADERS[2])] == [LABELS[c] for c in CKPTS]
    training = table(ablation_card, "| Checkpoint | Steps | Epochs | Training time (s) | Own settings |")
    assert [r[0] for r in training] == [*(LABELS[c] for c in CKPTS), *VARIANTS]
    assert [r[4] for r in training] == [CARD_INFO["overrides"][c] for c in [*CKPTS, *VARIANTS]]
    text = rendered[2]  # only the card's three rows: no Ablations table, no sampling table
    assert "### Ablations" not in text and "### Speculative sampling" not in text


def test_a_missing_card_row_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"the card needs its rows' checkpoint\(s\) dflash-noshift; "
                                         r"got dflash-shift, domino, domino-cf0"):
        render_results(FIXTURE, tmp_path, CARD_INFO, PROVENANCE, checkpoints=["dflash-shift", "domino", "domino-cf0"],
                         changes=VARIANTS)
    assert not (tmp_path / "model_card.md").exists()


def test_an_undescribed_variant_is_refused(tmp_path):
    with pytest.raises(ValueError, match="needs what domino-cf0 change"):
        render_results(FIXTURE, tmp_path, CARD_INFO, PROVENANCE, checkpoints=[*CKPTS, "domino-cf0"])


def test_sampling_table(ablation_card):
    rows = table(ablation_card, SAMPLING_HEADER)
    names = [*CKPTS, *VARIANTS]
    assert [(r[0], r[1]) for r in rows] == [(t, LABELS.get(c, c)) for t in ("0", "0.6") for c in names]
    for row in rows:
        c = names[[LABELS.get(n, n) for n in names].index(row[1])]
        f = fixture(f"benchmark/humaneval/{c}.json" if row[0] == "0" else f"sampling/T{row[0]}/humaneval/{c}.json")
        s = f["summary"]
        check_ci(row[2], s["acceptance_length"], s["acceptance_length_ci"], 3)
        for i in range(4):
            check_ci(row[3 + i], s["per_position_acceptance"][i], s["per_position_acceptance_ci"][i], 3)
        check_num(row[7].split(" [")[0], sum(s["per_position_acceptance"][4:]), 3)
        check_ci(row[8], s["speedup"], s["speedup_ci"], 2, "×")
    assert 'At T = 0.6 the protocol reads "sampling (temperature 0.6, top_p 1)".' in ablation_card


def test_new_timing_columns_are_masked_by_compare(ablation_card):
    """python -m domino.tools.compare blanks timing columns by header words; the new ones must be among them."""
    masked = {h: bool(compare.TIMING_COLUMNS.search(h)) for h in (
        "TPS", "Speedup difference", "Speedup", "vs DFlash noshift", "Accept len difference",
        "Accept len vs Domino", "Accept len", "Temperature", "a+1 validation accuracy")}
    assert masked == {"TPS": True, "Speedup difference": True, "Speedup": True,
                      "vs DFlash noshift": True, "Accept len difference": False, "Accept len vs Domino": False,
                      "Accept len": False, "Temperature": False, "a+1 validation accuracy": False}
    # every cell that holds a timing figure ("×" or a TPS) sits in a masked column
    for line in compare.card_tables(ablation_card):
        assert not any(c.endswith("]") and "×" in c for c in line), line


def test_zero_rates_print_as_counts_with_an_upper_bound():
    from domino.card.filters import ci
    from domino.card.tables import Estimate, zero_estimate
    zero = zero_estimate(1234, 40, 0.95)
    assert ci(zero) == f"0 of 1,234 steps (95% upper bound over 40 prompts: {1 - 0.025 ** (1 / 40):.3f})"
    assert ci(zero_estimate(0, 0, 0.95)) == "0 of 0 steps"  # a position no step reached
    assert ci(Estimate(0.5, 0.4, 0.6)) == "0.500 [0.400, 0.600]"


def test_an_acceptance_length_with_nothing_accepted_prints_an_upper_bound():
    """A run (or a category of tasks) that accepted no draft has acceptance length 1; its recorded
    bootstrap interval is the point [1, 1], which would say the figure is known exactly. The card
    prints the count and the exact bound over the prompts: a step accepts at most D drafts, so
    AL <= 1 + D * b, b the share of steps accepting a draft (0 of N over P prompts)."""
    from domino.card.filters import ci
    from domino.card.tables import category_rows, estimate, unaccepted_length
    from domino.stats import zero_upper_bound

    bound = 1 + 8 * zero_upper_bound(10)
    assert ci(unaccepted_length(7888, 10, 8, 0.95)) == \
        f"1.000, no draft accepted in 7,888 steps (95% upper bound over 10 prompts: {bound:.3f})"
    summary = {"acceptance_length": 1.0, "acceptance_length_ci": [1.0, 1.0], "accepted": 0, "steps": 7888,
               "drafts_per_step": 8, "prompts": 10, "bootstrap": {"level": 0.95}}
    est = estimate(summary, "acceptance_length")
    assert (est.low, est.high) == (1.0, pytest.approx(bound)) and "[1.000, 1.000]" not in ci(est)
    assert estimate({**summary, "accepted": 5}, "acceptance_length")[:3] == (1.0, 1.0, 1.0)  # the recorded interval
    # a category in which one run accepted nothing (MT-Bench humanities): its tasks' bound, not [1.000, 1.000]
    base = fixture("benchmark/humaneval/domino.json")
    benches = {}
    for run in ("domino", "dflash-noshift"):
        b = fixture(f"benchmark/humaneval/{run}.json")
        for i, p in enumerate(b["prompts"]):
            p["category"] = "humanities" if i < 4 else "coding"
            if run == "dflash-noshift" and i < 4:
                p["accepted_per_step"] = [0] * len(p["accepted_per_step"])
        benches[run] = b
    rows = {r.category: r for r in category_rows(benches, "domino", "dflash-noshift")}
    zero = rows["humanities"].acceptance_length["dflash-noshift"]
    steps = sum(len(p["accepted_per_step"]) for p in benches["dflash-noshift"]["prompts"][:4])
    assert (zero.value, zero.successes, zero.trials, zero.prompts) == (1.0, 0, steps, 4)
    assert ci(zero).startswith(f"1.000, no draft accepted in {steps:,} steps (95% upper bound over 4 prompts: ")
    assert rows["coding"].acceptance_length["dflash-noshift"].successes is None
    assert base["summary"]["accepted"] > 0


def test_an_exact_tie_reads_no_difference(results_copy, tmp_path):
    """Two runs that decode alike tie exactly, +0.0% [+0.0%, +0.0%]: the appendix says "no
    difference", not that the interval includes zero (nor, in a verdict, "opposite direction")."""
    src = json.loads((results_copy / "benchmark" / "humaneval" / "domino.json").read_text())
    write_json(results_copy / "benchmark" / "humaneval" / "dflash-shift.json",
               {**src, "row": "dflash-shift", "checkpoint": "results/train/dflash-shift/checkpoint"}, seal=True)
    render_results(results_copy, tmp_path, CARD_INFO, PROVENANCE)
    text = (tmp_path / "model_card_appendix.md").read_text()
    line = next(line for line in text.splitlines() if line.startswith("- Domino's acceptance length differs from "
                                                                        "DFlash shift's"))
    assert line == ("- Domino's acceptance length differs from DFlash shift's by +0.0% (no difference: its interval "
                    "is exactly zero); its speedup by +0.0% (no difference: its interval is exactly zero).")
    assert claims.verdict(0.277, iv(0.0, 0.0, 0.0)) == claims.NO_DIFFERENCE == "no difference"
    assert claims.verdict(1.0, iv(0.0, 0.0, 0.0)) == claims.NO_DIFFERENCE  # a ratio claim (9.70x) printed 1.00x


def test_a_drafter_without_a_fifth_draft_position_has_no_tail_figure():
    """pos_4+ of a drafter with four draft positions is not a zero rate: it is absent."""
    from domino.card.tables import tail_estimate

    bench = {"summary": {"per_position_acceptance": [0.5, 0.2, 0.1, 0.05]}, "prompts": []}
    assert tail_estimate(bench, 4) is None


# ---------------------------------------------------------------- the published claims


def iv(value, low, high):
    from domino.card.tables import Estimate
    return Estimate(value, low, high)


@pytest.mark.parametrize("published, measured, expected", [
    (0.277, iv(0.298, 0.248, 0.356), claims.REPRODUCED),          # the published value inside, zero outside
    (0.277, iv(0.60, 0.50, 0.70), claims.OTHER_SIZE),             # clearly positive, clearly larger
    (0.277, iv(0.05, 0.02, 0.08), claims.OTHER_SIZE),             # clearly positive, clearly smaller
    (0.178, iv(0.034, -0.026, 0.100), claims.SAME_NOT_SEPARATED),  # the run's TPS figure: reaches zero
    (0.178, iv(-0.05, -0.30, 0.20), claims.OPPOSITE_NOT_SEPARATED),
    (0.178, iv(0.0, -0.1, 0.1), claims.OPPOSITE_NOT_SEPARATED),   # an estimate of exactly zero has no side
    (0.178, iv(0.0, 0.0, 0.0), claims.NO_DIFFERENCE),             # an exact tie: +0.0% [+0.0%, +0.0%]
    (8.7, iv(0.0, 0.0, 0.0), claims.NO_DIFFERENCE),               # 1.00x [1.00x, 1.00x] against 9.70x
    (0.277, iv(-0.20, -0.30, -0.10), claims.CONTRADICTED),
    (-0.10, iv(-0.12, -0.20, -0.05), claims.REPRODUCED),          # a published decrease
    (-0.10, iv(0.12, 0.05, 0.20), claims.CONTRADICTED),
    (8.7, None, claims.NO_FIGURE),
    (0.277, iv(0.277, 0.277, 0.40), claims.REPRODUCED),           # bounds are inclusive
    (0.277, iv(0.1, 0.0, 0.2), claims.SAME_NOT_SEPARATED),        # an interval touching zero reaches it
])
def test_verdict_hand_cases(published, measured, expected):
    assert claims.verdict(published, measured) == expected


def test_verdict_refuses_a_claim_without_direction():
    with pytest.raises(ValueError, match="no direction"):
        claims.verdict(0.0, iv(0.1, 0.0, 0.2))


CLAIMS_HEADER = "| Claim | Published | This run (95% interval) | Verdict |"
SHOWN = re.compile(r"([+-]?[\d.]+)(%|×) \[([+-]?[\d.]+)(?:%|×), ([+-]?[\d.]+)(?:%|×)\]")


def check_claims(card: str, repro: str, benches: dict, scope: str = claims.OTHER_VERIFIER) -> list[str]:
    """The claims table: one row per published claim, this run's paired figure as computed here from
    the benchmark files (``benches``, by run name, "baseline" among them), and a verdict that follows
    from the printed interval; the card's opening repeats each verdict for a reproduction, and only
    this run's figures for another verifier; a run whose verdicts are withheld (``claims.withheld``)
    reads why in every row and has no opening figures at all. Returns the verdicts."""
    held = claims.withheld(scope, benches, LABELS)
    rows = table(repro, CLAIMS_HEADER)
    assert len(rows) == len(published.CLAIMS)
    verdicts = []
    for row, claim in zip(rows, published.CLAIMS):
        assert row[1] == claim["stated"]
        expected = claims.measure(claim["figure"], benches[claim["a"]], benches[claim["b"]])
        if held:
            assert row[3] == held.verdict
        if row[2] == "no figure":
            assert expected is None and row[3] == (held.verdict if held else claims.NO_FIGURE)
        else:
            m = SHOWN.fullmatch(row[2])
            assert m, row[2]
            scale_, shift = (100.0, 0.0) if m[2] == "%" else (1.0, 1.0)  # a ratio prints as 1 + difference
            printed = iv(*(float(m[i]) / scale_ - shift for i in (1, 3, 4)))
            rounding = 0.0005 if m[2] == "%" else 0.005  # half the last printed digit
            for got, want in zip(printed, expected):
                assert got == pytest.approx(want, abs=rounding + 1e-9)
            if not held:
                assert row[3] == claims.verdict(claim["published"], expected)
                # the printed figure gives the same verdict, unless a bound sits within rounding of 0 or p,
                # or the estimate within rounding of 0 (its sign then lost in the printing)
                assert row[3] == claims.verdict(claim["published"], printed) or abs(printed.value) <= rounding or any(
                    abs(x - y) <= rounding for x in (printed.low, printed.high) for y in (0.0, claim["published"]))
        assert row[3] in claims.VERDICTS
        verdicts.append(row[3])
    if held:
        assert "> **No headline and no verdict:**" in card and "> **Published claims**" not in card
    elif scope == claims.REPRODUCTION:
        line = next(line for line in card.splitlines() if line.startswith("> **Published claims**"))
        assert [v for v in re.findall(r"\*\*([^*]+)\*\*;", line)] == verdicts
        assert "this run differs in scale (" in line and "in backend (" in line and "in hardware (" in line
    else:  # this run's figures, as the claims table prints them, and no verdict
        start = card.index("> **Domino vs DFlash noshift on this verifier**")
        opening = card[start:card.index("\n\n", start)]
        for c, row in zip(published.CLAIMS, rows):
            assert f" {c['quantity']} {row[2]}" in opening.replace("\n", " ")
        assert not any(v in opening for v in claims.VERDICTS if v != claims.NO_FIGURE)  # "no figure" is a figure's
        assert all(c["stated"].split()[0].rstrip("×%") in opening for c in published.CLAIMS)  # the published figures
    return verdicts


def scale_of(kind: str) -> scale.ScaleStatement:
    """The fixtures' scale statement with a verifier of ``kind``: "hub" is the card's own."""
    from dataclasses import replace

    s = embedded_scale()
    checks = tuple(replace(c, matches=kind == "hub") if c.name == "verifier" else c for c in s.checks)
    return replace(s, verifier_kind=kind, checks=checks)


@pytest.mark.parametrize("kind, scope", [("hub", claims.REPRODUCTION), ("embedded", claims.OTHER_VERIFIER),
                                         ("gguf", claims.OTHER_VERIFIER), ("local", claims.OTHER_VERIFIER),
                                         ("random", claims.RANDOM_VERIFIER)])
def test_the_claims_section_follows_what_the_run_is(tmp_path, kind, scope):
    """The card opens with the published card's verdicts only when its verifier is the card's; another
    trained verifier gets this run's figures first, a random one no verdict anywhere."""
    assert claims.claims_scope(scale_of(kind)) == scope
    render_results(FIXTURE, tmp_path, CARD_INFO | {"scale": scale_of(kind)}, PROVENANCE)
    card, repro = (tmp_path / "model_card.md").read_text(), (tmp_path / "reproduction.md").read_text()
    benches = {c: fixture(f"benchmark/humaneval/{c}.json") for c in ["baseline", *CKPTS]}
    if scope == claims.RANDOM_VERIFIER:
        assert "> **No headline and no verdict:** the verifier has random weights" in card
        assert [r[3] for r in table(repro, CLAIMS_HEADER)] == [claims.NOT_TESTED] * len(published.CLAIMS)
        assert not any(v in card + repro for v in claims.VERDICTS if v != claims.NOT_TESTED)
    else:
        check_claims(card, repro, benches, scope)
    assert ("> **Published claims**," in card) == (scope == claims.REPRODUCTION)


@pytest.mark.parametrize("kind", ["hub", "embedded"])
def test_a_verifier_that_repeats_itself_gets_no_headline_and_no_verdict(results_copy, tmp_path, kind):
    """A run whose plain outputs repeat (most of their 4-grams repeat an earlier one: a verifier
    writing one token forever) opens with one sentence saying why it has no headline, and the main
    card gives no verdict; below the limit the opening is the usual one."""
    p = results_copy / "benchmark" / "humaneval" / "baseline.json"
    b = json.loads(p.read_text())
    b["summary"]["repeated_4gram_share"] = 0.97
    write_json(p, b, seal=True)
    render_results(results_copy, tmp_path, CARD_INFO | {"scale": scale_of(kind)}, PROVENANCE)
    card = (tmp_path / "model_card.md").read_text()
    why = [line for line in card.splitlines() if line.startswith("> **No headline and no verdict:**")]
    assert why == ["> **No headline and no verdict:** the verifier's own greedy outputs repeat themselves (97.0% of "
                   "their 4-grams repeat an earlier one, above the card's limit of 50.0%), and a verifier that loops is "
                   "easy to draft for, so no acceptance or speed measured here says how the drafter does on text."]
    assert "> **Published claims**" not in card and "on this verifier**" not in card
    assert not any(f"**{v}**" in card for v in claims.VERDICTS)
    assert claims.repeating_share(b["summary"]) == 0.97
    assert claims.repeating_share({**b["summary"], "repeated_4gram_share": 0.4}) is None
    assert claims.repeating_share({}) is None  # a results file without the check


def accepting_nothing(results_dir, runs):
    """The fixtures' ``runs`` as if the verifier had accepted none of their drafts."""
    for run in runs:
        p = results_dir / "benchmark" / "humaneval" / f"{run}.json"
        b = json.loads(p.read_text())
        for prompt in b["prompts"]:
            prompt["accepted_per_step"] = [0] * len(prompt["accepted_per_step"])
        n = len(b["summary"]["per_position_acceptance"])
        b["summary"].update(acceptance_length=1.0, acceptance_length_ci=[1.0, 1.0], accepted=0,
                            acceptance_length_per_prompt_mean=1.0, acceptance_length_per_prompt_mean_ci=[1.0, 1.0],
                            per_position_acceptance=[0.0] * n, per_position_acceptance_ci=[[0.0, 0.0]] * n,
                            conditional_acceptance=[0.0] * n)
        write_json(p, b, seal=True)


# a verifier: its kind, what it does to the fixtures' runs, and the verdict every claim then reads (None: its own)
VERIFIERS = {"trained": ("hub", None, None), "looping": ("hub", "loops", claims.LOOPING),
             "random": ("random", None, claims.NOT_TESTED),
             "random, in a local folder": ("local", "accepts nothing", claims.NOTHING_ACCEPTED)}
READINGS = ("its interval excludes zero", "its interval includes zero", "no difference: its interval is exactly zero")


@pytest.mark.parametrize("verifier", list(VERIFIERS))
def test_every_report_gives_or_withholds_its_verdicts_together(results_copy, tmp_path, verifier):
    """A verifier that loops (88.9% of its 4-grams repeated, as GPT-2's), a random one, a random one
    the run does not know for random (it accepts nothing) and a trained one: the card, its appendix
    and the reproduction report read one rule, so they withhold their verdicts together, each saying
    the same why, or all give them."""
    kind, does, expected = VERIFIERS[verifier]
    if does == "loops":
        p = results_copy / "benchmark" / "humaneval" / "baseline.json"
        b = json.loads(p.read_text())
        b["summary"]["repeated_4gram_share"] = 0.889
        write_json(p, b, seal=True)
    elif does == "accepts nothing":
        accepting_nothing(results_copy, CKPTS)
    render_results(results_copy, tmp_path, CARD_INFO | {"scale": scale_of(kind)}, PROVENANCE)
    card, appendix, repro = [(tmp_path / f).read_text() for f in ("model_card.md", "model_card_appendix.md",
                                                                   "reproduction.md")]
    held = claims.withheld(claims.claims_scope(scale_of(kind)), load_results(results_copy)["benchmark"], LABELS)
    facts = {"loops": {"share": 0.889}, "accepts nothing": {"rows": ("Domino", "DFlash noshift")}}.get(does, {})
    assert held == (None if expected is None else claims.Withheld(expected, **facts))
    verdicts = [r[3] for r in table(repro, CLAIMS_HEADER)]
    if expected is None:
        opening = next(line for line in card.splitlines() if line.startswith("> **Published claims**"))
        assert re.findall(r"\*\*([^*]+)\*\*;", opening) == verdicts and not set(verdicts) & set(claims.WITHHELD)
        assert any(r in appendix for r in READINGS) and "No verdict" not in appendix + repro
        assert "No headline" not in card
    else:
        assert verdicts == [expected] * len(published.CLAIMS)
        line = next(line for line in card.splitlines() if line.startswith("> **No headline and no verdict:** "))
        why = line.removeprefix("> **No headline and no verdict:** ").removesuffix(".")
        for text in (repro, appendix):
            assert f": {why}." in " ".join(text.split())
        assert not any(r in appendix for r in READINGS) and not any(f"**{v}**" in card for v in claims.VERDICTS)


def test_claims_table_on_the_fixtures(rendered):
    out, _, _, repro = rendered
    benches = {c: fixture(f"benchmark/humaneval/{c}.json") for c in ["baseline", *CKPTS]}
    verdicts = check_claims((out / "model_card.md").read_text(), repro, benches)
    assert verdicts[0] == claims.verdict(0.277, claims.measure("acceptance_length", benches["domino"],
                                                                 benches["dflash-noshift"]))
    assert repro.index("## Published claims") < repro.index("### Aggregate")  # at the top
    assert "**not comparable**" in repro


def test_claims_on_the_micro_run(micro_run):
    """Each verdict of the finished micro run follows from its interval."""
    reports = micro_run / "reports"
    benches = {c: json.loads((micro_run / "results" / "benchmark" / "humaneval" / f"{c}.json").read_text())
               for c in ["baseline", *CKPTS]}
    verdicts = check_claims((reports / "model_card.md").read_text(), (reports / "reproduction.md").read_text(),
                            benches)
    assert len(verdicts) == 3


MAIN_CARD_LINES = 185  # front matter included: a card that fits on a Hub page without scrolling forever


def test_main_card_is_pasteable(rendered):
    out = rendered[0]
    card = (out / "model_card.md").read_text()
    lines = card.splitlines()
    assert len(lines) <= MAIN_CARD_LINES, len(lines)
    widest = max(len(h.strip("|").split("|")) for h, _ in tables(card))
    assert widest == 9, widest  # the seed's conditional table (a column per slot); wider ones live in the appendix
    assert len(re.findall(r"!\[", card)) == 2  # two plots
    for section in ("## Model Description", "### Aggregate", "### Speedup over plain greedy decoding",
                    "### Per-position unconditional acceptance", "### Domino conditional per-position",
                    "## Training", "## Provenance"):
        assert section in lines, section
    assert "](model_card_appendix.md)" in card
    # a drafter below 1x (the fixture's DFlash shift) gets the one sentence why, linking the time table
    assert any(fixture(f"benchmark/humaneval/{c}.json")["summary"]["speedup"] < 1 for c in CKPTS)
    assert re.search(r"A speedup below 1: .*\]\(model_card_appendix\.md#where-the-time-goes\)", card)
    appendix = (out / "model_card_appendix.md").read_text()
    for section in ("## Scale of this run", "## Where the time goes", "## Teacher-forced vs served",
                    "## Domino conditional per-position", "| Package | Version |"):
        assert section in appendix, section
    assert "## Provenance" in appendix and "](model_card.md)" in appendix


def test_html_pages_embed_their_plots(rendered):
    out = rendered[0]
    page = (out / "model_card.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "<table>" in page and "data:image/png;base64," in page
    assert 'href="model_card_appendix.html#scale-of-this-run"' in page and ".png\"" not in page
    assert "<summary>Front matter" in page and "\n---\n" not in page.split("</details>")[1]
    appendix = (out / "model_card_appendix.html").read_text()
    assert '<h2 id="scale-of-this-run">' in appendix
    repro = (out / "reproduction.html").read_text()
    assert '<h2 id="published-claims">' in repro and "<th>Verdict</th>" in repro


# ---------------------------------------------------------------- the rows without training of their own

LOOKUP_RUNS = ["ngram", "suffix", "ngram-domino", "domino-adaptive", "hybrid"]  # every kind of domino.decoders


@pytest.fixture(scope="module")
def lookup_reports(tmp_path_factory):
    """The fixtures' card, appendix and reproduction report with every row of ``LOOKUP_RUNS``."""
    out = tmp_path_factory.mktemp("lookups")
    render_results(FIXTURE, out, CARD_INFO, PROVENANCE, lookups=LOOKUP_RUNS)
    return [(out / f).read_text() for f in ("model_card.md", "model_card_appendix.md", "reproduction.md")]


def raw_rows(text: str, header: str) -> list[str]:
    """The lines of the table under ``header``, as written (bold markers kept)."""
    lines = text.splitlines()
    start = lines.index(header) + 2
    return lines[start:lines.index("", start)]


def test_the_fastest_row_is_the_one_in_bold(lookup_reports):
    """In every table of the card that sets a row in bold, that row is the fastest, whichever it is
    (the fixtures' hybrid row, not Domino); the reproduction report names it."""
    card, _, repro = lookup_reports
    files = {r: fixture(f"benchmark/humaneval/{r}.json") for r in [*CKPTS, *LOOKUP_RUNS]}
    labels = {r: LABELS.get(r) or render.lookup_label(b) for r, b in files.items()}
    top = max(files, key=lambda r: files[r]["summary"]["speedup"])
    assert top == "hybrid"
    for header in (SEED_HEADERS[2], SEED_HEADERS[3], SPEED_HEADER):
        rows = raw_rows(card, header)
        assert [r.split("|")[1].strip() for r in rows if r.startswith("| **")] == [f"**{labels[top]}**"], header
    assert f"The fastest row of all, {labels[top]}, is the one the model card sets in bold." in repro


def test_no_acceptance_is_compared_across_definitions(lookup_reports):
    """A row whose acceptance length counts only the steps that sent a draft (the registry's
    ``every_step``) is compared in speed alone, in the card and its appendix; a row over every step
    (the lookup-then-Domino row) keeps its acceptance comparison."""
    card, appendix, repro = lookup_reports
    agg = {r[0]: r[3] for r in table(card, SEED_HEADERS[2])}
    kinds = set()
    for run in LOOKUP_RUNS:
        b = fixture(f"benchmark/humaneval/{run}.json")
        every = KINDS[b["decoder"]["kind"]].every_step
        kinds.add(every)
        cell = agg[render.lookup_label(b)]
        assert cell.startswith("acceptance not comparable, ") != every, cell
        assert re.fullmatch(r"(acceptance not comparable|\S+ \[\S+, \S+\] accept), \S+ \[\S+, \S+\] speedup", cell)
    assert kinds == {True, False}  # both kinds of row are exercised
    # the bar: Domino against the fastest free row (the suffix cache), in speed alone
    line = next(line for line in card.splitlines() if "Domino against it, paired over the same prompts: " in line)
    assert re.search(r"paired over the same prompts: \S+ \[\S+, \S+\] speedup\.$", line), line
    assert "acceptance length counts only the steps that sent a draft, so it is compared with none" in appendix
    assert "| every step |" in repro and "| the steps that sent a draft: not comparable |" in repro


def test_every_row_a_user_could_pick_is_in_the_reproduction_report(lookup_reports):
    """The reproduction report lists every row without training of its own, with its speedup and
    Domino's against it, and says whether a trained drafter clears the bar of the free rows."""
    _, _, repro = lookup_reports
    header = ("| Row | Needs a trained checkpoint | Speedup over plain greedy | Domino against it, speedup (paired) "
              "| Accept len | Acceptance length counts |")
    rows = {r[0]: r for r in table(repro, header)}
    dom = fixture("benchmark/humaneval/domino.json")
    for run in LOOKUP_RUNS:
        b = fixture(f"benchmark/humaneval/{run}.json")
        row = rows.pop(render.lookup_label(b))
        assert row[1] == ("no" if b["decoder"]["free"] else "yes")
        check_ci(row[2], b["summary"]["speedup"], b["summary"]["speedup_ci"], 2, "×")
        iv = compare_checkpoints(dom, b, seed=0).speedup
        check_ci(row[3], iv.estimate, (iv.low, iv.high), 1, "%", scale=100)
    assert rows == {}
    assert "No trained drafter clears the bar: the fastest row that needs no training, suffix cache, no training" \
        in " ".join(repro.split())
