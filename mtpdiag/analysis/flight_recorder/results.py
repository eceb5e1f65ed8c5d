"""What matching the recorder across ranks finds, per group: where members first disagree, who issued what
there and who did not (and why), unmatched sends and receives.

The records are the report's (``model.fr_analysis``: their fields are the ``flight_recorder`` section's JSON);
this module names them for the analysis and reads a recorded ``Call`` into them.
"""

from __future__ import annotations

from mtpdiag.analysis.flight_recorder.calls import Call
from mtpdiag.model.fr_analysis import (
    AbsentWhy,
    Divergence,
    FRAnalysis,
    FRCallSplit,
    GroupMatch,
    P2PMismatch,
    RankAt,
    Signature,
    culprits,
)
from mtpdiag.model.fr_analysis import signature as _signature
from mtpdiag.model.fr_analysis import size_key as _size_key

__all__ = [
    "AbsentWhy",
    "Divergence",
    "FRAnalysis",
    "FRCallSplit",
    "GroupMatch",
    "P2PMismatch",
    "RankAt",
    "Signature",
    "culprits",
    "rank_at",
    "signature",
    "size_key",
]


def size_key(c: Call) -> tuple[int | None, int | None]:
    return _size_key(c.op, c.input_numel, c.output_numel)


def signature(c: Call) -> Signature:
    return _signature(c.op, c.input_numel, c.output_numel, c.input_dtypes, c.output_dtypes)


def rank_at(rank: int, call: Call | None, state: str, last_entered: int, last_completed: int, doing: str) -> RankAt:
    """A member at the divergent number, with the call it issued there (None: nothing)."""
    if call is None:
        return RankAt(rank=rank, state=state, last_entered=last_entered, last_completed=last_completed, doing=doing)
    return RankAt(
        rank=rank,
        state=state,
        last_entered=last_entered,
        last_completed=last_completed,
        doing=doing,
        op=call.op,
        profiling_name=call.profiling_name,
        site=call.site,
        input_numel=call.input_numel,
        output_numel=call.output_numel,
        input_sizes=call.input_sizes,
        output_sizes=call.output_sizes,
        input_dtypes=tuple(sorted(call.input_dtypes)),
        output_dtypes=tuple(sorted(call.output_dtypes)),
        record_id=call.record_id,
    )
