"""mtpdiag: find the collective only part of a process group entered, and why."""

__version__ = "0.1.0"
