"""A rank's entries in one group, read as the calls it made: one entry, or a batch and its closing entry
(``model.fr_batches`` says which entries make one call)."""

from __future__ import annotations

from dataclasses import dataclass

from mtpdiag.model import Site
from mtpdiag.model.flight_recorder import FREntry, FRRankDump
from mtpdiag.model.fr_batches import batches
from mtpdiag.vocabulary.profiling_names import batch_op, parse_profiling_name


@dataclass(frozen=True)
class Call:
    """One op a rank issued in a group at one sequence number. ``entries``: the parts, then the closer."""

    rank: int
    group: str
    p2p: bool
    seq: int
    op: str
    entries: tuple[FREntry, ...]

    @property
    def closer(self) -> FREntry:
        return self.entries[-1]

    @property
    def parts(self) -> tuple[FREntry, ...]:
        return self.entries[:-1] if len(self.entries) > 1 else self.entries

    @property
    def state(self) -> str:
        return self.closer.state

    @property
    def done(self) -> bool:
        return self.closer.done

    @property
    def timed_out(self) -> bool:
        return self.closer.timed_out

    @property
    def record_id(self) -> int:
        return self.closer.record_id

    @property
    def first_record_id(self) -> int:
        return self.entries[0].record_id

    @property
    def site(self) -> Site | None:
        """The parts' call site: a batch's closing entry is recorded where the batch ends, not where it began."""
        return next((e.site for e in self.parts if e.site is not None), self.closer.site)

    @property
    def frames(self) -> tuple[Site, ...]:
        return next((e.frames for e in self.parts if e.frames), self.closer.frames)

    @property
    def input_numel(self) -> int:
        return sum(e.input_numel for e in self.parts)

    @property
    def output_numel(self) -> int:
        return sum(e.output_numel for e in self.parts)

    @property
    def input_sizes(self) -> tuple[tuple[int, ...], ...]:
        return tuple(s for e in self.parts for s in e.input_sizes)

    @property
    def output_sizes(self) -> tuple[tuple[int, ...], ...]:
        return tuple(s for e in self.parts for s in e.output_sizes)

    @property
    def input_dtypes(self) -> frozenset[str]:
        return frozenset(d for e in self.parts for d in e.input_dtypes)

    @property
    def output_dtypes(self) -> frozenset[str]:
        return frozenset(d for e in self.parts for d in e.output_dtypes)

    @property
    def time_created_ns(self) -> int:
        return self.entries[0].time_created_ns

    @property
    def profiling_name(self) -> str:
        return self.closer.profiling_name


def group_calls(dump: FRRankDump, group: str) -> tuple[Call, ...]:
    """Every call ``dump``'s rank made in ``group``, in record order."""
    mine = sorted((e for e in dump.entries if e.group == group), key=lambda e: e.record_id)
    return tuple(call_of(dump.rank, b) for b in batches(mine))


def call_of(rank: int, entries: tuple[FREntry, ...]) -> Call:
    closer = entries[-1]
    p2p = entries[0].is_p2p
    if len(entries) > 1:
        op = batch_op(parse_profiling_name(closer.profiling_name).type, [e.op for e in entries[:-1]])
    else:
        op = closer.op
    return Call(rank=rank, group=closer.group, p2p=p2p, seq=entries[0].seq, op=op, entries=entries)
