"""The Flight Recorder's data as mtpdiag keeps it: typed, frozen, JSON-able without torch.

What a bundle carries (``mtpdiag.fr/1``) is these types: per rank the version, the groups (``pg_config``),
torch's progress counters (``pg_status``) and the entries with their sizes, dtypes, states and call stacks.
Nothing else of the dump is kept (no thread names or ids, no ``nccl_comm_state``, no environment).
On the wire a rank's distinct stacks are stored once (``FRRankDump.stacks``) and each entry names its
stack by index (``FREntry.stack``): a rank repeats a few stacks thousands of times. ``packed`` makes that
form, and decoding unpacks it again, so that in memory every entry holds its own ``frames``.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import msgspec

from mtpdiag.model.fields import Record, decode_error
from mtpdiag.model.frames import Site

FR_SCHEMA = "mtpdiag.fr/1"


class FRFrame(Record, frozen=True, array_like=True):
    """A stack's frame on the wire: ``[file, line, function]``."""

    file: str
    line: int
    function: str


class FRGroup(Record, frozen=True):
    """A process group as one rank's ``pg_config`` describes it. ``ranks`` is empty when unrecorded.

    ``ranks`` is sorted; ``order`` is the recorded order (group rank i is ``order[i]``), kept only when
    it differs from ``ranks``.
    """

    name: str
    desc: str
    ranks: tuple[int, ...]
    order: tuple[int, ...] = ()

    def global_rank(self, local: int | None) -> int | None:
        """The global rank of group rank ``local`` (what ``nccl:send 1->0`` names), if known."""
        ranks = self.order or self.ranks
        if local is None or not 0 <= local < len(ranks):
            return None
        return ranks[local]


class FREntry(Record, frozen=True, kw_only=True):
    """One recorded op, as torch's writer fills it (FlightRecorderDetail.hpp ``getCollectiveTrace``).

    ``state`` is torch's (scheduled | started | completed) except for the parts of a batch, which have
    no events of their own and take their closing entry's state (``in_batch``). ``done``: completed, or
    retired by a backend without events (gloo). ``timed_out``: retired by NCCL's watchdog before its end
    event fired (torch: "a retired but not completed event has timed out"). ``src``/``dst`` are the global
    ranks of a send/recv. ``frames`` is the Python stack when it was issued, innermost first; ``site`` is
    the first of them outside torch and decorator plumbing.
    """

    record_id: int
    group: str
    group_desc: str
    op: str
    profiling_name: str
    collective_seq_id: int
    p2p_seq_id: int
    is_p2p: bool
    state: str
    done: bool
    input_sizes: tuple[tuple[int, ...], ...]
    output_sizes: tuple[tuple[int, ...], ...]
    site: Site | None
    pg_id: int = -1
    op_id: int = 0
    input_dtypes: tuple[str, ...] = ()
    output_dtypes: tuple[str, ...] = ()
    time_created_ns: int = 0
    timeout_ms: int | None = None
    duration_ms: float | None = None
    retired: bool = False
    timed_out: bool = False
    backend: str = ""
    src: int | None = None
    dst: int | None = None
    in_batch: bool = False
    frames: tuple[Site, ...] = ()
    stack: int = -1  # on the wire only: the index of ``frames`` in the rank's ``stacks``

    @property
    def seq(self) -> int:
        """The sequence number this entry is matched by: ``p2p_seq_id`` for send/recv, else collective."""
        return self.p2p_seq_id if self.is_p2p else self.collective_seq_id

    @property
    def input_numel(self) -> int:
        return sum(_numel(s) for s in self.input_sizes)

    @property
    def output_numel(self) -> int:
        return sum(_numel(s) for s in self.output_sizes)


class FRGroupStatus(Record, frozen=True, kw_only=True):
    """torch's per-group counters (``pg_status``); they survive the ring buffer dropping entries.

    ``group`` is the group name when an entry of the same ``pg_id`` names it, else "".
    -1 means none (torch's value before the first op, and for "started" without timing).
    """

    group: str
    last_enqueued: int
    last_completed: int
    last_started: int = -1
    pg_id: int = -1


class FRRankDump(Record, frozen=True, kw_only=True):
    """One rank's dump. ``notes`` say what could not be read fully (an unknown minor version)."""

    rank: int
    path: str
    version: str
    groups: tuple[FRGroup, ...]
    entries: tuple[FREntry, ...]
    status: tuple[FRGroupStatus, ...] = ()
    format: str = "pickle"  # pickle | json | bundle
    notes: tuple[str, ...] = ()

    def group(self, name: str) -> FRGroup | None:
        return next((g for g in self.groups if g.name == name), None)

    # On the wire only (see the module): the distinct stacks, each entry's ``stack`` an index into them.
    stacks: tuple[tuple[FRFrame, ...], ...] = ()

    def __post_init__(self) -> None:
        if self.stacks:  # decoded from a bundle: each entry gets its frames back
            table = [tuple(Site(f.file, f.line, f.function) for f in stack) for stack in self.stacks]
            try:
                entries = tuple(
                    msgspec.structs.replace(e, frames=table[e.stack], stack=-1) if e.stack >= 0 else e
                    for e in self.entries
                )
            except IndexError:
                raise ValueError(f"rank {self.rank}: an entry names a stack beyond the {len(table)} stored") from None
            msgspec.structs.force_setattr(self, "entries", entries)
            msgspec.structs.force_setattr(self, "stacks", ())

    def packed(self) -> FRRankDump:
        """This dump as a bundle stores it: each distinct stack once, the entries naming theirs by index."""
        index: dict[tuple[Site, ...], int] = {}
        entries = tuple(
            msgspec.structs.replace(e, frames=(), stack=index.setdefault(e.frames, len(index))) for e in self.entries
        )
        stacks = tuple(tuple(FRFrame(f.file, f.line, f.function) for f in stack) for stack in index)
        out = msgspec.structs.replace(self, entries=entries, format="bundle")
        msgspec.structs.force_setattr(out, "stacks", stacks)  # not through __init__: that would unpack it
        return out


class FRDump(Record, frozen=True, kw_only=True, tag_field="schema", tag=FR_SCHEMA):
    """Every rank's dump of one job, sorted by rank. ``missing`` lists ranks whose dump was expected
    (a member of some recorded group) but not found; ``notes`` what the loader wants said."""

    source: str
    ranks: tuple[FRRankDump, ...]
    missing: tuple[int, ...] = ()
    notes: tuple[str, ...] = ()

    def rank(self, rank: int) -> FRRankDump | None:
        return next((r for r in self.ranks if r.rank == rank), None)

    @property
    def version(self) -> str:
        return next((d.version for d in self.ranks if d.version), "")

    def __post_init__(self) -> None:
        if any(a.rank > b.rank for a, b in pairwise(self.ranks)):
            msgspec.structs.force_setattr(self, "ranks", tuple(sorted(self.ranks, key=lambda r: r.rank)))

    def packed(self) -> FRDump:
        """The dumps as a bundle stores them (``FRRankDump.packed``)."""
        return msgspec.structs.replace(self, ranks=tuple(r.packed() for r in self.ranks))

    @staticmethod
    def from_dict(d: Any) -> FRDump:
        """The dumps of an ``mtpdiag.fr/1`` document; SchemaError (one line) for anything else."""
        try:
            return msgspec.convert(d, FRDump)
        except msgspec.ValidationError as exc:
            raise decode_error(exc) from None


def expected_ranks(ranks: tuple[FRRankDump, ...]) -> tuple[int, ...]:
    """Every rank some dump names as a group member (the job's ranks, as far as the dumps know)."""
    return tuple(sorted({r for d in ranks for g in d.groups for r in g.ranks} | {d.rank for d in ranks}))


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for x in shape:
        n *= x
    return n


def as_int(value: Any) -> int:
    """``value`` if it is an int (not a bool), else TypeError: torch writes every number as an int."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    return value


def as_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected a boolean, got {type(value).__name__}")
    return value
