"""The findings of ``mtpdiag.report/2``: one type per stable finding id (docs/design.md), each with the
``details`` of its own type.

The finding types are a tagged union on ``id`` (msgspec's tagged Structs): the id is the tag, written first,
so the JSON is ``{"id": "missing-rank", "ranks": [...], "summary": ..., "remedy": ..., "details": {...}}`` and
a decoder reads each finding's ``details`` as the type its id names. ``Finding`` is that union; construct a
finding by its own type (``MissingRank(ranks=..., details=MissingDetails(...))``).
"""

from __future__ import annotations

from typing import TypeAlias

import msgspec

from mtpdiag.model.fields import Record
from mtpdiag.model.frames import Site
from mtpdiag.vocabulary.states import FindingId, GateStrength, GroupFrom, OrderSource, RankState, Source
from mtpdiag.vocabulary.waits import Confidence, WaitKind

Coords = dict[str, int]  # coordinate (``Coordinate``) -> value


class FindingBase(Record, frozen=True, kw_only=True, tag_field="id"):
    """What every finding says: the ranks it is about, one line a person reads first, and what to do."""

    ranks: tuple[int, ...]
    summary: str
    remedy: str | None

    @property
    def id(self) -> FindingId:
        """The stable finding id (the JSON's ``id``, this type's tag)."""
        return FindingId(self.__struct_config__.tag)


# ---------------------------------------------------------------- details


class SplitDetails(Record, frozen=True, kw_only=True):
    """A split collective (``mtp-cp-gated-reduce``, ``gated-collective``): the union of its split instances
    of one group kind. ``signature`` names a known metric tracker's helper (a look-alike), when it is one."""

    op: str
    site: Site | None
    group: str
    gate: Coords | None
    members: tuple[int, ...]
    entered: tuple[int, ...]
    absent: tuple[int, ...]
    instances: int
    group_from: GroupFrom
    group_candidates: tuple[str, ...]
    gate_strength: GateStrength | None
    source: Source
    order: RootOrderDetails | None = None  # why program order makes this split the root of its cycle
    signature: str | None = None


class OrderInstead(Record, frozen=True):
    """Where the ranks that went past a root wait instead."""

    op: str | None
    site: Site | None


class OrderFrame(Record, frozen=True):
    """The deepest frame two stacks share, and the line each side stands at in it."""

    file: str
    function: str
    line: int  # the line of the side that entered the root
    their_line: int  # the line of the side that went past it


class RootOrderDetails(Record, frozen=True, kw_only=True):
    """Why a root of a cycle comes first in program order (``analysis/program_order.py``): how we know
    (``source``) and how sure that is, who went past it and where they wait, the shared frame where the stacks
    were compared, a known early return, and whether line order alone decided (``loop_caveat``: a loop could
    reverse it) or said the other way round (``contradicted``)."""

    source: OrderSource
    confidence: Confidence
    skipped_by: tuple[int, ...]
    instead: OrderInstead
    frame: OrderFrame | None
    early_return: str | None
    loop_caveat: bool
    contradicted: bool


class P2PDetails(Record, frozen=True, kw_only=True):
    """Unmatched send/recv waits at one site: each (rank, peer) pair, and what each peer does instead."""

    op: str
    site: Site | None
    pairs: tuple[tuple[int, int], ...]
    peer_doing: dict[int, str]


class Waiter(Record, frozen=True, kw_only=True):
    """A wait that a straggler or a frozen rank holds up: a split collective (``group``, ``entered``) or a
    send/recv of rank ``rank``."""

    op: str
    site: Site | None
    group: str | None = None
    entered: tuple[int, ...] = ()
    rank: int | None = None


class StragglerDetails(Record, frozen=True, kw_only=True):
    """Where the stragglers are and what they wait on, and (the first 16 of) the waits they hold up."""

    site: Site | None
    wait: WaitKind
    waiting: tuple[Waiter, ...]


class FrozenDetails(Record, frozen=True, kw_only=True):
    """The frozen ranks' state and (the first 16 of) the waits they hold up."""

    state: RankState
    waiting: tuple[Waiter, ...]


class MissingDetails(Record, frozen=True, kw_only=True):
    """The ranks of the world that were not captured, and their coordinates when the layout is known."""

    missing: tuple[int, ...]
    world_size: int
    coords: dict[int, Coords] | None = None  # by rank


class OpSite(Record, frozen=True):
    """A collective and the call site it waits at."""

    op: str | None
    site: Site | None


class WaitingGroup(Record, frozen=True, kw_only=True):
    """A recorded group whose every member that reached collective ``seq`` waits there."""

    group: str
    desc: str
    seq: int
    op: str
    members: tuple[int, ...]


class AllWaitingDetails(Record, frozen=True, kw_only=True):
    """From the stacks: the sites every rank waits at (``sites``). From the Flight Recorder (``source``
    ``flight-recorder``): the groups whose every member waits at one number (``groups``)."""

    source: Source | None = None
    groups: tuple[WaitingGroup, ...] = ()
    sites: tuple[OpSite, ...] = ()


class SizeDetails(Record, frozen=True, kw_only=True):
    """A collective every member entered with different sizes (or dtypes): each value and its ranks."""

    op: str
    seq: int
    group: str
    fr_group: str
    site: Site | None
    values: dict[str, tuple[int, ...]]  # "14 elements" -> ranks
    source: Source


class KnownSiteAt(Record, frozen=True, kw_only=True):
    """Without a layout: ranks in a collective at a call site whose group the known-site table names."""

    op: str
    site: Site | None
    ranks: tuple[int, ...]
    group: str


class UnexplainedWaitDetails(Record, frozen=True, kw_only=True):
    """The stuck ranks by what they wait on (a wait kind, or their state when frozen); without a layout, the
    known call sites some of them wait at (``known_sites``: what those sites imply). From a watchdog log alone
    (``source`` ``watchdog-log``): the ranks that timed out (``timed_out``), and no ``waits``."""

    waits: dict[str, tuple[int, ...]] = msgspec.field(default_factory=dict)
    known_sites: tuple[KnownSiteAt, ...] = ()
    source: Source | None = None
    timed_out: tuple[int, ...] = ()


# ---------------------------------------------------------------- one type per id


class MtpCpGatedReduce(FindingBase, frozen=True, kw_only=True, tag=FindingId.MTP_CP_GATED_REDUCE.value):
    details: SplitDetails


class GatedCollective(FindingBase, frozen=True, kw_only=True, tag=FindingId.GATED_COLLECTIVE.value):
    details: SplitDetails


class P2PUnmatched(FindingBase, frozen=True, kw_only=True, tag=FindingId.P2P_UNMATCHED.value):
    details: P2PDetails


class Straggler(FindingBase, frozen=True, kw_only=True, tag=FindingId.STRAGGLER.value):
    details: StragglerDetails | None = None  # none without a layout: the groups are unknown


class FrozenRank(FindingBase, frozen=True, kw_only=True, tag=FindingId.FROZEN_RANK.value):
    details: FrozenDetails | None = None  # none without a layout: the groups are unknown


class MissingRank(FindingBase, frozen=True, kw_only=True, tag=FindingId.MISSING_RANK.value):
    details: MissingDetails


class AllWaiting(FindingBase, frozen=True, kw_only=True, tag=FindingId.ALL_WAITING.value):
    details: AllWaitingDetails


class SizeMismatch(FindingBase, frozen=True, kw_only=True, tag=FindingId.SIZE_MISMATCH.value):
    details: SizeDetails


class DtypeMismatch(FindingBase, frozen=True, kw_only=True, tag=FindingId.DTYPE_MISMATCH.value):
    details: SizeDetails


class UnexplainedWait(FindingBase, frozen=True, kw_only=True, tag=FindingId.UNEXPLAINED_WAIT.value):
    details: UnexplainedWaitDetails


Finding: TypeAlias = (
    MtpCpGatedReduce
    | GatedCollective
    | P2PUnmatched
    | Straggler
    | FrozenRank
    | MissingRank
    | AllWaiting
    | SizeMismatch
    | DtypeMismatch
    | UnexplainedWait
)
# The type of each finding id.
FINDING_TYPES: dict[FindingId, type[FindingBase]] = {FindingId(t.__struct_config__.tag): t for t in Finding.__args__}
