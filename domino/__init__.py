"""Domino: DFlash parallel drafting with a GRU correction head, and the tools to reproduce it."""

import os

# OpenMP threads that spin while they wait take the core another process needs: beside one busy
# core a 2-thread CPU job then runs tens of times slower. Waiting threads sleep instead. OpenMP
# reads this once, when torch loads it, so it is set here, before any module imports torch; an
# OMP_WAIT_POLICY or GOMP_SPINCOUNT already in the environment wins (README "Threads";
# python -m domino.tools.bench_threads measures the policies).
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

__version__ = "0.1.0"
