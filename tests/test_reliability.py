"""Reliability: resumed training ends where an uninterrupted run ends (after
``max_steps``, SIGTERM and SIGKILL), extraction resumes at the first missing shard, corrupted
shards are refused by name, and interrupted writers leave nothing that looks done."""

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch

from conftest import RELIABILITY_CFG as CFG, stage_cli_config, synthetic_features, tiny_drafter, tiny_verifier
from domino.data.features import ShardError, extract, load_features
from domino.io import atomic_path, write_json
from domino.model import Drafter
from domino.train.loop import total_steps, train

ROOT = Path(__file__).resolve().parent.parent
OUTPUTS = ("checkpoint/model.safetensors", "checkpoint/drafter_config.json", "metrics.jsonl", "summary.json")


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The initial drafter saved once (every run starts from ``Drafter.load`` of it), the features,
    and a reference run trained without interruption."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    work = tmp_path_factory.mktemp("train")
    drafter = tiny_drafter(tiny_verifier(), projector="domino", attn="eager").float()  # float64 -> float32
    assert drafter.fc.weight.dtype == torch.float32
    drafter.save(work / "init")
    feats = synthetic_features()
    torch.save(feats, work / "feats.pt")
    (work / "cfg.json").write_text(json.dumps(asdict(CFG)))
    ref_dir = work / "reference"
    ref = Drafter.load(work / "init")
    summary = train(ref, feats, CFG, ref_dir)
    assert summary["complete"] and summary["steps"] == total_steps(summary["rows"], CFG)
    assert 10 <= summary["steps"] <= 30, summary["steps"]  # enough steps to interrupt in the middle
    assert not (ref_dir / "state" / "state.pt").exists()  # removed once the run is complete
    torch.set_num_threads(threads)
    return {"work": work, "feats": feats, "ref_dir": ref_dir, "ref": ref.state_dict(), "total": summary["steps"]}


def _assert_same_as_reference(setup, out_dir, drafter=None):
    from safetensors.torch import load_file

    a = load_file(str(setup["ref_dir"] / "checkpoint" / "model.safetensors"))
    b = load_file(str(Path(out_dir) / "checkpoint" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    if drafter is not None:
        for k, v in drafter.state_dict().items():
            assert torch.equal(v, setup["ref"][k]), k
    assert (setup["ref_dir"] / "metrics.jsonl").read_bytes() == (Path(out_dir) / "metrics.jsonl").read_bytes()
    assert not (Path(out_dir) / "state" / "state.pt").exists()


def _assert_nothing_done(out_dir):
    """No declared output of the train rule exists; only the state (and maybe a .tmp- file)."""
    out_dir = Path(out_dir)
    for rel in OUTPUTS:
        assert not (out_dir / rel).exists(), rel
    for p in out_dir.rglob("*"):
        if p.is_file():
            assert p.relative_to(out_dir).as_posix() == "state/state.pt" or p.name.startswith(".tmp-"), p


# -----------------------------------------------------------------------------
# training resume


def test_resume_after_max_steps_is_bitwise_identical(setup, tmp_path, caplog):
    out = tmp_path / "run"
    d = Drafter.load(setup["work"] / "init")
    s = train(d, setup["feats"], CFG, out, max_steps=7)
    assert s == {"steps": 7, "complete": False}
    _assert_nothing_done(out)
    st = torch.load(out / "state" / "state.pt", weights_only=True)
    assert st["step"] == 7 and len(st["metrics"]) == 7
    assert set(st) >= {"model", "optimizer", "step", "metrics", "config", "total_steps", "inputs"}

    d = Drafter.load(setup["work"] / "init")  # the weights come from the state, not from here
    with caplog.at_level(logging.INFO, logger="domino.train.loop"):
        s = train(d, setup["feats"], CFG, out)
    assert s["complete"] and s["steps"] == setup["total"]
    assert any(f"resuming at step 7 of {setup['total']}" in m for m in caplog.messages), caplog.messages
    _assert_same_as_reference(setup, out, d)


def test_resume_twice_and_from_periodic_state(setup, tmp_path):
    """Stop at 4 (state at 4), again at 9; the periodic save at 6 is overwritten at 9."""
    out = tmp_path / "run"
    for stop in (4, 9, None):
        d = Drafter.load(setup["work"] / "init")
        train(d, setup["feats"], CFG, out, max_steps=stop)
    _assert_same_as_reference(setup, out, d)


def test_state_from_other_settings_or_inputs_is_refused(setup, tmp_path):
    out = tmp_path / "run"
    train(Drafter.load(setup["work"] / "init"), setup["feats"], CFG, out, max_steps=2)
    with pytest.raises(RuntimeError, match="other training settings"):
        train(Drafter.load(setup["work"] / "init"), setup["feats"], replace(CFG, lr=1e-3), out)
    other = dict(setup["feats"], aux=setup["feats"]["aux"] + 1)  # same shapes, other content
    with pytest.raises(RuntimeError, match="other features"):
        train(Drafter.load(setup["work"] / "init"), other, CFG, out)
    (out / "state" / "state.pt").write_bytes(b"not a torch file")
    with pytest.raises(RuntimeError, match="state.pt cannot be read"):
        train(Drafter.load(setup["work"] / "init"), setup["feats"], CFG, out)


SCRIPT = textwrap.dedent("""
    import json, sys, time
    import torch
    torch.set_num_threads(1)
    import domino.train.loop as T
    from domino.model import Drafter

    work, out, pause = sys.argv[1], sys.argv[2], float(sys.argv[3])
    orig = T.compute_losses

    def slow(drafter, batch, cfg, step_seed, *a, **k):
        print(f"step {step_seed[2]}", flush=True)  # (seed, 3, step)
        time.sleep(pause)
        return orig(drafter, batch, cfg, step_seed, *a, **k)

    T.compute_losses = slow
    c = json.loads(open(work + "/cfg.json").read())
    c["betas"] = tuple(c["betas"])
    feats = torch.load(work + "/feats.pt", weights_only=False)
    T.train(Drafter.load(work + "/init"), feats, T.TrainConfig(**c), out)
    print("finished", flush=True)
""")


def _launch(setup, tmp_path, pause):
    script = tmp_path / "train_child.py"
    script.write_text(SCRIPT)
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, str(script), str(setup["work"]), str(out), str(pause)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path)
    return proc, out


def _read_until(proc, line_wanted, timeout=60):
    seen, t0 = [], time.monotonic()
    while time.monotonic() - t0 < timeout:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line.rstrip())
        if line.strip() == line_wanted:
            return seen
    proc.kill()
    proc.wait()
    raise AssertionError(f"child never printed {line_wanted!r}:\n" + "\n".join(seen[-30:]))


def test_sigterm_saves_state_and_resume_matches(setup, tmp_path, caplog):
    proc, out = _launch(setup, tmp_path, pause=0.2)
    _read_until(proc, "step 4")  # the periodic state of step 3 is on disk; step 4 is under way
    assert (out / "state" / "state.pt").exists()
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode not in (0, -signal.SIGTERM), rest  # the handler ran, then the job failed
    _assert_nothing_done(out)
    st = torch.load(out / "state" / "state.pt", weights_only=True)
    # the step under way (4, or a later one on a slow machine) was finished and saved, no further
    assert 5 <= st["step"] < setup["total"] and len(st["metrics"]) == st["step"], st["step"]
    assert f"interrupted at step {st['step']}" in rest and "finished" not in rest, rest

    d = Drafter.load(setup["work"] / "init")
    with caplog.at_level(logging.INFO, logger="domino.train.loop"):
        train(d, setup["feats"], CFG, out)
    assert any(f"resuming at step {st['step']}" in m for m in caplog.messages), caplog.messages
    _assert_same_as_reference(setup, out, d)


def test_sigkill_resumes_from_last_periodic_state(setup, tmp_path, caplog):
    proc, out = _launch(setup, tmp_path, pause=0.2)
    _read_until(proc, "step 7")  # periodic state at 6; step 7 under way
    proc.kill()  # SIGKILL: no handler, no last save
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    _assert_nothing_done(out)
    st = torch.load(out / "state" / "state.pt", weights_only=True)
    # the periodic state of step 6 (or a later one on a slow machine); the steps after it are lost
    assert st["step"] >= 6 and st["step"] % CFG.checkpoint_every == 0 and len(st["metrics"]) == st["step"]

    d = Drafter.load(setup["work"] / "init")
    with caplog.at_level(logging.INFO, logger="domino.train.loop"):
        train(d, setup["feats"], CFG, out)
    assert any(f"resuming at step {st['step']}" in m for m in caplog.messages), caplog.messages
    _assert_same_as_reference(setup, out, d)


# -----------------------------------------------------------------------------
# extraction resume and shard checks


@pytest.fixture(scope="module")
def extraction(tmp_path_factory):
    verifier = tiny_verifier()
    g = torch.Generator().manual_seed(5)
    rows = []
    for i in range(10):
        n = int(torch.randint(8, 20, (1,), generator=g))
        ids = torch.randint(0, 95, (n,), generator=g).tolist()
        rows.append({"id": str(i), "input_ids": ids, "loss_mask": [0] * (n // 2) + [1] * (n - n // 2)})
    draft_ids = torch.sort(torch.randperm(95, generator=g)[:64]).values
    return {"verifier": verifier, "rows": rows, "draft_ids": draft_ids}


class _Messages(logging.Handler):
    """Hands each logged message to ``sink``."""

    def __init__(self, sink):
        super().__init__(logging.INFO)
        self.sink = sink

    def emit(self, record):
        self.sink(record.getMessage())


def _extract(ex, out, log, rows=None, aux=(1, 2, 4)):
    """``extract`` on the fixture's rows; ``log`` receives what it logs."""
    logger, handler = logging.getLogger("domino.data.features"), _Messages(log)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        return extract(ex["verifier"], rows or ex["rows"], list(aux), ex["draft_ids"], Path(out) / "index.json",
                       batch_size=2, shard_samples=3, dtype="float32")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _shards(out):
    return sorted(p.name for p in Path(out).glob("shard-*.safetensors"))


def _assert_same_features(a, b):
    for k in ("input_ids", "loss_mask", "aux", "target", "offsets"):
        assert torch.equal(a[k], b[k]), k


def test_extraction_stores_the_last_hidden_state_before_the_final_norm(extraction, tmp_path):
    """With ``last_hidden_state`` each token's aux-id-L state is stored; the verifier's head
    over it (``VerifierHead``: final norm, draft rows) gives back the stored greedy target.
    The other tensors and the shards' names are those of an extraction without it."""
    from domino.aux import aux_states
    from domino.train.loop import VerifierHead

    ex = extraction
    _extract(ex, tmp_path / "plain", lambda message: None)
    plain = load_features(tmp_path / "plain" / "index.json")
    index = extract(ex["verifier"], ex["rows"], [1, 2, 4], ex["draft_ids"], tmp_path / "last" / "index.json",
                    batch_size=2, shard_samples=3, dtype="float32", last_hidden_state=True)
    assert index["last_hidden_state"] and not plain["index"]["last_hidden_state"] and "last" not in plain
    feats = load_features(tmp_path / "last" / "index.json")
    _assert_same_features(feats, plain)
    L = ex["verifier"].config.num_hidden_layers
    first = ex["rows"][0]["input_ids"]
    want = aux_states(ex["verifier"], torch.tensor([first]), [L])[0].float()
    torch.testing.assert_close(feats["last"][: len(first)], want)
    normed = ex["verifier"].model(input_ids=torch.tensor([first])).last_hidden_state[0].float()
    assert not torch.allclose(want, normed, atol=1e-3)  # not the normed state transformers returns last
    head = VerifierHead(ex["verifier"], ex["draft_ids"])
    assert torch.equal(head(feats["last"]).argmax(-1), feats["target"])


def test_a_subset_of_conversations_is_cut_from_each_shard_as_it_is_read(extraction, tmp_path):
    """``train.samples``: the chosen conversations, token for token what the whole set holds at
    their offsets, across shard borders; a larger subset holds every smaller one; all of them is
    the whole set; a subset's training state is not taken for another's."""
    from domino.data.features import chosen_conversations
    from domino.train.loop import _inputs_fingerprint

    out = tmp_path / "feat"
    _extract(extraction, out, log=lambda m: None)  # 10 conversations in shards of 3
    whole = load_features(out / "index.json")
    offs = whole["offsets"].tolist()
    small, large = chosen_conversations(10, 4, seed=3), chosen_conversations(10, 7, seed=3)
    assert len(small) == 4 and set(small) < set(large) and len({i // 3 for i in small}) > 1
    sub = load_features(out / "index.json", samples=4, seed=3)
    assert sub["offsets"].tolist() == [0, *torch.tensor([offs[i + 1] - offs[i] for i in small]).cumsum(0).tolist()]
    for j, i in enumerate(small):
        a, b = sub["offsets"][j], sub["offsets"][j + 1]
        for k in ("input_ids", "loss_mask", "aux", "target"):
            assert torch.equal(sub[k][a:b], whole[k][offs[i]:offs[i + 1]]), (k, i)
    assert sub["index"]["chosen"] == {"samples": 4, "seed": 3}
    _assert_same_features(load_features(out / "index.json", samples=10, seed=3), whole)
    drafter = tiny_drafter(extraction["verifier"])
    prints = {_inputs_fingerprint(drafter, f) for f in (whole, sub, load_features(out / "index.json", samples=4))}
    assert len(prints) == 3


def test_extraction_resumes_at_the_first_missing_shard(extraction, tmp_path):
    out = tmp_path / "feat"
    first = _extract(extraction, out, log=lambda m: None)
    assert _shards(out) == [f"shard-{i:05d}.safetensors" for i in range(4)]  # 3 + 3 + 3 + 1
    ref = load_features(out / "index.json")
    mtimes = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}

    (out / "shard-00001.safetensors").unlink()
    (out / "shard-00001.safetensors.sha256").unlink()
    (out / "index.json").unlink()
    logs = []
    second = _extract(extraction, out, log=logs.append)
    skipped = sorted(m.split(":")[0] for m in logs if m.endswith("skipped"))
    assert skipped == ["shard-00000.safetensors", "shard-00002.safetensors", "shard-00003.safetensors"], logs
    for name in skipped:
        assert (out / name).stat().st_mtime_ns == mtimes[name]
    assert second == first
    _assert_same_features(load_features(out / "index.json"), ref)


def test_extraction_bar_moves_per_batch_not_per_shard(extraction, tmp_path, monkeypatch):
    """A shard holds 1,000 conversations at the profiles' sizes, a quarter of an hour on a slow CPU:
    the bar advances by each batch's conversations, so it moves within a shard."""
    import domino.data.features as F

    updates = []

    class Bar:
        def __init__(self, *a, **k):
            pass

        def update(self, n):
            updates.append(n)

        def close(self):
            pass

    monkeypatch.setattr(F, "tqdm", Bar)
    _extract(extraction, tmp_path / "feat", log=lambda m: None)  # 10 rows, shards of 3, batches of 2
    assert updates == [2, 1, 2, 1, 2, 1, 1]


def test_extraction_killed_midway_leaves_no_index_and_resumes(extraction, tmp_path, monkeypatch):
    import domino.data.features as F

    out = tmp_path / "feat"
    ref_index = _extract(extraction, tmp_path / "ref", log=lambda m: None)
    orig, calls = F._extract_part, []

    def dies_on_third(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt("killed")
        return orig(*a, **k)

    monkeypatch.setattr(F, "_extract_part", dies_on_third)
    with pytest.raises(KeyboardInterrupt, match="killed"):
        _extract(extraction, out, log=lambda m: None)
    assert not (out / "index.json").exists()  # what Snakemake and load_features take as done
    assert _shards(out) == ["shard-00000.safetensors", "shard-00001.safetensors"]
    assert not [p for p in out.iterdir() if p.name.startswith(".tmp-")]
    with pytest.raises(ShardError, match="index.json is missing"):
        load_features(out / "index.json")

    # a shard written without its sidecar (killed between the two renames) is not trusted
    (out / "shard-00001.safetensors.sha256").unlink()
    monkeypatch.setattr(F, "_extract_part", orig)
    logs = []
    index = _extract(extraction, out, log=logs.append)
    assert [m.split(":")[0] for m in logs if m.endswith("skipped")] == ["shard-00000.safetensors"], logs
    assert index == ref_index
    _assert_same_features(load_features(out / "index.json"), load_features(tmp_path / "ref" / "index.json"))


def test_shards_from_other_inputs_are_not_reused(extraction, tmp_path):
    out = tmp_path / "feat"
    _extract(extraction, out, log=lambda m: None)
    (out / "index.json").unlink()
    rows = [dict(r) for r in extraction["rows"]]
    rows[4] = dict(rows[4], input_ids=list(reversed(rows[4]["input_ids"])))  # in shard 1
    logs = []
    _extract(extraction, out, log=logs.append, rows=rows)
    skipped = [m.split(":")[0] for m in logs if m.endswith("skipped")]
    assert skipped == ["shard-00000.safetensors", "shard-00002.safetensors", "shard-00003.safetensors"], logs
    fresh = tmp_path / "fresh"
    _extract(extraction, fresh, log=lambda m: None, rows=rows)
    _assert_same_features(load_features(out / "index.json"), load_features(fresh / "index.json"))

    logs = []
    _extract(extraction, out, log=logs.append, rows=rows, aux=(0, 2, 3))  # other aux layers: nothing reused
    assert not [m for m in logs if m.endswith("skipped")], logs


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_damaged_shard_is_refused_by_name(extraction, tmp_path, damage):
    out = tmp_path / "feat"
    _extract(extraction, out, log=lambda m: None)
    shard = out / "shard-00002.safetensors"
    data = bytearray(shard.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF  # inside the tensor data: the file still parses
        shard.write_bytes(bytes(data))
    elif damage == "truncate":
        shard.write_bytes(bytes(data[: len(data) - 100]))
    else:
        shard.unlink()
    with pytest.raises(ShardError, match="shard-00002.safetensors") as info:
        load_features(out / "index.json")
    assert {"flip": "corrupted", "truncate": "corrupted", "delete": "missing"}[damage] in str(info.value)
    if damage == "truncate":  # without the checksum the reader still refuses it, by name
        with pytest.raises(ShardError, match="shard-00002.safetensors"):
            load_features(out / "index.json", verify=False)


# -----------------------------------------------------------------------------
# atomic outputs


def test_atomic_path_leaves_nothing_when_the_writer_fails(tmp_path):
    target = tmp_path / "sub" / "out.json"
    with pytest.raises(RuntimeError, match="killed"):
        with atomic_path(target) as tmp:
            tmp.write_text('{"half": ')
            raise RuntimeError("killed")
    assert not target.exists()
    assert list(target.parent.iterdir()) == []

    write_json(target, {"a": 1})
    with pytest.raises(RuntimeError, match="killed"):
        with atomic_path(target) as tmp:
            tmp.write_text("garbage")
            raise RuntimeError("killed")
    assert json.loads(target.read_text()) == {"a": 1}  # the previous complete file is untouched
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.json"]


def test_training_stopped_early_leaves_no_declared_output(setup, tmp_path):
    out = tmp_path / "run"
    train(Drafter.load(setup["work"] / "init"), setup["feats"], CFG, out, max_steps=3)
    _assert_nothing_done(out)
    assert (out / "state" / "state.pt").exists()


def test_corrupted_shard_stops_the_stage_with_its_name(setup, extraction, tmp_path, capsys):
    """Through ``python -m domino`` (in process): one line naming the shard, no results file."""
    from domino.__main__ import main

    out = tmp_path / "feat"
    _extract(extraction, out, log=lambda m: None)
    capsys.readouterr()  # the extraction's progress bar
    shard = out / "shard-00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-5] ^= 0x01
    shard.write_bytes(bytes(data))
    result = tmp_path / "validate.json"
    det = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        with pytest.raises(SystemExit, match="^1$") as info:  # the message is printed, the code is 1
            main(["validate", "--config", stage_cli_config("validate", {"threads": 1}, checkpoint="domino"),
                  "--checkpoint", "domino", "--checkpoint-dir", str(setup["ref_dir"] / "checkpoint"),
                  "--features", str(out / "index.json"), "--out", str(result)])
    finally:  # main() switches these on for the whole process
        torch.use_deterministic_algorithms(det[0], warn_only=det[1])
    assert info.value.code == 1
    msg = capsys.readouterr().err.strip().splitlines()[-1]  # the stage's last word, one line
    assert msg.startswith("domino validate: ShardError: "), msg
    assert "shard-00001.safetensors" in msg and "corrupted" in msg, msg
    assert not result.exists()
