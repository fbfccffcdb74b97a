"""A seeded fuzzer over config.yaml: every mutated config validates or is refused in one line
that names the key; nothing else escapes (a traceback would be a bug).

Mutations, each applied to one place of the default config:
- a type swap (a leaf becomes a string, a number, a bool, null, a list or a mapping);
- an out-of-range number (negative, zero, huge, tiny, not finite);
- an unknown key in a section;
- an empty section (``{}`` or null);
- a YAML trap: the value YAML itself gives to ``6e-4`` (text), ``no`` (false), ``1:30``
  (90, base 60), ``1_000``, ``.nan``, ``~`` and others, as a user typing them would get.
"""

import copy
import random

import pytest
import yaml

from conftest import ROOT, copy_repo, run_snakemake
from domino.config import validate_config
from domino.schema import ConfigError, load_schema

CASES = 600
SEED = 0
TRAPS = ("6e-4", "1e3", "no", "yes", "on", "off", "1:30", "1_000", "0x10", "017", "~", ".nan", ".inf", "-.inf",
         "'3'", "[]", "{}", "null", "2026-12-01", "3.")
SWAPS = ("x", 1, 1.5, True, None, [1], {"a": 1})
NUMBERS = (-1, 0, -0.5, 10 ** 12, 1e-12, 2 ** 31, float("nan"), float("inf"))


def _leaves(node, path=()):
    """Every (path, value) of a scalar or list leaf, in a stable order."""
    if isinstance(node, dict):
        for k in sorted(node):
            yield from _leaves(node[k], (*path, k))
    else:
        yield path, node


def _sections(node, path=()):
    """Every (path, mapping), the top level included."""
    if isinstance(node, dict):
        yield path, node
        for k in sorted(node):
            yield from _sections(node[k], (*path, k))


def _set(cfg, path, value):
    node = cfg
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value


def mutations(base: dict, n: int, seed: int):
    """``n`` seeded (kind, dotted path, mutated config) cases."""
    rng = random.Random(seed)
    leaves = list(_leaves(base))
    numeric = [(p, v) for p, v in leaves if isinstance(v, (int, float)) and not isinstance(v, bool)]
    sections = [(p, s) for p, s in _sections(base) if p]
    for _ in range(n):
        cfg, kind = copy.deepcopy(base), rng.choice(("swap", "range", "unknown", "empty", "trap"))
        if kind == "swap":
            path, old = rng.choice(leaves)
            _set(cfg, path, rng.choice([s for s in SWAPS if type(s) is not type(old)]))
        elif kind == "range":
            path, _ = rng.choice(numeric)
            _set(cfg, path, rng.choice(NUMBERS))
        elif kind == "unknown":
            path, _ = rng.choice([(p, s) for p, s in _sections(cfg)])
            _set(cfg, (*path, "zz_unknown"), 1) if path else cfg.__setitem__("zz_unknown", 1)
            path = (*path, "zz_unknown")
        elif kind == "empty":
            path, _ = rng.choice(sections)
            _set(cfg, path, rng.choice(({}, None)))
        else:
            path, _ = rng.choice(leaves)
            _set(cfg, path, yaml.safe_load(f"k: {rng.choice(TRAPS)}")["k"])
        yield kind, ".".join(map(str, path)), cfg


def _names_the_key(message: str, path: str) -> bool:
    """The refusal's key (before the first colon) is the mutated key, one of its sections, or a
    key inside it; or a cross-field check names the mutated key in its text."""
    key = message.split(":", 1)[0]
    related = path == key or path.startswith(key + ".") or key.startswith(path + ".")
    return related or path.rsplit(".", 1)[-1] in message


def test_fuzzed_configs_validate_or_are_refused_naming_the_key(capsys):
    base = yaml.safe_load((ROOT / "config.yaml").read_text())
    counts = {"validated": 0, "refused": 0}
    unnamed, escaped = [], []
    for kind, path, cfg in mutations(base, CASES, SEED):
        try:
            validate_config(cfg)
            counts["validated"] += 1
        except ConfigError as err:
            counts["refused"] += 1
            msg = str(err)
            if "\n" in msg or not _names_the_key(msg, path):
                unnamed.append((kind, path, msg))
        except Exception as err:  # noqa: BLE001  (what a user would see as a traceback)
            escaped.append((kind, path, f"{type(err).__name__}: {err}"))
    with capsys.disabled():
        print(f"\nconfig fuzzer (seed {SEED}): {CASES} cases, {counts['validated']} validated, "
              f"{counts['refused']} refused in one line naming the key, {len(escaped)} tracebacks")
    assert not escaped, escaped[:5]
    assert not unnamed, unnamed[:5]
    assert counts["refused"] > CASES // 2  # the fuzzer is not vacuous: most mutations are errors


def test_no_finite_number_is_passed_as_nan_or_infinity():
    """NaN passes every ``minimum`` of a JSON Schema (each comparison is false): refused by name."""
    base = yaml.safe_load((ROOT / "config.yaml").read_text())
    for value in (float("nan"), float("inf")):
        cfg = copy.deepcopy(base)
        cfg["train"]["lr"] = value
        with pytest.raises(ConfigError, match=r"^train\.lr: "):
            validate_config(cfg)


def test_every_integer_written_as_a_float_is_refused_naming_the_key():
    """JSON Schema's integer takes 128.0; the code then slices or counts with it (draft_vocab's
    ``TypeError: slice indices must be integers``). Every integer of config.yaml, and every item
    of an integer list, written with a decimal point is refused in one line naming its key."""
    base = yaml.safe_load((ROOT / "config.yaml").read_text())
    places, schema = [], load_schema()
    for path, value in _leaves(base):
        rule = schema
        for k in path:
            rule = rule.get("properties", {}).get(k, {})
        if isinstance(value, int) and not isinstance(value, bool):
            places.append((path, float(value)))
        elif value and isinstance(value, list) and "integer" in str(rule.get("items", {}).get("type")):
            places.append((path, [float(value[0]), *value[1:]]))
    assert ("drafter", "draft_vocab_size") in [p for p, _ in places] and len(places) > 20
    for path, value in places:
        cfg = copy.deepcopy(base)
        _set(cfg, path, value)
        key = ".".join(map(str, path)) + (".0" if isinstance(value, list) else "")
        with pytest.raises(ConfigError) as err:
            validate_config(cfg, schema)
        assert str(err.value).startswith(f"{key}: ") and "without the decimal point" in str(err.value), str(err.value)


def _refused_cases(n: int) -> list[tuple[str, str, dict]]:
    """The first ``n`` fuzzed cases that the config check refuses."""
    base = yaml.safe_load((ROOT / "config.yaml").read_text())
    found = []
    for kind, path, cfg in mutations(base, CASES, SEED + 1):
        try:
            validate_config(cfg)
        except ConfigError:
            found.append((kind, path, cfg))
        if len(found) == n:
            break
    return found


@pytest.mark.parametrize("kind,path,cfg", _refused_cases(3), ids=lambda v: v if isinstance(v, str) else "")
def test_snakemake_refuses_a_fuzzed_config_before_any_job(kind, path, cfg, tmp_path):
    """Through Snakemake, with the fuzzed config as config.yaml: one 'config error:' line naming
    the key, no traceback, no job planned."""
    repo = copy_repo(tmp_path)
    (repo / "config.yaml").write_text(yaml.safe_dump(cfg))
    out = run_snakemake(repo, "-n", "reports/model_card.md", check=False)
    text = out.stdout + out.stderr
    errors = [ln for ln in text.splitlines() if ln.startswith("config error:")]
    assert out.returncode != 0 and len(errors) == 1, text[-2000:]
    assert _names_the_key(errors[0].removeprefix("config error: "), path), errors[0]
    assert "Traceback" not in text and "Job stats" not in text
