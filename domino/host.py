"""What this machine is, read without torch (the workflow reads it when it plans a run): the CPU's
matrix units, and the verifier dtype they make fast (``verifier.dtype: auto``)."""

from __future__ import annotations

# The CPU instructions that decide whether bf16 matrix products are fast here: with AMX or
# AVX512-BF16 a bf16 product runs at or above float32's speed; with AVX2 alone it is emulated and
# runs several times slower (docs/log/2026-12-02-smollm2-quick.md).
BF16_UNITS = ("amx_bf16", "avx512_bf16")
CPU_UNITS = (*BF16_UNITS, "avx512f", "avx2")  # the flags a results file names, widest first


def cpu_units(cpuinfo: str | None = None) -> list[str]:
    """The flags of ``CPU_UNITS`` this CPU has, in that order (``/proc/cpuinfo``'s first ``flags``
    line, or ``cpuinfo``'s text); [] where there is no such file."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return []
    line = next((ln for ln in cpuinfo.splitlines() if ln.startswith("flags")), "")
    flags = set(line.partition(":")[2].split())
    return [u for u in CPU_UNITS if u in flags]


def auto_dtype(device: str, units: list[str]) -> str:
    """``verifier.dtype: auto``: bfloat16 on a GPU or on a CPU with bf16 matrix units
    (``BF16_UNITS``), float32 otherwise."""
    return "bfloat16" if device.startswith("cuda") or any(u in BF16_UNITS for u in units) else "float32"
