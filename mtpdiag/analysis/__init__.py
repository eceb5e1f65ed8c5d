"""Pure analysis: a Snapshot (and an optional layout) in, a Report out. No I/O, no torch."""

from mtpdiag.analysis.diagnose import diagnose

__all__ = ["diagnose"]
