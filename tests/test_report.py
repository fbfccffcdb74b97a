"""domino.card.report: the report stage end to end on the fixtures, per scale; provenance; stage times."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import load_config_files as load, random_verifier_dir, record_training, recorded_training
from domino import io
from domino.card import published, render, report

FIXTURE = Path(__file__).parent / "fixtures" / "results"
# an absolute path: a slash at the start of a word, not inside a URL or a relative path
ABSOLUTE_PATH = re.compile(r"(?<![\w:/.~-])/[\w.-]+/")


@pytest.fixture
def results(tmp_path):
    dst = tmp_path / "results"
    shutil.copytree(FIXTURE, dst)
    io.write_json(dst / "prepare_data" / "summary.json",
                  {"corpus": "python-stdlib", "samples": 500, "seq_len": 512, "data_sha256": "ab" * 32}, seal=True)
    return dst


def configs(tmp_path):
    return {"embedded": load("config.yaml"), "card": load("config.yaml", "config/card.yaml"),
            "card-offline": load("config.yaml", "config/card.yaml", "config/card-offline.yaml",
                                 source=str(random_verifier_dir(tmp_path)))}


@pytest.mark.parametrize("scale_name, base_model, datasets", [
    ("embedded", None, None),
    ("card", "Qwen/Qwen3-0.6B", ["Aeala/ShareGPT_Vicuna_unfiltered", "openai/openai_humaneval"]),
    ("card-offline", None, None),
])
def test_front_matter_valid_per_scale_and_no_local_path(tmp_path, results, scale_name, base_model, datasets):
    cfg = configs(tmp_path)[scale_name]
    out = tmp_path / "reports"
    report.build_report(cfg, results, out, bench_dir=None, repo=tmp_path)
    text, repro = (out / "model_card.md").read_text(), (out / "reproduction.md").read_text()
    data = render.check_front_matter(text)
    assert data.base_model == base_model and data.datasets == datasets
    for doc in (text, repro):
        assert str(tmp_path) not in doc and sys.executable not in doc and sys.prefix not in doc
        assert not ABSOLUTE_PATH.search(doc), ABSOLUTE_PATH.search(doc)
    if scale_name == "card-offline":
        assert "random weights" in text.split("## Model Description")[0]
        assert "random weights" in repro


def test_git_commit_marks_a_dirty_checkout(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                       check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "f.txt").write_text("a")
    git("add", "f.txt")
    git("commit", "-q", "-m", "c")
    clean = report.git_commit(tmp_path)
    assert re.fullmatch(r"[0-9a-f]{40}", clean)
    (tmp_path / "untracked_output.txt").write_text("results are not changes")
    assert report.git_commit(tmp_path) == clean
    (tmp_path / "f.txt").write_text("b")
    assert report.git_commit(tmp_path) == clean + "+dirty"
    assert report.git_commit(tmp_path / "nowhere") == "unknown"


def test_python_version_names_no_path():
    v = report.python_version()
    assert re.fullmatch(r"\w+ \d+\.\d+\.\d+\S*", v) and "/" not in v


def test_stage_table_lists_the_card_stages_in_dag_order(tmp_path):
    cfg = load("config.yaml")
    bench = tmp_path / "benchmarks"
    files = ["export/domino", "benchmark/humaneval", "train/domino", "prepare_data", "tokenizer", "something/else"]
    for i, name in enumerate(files):
        f = bench / f"{name}.tsv"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(f"s\th:m:s\n{i + 0.5}\t0:00:01\n")
    seconds = report.stage_seconds(bench, report.card_stages(cfg))
    assert list(seconds) == ["tokenizer", "prepare_data", "train/domino", "benchmark/humaneval"]  # no export row
    assert seconds["train/domino"] == 2.5


def test_card_stages_follow_the_config():
    embedded, hub = report.card_stages(load("config.yaml")), report.card_stages(load("config.yaml", "config/card.yaml"))
    assert embedded[:3] == ["tokenizer", "verifier", "prepare_data"] and hub[0] == "prepare_data"
    assert embedded.index("train/domino") < embedded.index("validate/domino") < embedded.index("benchmark/humaneval")
    assert not any(s.startswith("export/") for s in embedded)
    three = load("config.yaml")
    three["train"]["replicates"] = 3
    assert [s for s in report.card_stages(three) if s.startswith("train/domino")] == \
        ["train/domino", "train/domino-seed1", "train/domino-seed2"]


def ablation_config():
    """The default with the fixtures' two ablation variants and a sampling temperature."""
    cfg = load("config.yaml")
    cfg["checkpoints"]["domino-cf0"] = {"projector": "domino", "shift_label": True, "weighting": "shifted",
                                        "drafter": {"correct_from": 0}}
    cfg["checkpoints"]["dflash-noshift-muon"] = {"projector": "dflash", "shift_label": False, "weighting": "classic",
                                                 "train": {"optimizer": "muon"}}
    cfg["benchmark"]["temperatures"] = [0, 0.6]
    return cfg


def trained(cfg: dict) -> dict:
    """Every checkpoint's ``report.trained_config``, as if each had been trained with ``cfg``."""
    recorded = recorded_training(cfg)
    return {n: report.trained_config(cfg, recorded, n) for n in cfg["checkpoints"]}


def test_variant_changes_are_computed_from_what_each_trained_with():
    cfg = ablation_config()
    assert report.variant_changes(trained(cfg), "domino-cf0") == "drafter.correct_from 0"
    assert report.variant_changes(trained(cfg), "dflash-noshift-muon") == (
        "projector dflash, shift_label false, weighting classic, train.optimizer muon")
    assert report.variant_changes(trained(cfg), "dflash-shift") == "projector dflash, weighting classic"
    # a value the reference overrides too is compared after both overrides
    cfg["checkpoints"]["domino"]["train"] = {"optimizer": "muon"}
    assert report.variant_changes(trained(cfg), "dflash-noshift-muon") == \
        "projector dflash, shift_label false, weighting classic"
    cfg["checkpoints"]["domino-same"] = dict(cfg["checkpoints"]["domino"])
    assert report.variant_changes(trained(cfg), "domino-same") == "no change"
    ablations = trained(load("config.yaml", "config/ablations.yaml"))
    assert report.variant_changes(ablations, "domino-uniform-noise") == "train.noise uniform"
    assert report.variant_changes(ablations, "domino-block-causal") == "drafter.block_causal true"
    assert report.variant_changes(ablations, "domino-loss-mask-input") == "train.loss_mask_at input"
    assert report.variant_changes(ablations, "domino-uniform-noise-storage") == (
        "train.noise uniform, train.noise_dtype storage")
    assert report.variant_changes(ablations, "domino-regenerated") == "data.responses verifier"
    cfg = load("config.yaml", "config/ablations.yaml")
    assert report.overrides(cfg, ablations, "domino-regenerated") == "data.responses verifier"
    assert report.overrides(cfg, ablations, "domino-cf0") == "drafter.correct_from 0"


def test_each_row_prints_what_its_training_recorded(tmp_path, results):
    """The card's settings come from each training's summary.json, not from the config: a row
    trained with another lr than the config's says so; a summary without its settings is
    refused, naming the file."""
    cfg = load("config.yaml")
    record_training(results, cfg)
    summary = results / "train" / "domino" / "summary.json"
    recorded = io.read_json(summary)
    io.write_json(summary, {**recorded, "config": {**recorded["config"], "lr": 1.0e-3}}, seal=True)
    report.build_report(cfg, results, tmp_path / "reports", repo=tmp_path)
    card = (tmp_path / "reports" / "model_card.md").read_text()
    sci = render.environment(render.TEMPLATES).filters["sci"]
    assert f"| LR | {sci(cfg['train']['lr'])} (Domino: 1e-3), linear schedule" in card
    del recorded["config"]
    io.write_json(summary, recorded, seal=True)
    with pytest.raises(ValueError, match=r"summary\.json lacks field config$"):
        report.build_report(cfg, results, tmp_path / "again", repo=tmp_path)


def test_training_rows_say_what_was_used():
    default, card_cfg = load("config.yaml"), load("config.yaml", "config/card.yaml")
    assert report.optimizer_text(default["train"]) == "AdamW on every parameter (betas (0.9, 0.999), weight decay 0)"
    assert report.optimizer_text(card_cfg["train"]) == (
        "Muon on the 2-D weight matrices except the embedding and lm_head (lr 10× the scheduled lr, momentum 0.95, "
        "weight decay 0.1, 5 Newton-Schulz steps, adjust_lr_fn match_rms_adamw); AdamW on the rest "
        "(betas (0.9, 0.999), weight decay 0.01)")
    assert report.noise_text(default["train"]) == "none"
    assert report.noise_text(card_cfg["train"]) == "uniform in [−0.05, 0.05]"
    assert report.noise_text({"noise": "gaussian", "noise_scale": 0.1, "noise_dtype": "float32"}) == \
        "Gaussian, standard deviation 0.1"
    # the three conventions: the card profile follows PR 685 on each, the default keeps its own; where PR 685
    # sets each is the appendix's to cite
    assert report.noise_text(card_cfg["train"], "bfloat16") == (
        "uniform in [−0.05, 0.05], added in the features' storage dtype (bfloat16), which rounds the sum, "
        "as speculators PR 685")
    assert report.noise_text(default["train"], "bfloat16") == "none"
    assert report.noise_text({**default["train"], "noise": "uniform"}, "bfloat16") == (
        "uniform in [−0.05, 0.05], added in float32, speculators PR 685: noise_dtype storage")
    assert report.block_text(card_cfg["drafter"]) == "causal: slot k sees slots 0..k of its block, as speculators PR 685"
    assert report.block_text(default["drafter"]) == (
        "bidirectional: every slot sees the whole block, speculators PR 685: block_causal true")
    assert report.loss_mask_text(card_cfg["train"]).endswith("as speculators PR 685")
    assert report.loss_mask_text(default["train"]).startswith("the predicted position: slot k counts when a+k+shift")
    assert "speculators PR 685: loss_mask_at input" in report.loss_mask_text(default["train"])
    assert report.attention_text(card_cfg["drafter"]).endswith("the 2,048 context positions before its anchor")
    assert report.init_text(card_cfg["drafter"]).startswith("Hugging Face: normal(0, 0.02)")
    assert report.init_text(default["drafter"]) == "PyTorch's default initialisation of each layer"


def test_ablations_and_sampling_reach_the_card(tmp_path, results):
    cfg = ablation_config()
    assert "sampling/T0.6/humaneval" in report.card_stages(cfg)
    assert not any(s.startswith("sampling/") for s in report.card_stages(load("config.yaml")))
    report.build_report(cfg, results, tmp_path / "reports", repo=tmp_path)
    card = (tmp_path / "reports" / "model_card.md").read_text()
    text = card + (tmp_path / "reports" / "model_card_appendix.md").read_text()
    assert "| domino-cf0 | drafter.correct_from 0 |" in text
    assert "| dflash-noshift-muon | projector dflash, shift_label false, weighting classic, train.optimizer muon |" in text
    assert "| 0.6 | domino-cf0 |" in text and "| Optimizer | AdamW on every parameter" in text


def test_hub_datasets_used():
    assert report.hub_datasets_used(load("config.yaml")) == []
    assert report.hub_datasets_used(load("config.yaml", "config/card.yaml")) == [
        "Aeala/ShareGPT_Vicuna_unfiltered", "openai/openai_humaneval"]


def test_a_mix_names_each_part_on_the_card(tmp_path, results):
    """data.mix: the Dataset row names each part with the conversations it gave; a Hub part is a
    Hub dataset the run read."""
    cfg = load("config.yaml")
    cfg["data"]["mix"] = [{"corpus": "sharegpt-hub", "samples": 200}]
    io.write_json(results / "prepare_data" / "summary.json",
                  {"corpus": "python-stdlib", "samples": 700, "seq_len": 512, "data_sha256": "ab" * 32,
                   "parts": [{"corpus": "python-stdlib", "samples": 500, "train": 450, "val": 50},
                             {"corpus": "sharegpt-hub", "samples": 200, "train": 180, "val": 20}]}, seal=True)
    report.build_report(cfg, results, tmp_path / "reports", repo=tmp_path)
    card = (tmp_path / "reports" / "model_card.md").read_text()
    assert ("| Dataset | Python standard library functions (signature + docstring -> body): 500 mixed with "
            "ShareGPT (Aeala/ShareGPT_Vicuna_unfiltered): 200, 700 samples |") in card
    assert report.hub_datasets_used(cfg) == ["Aeala/ShareGPT_Vicuna_unfiltered"]


def test_a_per_checkpoint_override_appears_in_its_row(tmp_path, results):
    """checkpoints.domino.train.lr: the card's Training table, the checkpoint's own row, the "differ only
    in" sentence and the scale table say so; the other rows keep the shared value."""
    cfg = load("config.yaml")
    cfg["checkpoints"]["domino"]["train"] = {"lr": 1.0e-3}
    record_training(results, cfg)
    report.build_report(cfg, results, tmp_path / "reports", repo=tmp_path)
    card = (tmp_path / "reports" / "model_card.md").read_text()
    appendix = (tmp_path / "reports" / "model_card_appendix.md").read_text()
    shared = cfg["train"]["lr"]
    assert f"| LR | {render.environment(render.TEMPLATES).filters['sci'](shared)} (Domino: 1e-3), linear schedule" in card
    own = {line.split("|")[1].strip(): line.split("|")[5].strip() for line in card.splitlines()
           if line.startswith("| ") and line.count("|") == 6 and "Steps" not in line}
    assert own["Domino"] == "train.lr 0.001" and own["DFlash shift"] == own["DFlash noshift"] == "none"
    sentence = " ".join(card.split("they differ only in ")[1].split(":\n")[0].split())
    assert sentence == (f"the projector, how block slots map to target tokens and train.lr "
                        f"(DFlash shift, DFlash noshift {shared:g}; Domino 0.001)")
    scale_row = next(line for line in appendix.splitlines() if line.startswith("| learning rate and warmup |"))
    assert f"Domino: lr 0.001, warmup_steps {cfg['train']['warmup_steps']}" in scale_row
    assert f"DFlash shift, DFlash noshift: lr {shared:g}" in scale_row
    # without the override: one value, no names
    record_training(results, load("config.yaml"))
    report.build_report(load("config.yaml"), results, tmp_path / "plain", repo=tmp_path)
    plain = (tmp_path / "plain" / "model_card.md").read_text()
    assert "(Domino:" not in plain and "they differ only in the projector and how block slots map" in plain


def test_the_loss_row_names_the_loss_and_pr_685s_choice():
    ce = report.loss_text({"loss": "ce", "gamma": 7.0})
    kl = report.loss_text({"loss": "kl_div", "gamma": 4.0})
    assert ce == ("Position-weighted cross-entropy against the verifier's greedy token (gamma=7), "
                  "speculators PR 685: loss kl_div")
    assert kl == "Position-weighted KL from the verifier's distribution over the draft vocabulary (gamma=4), " \
        "as speculators PR 685"


def test_the_trainers_sources_are_cited_in_the_appendix_not_the_training_table(tmp_path, results):
    """The card profile's Training table says where each setting stands against PR 685 in a few
    words; the files and lines where PR 685 sets it are cited once, in the appendix."""
    report.build_report(load("config.yaml", "config/card.yaml"), results, tmp_path / "reports", repo=tmp_path)
    card = (tmp_path / "reports" / "model_card.md").read_text()
    appendix = (tmp_path / "reports" / "model_card_appendix.md").read_text()
    training = card.split("## Training")[1].split("\n## ")[0]
    cells = [c for line in training.splitlines() if line.startswith("|") for c in line.split("|")]
    assert "as speculators PR 685" in training and not [c for c in cells if ".py:" in c]
    for key, (choice, source) in published.TRAINER_CONVENTIONS.items():
        assert source not in card and source.split(" (")[0] not in card
        assert appendix.count(f"| `{key}` | {str(choice).lower()} | `{source}` |") == 1, key
    assert f"at commit `{published.TRAINER_COMMIT}`" in appendix


def test_the_report_measures_each_variant_that_takes_the_trainers_conventions(tmp_path, results):
    """A variant that differs from Domino only in PR 685's choices (here the fixtures' second
    Domino run declared as PR 685's training precision) gets a row in the reproduction report, its
    acceptance set against Domino's; a variant that changes anything else (DFlash noshift with
    Muon) does not."""
    cfg = ablation_config()
    cfg["checkpoints"]["domino-cf0"] = {"projector": "domino", "shift_label": True, "weighting": "shifted",
                                        "train": {"weights_dtype": "bfloat16", "rotary_dtype": "weights"}}
    record_training(results, cfg)
    assert report.trainer_variants(trained(cfg)) == {
        "domino-cf0": "train.rotary_dtype weights, train.weights_dtype bfloat16"}
    report.build_report(cfg, results, tmp_path / "reports", repo=tmp_path)
    repro = (tmp_path / "reports" / "reproduction.md").read_text()
    section = repro.split("## The card's trainer's conventions, measured in this run")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| domino") or line.startswith("| dflash")]
    assert len(rows) == 1 and rows[0].startswith("| domino-cf0 | train.rotary_dtype weights, train.weights_dtype bfloat16 |")
    assert re.search(r"\| [\d.]+ \[[\d.]+, [\d.]+\] \| [+-][\d.]+% \[[+-][\d.]+%, [+-][\d.]+%\] \|$", rows[0]), rows[0]
    plain = tmp_path / "plain"
    record_training(results, load("config.yaml"))
    report.build_report(load("config.yaml"), results, plain, repo=tmp_path)
    assert "trainer's conventions, measured" not in (plain / "reproduction.md").read_text()


def test_a_variant_on_other_answers_is_named_with_its_steps(tmp_path, results):
    """A checkpoint that overrides data.responses: its training summary says so, the Ablations
    table names the change, and the card gives its training steps beside Domino's, since other
    answers make other rows to train on. The regenerate and responses-verifier jobs are among the
    card's stages."""
    cfg = load("config.yaml")
    cfg["checkpoints"]["domino-regenerated"] = {"projector": "domino", "shift_label": True, "weighting": "shifted",
                                                "data": {"responses": "verifier"}}
    for rel in ("validate/{}.json", "train/{}", "benchmark/humaneval/{}.json"):
        src, dst = results / rel.format("domino"), results / rel.format("domino-regenerated")
        shutil.copytree(src, dst) if src.is_dir() else shutil.copy(src, dst)
    record_training(results, cfg)
    summary = json.loads((results / "train" / "domino-regenerated" / "summary.json").read_text())
    assert summary["data"] == {"responses": "verifier"}
    io.write_json(results / "train" / "domino-regenerated" / "summary.json", {**summary, "steps": 1234}, seal=True)
    stages = report.card_stages(cfg)
    assert stages[stages.index("prepare_data") + 1:][:2] == ["regenerate/train", "regenerate/val"]
    assert "extract_hidden_states/responses-verifier/train" in stages
    report.build_report(cfg, results, tmp_path / "reports", repo=tmp_path)
    appendix = " ".join((tmp_path / "reports" / "model_card_appendix.md").read_text().split())
    steps = json.loads((results / "train" / "domino" / "summary.json").read_text())["steps"]
    assert "| domino-regenerated | data.responses verifier |" in appendix
    assert f"for another number of steps: domino-regenerated 1,234 against Domino's {steps:,}." in appendix


def test_the_card_sets_each_row_beside_its_twin_on_other_answers(tmp_path, results):
    """config/regenerated-rows.yaml: each card row trained once more on the verifier's answers is
    found as that row's twin (a variant that changes anything else is not), and the appendix's
    Training answers section gives each pair's paired differences, the step counts and Domino vs
    DFlash noshift on both answers."""
    cfg = load("config.yaml", "config/regenerated-rows.yaml")
    assert report.answer_twins(trained(ablation_config())) == {}
    for row in ("dflash-shift", "dflash-noshift", "domino"):
        for rel in ("validate/{}.json", "train/{}", "benchmark/humaneval/{}.json"):
            src, dst = results / rel.format(row), results / rel.format(f"{row}-regenerated")
            shutil.copytree(src, dst) if src.is_dir() else shutil.copy(src, dst)
    record_training(results, cfg)
    twins = report.answer_twins(trained(cfg))
    assert twins == {f"{row}-regenerated": {"row": row, "row_answers": "corpus", "answers": "verifier"}
                     for row in ("dflash-shift", "dflash-noshift", "domino")}
    report.build_report(cfg, results, tmp_path / "reports", repo=tmp_path)
    appendix = (tmp_path / "reports" / "model_card_appendix.md").read_text()
    section = appendix.split("## Training answers: the corpus' or the verifier's")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| D")]
    assert [r.split(" | ")[0] for r in rows] == ["| DFlash shift (dflash-shift-regenerated)",
                                                 "| DFlash noshift (dflash-noshift-regenerated)",
                                                 "| Domino (domino-regenerated)"]
    # the twins decoded what their rows decoded here: no difference, with an interval around it
    assert all(" | +0.0% [+0.0%, +0.0%] | " in r for r in rows), rows
    steps = json.loads((results / "train" / "domino" / "summary.json").read_text())["steps"]
    assert rows[-1].endswith(f"| {steps:,} / {steps:,} |")
    joined = " ".join(section.split())
    assert "in speed on `corpus` answers;" in joined and "on `verifier` answers." in joined


@pytest.mark.parametrize("share, loaded", [(0.42, True), (0.03, False)])
def test_the_card_says_what_else_the_machine_did(tmp_path, results, share, loaded):
    """The benchmark's record of the machine's load is printed beside TPS; above the limit the TPS
    figures are marked as measured on a loaded machine."""
    record = {"cpus": 2, "load_average_before": [1.5, 1.2, 1.0], "load_average_after": [2.5, 1.9, 1.4],
              "other_processes_share": share, "loaded": loaded}
    path = results / "benchmark" / "humaneval" / "baseline.json"
    bench = json.loads(path.read_text())
    bench["summary"]["machine_load"] = record
    io.write_json(path, bench, seal=True)
    report.build_report(load("config.yaml"), results, tmp_path / "reports", repo=tmp_path)
    card = (tmp_path / "reports" / "model_card.md").read_text()
    assert f"took {share:.1%} of the machine's CPU time while these decodes were timed" in card
    assert "(2 CPUs, 1-minute load average 1.50 before, 2.50 after)" in card
    assert ("**TPS measured on a loaded machine:**" in card) == loaded
    assert "resumed" not in card


def test_the_card_says_a_benchmark_job_was_resumed(tmp_path, results):
    path = results / "benchmark" / "humaneval" / "baseline.json"
    bench = json.loads(path.read_text())
    bench["summary"]["machine_load"] = {"cpus": 2, "load_average_before": [0.1, 0.1, 0.1],
                                        "load_average_after": [1.0, 0.5, 0.2], "other_processes_share": 0.02,
                                        "loaded": False, "resumed_prompts": 7}
    io.write_json(path, bench, seal=True)
    report.build_report(load("config.yaml"), results, tmp_path / "reports", repo=tmp_path)
    card = " ".join((tmp_path / "reports" / "model_card.md").read_text().split())
    assert ("1-minute load average 0.10 before, 1.00 after, the last process's: the job was stopped and resumed, "
            "and 7 of its prompts were timed before the stop)") in card


def test_a_gguf_verifier_is_named_with_its_file_and_quantization():
    from domino.card.scale import verifier_label

    cfg = load("config.yaml", "config/smollm2.yaml")
    assert verifier_label(cfg) == ("HuggingFaceTB/SmolLM2-135M-Instruct, as the GGUF file SmolLM2-135M-Instruct.Q4_1.gguf "
                                   "(Q4_1 weights, dequantized)")
    assert verifier_label(load("config.yaml")) == "embedded-qwen3-tiny"


def test_the_card_sets_each_data_size_beside_the_rows(tmp_path, results):
    """config/smollm2-data-size.yaml's kind of variant: a card row on fewer conversations
    (``train.samples`` and nothing else) is a data-size point; one that changes anything more is
    not. The appendix's Training-data size section has a line per size, the card's rows as the
    largest, and its plot is drawn and declared among the report's plots."""
    from domino.card.paths import DATA_SIZE_PLOT, PLOTS, data_size_points, report_plots

    cfg = load("config.yaml")
    points = {"dflash-noshift-40": ("dflash-noshift", 40), "domino-40": ("domino", 40), "domino-80": ("domino", 80)}
    for name, (row, n) in points.items():
        cfg["checkpoints"][name] = {**cfg["checkpoints"][row], "train": {"samples": n}}
    cfg["checkpoints"]["domino-40-muon"] = {**cfg["checkpoints"]["domino"], "train": {"samples": 40, "optimizer": "muon"}}
    assert data_size_points(cfg["checkpoints"]) == {k: {"row": r, "samples": n} for k, (r, n) in points.items()}
    assert report_plots(cfg["checkpoints"]) == {**PLOTS, **DATA_SIZE_PLOT} and report_plots(load("config.yaml")["checkpoints"]) == PLOTS
    for name, (row, _) in {**points, "domino-40-muon": ("domino", 40)}.items():
        for rel in ("validate/{}.json", "train/{}", "benchmark/humaneval/{}.json"):
            src, dst = results / rel.format(row), results / rel.format(name)
            shutil.copytree(src, dst) if src.is_dir() else shutil.copy(src, dst)
    record_training(results, cfg)
    summary = json.loads((results / "prepare_data" / "summary.json").read_text())
    io.write_json(results / "prepare_data" / "summary.json", {**summary, "train": 120}, seal=True)
    assert report.variant_changes(trained(cfg), "domino-80") == "train.samples 80"
    paths = report.build_report(cfg, results, tmp_path / "reports", repo=tmp_path)
    assert tmp_path / "reports" / DATA_SIZE_PLOT["data_size"] in paths
    appendix = (tmp_path / "reports" / "model_card_appendix.md").read_text()
    section = appendix.split("## Training-data size")[1].split("\n## ")[0]
    lines = [line for line in section.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [line.split(" | ")[0] for line in lines] == ["| 40", "| 80", "| 120"]
    assert lines[1].count(" — |") == 5  # no DFlash noshift at 80: its three cells and the comparison's two
    # each point decoded what its row decoded here: Domino vs DFlash noshift at 40 is the rows' at 120
    assert lines[0].split(" | ")[-2:] == lines[2].split(" | ")[-2:] and "+0.0%" not in lines[0]
    assert "120 training conversations" in " ".join(section.split())
    assert f"]({DATA_SIZE_PLOT['data_size']})" in section


def test_the_appendix_draws_the_served_validation_curve_with_the_step_kept(tmp_path, results):
    """A checkpoint trained with served validation: the appendix's Training section tabulates its
    evaluations and the step kept, and the served curve's plot is drawn and declared among the
    report's plots; without one, neither."""
    from domino.card.paths import PLOTS, SERVED_PLOT, report_plots

    cfg = load("config.yaml")
    cfg["checkpoints"]["domino"]["train"] = {"served_prompts": 4, "keep": "best_served"}
    assert report_plots(cfg["checkpoints"], served=True) == {**PLOTS, **SERVED_PLOT}
    record_training(results, cfg)
    metrics = [json.loads(x) for x in (results / "train" / "domino" / "metrics.jsonl").read_text().splitlines()]
    curve = [{"step": m["step"], "epochs": (m["step"] + 1) / len(metrics), "mean_loss": m["loss"],
              "acceptance_length": al, "steps": 40, "accepted": round(40 * (al - 1)), "tokens": 80}
             for m, al in zip(metrics[1::2], (1.25, 1.5, 1.375))]
    summary = json.loads((results / "train" / "domino" / "summary.json").read_text())
    io.write_json(results / "train" / "domino" / "summary.json", {**summary, "served_validation": {
        "prompts": 4, "max_new_tokens": 16, "every_steps": 2, "keep": "best_served", "patience": 0,
        "kept_step": curve[1]["step"], "stopped_early": False, "seconds": 1.0, "curve": curve}}, seal=True)
    paths = report.build_report(cfg, results, tmp_path / "reports", repo=tmp_path)
    assert tmp_path / "reports" / SERVED_PLOT["served"] in paths
    appendix = (tmp_path / "reports" / "model_card_appendix.md").read_text()
    section = appendix.split("### Served validation")[1].split("\n## ")[0]
    row = next(line for line in section.splitlines() if line.startswith("| Domino |"))
    assert f"step {curve[1]['step']}, " in row and "(best_served)" in row
    assert "| 1.500 |" in row and f"| 1.375 (step {curve[2]['step']}) |" in row
    assert f"]({SERVED_PLOT['served']})" in section
    plain = tmp_path / "plain"
    report.build_report(load("config.yaml"), FIXTURE, plain / "reports", repo=tmp_path)
    assert "### Served validation" not in (plain / "reports" / "model_card_appendix.md").read_text()
    assert not (plain / "reports" / SERVED_PLOT["served"]).exists()
