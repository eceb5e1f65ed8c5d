"""What the files of one ``analyze`` say together: one Snapshot, after checking they agree.

The same rank in two files, or two different world sizes, is an input error naming both files.
"""

from __future__ import annotations

from itertools import chain
from operator import attrgetter

from mtpdiag import __version__
from mtpdiag.errors import InputError
from mtpdiag.inputs.base import FileCaptures
from mtpdiag.model import UNKNOWN_HOST, RankCapture, Snapshot, world_sizes
from mtpdiag.model.flight_recorder import FRDump, FRRankDump


def check_world_sizes(loaded: list[FileCaptures], sizes: list[int] | None = None) -> None:
    """Two different WORLD_SIZEs are an input error naming the files. ``sizes``: the distinct sizes of all the
    files' captures, when known (``Snapshot.world_sizes``): fewer than two spare the walk over every file."""
    if sizes is not None and len(sizes) < 2:
        return
    first: tuple[int, str] | None = None
    for item in loaded:
        for size in world_sizes(item.captures):
            if first is None:
                first = (size, item.path)
            elif size != first[0]:
                where = (
                    f"{item.path} says both {first[0]} and {size}"
                    if item.path == first[1]
                    else f"{first[1]} says {first[0]}, {item.path} says {size}"
                )
                raise InputError(f"world sizes differ: {where}")


def check_duplicate_ranks(loaded: list[FileCaptures], captures: tuple[RankCapture, ...] | None = None) -> None:
    """A rank in two files, or twice in a file that is not a bundle, is an input error naming the files.
    ``captures``: all the files' captures, when at hand: when no two carry one rank, the files are not walked
    (read in C, 3 ms at 16k ranks; the walk is 8 ms)."""
    if captures is not None:
        every = list(map(attrgetter("rank"), captures))
        distinct = set(every)
        distinct.discard(None)
        if len(distinct) == len(every) - every.count(None):
            return
    owner: dict[int, str] = {}
    for item in loaded:
        ranks: dict[int, int] = {}
        for c in item.captures:
            if c.rank is not None:
                ranks[c.rank] = ranks.get(c.rank, 0) + 1
        for rank in sorted(ranks):
            if rank in owner:
                raise InputError(f"rank {rank} is in two files: {owner[rank]} and {item.path}")
            if ranks[rank] > 1 and item.snapshot is None:
                raise InputError(
                    f"rank {rank} is in {item.path} {ranks[rank]} times (different processes "
                    "name the same rank: pass --rank-from REGEX to say which line names a rank)"
                )
            owner[rank] = item.path


def merge(loaded: list[FileCaptures], errors: list[str]) -> Snapshot:
    captures = tuple(chain.from_iterable(item.captures for item in loaded))
    bundles = [item.snapshot for item in loaded if item.snapshot is not None]
    hosts = set(map(attrgetter("host"), captures))  # read in C: 16k ranks
    hosts.discard(UNKNOWN_HOST)
    created = sorted(b.created for b in bundles if b.created)
    bundle_errors = [e for b in bundles for e in b.errors]
    return Snapshot(
        captures=_by_rank(captures),
        host=",".join(sorted(hosts)) if hosts else UNKNOWN_HOST,
        created=created[0] if created else "",
        tool_version=__version__,
        errors=tuple(bundle_errors + errors),
        flight_recorder=merged_flight_recorder([b.flight_recorder for b in bundles if b.flight_recorder]),
    )


def _by_rank(captures: tuple[RankCapture, ...]) -> tuple[RankCapture, ...]:
    """The captures by rank (unranked last), then by file and pid. When every capture has a rank of its own,
    the rank alone orders them, and is read by ``attrgetter`` rather than a key function (16k ranks)."""
    ranks = set(map(attrgetter("rank"), captures))
    if len(ranks) == len(captures) and None not in ranks:
        return tuple(sorted(captures, key=attrgetter("rank")))
    return tuple(sorted(captures, key=lambda c: (c.rank is None, c.rank or 0, c.source or "", c.pid or 0)))


def merged_flight_recorder(parts: list[FRDump]) -> FRDump | None:
    """The Flight Recorder dumps that several hosts' bundles carry, as one set (a rank's first dump wins)."""
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    ranks: dict[int, FRRankDump] = {}
    for part in parts:
        for dump in part.ranks:
            ranks.setdefault(dump.rank, dump)
    dumped = set(ranks)
    missing = sorted({r for p in parts for r in p.missing} - dumped)
    notes = tuple(dict.fromkeys(n for p in parts for n in p.notes if not n.startswith("no Flight Recorder dump")))
    return FRDump(
        source=", ".join(dict.fromkeys(p.source for p in parts)),
        ranks=tuple(ranks[r] for r in sorted(ranks)),
        missing=tuple(missing),
        notes=notes,
    )
