"""Domino: DFlash parallel drafting with a GRU correction head, and the tools to reproduce it."""

__version__ = "0.1.0"
