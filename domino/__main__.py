"""``python -m domino <stage>``: every workflow stage, callable without Snakemake.

Each stage takes ``--params`` (a JSON object: the config values that stage uses, as the
workflow passes them) and explicit input/output paths.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import sysconfig
from pathlib import Path


def _setup(params: dict) -> None:
    import torch

    torch.manual_seed(params.get("seed", 0))
    threads = params.get("threads")
    if threads:
        torch.set_num_threads(int(threads))
    torch.use_deterministic_algorithms(True, warn_only=True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _device(params):
    import torch

    dev = params.get("device", "cpu")
    if dev.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("config device is 'cuda' but no CUDA device is visible")
    return dev


# -----------------------------------------------------------------------------
# stages


def cmd_tokenizer(a, p):
    from .data import load_corpus
    from .verifier import train_tokenizer

    d = p["data"]
    records = load_corpus(d["corpus"], d["samples"], d.get("hub_dataset"), d.get("hub_split", "train"))
    texts = (m["content"] for r in records for m in r["messages"])
    tok = train_tokenizer(texts, p["verifier"]["embedded"]["vocab_size"], a.out)
    _log(f"tokenizer with {len(tok)} tokens written to {a.out}")


def cmd_prepare_data(a, p):
    from .data import load_corpus, prepare_records, write_jsonl
    from .io import write_json
    from .verifier import load_tokenizer

    d = p["data"]
    tok = load_tokenizer(a.tokenizer)
    records = load_corpus(d["corpus"], d["samples"], d.get("hub_dataset"), d.get("hub_split", "train"))
    kwargs = {"enable_thinking": d["enable_thinking"]} if d.get("enable_thinking") is not None else {}
    train, val = prepare_records(tok, records, d["seq_len"], d["val_fraction"], p["seed"], kwargs)
    out = Path(a.out_dir)
    write_jsonl(out / "train.jsonl", train)
    write_jsonl(out / "val.jsonl", val)
    from .io import sha256_file

    digest = hashlib.sha256((sha256_file(out / "train.jsonl") + sha256_file(out / "val.jsonl")).encode())
    n_tok = sum(len(r["input_ids"]) for r in train + val)
    n_ast = sum(sum(r["loss_mask"]) for r in train + val)
    write_json(out / "summary.json", {"corpus": d["corpus"], "samples": len(records), "train": len(train),
                                      "val": len(val), "tokens": n_tok, "assistant_tokens": n_ast,
                                      "seq_len": d["seq_len"], "data_sha256": digest.hexdigest(),
                                      "python": sys.version.split()[0], "stdlib": sysconfig.get_paths()["stdlib"]})
    _log(f"{len(train)} train / {len(val)} val conversations, {n_tok} tokens ({n_ast} assistant)")


def cmd_verifier(a, p):
    from .data import read_jsonl
    from .verifier import load_tokenizer, pretrain_embedded_verifier

    tok = load_tokenizer(a.tokenizer)
    rows = read_jsonl(a.train)
    s = pretrain_embedded_verifier(rows, tok, p["verifier"]["embedded"], a.out, p["seed"], log=_log)
    _log(f"verifier: {s['parameters']} parameters, loss {s['first_loss']:.3f} -> {s['final_loss']:.3f}")


def cmd_draft_vocab(a, p):
    from .data import read_jsonl
    from .io import write_json
    from .verifier import eos_ids, load_tokenizer
    from .vocab import count_tokens, mappings, save_vocab, select_draft_vocab
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(a.verifier)
    rows = read_jsonl(a.train)
    V = cfg.vocab_size
    size = p["drafter"]["draft_vocab_size"]
    if size > V:
        raise SystemExit(f"drafter.draft_vocab_size {size} exceeds the verifier's vocabulary of {V}")
    counts = count_tokens([r["input_ids"] for r in rows], [r["loss_mask"] for r in rows], V)
    ids = select_draft_vocab(counts, size, always=eos_ids(load_tokenizer(a.verifier), cfg))
    d2t, t2d = mappings(ids, V)
    save_vocab(a.out, d2t, t2d, counts)
    covered = float(counts[ids].sum() / counts.sum().clamp(min=1))
    write_json(Path(a.out).with_suffix(".json"), {"draft_vocab_size": size, "target_vocab_size": V,
                                                   "assistant_token_coverage": covered,
                                                   "seen_tokens": int((counts > 0).sum())})
    _log(f"draft vocab {size} of {V}: covers {covered:.1%} of assistant tokens")


def cmd_extract(a, p):
    from .data import read_jsonl
    from .features import extract
    from .verifier import load_verifier
    from .vocab import load_vocab, target_ids

    f = p["features"]
    aux = p["drafter"]["aux_layer_ids"]
    backend = None
    if f.get("backend") == "vllm":
        from .vllm_backend import VllmExtractor

        # transformers keeps a CPU copy for the final norm, the lm_head rows and the shard key
        verifier = load_verifier(a.verifier, p["verifier"]["dtype"], "cpu")
        backend = VllmExtractor(a.verifier, verifier, aux, p["verifier"]["dtype"],
                                max_model_len=verifier.config.max_position_embeddings,
                                memory_fraction=p["vllm"]["memory_fraction"], seed=p.get("seed", 0),
                                device=_device(p))
    else:
        verifier = load_verifier(a.verifier, p["verifier"]["dtype"], _device(p))
    d2t, _ = load_vocab(a.vocab)
    rows = read_jsonl(a.data)
    extract(verifier, rows, aux, target_ids(d2t), a.out_dir, f["batch_size"], f["shard_samples"], f["dtype"],
            log=_log, backend=backend)


def _drafter_fields(p, checkpoint: str, tokenizer) -> dict:
    from .verifier import mask_token_id

    d = dict(p["drafter"])
    kind = p["checkpoints"][checkpoint]
    d["mask_token_id"] = mask_token_id(tokenizer, d.get("mask_token_id"))
    fields = {k: d[k] for k in ("num_layers", "block_size", "aux_layer_ids", "draft_vocab_size", "gru_hidden_size",
                                "bottleneck_size", "pure_draft_prefix_len", "correct_from", "mask_token_id")}
    fields.update(projector=kind["projector"], shift_label=kind["shift_label"],
                  attn_implementation=d.get("attn_implementation", "sdpa"))
    return fields


def _train_config(p, checkpoint: str):
    from .train import TrainConfig

    t = dict(p["train"])
    t["betas"] = tuple(t.get("betas", (0.9, 0.999)))
    t.pop("autocast", None)
    t.pop("nproc_per_node", None)
    return TrainConfig(seed=p["seed"], weighting=p["checkpoints"][checkpoint]["weighting"], **t)


def _autocast(p):
    from .verifier import DTYPES

    name = p["train"].get("autocast")
    return DTYPES[name] if name else None


def cmd_train(a, p):
    from .features import load_features
    from .model import Drafter, DrafterConfig
    from .train import train
    from .verifier import load_tokenizer, load_verifier
    from .vocab import load_vocab

    verifier = load_verifier(a.verifier, "float32", "cpu")
    fields = _drafter_fields(p, a.checkpoint, load_tokenizer(a.verifier))
    cfg = DrafterConfig.from_verifier(verifier.config, verifier=p["verifier"]["name"], **fields)
    d2t, t2d = load_vocab(a.vocab)
    import torch

    torch.manual_seed(p["seed"])
    drafter = Drafter.from_verifier(verifier, cfg, d2t, t2d)
    del verifier
    feats = load_features(a.features)
    device = _device(p)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:  # started by torchrun: one process per GPU (nccl) or per CPU worker (gloo)
        import torch.distributed as dist

        cuda = device.startswith("cuda")
        dist.init_process_group("nccl" if cuda else "gloo")
        if cuda:
            device = f"cuda:{os.environ.get('LOCAL_RANK', '0')}"
            torch.cuda.set_device(device)
    s = train(drafter, feats, _train_config(p, a.checkpoint), a.out_dir, device, _autocast(p), log=_log)
    if world > 1:
        dist.destroy_process_group()
    if s.get("rank", 0) == 0:
        _log(f"trained {a.checkpoint}: {s['steps']} steps in {s['seconds']:.1f}s, final loss {s['final_loss']:.4f}")


def cmd_validate(a, p):
    from .features import load_features
    from .io import write_json
    from .model import Drafter
    from .train import validate

    drafter = Drafter.load(a.checkpoint_dir)
    feats = load_features(a.features)
    res = validate(drafter, feats, _train_config(p, a.checkpoint), _device(p), _autocast(p))
    res["checkpoint"] = a.checkpoint
    write_json(a.out, res)
    acc = [f"{s['final_acc']:.3f}" for s in res["per_slot"]]
    _log(f"{a.checkpoint}: final accuracy per slot {acc}, overall {res['overall']['final_acc']:.3f}")


def cmd_benchmark(a, p):
    from .bench import run_benchmark

    run_benchmark(p, a.run, a.verifier, a.checkpoint_dir, a.baseline, a.out, log=_log)


def cmd_vllm_benchmark(a, p):
    from .bench import run_vllm_benchmark

    run_vllm_benchmark(p, a.run, a.verifier, a.export_dir, a.baseline, a.ours, a.out, log=_log)


def cmd_report(a, p):
    from .report import build_report

    build_report(p, a.results, a.out_dir, a.stage_benchmarks, log=_log)


def cmd_export(a, p):
    from .export import export_speculators

    v = p["verifier"]
    cfg = export_speculators(a.checkpoint_dir, a.out_dir, v["name"], dtype=v.get("dtype"))
    _log(f"exported {a.checkpoint_dir} to {a.out_dir} (speculators dflash, projector "
         f"{cfg['projector_type']}, {cfg['speculators_config']['proposal_methods'][0]['speculative_tokens']} "
         f"speculative tokens, {cfg['dtype']})")


STAGES = {
    "tokenizer": (cmd_tokenizer, ["out"]),
    "prepare-data": (cmd_prepare_data, ["tokenizer", "out_dir"]),
    "verifier": (cmd_verifier, ["tokenizer", "train", "out"]),
    "draft-vocab": (cmd_draft_vocab, ["verifier", "train", "out"]),
    "extract": (cmd_extract, ["verifier", "vocab", "data", "out_dir"]),
    "train": (cmd_train, ["checkpoint", "verifier", "vocab", "features", "out_dir"]),
    "validate": (cmd_validate, ["checkpoint", "checkpoint_dir", "features", "out"]),
    "benchmark": (cmd_benchmark, ["run", "verifier", "checkpoint_dir", "baseline", "out"]),
    "vllm-benchmark": (cmd_vllm_benchmark, ["run", "verifier", "export_dir", "baseline", "ours", "out"]),
    "report": (cmd_report, ["results", "out_dir", "stage_benchmarks"]),
    "export": (cmd_export, ["checkpoint_dir", "out_dir"]),
}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m domino", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="stage", required=True)
    for name, (_, args) in STAGES.items():
        sp = sub.add_parser(name)
        sp.add_argument("--params", required=True, help="JSON object of config values, or @file.json")
        for arg in args:
            sp.add_argument("--" + arg.replace("_", "-"), dest=arg, default=None)
    a = parser.parse_args(argv)
    raw = a.params
    params = json.loads(Path(raw[1:]).read_text() if raw.startswith("@") else raw)
    _setup(params)
    fn = STAGES[a.stage][0]
    try:
        fn(a, params)
    except (ValueError, FileNotFoundError, RuntimeError) as err:
        # a clear one-line reason instead of a traceback for the errors we raise on purpose
        if os.environ.get("DOMINO_TRACEBACK"):
            raise
        raise SystemExit(f"domino {a.stage}: {type(err).__name__}: {err}") from None


if __name__ == "__main__":
    main()
