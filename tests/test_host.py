"""``verifier.dtype: auto``: the CPU's matrix units read from /proc/cpuinfo's text, and the dtype
they make fast; the config gate hands every job the dtype chosen, never "auto"."""

import copy

import pytest
import yaml

from domino.config import validate_config
from domino.host import auto_dtype, cpu_units

AVX2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu sse2 avx avx2 fma\n"
SPR = "flags\t\t: avx2 avx512f avx512_bf16 amx_tile amx_bf16 amx_int8\n"
CPX = "flags\t\t: avx2 avx512f avx512_bf16\n"


@pytest.mark.parametrize("text, units, cpu, gpu", [
    (AVX2, ["avx2"], "float32", "bfloat16"),
    (SPR, ["amx_bf16", "avx512_bf16", "avx512f", "avx2"], "bfloat16", "bfloat16"),
    (CPX, ["avx512_bf16", "avx512f", "avx2"], "bfloat16", "bfloat16"),
    ("", [], "float32", "bfloat16"),
])
def test_units_and_the_dtype_they_choose(text, units, cpu, gpu):
    assert cpu_units(text) == units
    assert auto_dtype("cpu", units) == cpu
    assert auto_dtype("cuda:0", units) == gpu


def test_the_gate_hands_jobs_this_machines_dtype():
    with open("config.yaml") as f:
        cfg = yaml.safe_load(f)
    cfg = copy.deepcopy(cfg)
    cfg["verifier"]["dtype"] = "auto"
    out = validate_config(cfg)
    assert out["verifier"]["dtype"] == auto_dtype("cpu", cpu_units()) != "auto"
    with open("config/smollm2.yaml") as f:
        assert yaml.safe_load(f)["verifier"]["dtype"] == "auto"
