"""The results files the card reads, checked against their JSON Schemas as they are read.

``results_schemas.yaml`` holds one JSON Schema per file (validate, train metrics and summary,
the drafter config, benchmark and sampling, vLLM benchmark): ``required`` is what the card
reads, ``properties`` every field the stage writes, with its meaning. ``load_results`` reads and
checks every file of a run; a file that breaks its schema is refused with one line naming the
file and the field. Every number is finite: NaN and Infinity, which Python's JSON reads and
which pass every bound of a schema, are refused in every file. Every stage seals the JSON files
it writes for the card (``content_sha256``, ``domino.io.write_json``), and each is read only with
an intact seal: one missing or not matching the content is refused in one line naming the file.
The training metrics (``metrics.jsonl``, lines appended as training goes) are sealed by their
training's summary: ``metrics_sha256`` is the file's sha256, checked as it is read. The field tables of docs/results.md are generated from the same schemas
(``python -m domino.card.results`` prints them; a test keeps the document equal to them).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
from pathlib import Path

import yaml

from .. import io
from ..checkpoints import split_replicate, trained_checkpoints
from ..io import read_json
from .published import CHECKPOINTS

SCHEMAS = Path(__file__).resolve().parent / "results_schemas.yaml"  # shipped inside the package


@functools.lru_cache(maxsize=1)
def schemas() -> dict:
    """Every results file's JSON Schema, by kind (``validate``, ``benchmark``, ...)."""
    return yaml.safe_load(SCHEMAS.read_text())


@functools.lru_cache(maxsize=None)
def _validator(kind: str):
    from jsonschema import Draft202012Validator

    return Draft202012Validator(schemas()[kind])


def check(obj, kind: str, path: Path | str):
    """``obj`` if it is a valid ``kind`` file, else ValueError naming ``path`` and the first bad field."""
    if not isinstance(obj, dict):
        raise ValueError(f"results file {path}: expected a JSON object, got {type(obj).__name__}")
    bad = _non_finite(obj)
    if bad:
        raise ValueError(f"results file {path}: {bad}")
    errors = sorted(_validator(kind).iter_errors(obj),
                    key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    if not errors:
        bad = _cross_field(obj, kind)
        if bad:
            raise ValueError(f"results file {path}: {bad}")
        return obj
    err = errors[0]
    where = ".".join(str(p) for p in err.absolute_path)
    if err.validator == "required":
        missing = [k for k in err.validator_value if k not in err.instance]
        field = ".".join(filter(None, (where, missing[0])))
        raise ValueError(f"results file {path} lacks field {field}")
    raise ValueError(f"results file {path}: {where or '(top level)'}: {' '.join(err.message.split())}")


def _non_finite(node, path=()) -> str | None:
    """``"field: NaN is not a finite number"`` for the first NaN or infinity in ``node``, or None."""
    if isinstance(node, dict):
        items = node.items()
    elif isinstance(node, list):
        items = enumerate(node)
    else:
        if isinstance(node, float) and not math.isfinite(node):
            return f"{'.'.join(map(str, path)) or '(top level)'}: {json.dumps(node)} is not a finite number"
        return None
    return next((bad for k, v in items if (bad := _non_finite(v, (*path, k)))), None)


def _cross_field(obj: dict, kind: str) -> str | None:
    """What a schema cannot bound, ``"field: what is wrong"``, or None: a validate file's slots are
    the block's 0..B-1 (``per_slot`` holds all B) and ``first_trained_slot`` names one of them; a
    benchmark's steps accept at most the drafts a step proposes."""
    if kind == "validate":
        slots = [r["slot"] for r in obj["per_slot"]]
        for i, slot in enumerate(slots):
            if slot >= len(slots):
                return f"per_slot.{i}.slot: {slot} is outside the block's slots 0..{len(slots) - 1}"
        first = obj["first_trained_slot"]
        if first is not None and first not in slots:
            return f"first_trained_slot: {first} names no slot of per_slot (slots: {sorted(slots)})"
    if kind == "benchmark" and obj["summary"].get("drafts_per_step") is not None:
        most = obj["summary"]["drafts_per_step"]
        for i, record in enumerate(obj["prompts"]):
            over = [c for c in record["accepted_per_step"] if c > most]
            if over:
                return (f"prompts.{i}.accepted_per_step: {over[0]} accepted drafts in one step, more than the "
                        f"{most} a step proposes (summary.drafts_per_step)")
    return None


def _read(path: Path, kind: str) -> dict:
    """A results file checked against its seal, which every kind's stage writes (no seal, no
    read: ``domino.io.read_json``), then against its schema."""
    return check(read_json(path, sealed=True), kind, path)


def _read_metrics(path: Path, digest: str, keys: tuple) -> list[dict]:
    """A training's metrics, read only when their sha256 is the one its summary recorded."""
    if path.exists() and io.sha256_file(path) != digest:
        raise io.DamagedFile(f"results file {path} is damaged (its sha256 is not the metrics_sha256 of the "
                             f"summary.json beside it); {io.rebuild_hint(path)}")
    rows = io.read_jsonl(path, keys)
    for row in rows:
        check(row, "train_metrics", path)
    return rows


def read_benchmark(p: Path) -> dict:
    """A benchmark or sampling results file: protocol, summary and, of the per-prompt records, the
    fields a paired comparison reads (those the schema requires of a prompt record)."""
    bench = _read(p, "benchmark")
    keys = schemas()["benchmark"]["properties"]["prompts"]["items"]["required"]
    prompts = [{k: r[k] for k in keys} | ({"category": r["category"]} if "category" in r else {})
               for r in bench["prompts"]]
    return {"row": bench.get("row", p.stem), "protocol": bench["protocol"], "summary": bench["summary"],
            "path": str(p), "prompts": prompts,
            **{k: bench[k] for k in ("lookup", "decoder", "adaptive") if k in bench}}


def _one_protocol(rows: dict, what: str) -> None:
    protocols = [b["protocol"] for b in rows.values()]
    if any(p != protocols[0] for p in protocols):
        paths = ", ".join(b["path"] for b in rows.values())
        raise ValueError(f"{what} protocols differ between {paths}; the card needs one protocol")


def sampling_dir(temperature: float) -> str:
    """``results/sampling/`` folder of a temperature, as the workflow names it (``T0.6``)."""
    return f"T{temperature:g}"


MAIN_SUITE = "humaneval"  # the suite of the card's main tables, as the published card's


def benchmark_path(root: Path, suite: str, row: str, temperature: float = 0) -> Path:
    """Where a row's results of one suite lie: ``benchmark/<suite>/<row>.json`` (greedy) or
    ``sampling/T<T>/<suite>/<row>.json``, under the results folder ``root``."""
    folder = root / "benchmark" if temperature == 0 else root / "sampling" / sampling_dir(temperature)
    return folder / suite / f"{row}.json"


def _read_replicates(root: Path, checkpoints, replicates: int) -> tuple[dict, dict]:
    """Benchmark and validate results of seed replicates 1 .. N-1 (rows ``<checkpoint>-seed<r>``),
    each by row name."""
    if not isinstance(replicates, int) or isinstance(replicates, bool) or replicates < 1:
        raise ValueError(f"replicates must be a whole number >= 1, got {replicates!r}")
    benches, validates = {}, {}
    for row in trained_checkpoints(checkpoints, replicates):
        ckpt, r = split_replicate(row)
        if r == 0:
            continue
        try:
            benches[row] = read_benchmark(benchmark_path(root, MAIN_SUITE, row))
            validates[row] = _read(root / "validate" / f"{row}.json", "validate")
        except FileNotFoundError as err:
            raise FileNotFoundError(f"{err} (seed replicate {r} of {ckpt}; train.replicates = {replicates})") from None
    return benches, validates


def load_results(results_dir: Path, checkpoints=CHECKPOINTS, vllm_rows=(), temperatures=(0,),
                 replicates: int = 1, regenerated: bool = False, suites=(MAIN_SUITE,), lookups=()) -> dict:
    """Read and check every results file the report stage needs, once; raise naming any missing
    or bad file. The report stage reads the run through this dict only.

    ``checkpoints``: every configured variant (``cfg["checkpoints"]``, the card's three rows
    among them). ``vllm_rows`` (optional, ``vllm.benchmark``): the rows served by vLLM, read from
    ``results/vllm_benchmark/{suite}/{row}.json`` for every suite, under ``"vllm"`` by suite;
    "baseline" must be among them. ``temperatures``
    (``benchmark.temperatures``): each T > 0 is read from ``results/sampling/T{T:g}/{suite}/{row}.json``.
    ``suites`` (``benchmark.suites``): HumanEval's greedy results, ``results/benchmark/humaneval/``,
    are ``"benchmark"``, the card's main tables; every suite's, HumanEval's included, go under
    ``"suites"`` by suite, and sampling's under ``"sampling"`` by temperature and suite.
    ``replicates`` (``train.replicates``): for N > 1 HumanEval's benchmark results of replicates
    1 .. N-1, ``results/benchmark/humaneval/{checkpoint}-seed{r}.json``, go under ``"replicates"``
    and their validate results, ``results/validate/{checkpoint}-seed{r}.json``, under
    ``"replicate_validate"`` (replicate 0 is the checkpoint's own file, under ``"benchmark"`` and
    ``"validate"``). ``regenerated``
    (``data.responses: verifier``): the regenerate stage's summaries go under ``"regenerate"``, by
    split. ``lookups`` (``domino.decoders.untrained_rows``): the n-gram lookup rows' greedy results of
    every suite, under ``"lookup"`` by suite and row. ``"temperatures"`` and ``"replicate_count"``
    say what was asked for."""
    if MAIN_SUITE not in suites:
        raise ValueError(f"the card's tables are {MAIN_SUITE}'s; suites {list(suites)} leave it out")
    root = Path(results_dir)
    out = {"data": _read(root / "prepare_data" / "summary.json", "prepare_data"),
           "regenerate": {split: _read(root / "regenerate" / f"{split}.json", "regenerate")
                          for split in ("train", "val")} if regenerated else {},
           "validate": {}, "benchmark": {}, "metrics": {}, "train_summary": {}, "drafter_config": {}, "vllm": {},
           "sampling": {}, "suites": {}, "lookup": {}, "temperatures": list(temperatures),
           "replicate_count": replicates}
    out["replicates"], out["replicate_validate"] = _read_replicates(root, checkpoints, replicates)
    metric_keys = tuple(schemas()["train_metrics"]["required"])
    for ckpt in checkpoints:
        out["validate"][ckpt] = _read(root / "validate" / f"{ckpt}.json", "validate")
        train = root / "train" / ckpt
        out["train_summary"][ckpt] = summary = _read(train / "summary.json", "train_summary")
        out["metrics"][ckpt] = _read_metrics(train / "metrics.jsonl", summary["metrics_sha256"], metric_keys)
        out["drafter_config"][ckpt] = _read(train / "checkpoint" / "drafter_config.json", "drafter_config")
    for suite in suites:
        rows = {row: read_benchmark(benchmark_path(root, suite, row)) for row in ("baseline", *checkpoints)}
        out["lookup"][suite] = {row: read_benchmark(benchmark_path(root, suite, row)) for row in lookups}
        _one_protocol({**rows, **out["lookup"][suite], **(out["replicates"] if suite == MAIN_SUITE else {})},
                      f"benchmark ({suite})")
        out["suites"][suite] = rows
    out["benchmark"] = out["suites"][MAIN_SUITE]
    for t in sorted(t for t in temperatures if t > 0):
        out["sampling"][t] = {}
        for suite in suites:
            rows = {row: read_benchmark(benchmark_path(root, suite, row, t)) for row in ("baseline", *checkpoints)}
            _one_protocol(rows, f"sampling (T = {t:g}, {suite})")
            out["sampling"][t][suite] = rows
    if vllm_rows and "baseline" not in vllm_rows:
        raise ValueError("the vLLM cross-check needs its plain-greedy baseline row")
    for suite in suites if vllm_rows else ():
        out["vllm"][suite] = {}
        for row in vllm_rows:
            bench = _read(root / "vllm_benchmark" / suite / f"{row}.json", "vllm_benchmark")
            out["vllm"][suite][row] = {"protocol": bench["protocol"], "summary": bench["summary"],
                                       **({"lookup": bench["lookup"]} if "lookup" in bench else {})}
    return out


# ---------------------------------------------------------------- the field tables of docs/results.md

def _type(prop: dict, defs: dict) -> str:
    if "$ref" in prop:
        return _type(defs[prop["$ref"].rsplit("/", 1)[-1]], defs)
    t = prop.get("type", "")
    t = " or ".join(t) if isinstance(t, list) else t
    if t == "array" and prop.get("minItems") == 2 == prop.get("maxItems"):
        return "[low, high]"
    if t == "array" and "items" in prop and "properties" not in prop["items"]:
        return f"array of {_type(prop['items'], defs)}"
    return t


def field_rows(kind: str) -> list[tuple[str, str, bool, str]]:
    """(field, type, read by the card, meaning) for every field of ``kind``, nested fields as
    dotted paths (``summary.tps``; ``prompts[].task_id`` for a field of each record)."""
    schema = schemas()[kind]
    defs = schema.get("$defs", {})
    rows = []

    def walk(node: dict, prefix: str, required: set) -> None:
        for name, prop in node.get("properties", {}).items():
            path = f"{prefix}{name}"
            ref = defs.get(prop.get("$ref", "").rsplit("/", 1)[-1], {})
            desc = prop.get("description") or ref.get("description", "")
            rows.append((path, _type(prop, defs), name in required, desc))
            if "properties" in prop:
                walk(prop, path + ".", set(prop.get("required", ())))
            elif prop.get("type") == "array" and "properties" in prop.get("items", {}):
                walk(prop["items"], path + "[].", set(prop["items"].get("required", ())))

    walk(schema, "", set(schema.get("required", ())))
    return rows


def field_table(kind: str) -> str:
    """The markdown table of ``kind``'s fields, as docs/results.md shows it."""
    lines = ["| field | type | card | meaning |", "|---|---|---|---|"]
    lines += [f"| `{f}` | {t} | {'yes' if r else ''} | {d} |" for f, t, r, d in field_rows(kind)]
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m domino.card.results",
                                description="Print the field table of each results file, as docs/results.md shows it.")
    p.add_argument("kinds", nargs="*", help=f"of {', '.join(schemas())} (default: all)")
    a = p.parse_args(argv)
    for kind in a.kinds or schemas():
        print(f"<!-- fields: {kind} -->\n{field_table(kind)}\n<!-- /fields -->\n")


if __name__ == "__main__":
    main()
