"""A rank's entries in one group, read as the calls it made: one entry, or a batch and its closing entry.

torch numbers a group's collectives (``collective_seq_id``) and point-to-point ops (``p2p_seq_id``) once
per kernel launch, so the parts of a batch share their closing entry's number. Within one group and
in record order, a run of entries with the same number that ends in a ``coalesced``/``*_coalesced``
entry is one call (torch's analyzer groups them the same way, ``find_coalesced_group``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from mtpdiag.inputs.flight_recorder.names import batch_op, parse_profiling_name
from mtpdiag.model import Site
from mtpdiag.model.flight_recorder import FREntry, FRRankDump


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


def batches(entries: Iterable[FREntry]) -> list[tuple[FREntry, ...]]:
    """One group's entries (record order) cut into calls: a single entry, or a batch's parts + closer."""
    out: list[tuple[FREntry, ...]] = []
    run: list[FREntry] = []
    for e in entries:
        if run and _same_number(run[0], e):
            run.append(e)
            if parse_profiling_name(e.profiling_name).closes_batch:
                out.append(tuple(run))
                run = []
            continue
        out.extend((x,) for x in run)
        run = [e]
    out.extend((x,) for x in run)
    return out


def _same_number(first: FREntry, e: FREntry) -> bool:
    """Whether ``e`` shares ``first``'s launch: the closing ``coalesced`` entry of a p2p batch may carry
    either flag, so it is matched by the number its run is counted by."""
    if first.is_p2p:
        return e.p2p_seq_id == first.p2p_seq_id and (e.is_p2p or e.collective_seq_id in (0, first.collective_seq_id))
    return not e.is_p2p and e.collective_seq_id == first.collective_seq_id


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
