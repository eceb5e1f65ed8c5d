"""What the diagnosis knows when its findings are built: the one input of every finding rule."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import msgspec

from mtpdiag.analysis.causes import Causes
from mtpdiag.layout import ParallelLayout
from mtpdiag.model import Mismatch, RankView
from mtpdiag.vocabulary.states import Role, StrEnum

if TYPE_CHECKING:  # the Flight Recorder's analysis is imported only when there are dumps
    from mtpdiag.analysis.flight_recorder.evidence import SizeProblem, StuckGroup


class Mode(StrEnum):
    """How far the group analysis got, which decides the rules that can say something."""

    GROUPS = "groups"  # a layout, the Flight Recorder or the watchdog log named the groups: the wait-for graph
    WORLD_OPS = "world-ops"  # no layout, but world-group calls (barriers, group creation) split the world
    LAYOUT_FREE = "layout-free"  # no groups at all: only whole-world readings


class Facts(msgspec.Struct, frozen=True):
    """The views, the splits with their roles and the wait-for graph, the recorder's and the log's problems,
    and what is missing."""

    mode: Mode
    layout: ParallelLayout | None
    views: tuple[RankView, ...]
    by_rank: Mapping[int, RankView]  # the ranked views inside the world, by rank
    world_size: int | None
    mismatches: tuple[Mismatch, ...]  # every split, roots first, with its role
    causes: Causes | None  # the wait-for graph (Mode.GROUPS and Mode.WORLD_OPS)
    size_problems: tuple[SizeProblem, ...] = ()
    stuck_groups: tuple[StuckGroup, ...] = ()
    missing: tuple[int, ...] = ()
    missing_is_a_finding: bool = False  # else a note says what a partial capture covers
    fr_found: bool = False  # Flight Recorder dumps came with the capture
    # Members without a dump of a group in which a dumped member waits: others wait for them.
    waited_on_undumped: frozenset[int] = frozenset()

    @property
    def roots(self) -> list[Mismatch]:
        return [m for m in self.mismatches if m.role == Role.ROOT]

    @property
    def waited_on(self) -> frozenset[int]:
        """Ranks something waits on that wait on nothing themselves (Mode.GROUPS only)."""
        if self.causes is None or self.mode != Mode.GROUPS:
            return frozenset()
        return frozenset(self.causes.blocked_on)

    @property
    def unmatched_p2p(self) -> bool:
        return (
            self.mode == Mode.GROUPS
            and self.causes is not None
            and bool(self.causes.root_p2p or self.causes.consequence_p2p)
        )
