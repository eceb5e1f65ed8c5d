"""The Flight Recorder's account of a hang (pure): match every rank's record per process group, find where
each group first diverged, tell a rank that skipped a call from one that is behind, and hold it all against
the stacks.

* ``match``: per group, the first sequence number where members disagree (``match_groups``), as ``results``;
* ``order``: whether a rank absent from a call skipped it (root) or is behind (consequence);
* ``progress``: how far each member of each group got;
* ``correlate``: the recorder's view next to a stack diagnosis, and where the two disagree;
* ``evidence``: all of it folded into what ``diagnose`` works with (splits, size problems, pending ops).
"""

from mtpdiag.analysis.flight_recorder.correlate import correlate, ops_match
from mtpdiag.analysis.flight_recorder.match import match_groups, mismatches
from mtpdiag.analysis.flight_recorder.order import AbsentWhy
from mtpdiag.analysis.flight_recorder.progress import GroupProgress, group_progress
from mtpdiag.analysis.flight_recorder.results import (
    Divergence,
    FRAnalysis,
    FRCallSplit,
    GroupMatch,
    P2PMismatch,
    RankAt,
)

__all__ = [
    "AbsentWhy",
    "Divergence",
    "FRAnalysis",
    "FRCallSplit",
    "GroupMatch",
    "GroupProgress",
    "P2PMismatch",
    "RankAt",
    "correlate",
    "group_progress",
    "match_groups",
    "mismatches",
    "ops_match",
]
