"""Which split collective of a deadlock cycle comes first in program order, read from the stacks.

Two ranks that wait in different collectives of one cycle are compared as LLNL STAT's prefix tree compares
stacks: outermost frame first, down to the deepest frame they share (same file and function, every frame
above it identical). The rank that stands at the later line of that frame has passed the earlier line, so the
collective the other rank waits in is one it went past without entering: the one it skipped, the root.

Line order is program order only within one run of that frame. Where the shared frame is a loop body, or
is called from one, the rank at the earlier line may be an iteration ahead instead: line order alone is
``possible``, never more, and the Flight Recorder's sequence numbers (``flight_recorder.order``) decide.
The known-site table adds what line order cannot: a function that returns before its collectives on part
of the group (its ``skip``, an early return on an empty metric tracker) explains how the ranks got past.

The work is per distinct pair of stacks (a cycle repeated over 4,096 data-parallel replicas compares two
stacks once), never per rank.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import compress
from operator import attrgetter

import msgspec

from mtpdiag.analysis.known_sites import skip_of
from mtpdiag.model import Frame, OrderFrame, OrderInstead, RankView, RootOrderDetails, Site, Stack
from mtpdiag.vocabulary.states import OrderSource
from mtpdiag.vocabulary.waits import Confidence


class Parting(msgspec.Struct, frozen=True, gc=False):
    """Where two stacks part: the deepest frame they share, and the line each of them stands at in it."""

    file: str
    function: str
    first: int  # the line of the stack given first
    second: int


class Passing(msgspec.Struct, frozen=True, gc=False):
    """What the stacks say of one split: did its absent ranks go past it?

    ``passed``: absent ranks that stand at a later line of the frame they share with an entered rank (they went
    past the collective without entering it); ``behind``: absent ranks at an earlier line (they have not got
    there). ``at``: where the first passing rank parted from the entered side. ``early_return``: the
    known-site table's words for how the entered side's code lets part of the group skip its collectives.
    """

    passed: tuple[int, ...] = ()
    behind: tuple[int, ...] = ()
    at: Parting | None = None
    early_return: str | None = None


class RootOrder(msgspec.Struct, frozen=True):
    """Why a root of a cycle comes first in program order: who went past it and where they wait, how we know
    (``source``) and how sure that is (``confidence``). ``at``: the shared frame and its two lines, when the
    stacks were compared; ``loop_caveat``: line order alone decided, which a loop could reverse."""

    source: OrderSource
    confidence: Confidence
    skipped_by: tuple[int, ...]
    instead_op: str | None = None
    instead_site: Site | None = None
    at: Parting | None = None
    early_return: str | None = None
    loop_caveat: bool = False
    contradicted: bool = False  # line order says the other way round (a loop explains it)

    def details(self) -> RootOrderDetails:
        """The finding's ``details.order``."""
        return RootOrderDetails(
            source=self.source,
            confidence=self.confidence,
            skipped_by=self.skipped_by,
            instead=OrderInstead(self.instead_op, self.instead_site),
            frame=OrderFrame(self.at.file, self.at.function, self.at.first, self.at.second) if self.at else None,
            early_return=self.early_return,
            loop_caveat=self.loop_caveat,
            contradicted=self.contradicted,
        )


def program_order(x: Sequence[Site | Frame], y: Sequence[Site | Frame]) -> str:
    """Where stack ``y`` lies relative to ``x`` (both outermost frame first): before | after | same | unknown.

    At the first frame that differs, the same function at a larger line means ``y`` comes later ("before"
    reads: x comes before y).
    """
    parting = part(x, y)
    if parting is None:
        return "same" if len(x) == len(y) and x and all(map(_same_place, x, y)) else "unknown"
    if parting.first == parting.second:
        return "unknown"
    return "before" if parting.first < parting.second else "after"


def part(x: Sequence[Site | Frame], y: Sequence[Site | Frame]) -> Parting | None:
    """The deepest frame two stacks (outermost first) share and their lines in it; None when they never part at
    one function (identical, one a prefix of the other, or different functions below a shared line)."""
    for fx, fy in zip(x, y, strict=False):  # the shorter one ends the comparison
        if _same_place(fx, fy):
            continue
        if fx.file == fy.file and fx.function == fy.function:
            return Parting(fx.file, fx.function, fx.line, fy.line)
        return Parting(fx.file, fx.function, 0, 0)  # parted at one line, into different calls: no order
    return None


def _same_place(a: Site | Frame, b: Site | Frame) -> bool:
    return a.line == b.line and a.function == b.function and a.file == b.file


_Reading = tuple[frozenset[int], frozenset[int], "Parting | None", "str | None"]


class StackOrders:
    """Line orders between the stacks of a report (``stacks``: innermost first, as ``Report.stacks``), each
    distinct pair compared once."""

    def __init__(self, stacks: Sequence[Stack], views: Mapping[int, RankView]) -> None:
        self.stacks = stacks
        self.views = views
        self._outer: dict[int, tuple[Frame, ...]] = {}
        self._parts: dict[tuple[int, int], Parting | None] = {}
        self._skips: dict[tuple[int, int], str | None] = {}
        self._readings: dict[tuple[int, tuple[int | None, ...]], _Reading] = {}

    def passing(self, entered: Sequence[int], absent: Sequence[int]) -> Passing:
        """What the stacks say of a split site whose entered ranks include ``entered`` (one per split is enough:
        the ranks of a split at one site share their stack) and whose absent ranks are ``absent``. Each distinct
        pair of their stacks is compared once; the ranks are picked in C."""
        views = self.views
        mine = list(dict.fromkeys(map(attrgetter("stack"), filter(None, map(views.get, entered)))))
        present = list(compress(absent, map(views.__contains__, absent)))
        ids = list(map(attrgetter("stack"), map(views.__getitem__, present)))
        later: set[int] = set()
        earlier: set[int] = set()
        at: Parting | None = None
        early: str | None = None
        for sid in mine:
            if sid is None:
                continue
            key = (sid, tuple(dict.fromkeys(ids)))
            reading = self._readings.get(key)
            if reading is None:
                reading = self._readings[key] = self._read(sid, key[1])
            later |= reading[0]
            earlier |= reading[1]
            at, early = at or reading[2], early or reading[3]
        earlier -= later
        passed = tuple(compress(present, map(later.__contains__, ids))) if later else ()
        behind = tuple(compress(present, map(earlier.__contains__, ids))) if earlier else ()
        return Passing(passed, behind, at, early)

    def _read(self, mine: int, theirs: Sequence[int | None]) -> _Reading:
        """Which of the distinct stacks ``theirs`` stand at a later line of the frame they share with ``mine``
        (``later``), which at an earlier one, where the first later one parts, and the early return found."""
        later: set[int] = set()
        earlier: set[int] = set()
        at: Parting | None = None
        early: str | None = None
        for sid in theirs:
            if sid is None:
                continue
            parting = self._part(mine, sid)
            if parting is None or parting.first == parting.second:
                continue
            if parting.second > parting.first:
                later.add(sid)
                at = at or parting
            else:
                earlier.add(sid)
            early = early or self._skip(mine, sid)
        return frozenset(later), frozenset(earlier), at, early

    def _outermost_first(self, sid: int) -> tuple[Frame, ...]:
        found = self._outer.get(sid)
        if found is None:
            found = self._outer[sid] = tuple(f for f in reversed(self.stacks[sid]) if not f.native)
        return found

    def _part(self, a: int, b: int) -> Parting | None:
        key = (a, b)
        if key not in self._parts:
            self._parts[key] = part(self._outermost_first(a), self._outermost_first(b))
        return self._parts[key]

    def _skip(self, a: int, b: int) -> str | None:
        """The known-site table's early return of a frame the entered stack ``a`` holds below where it parts
        from ``b``: the code the other side left (or never called) before the collective."""
        key = (a, b)
        if key not in self._skips:
            outer, other = self._outermost_first(a), self._outermost_first(b)
            depth = next((i for i, (x, y) in enumerate(zip(outer, other, strict=False)) if not _same_place(x, y)), 0)
            below = outer[depth + 1 :]  # the frames the other side is not in (both are in the parting one)
            self._skips[key] = next(
                (s for s in (skip_of(Site(f.file, f.line, f.function)) for f in reversed(below)) if s), None
            )
        return self._skips[key]
