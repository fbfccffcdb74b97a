"""Helpers every part of the project shares: dtypes, the process set-up of a stage, the
hardware description and data-parallel set-up.

Nothing here knows about drafters, verifiers or the workflow; it is the neutral module that
the library, the stage layer and the tools import.
"""

from __future__ import annotations

import os
import platform
import time
from contextlib import contextmanager

import torch

from .host import cpu_units

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def setup_process(seed: int, threads: int | None) -> None:
    """Seed torch, fix the CPU thread count and ask for deterministic kernels."""
    torch.manual_seed(seed)
    if threads:
        torch.set_num_threads(int(threads))
    torch.use_deterministic_algorithms(True, warn_only=True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def check_device(device: str) -> str:
    """``device`` itself, or a one-line refusal when CUDA is asked for and none is visible."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("config device is 'cuda' but no CUDA device is visible")
    return device


def hardware() -> str:
    """The accelerator's name, or the CPU with its core and thread counts and its matrix units
    (``cpu_units``: the ones that decide whether bf16 is fast)."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    threads = torch.get_num_threads()
    units = ", ".join(cpu_units()) or "no AVX2"
    return (f"CPU {platform.machine()} ({os.cpu_count()} cores, {threads} torch thread{'s' if threads != 1 else ''}; "
            f"{units})")


LOADED_SHARE = 0.10  # other processes' share of the machine's CPU time above which timings are marked as loaded


def busy_cpu_seconds() -> float | None:
    """CPU seconds every process of the machine has spent busy since boot (``/proc/stat``), or None
    where there is no such file."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


class MachineLoad:
    """What else the machine did while a block of code ran: the load average before and after, and
    the other processes' share of the machine's CPU time (busy CPU time of the whole machine less
    this process's, over wall time x CPUs). ``record()`` after the block; None fields where the
    operating system does not say."""

    def __init__(self):
        self.cpus = os.cpu_count() or 1
        self.load_before = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
        self.busy0, self.own0, self.wall0 = busy_cpu_seconds(), time.process_time(), time.perf_counter()

    def record(self, resumed: list[tuple[float | None, float]] = ()) -> dict:
        """``resumed``: (other processes' busy CPU seconds, wall seconds) of each prompt that an
        earlier process of a resumed job timed (``domino.bench.timing.Journal``), counted in the
        share with this process's own time; the load averages are this process's."""
        wall, own = time.perf_counter() - self.wall0, time.process_time() - self.own0
        busy = busy_cpu_seconds()
        share, other = None, None if busy is None or self.busy0 is None else busy - self.busy0 - own
        if other is not None and all(o is not None for o, _ in resumed):
            other += sum(o for o, _ in resumed)
            wall += sum(w for _, w in resumed)
            share = min(1.0, max(0.0, other / (wall * self.cpus))) if wall > 0 else None
        return {"cpus": self.cpus, "load_average_before": self.load_before,
                "load_average_after": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
                "other_processes_share": share, "loaded": None if share is None else share > LOADED_SHARE,
                **({"resumed_prompts": len(resumed)} if resumed else {})}


def world_size() -> int:
    """Processes of a torchrun launch (1 without torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


@contextmanager
def distributed(device: str):
    """Data-parallel set-up around a training run; yields the device this process uses.

    Without torchrun (``WORLD_SIZE`` unset or 1) it does nothing. Under torchrun it starts the
    process group: nccl with one GPU per process on CUDA, gloo on CPU.
    """
    if world_size() == 1:
        yield device
        return
    import torch.distributed as dist

    cuda = device.startswith("cuda")
    dist.init_process_group("nccl" if cuda else "gloo")
    if cuda:
        device = f"cuda:{os.environ.get('LOCAL_RANK', '0')}"
        torch.cuda.set_device(device)
    try:
        yield device
    finally:
        dist.destroy_process_group()
