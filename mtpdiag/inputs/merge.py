"""What the files of one ``analyze`` say together: one Snapshot, after checking they agree.

* Two different world sizes are an input error naming both files.
* One rank in several files (a py-spy JSON and a text dump of one capture, the Python and the ``--native``
  dump, a bundle and a raw dump) is one capture when the captures are of one process (same host and pid,
  where both say) with the same Python stacks: the richest is kept (native frames, then kept arguments, then
  full paths, then a /proc state) and what it lacks (pid, host, state, whitelisted environment keys, layout
  hints, kept arguments) is taken from the others. No note: nothing was lost or chosen.
* Captures of one rank that differ (two moments, two jobs, two processes claiming it) are all kept, and the
  snapshot records a ``RankConflict`` naming their files; the report says it in a note. The group analysis
  reads the capture of the first file named (a directory's files by name) that holds a stack: reorder or
  leave out files to choose. Never a refusal of the whole input.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from itertools import chain, groupby
from operator import attrgetter, itemgetter

from mtpdiag import __version__
from mtpdiag.errors import InputError
from mtpdiag.inputs.base import FileCaptures
from mtpdiag.model import (
    STATE_UNKNOWN,
    STATE_UNREADABLE,
    UNKNOWN_HOST,
    Env,
    Frame,
    FrameArgs,
    RankCapture,
    Snapshot,
    ThreadStack,
    replace,
    world_sizes,
)
from mtpdiag.model.captures import RankConflict
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


def merge(loaded: list[FileCaptures], errors: list[str]) -> Snapshot:
    captures, conflicts = one_per_rank(loaded)
    bundles = [item.snapshot for item in loaded if item.snapshot is not None]
    hosts = set(map(attrgetter("host"), captures))  # read in C: 16k ranks
    hosts.discard(UNKNOWN_HOST)
    created = sorted(b.created for b in bundles if b.created)
    bundle_errors = [e for b in bundles for e in b.errors]
    return Snapshot(
        captures=captures,
        host=",".join(sorted(hosts)) if hosts else UNKNOWN_HOST,
        created=created[0] if created else "",
        tool_version=__version__,
        errors=tuple(bundle_errors + errors),
        flight_recorder=merged_flight_recorder([b.flight_recorder for b in bundles if b.flight_recorder]),
        conflicts=conflicts,
    )


def one_per_rank(loaded: list[FileCaptures]) -> tuple[tuple[RankCapture, ...], tuple[RankConflict, ...]]:
    """The files' captures by rank (unranked last, by file and pid), a rank in several captures settled as the
    module says. When no two captures carry one rank (read in C, 3 ms at 16k ranks), the rank alone orders them,
    read by ``attrgetter`` rather than a key function."""
    captures = tuple(chain.from_iterable(item.captures for item in loaded))
    ranks = list(map(attrgetter("rank"), captures))
    distinct = set(ranks)
    distinct.discard(None)
    if len(distinct) == len(ranks) - ranks.count(None):
        if None not in ranks:
            return tuple(sorted(captures, key=attrgetter("rank"))), ()
        return tuple(sorted(captures, key=_unranked_last)), ()
    indexed = [(i, c) for i, item in enumerate(loaded) for c in item.captures]
    ranked = sorted((x for x in indexed if x[1].rank is not None), key=lambda x: (x[1].rank, x[0], x[1].pid or 0))
    unranked = sorted((c for _, c in indexed if c.rank is None), key=_unranked_last)
    bundles = {item.path for item in loaded if item.snapshot is not None}
    out: list[RankCapture] = []
    conflicts: list[RankConflict] = []
    for rank, group in groupby(map(itemgetter(1), ranked), key=attrgetter("rank")):
        kept, conflict = _one_rank(rank, list(group), bundles)
        out += kept
        if conflict is not None:
            conflicts.append(conflict)
    return (*out, *unranked), tuple(conflicts)


def _unranked_last(c: RankCapture) -> tuple[bool, int, str, int]:
    return (c.rank is None, c.rank or 0, c.source or "", c.pid or 0)


def _one_rank(rank: int, group: list[RankCapture], bundles: set[str]) -> tuple[list[RankCapture], RankConflict | None]:
    """One capture for a rank whose captures are all of one process and moment; else each distinct one, the one
    the group analysis reads first (the first with a stack, in the order the files were named), and the
    conflict that names them."""
    alike: list[list[RankCapture]] = []
    for capture in group:
        same = next((a for a in alike if _same_capture(a[0], capture)), None)
        if same is None:
            alike.append([capture])
        else:
            same.append(capture)
    kept = [_richest(a) for a in alike]
    if len(kept) == 1:
        return kept, None
    used = next((k for k in kept if k.threads), kept[0])
    kept = [used, *(k for k in kept if k is not used)]
    return kept, RankConflict(rank=rank, sources=_labels(kept), why=_what_differs(kept, bundles))


def _same_capture(a: RankCapture, b: RankCapture) -> bool:
    """Of one process (same host and pid, where both say) and the same Python stacks."""
    if UNKNOWN_HOST not in (a.host, b.host) and a.host != b.host:
        return False
    if a.pid is not None and b.pid is not None and a.pid != b.pid:
        return False
    return _python_stacks(a) == _python_stacks(b)


FrameKey = tuple[str, str, int]


def _frame_key(f: Frame) -> FrameKey:
    return (f.function.rsplit(".", 1)[-1], os.path.basename(f.file), f.line)


def _python_stacks(c: RankCapture) -> list[tuple[FrameKey, ...]]:
    """Each thread's Python frames as every reader spells them: the function's own name (pystack and
    faulthandler leave out the class), the file's base name (py-spy's text shows its short name), the line. The
    threads are compared as a set: py-spy's text names a thread by its native id, its JSON by pthread's."""
    stacks = (tuple(map(_frame_key, _python(t))) for t in c.threads)
    return sorted(s for s in stacks if s)


def _richness(c: RankCapture) -> tuple[bool, bool, int, bool]:
    """Native frames, then kept arguments, then how many Python frames name their file by a path (py-spy's text
    shortens all but site-packages' to a base name), then a /proc state."""
    frames = [f for t in c.threads for f in t.frames]
    return (
        any(f.native for f in frames),
        any(f.args is not None for f in frames),
        sum("/" in f.file for f in frames if not f.native),
        c.state not in (STATE_UNKNOWN, STATE_UNREADABLE),
    )


def _richest(alike: list[RankCapture]) -> RankCapture:
    """The richest of captures of one moment (the first named of equals), with what it lacks from the others."""
    if len(alike) == 1:
        return alike[0]
    kept = max(alike, key=_richness)
    for other in alike:
        if other is not kept:
            kept = _filled_from(kept, other)
    return kept


def _filled_from(kept: RankCapture, other: RankCapture) -> RankCapture:
    """``kept`` with what only ``other`` says of the same process: its pid, host and /proc facts, whitelisted
    environment keys, layout hints, and the kept arguments of the Python frames both show."""
    return replace(
        kept,
        pid=kept.pid if kept.pid is not None else other.pid,
        host=kept.host if kept.host != UNKNOWN_HOST else other.host,
        state=other.state if kept.state == STATE_UNKNOWN and other.state != STATE_UNREADABLE else kept.state,
        env=Env.of({**other.env.as_dict(), **kept.env.as_dict()}),
        layout_hints=kept.layout_hints or other.layout_hints,
        main_syscall=kept.main_syscall if kept.main_syscall is not None else other.main_syscall,
        cuda=kept.cuda if kept.cuda is not None else other.cuda,
        main_cpu_ticks=kept.main_cpu_ticks if kept.main_cpu_ticks is not None else other.main_cpu_ticks,
        threads=_with_args_of(kept, other),
    )


def _with_args_of(kept: RankCapture, other: RankCapture) -> tuple[ThreadStack, ...]:
    """``kept``'s threads with what ``other``'s same threads (the same Python frames) add: the kept arguments
    (dst, src, ...) of their Python frames (``py-spy dump --locals`` and ``--native`` are often run one after the
    other), and what a live capture read of each (what its line calls, whether py-spy saw it active, its name
    and native id)."""
    same = {tuple(map(_frame_key, _python(t))): t for t in other.threads}
    out = []
    for thread in kept.threads:
        match = same.get(tuple(map(_frame_key, _python(thread))))
        if match is None:
            out.append(thread)
            continue
        args = {_frame_key(f): f.args for f in _python(match) if f.args is not None}
        out.append(
            replace(
                thread,
                frames=tuple(_given(f, args) for f in thread.frames) if args else thread.frames,
                calls=thread.calls or match.calls,
                active=thread.active if thread.active is not None else match.active,
                name=thread.name or match.name,
                native_id=thread.native_id if thread.native_id is not None else match.native_id,
            )
        )
    return tuple(out)


def _python(t: ThreadStack) -> list[Frame]:
    return [f for f in t.frames if not f.native]


def _given(f: Frame, args: dict[FrameKey, FrameArgs]) -> Frame:
    if f.native or f.args is not None:
        return f
    found = args.get(_frame_key(f))
    return f if found is None else replace(f, args=found)


def _labels(kept: Iterable[RankCapture]) -> tuple[str, ...]:
    """Each capture's file, and its pid where one file holds several of them."""
    kept = list(kept)
    sources = [c.source or "?" for c in kept]
    return tuple(
        f"{s} (pid {c.pid})" if sources.count(s) > 1 and c.pid is not None else s
        for s, c in zip(sources, kept, strict=True)
    )


def _what_differs(kept: list[RankCapture], bundles: set[str]) -> str:
    hosts = list(dict.fromkeys(c.host for c in kept if c.host != UNKNOWN_HOST))
    pids = list(dict.fromkeys(c.pid for c in kept if c.pid is not None))
    if len(hosts) > 1:
        why = "different hosts: " + ", ".join(hosts)
    elif len(pids) > 1:
        why = "different pids: " + ", ".join(map(str, pids))
    elif not all(c.threads for c in kept):
        why = "not every capture holds a stack"
    else:
        why = "different stacks"
    sources = [c.source for c in kept]
    if len(set(sources)) < len(sources) and not bundles.issuperset(s for s in sources if s is not None):
        why += "; processes in one file name the same rank: pass --rank-from REGEX to say which line names a rank"
    return why


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
