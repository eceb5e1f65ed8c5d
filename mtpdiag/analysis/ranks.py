"""The diagnosis' steps over the ranks: each capture's view (``read_ranks``), then the views placed by rank,
with the one the group analysis reads for each rank (``place_ranks``). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from itertools import compress
from operator import attrgetter

import msgspec

from mtpdiag.analysis.gate import CoordsOf
from mtpdiag.analysis.views import StackReader
from mtpdiag.layout import LayoutError, ParallelLayout
from mtpdiag.model import RankView, Snapshot, Stack
from mtpdiag.model.captures import RankConflict
from mtpdiag.vocabulary.labels import rank_list

Notes = tuple[str, ...]
_LIST = 8  # ranks listed in a note before "…"


class Ranks(msgspec.Struct, frozen=True):
    """Each capture's view, in capture order; the report's stack table; the captures' /proc state letters (as
    ``StackReader.states`` saw them); and ``coords_of``, every rank's coordinates."""

    views: list[RankView]
    stacks: tuple[Stack, ...]
    states: set[str]
    coords_of: CoordsOf


def read_ranks(snapshot: Snapshot, layout: ParallelLayout | None) -> Ranks:
    read = StackReader(layout)
    views = read.views(snapshot.captures)
    return Ranks(
        views=views, stacks=read.stacks(), states=read.states, coords_of=_Coordinates(layout, views).__getitem__
    )


class _Coordinates(dict[int, Mapping[str, int]]):
    """Coordinates by rank: the views' own, and any other rank's computed when first asked. Its ``__getitem__``
    is the analysis' ``coords_of``: a lookup in C, asked 40k times at 16k ranks (a Python function: twice the cost)."""

    def __init__(self, layout: ParallelLayout | None, views: list[RankView]) -> None:
        coords = list(map(attrgetter("coords"), views))
        super().__init__(compress(zip(map(attrgetter("rank"), views), coords, strict=True), coords))  # placed ones
        self.layout = layout

    def __missing__(self, rank: int) -> Mapping[str, int]:
        if self.layout is None:
            raise LayoutError(f"rank {rank} has no coordinates without a layout")
        coords = self[rank] = self.layout.coords(rank)
        return coords


class Placed(msgspec.Struct, frozen=True):
    """The views by rank (unranked last); the ones the group analysis reads, by rank; and the views the site
    groups are made of: all of them, but for a rank captured differently by several files, only the one read."""

    views: tuple[RankView, ...]
    by_rank: dict[int, RankView]
    notes: Notes
    sited: tuple[RankView, ...]


def place_ranks(
    captured: list[RankView], layout: ParallelLayout | None, conflicts: tuple[RankConflict, ...] = ()
) -> Placed:
    """The views by rank, and the index of them the group analysis reads. When every view has a rank of its
    own, inside the layout's world (a job's captures, merged by rank), the rank alone orders them and indexes
    them, read in C (8 ms of Python at 16k ranks). Otherwise the views of one rank keep the snapshot's order
    (the capture the group analysis reads first: ``inputs.merge`` puts it there), and unranked ones go last,
    by pid."""
    ranks = list(map(attrgetter("rank"), captured))
    if ranks and None not in ranks and len(set(ranks)) == len(ranks):
        ranks.sort()
        if layout is None or 0 <= ranks[0] and ranks[-1] < layout.world_size:
            views = tuple(sorted(captured, key=attrgetter("rank")))
            return Placed(views=views, by_rank=dict(zip(ranks, views, strict=True)), notes=(), sited=views)
    views = tuple(sorted(captured, key=lambda v: (v.rank is None, v.rank or 0, v.pid or 0 if v.rank is None else 0)))
    by_rank, notes = _index(views, layout, conflicts)
    return Placed(views=views, by_rank=by_rank, notes=notes, sited=_sited(views, conflicts))


def _sited(views: tuple[RankView, ...], conflicts: tuple[RankConflict, ...]) -> tuple[RankView, ...]:
    """The views without the captures of a conflicting rank after its first (the one the analysis reads), so
    that a rank stands at one site, the one its diagnosis is about."""
    if not conflicts:
        return views
    in_conflict = {c.rank for c in conflicts}
    seen: set[int] = set()
    out = []
    for view in views:
        if view.rank in in_conflict:
            if view.rank in seen:
                continue
            seen.add(view.rank)
        out.append(view)
    return tuple(out)


def _index(
    views: tuple[RankView, ...], layout: ParallelLayout | None, conflicts: tuple[RankConflict, ...]
) -> tuple[dict[int, RankView], Notes]:
    """Views by rank for the group analysis: the first capture of a rank, inside the layout's world."""
    by_rank: dict[int, RankView] = {}
    duplicates, outside, unranked = [], [], 0
    for view in views:
        if view.rank is None:
            unranked += 1
        elif view.rank in by_rank:
            duplicates.append(view.rank)
        elif layout is not None and not 0 <= view.rank < layout.world_size:
            outside.append(view.rank)
        else:
            by_rank[view.rank] = view
    notes = []
    if unranked:
        notes.append(
            f"{unranked} capture{'s carry' if unranked > 1 else ' carries'} no rank (no RANK in "
            "the environment or the file name): left out of the group analysis"
        )
    notes += map(_conflict_note, conflicts)
    in_conflict = {c.rank for c in conflicts}
    duplicates = [r for r in duplicates if r not in in_conflict]
    if duplicates:
        notes.append(
            f"rank{'s' if len(duplicates) > 1 else ''} {_list(duplicates)} captured more than once: "
            "the first capture is used"
        )
    if outside:
        notes.append(
            f"rank{'s' if len(outside) > 1 else ''} {_list(outside)} outside the layout's world of "
            f"{layout.world_size if layout else '?'}: left out of the group analysis"
        )
    return by_rank, tuple(notes)


def _conflict_note(conflict: RankConflict) -> str:
    first, *others = conflict.sources
    return (
        f"rank {conflict.rank} was captured differently ({conflict.why}) by {first} and {', '.join(others)}: "
        f"each capture is listed, and the group analysis and the site groups read the one from {first}"
    )


def _list(ranks: list[int]) -> str:
    return rank_list(ranks, _LIST, more=", … ({n})")
