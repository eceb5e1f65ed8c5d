"""What the diagnosis says: where each rank waits, the split collectives, the findings (``mtpdiag.report/2``).

The JSON is these types (``report.json_report`` encodes them with msgspec). Each distinct stack is listed
once in ``Report.stacks`` and a rank names its own by index (``RankView.stack``), as LLNL STAT's equivalence
classes do: a 16k-rank job holds a handful of stacks.
"""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from mtpdiag.model.fields import Record
from mtpdiag.model.findings import Finding
from mtpdiag.model.frames import Site, Stack
from mtpdiag.model.sections import FlightRecorderSection, Progress, WatchdogSection
from mtpdiag.vocabulary.groups import GroupKind
from mtpdiag.vocabulary.states import GateStrength, GroupFrom, RankState, Role, Source, Verdict
from mtpdiag.vocabulary.waits import Confidence, WaitKind

REPORT_SCHEMA = "mtpdiag.report/2"

Coords = dict[str, int]  # coordinate (``Coordinate``) -> value
# A split's group: a layout group kind wherever one fits (``GroupKind``); else the name the Flight Recorder or the
# watchdog's log gives the group (a group of the job's own, which no kind of the layout describes). JSON Schema
# and msgspec cannot say "one of these words, or any other string", so the kinds are its examples.
GroupName = Annotated[
    str,
    Meta(
        description="a group kind (GroupKind), or the recorded name of a group no kind of the layout fits",
        examples=[k.value for k in GroupKind],
    ),
]


class Layout(Record, frozen=True):
    """The parallel layout the diagnosis used (``layout.ParallelLayout``'s sizes and rank order); ``vpp`` and
    ``etp`` only when set."""

    tp: int
    cp: int
    ep: int
    dp: int
    pp: int
    order: str
    vpp: int | None = None
    etp: int | None = None

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    def sizes(self) -> dict[str, int]:
        """The sizes that are set, by name: ``tp``, ``cp``, ``ep``, ``dp``, ``pp``, and ``vpp``, ``etp``."""
        return {k: v for k in ("tp", "cp", "ep", "dp", "pp", "vpp", "etp") if (v := getattr(self, k)) is not None}


class WaitState(Record, frozen=True, omit_defaults=False):
    """Where a rank is stuck, and how sure the evidence makes us.

    ``kind``: collective | host_sync | comm_init | data_loader | lock | io | sleep | running | unknown.
    ``confidence``: certain | likely | possible. ``evidence`` says what the call rests on, in a few words
    each. ``thread`` names the thread that shows it when that is not the main thread.
    """

    kind: WaitKind
    confidence: Confidence
    evidence: tuple[str, ...] = ()
    thread: str | None = None


class RankView(Record, frozen=True, kw_only=True):
    """One rank as the report shows it. ``state`` is collective|waiting|running|stopped|gone|unreadable
    (``waiting``: blocked outside any collective, e.g. at a host sync or a lock; ``wait`` says on what).

    ``stack`` is the index of the rank's stack (the main thread's, or the thread in a collective) in
    ``Report.stacks``; None when no stack was read.
    """

    rank: int | None
    pid: int | None
    host: str
    state: RankState
    coords: Coords | None
    op: str | None
    site: Site | None
    stack: int | None
    wait: WaitState | None
    peer: int | None = None  # the other end of a send/recv, when known
    error: str | None = None


class SiteGroup(Record, frozen=True, omit_defaults=False):
    """Ranks that wait in the same op at the same site (op None: in no collective at that user frame; then
    ``wait`` is what they wait on there, e.g. ``host_sync``, or ``running``)."""

    op: str | None
    site: Site | None
    ranks: tuple[int, ...]
    wait: WaitKind | None = None


class Mismatch(Record, frozen=True, kw_only=True, omit_defaults=False):
    """A process-group instance that only some of its members entered at a site."""

    op: str
    site: Site | None
    group: GroupName
    members: tuple[int, ...]
    entered: tuple[int, ...]
    absent: tuple[int, ...]
    gate: Coords | None
    absent_doing: dict[int, str] = {}  # rank -> "all_gather in ring_attention", by rank
    role: Role = Role.ROOT
    # How the group kind was found: known-site | flight-recorder | unique-fit | guess; every kind that fit.
    group_from: GroupFrom = GroupFrom.UNIQUE_FIT
    group_candidates: tuple[str, ...] = ()
    # strong: several ranks on each side split cleanly along the gate; weak: one rank alone, or other
    # coordinate conditions separate the sides as well (``gate_alternatives``): data-dependent divergence
    # (a loop that ran once more on some ranks) fits just as well.
    gate_strength: GateStrength | None = None
    gate_alternatives: tuple[Coords, ...] = ()
    source: Source = Source.STACKS
    seq: int | None = None  # the Flight Recorder's collective sequence number in the group, when known


class Report(Record, frozen=True, kw_only=True, tag_field="schema", tag=REPORT_SCHEMA):
    """The diagnosis. ``verdict``: ok | problem | incomplete. ``stacks``: each distinct stack once."""

    verdict: Verdict
    world_size: int | None
    layout: Layout | None
    layout_source: str | None
    ranks: tuple[RankView, ...]
    stacks: tuple[Stack, ...]
    sites: tuple[SiteGroup, ...]
    mismatches: tuple[Mismatch, ...]
    findings: tuple[Finding, ...]
    notes: tuple[str, ...]  # what is missing or uncertain, in plain words
    # Optional sections (``model.sections``), present when their evidence was there.
    progress: Progress | None = None
    flight_recorder: FlightRecorderSection | None = None
    watchdog: WatchdogSection | None = None

    def stack_of(self, view: RankView) -> Stack:
        """The frames of ``view``'s stack, innermost first (empty when none was read)."""
        return self.stacks[view.stack] if view.stack is not None else ()
