"""``diagnose(snapshot, layout) -> Report``: the pure analysis pipeline.

Named steps, each returning its result and its notes for the report: size the world and fit the layout
(``size_the_world``) → read each rank's view (``ranks.read_ranks``) → join the Flight Recorder's dumps
(``recorded.join_recorder``) → place the ranks (``ranks.place_ranks``) → split group instances, with gates, and tell
root from consequence in the wait-for graph (``find_splits``) → judge the ranks nobody captured
(``judge_missing``) → findings → verdict. No I/O; near-linear in the number of ranks (groups are looked up by
rank through the layout's cached index).
"""

from __future__ import annotations

from itertools import compress, filterfalse
from operator import attrgetter

import msgspec

from mtpdiag.analysis import findings
from mtpdiag.analysis.causes import Causes, find_causes
from mtpdiag.analysis.findings.facts import Facts, Mode
from mtpdiag.analysis.gate import CoordsOf
from mtpdiag.analysis.mismatch import find_mismatches, is_p2p_op
from mtpdiag.analysis.ranks import Notes, Placed, place_ranks, read_ranks
from mtpdiag.analysis.recorded import (
    RecorderJoin,
    WatchdogJoin,
    fold_watchdog,
    join_recorder,
    recorded_world_size,
    recorder_section,
    watchdog_section,
    with_recorder_splits,
)
from mtpdiag.analysis.sites import group_sites
from mtpdiag.layout import LayoutError, ParallelLayout
from mtpdiag.model import (
    STATE_UNKNOWN,
    Finding,
    Mismatch,
    RankView,
    Report,
    Snapshot,
    Stack,
    replace,
    who_and_why,
)
from mtpdiag.model.flight_recorder import FRDump
from mtpdiag.model.watchdog import WatchdogLog
from mtpdiag.vocabulary.groups import GroupKind
from mtpdiag.vocabulary.labels import rank_list
from mtpdiag.vocabulary.ops import WORLD_OPS
from mtpdiag.vocabulary.states import RankState, Role, Verdict

NO_LAYOUT_NOTE = "no parallel layout: pass --tp/--cp/--pp or --config to find split groups"
_LIST = 8  # ranks listed in a note before "…"


def diagnose(
    snapshot: Snapshot,
    layout: ParallelLayout | None = None,
    layout_source: str | None = None,
    fr: FRDump | None = None,
    log: WatchdogLog | None = None,
) -> Report:
    """Diagnose one snapshot; ``layout`` (and where it came from) makes group analysis possible; ``fr``, the
    Flight Recorder dumps of the same hang, says which collective hangs when the stacks cannot; ``log``, the
    NCCL watchdog's timeout lines, says it too, without call sites, when there are no dumps. Without ``fr``,
    the dumps the snapshot carries (a bundle's) are used."""
    fr = snapshot.flight_recorder if fr is None else fr
    world = size_the_world(snapshot, layout, fr)
    ranks = read_ranks(snapshot, world.layout)
    join = join_recorder(ranks.views, fr, world.layout, ranks.coords_of) if fr is not None else None
    placed = place_ranks(join.views if join is not None else ranks.views, world.layout, snapshot.conflicts)
    # The watchdog's log, like the recorder, is read only when given, and speaks only when there are no dumps.
    logged = fold_watchdog(log, world.layout, ranks.coords_of) if log is not None and join is None else None
    splits = find_splits(placed.by_rank, world.layout, world.size, join, logged, ranks.stacks)
    missing = judge_missing(snapshot, world, placed.by_rank, splits, join, logged)
    found = findings.build(_facts(world, placed, splits, missing, join, logged))
    if logged is not None and not found:  # nothing split: what the log shows, and what to collect next
        found = logged.evidence.findings
    elif logged is not None and placed.views and all(v.state == RankState.UNREADABLE for v in placed.views):
        found = (*logged.evidence.findings, *found)  # no stack was read: the log says more, then how to get them
    verdict, verdict_notes = judge(found, placed.by_rank, world.layout)
    notes = (
        *world.notes,
        *(join.notes if join is not None else ()),
        *placed.notes,
        *splits.notes,
        *missing.notes,
        *_capture_notes(snapshot, placed.views, ranks.states),
        *verdict_notes,
    )
    report = Report(
        verdict=verdict,
        world_size=world.size,
        layout=world.layout.record() if world.layout is not None else None,
        ranks=placed.views,
        stacks=ranks.stacks,
        sites=group_sites(placed.sited),
        mismatches=splits.mismatches,
        findings=found,
        layout_source=layout_source,
        notes=notes,
    )
    return _with_sections(report, join, log, logged, world.layout, ranks.coords_of)


def _facts(
    world: World,
    placed: Placed,
    splits: Splits,
    missing: Missing,
    join: RecorderJoin | None,
    logged: WatchdogJoin | None,
) -> Facts:
    """What the finding rules read."""
    evidence = join.evidence if join is not None else None
    log = logged.evidence if logged is not None else None
    return Facts(
        mode=splits.mode,
        layout=world.layout,
        views=placed.views,
        by_rank=placed.by_rank,
        world_size=world.size,
        mismatches=splits.mismatches,
        causes=splits.causes,
        size_problems=evidence.size_problems if evidence else log.size_problems if log else (),
        stuck_groups=evidence.stuck if evidence else (),
        missing=missing.ranks,
        missing_is_a_finding=missing.is_a_finding,
        fr_found=join is not None,
        waited_on_undumped=evidence.waited_on_undumped if evidence else frozenset(),
    )


def _with_sections(
    report: Report,
    join: RecorderJoin | None,
    log: WatchdogLog | None,
    logged: WatchdogJoin | None,
    layout: ParallelLayout | None,
    coords_of: CoordsOf,
) -> Report:
    """The report with its ``flight_recorder`` and ``watchdog`` sections, when those records were given (the
    log's section is shown even where the dumps made the diagnosis)."""
    if join is not None:
        report = replace(report, flight_recorder=recorder_section(report, join))
    if log is not None:
        shown = logged if logged is not None else fold_watchdog(log, layout, coords_of)
        notes = (*report.notes, *(f"watchdog log: {n}" for n in shown.evidence.notes))
        report = replace(report, watchdog=watchdog_section(shown), notes=notes)
    return report


# ---------------------------------------------------------------- world and layout


class World(msgspec.Struct, frozen=True):
    """The world the diagnosis covers: its size (None when nothing says it) and the layout fitted to it."""

    size: int | None
    layout: ParallelLayout | None
    notes: Notes


def size_the_world(snapshot: Snapshot, layout: ParallelLayout | None, fr: FRDump | None) -> World:
    """The world size from the captures (else the recorder), and the layout fitted to it."""
    size, size_notes = _world_size(snapshot, layout, fr)
    fitted, layout_notes = _usable_layout(layout, size)
    if size is None and fitted is not None:
        size = fitted.world_size
    return World(size=size, layout=fitted, notes=(*size_notes, *layout_notes))


def _world_size(snapshot: Snapshot, layout: ParallelLayout | None, fr: FRDump | None) -> tuple[int | None, Notes]:
    sizes = snapshot.world_sizes
    if sizes:
        disagree = f"captures disagree on WORLD_SIZE ({', '.join(map(str, sizes))}): using {sizes[-1]}"
        return sizes[-1], (disagree,) if len(sizes) > 1 else ()
    recorded = recorded_world_size(fr) if fr is not None else None
    if recorded is not None and (layout is None or layout.world_size == recorded):
        return recorded, ()
    if layout is not None:
        return None, (f"WORLD_SIZE not in the captures: the layout's world of {layout.world_size} is assumed",)
    return None, ("WORLD_SIZE unknown (not in the captures' environment): cannot tell whether every rank was captured",)


def _usable_layout(layout: ParallelLayout | None, world_size: int | None) -> tuple[ParallelLayout | None, Notes]:
    if layout is None or world_size is None or layout.world_size == world_size:
        return layout, ()
    try:
        fitted = ParallelLayout.for_world(
            world_size,
            tp=layout.tp,
            cp=layout.cp,
            pp=layout.pp,
            ep=layout.ep,
            vpp=layout.vpp,
            etp=layout.etp,
            order=layout.order,
        )
    except LayoutError as exc:
        return None, (
            f"the layout ({layout.world_size} ranks) does not fit WORLD_SIZE {world_size} ({exc}): it is ignored",
        )
    return fitted, (
        f"the layout described {layout.world_size} ranks but WORLD_SIZE is {world_size}: dp is taken as {fitted.dp}",
    )


# ---------------------------------------------------------------- splits and the wait-for graph


class Splits(msgspec.Struct, frozen=True):
    """How far the group analysis got, the wait-for graph, and every split with its role (roots first)."""

    mode: Mode
    causes: Causes | None
    mismatches: tuple[Mismatch, ...]
    notes: Notes


def find_splits(
    by_rank: dict[int, RankView],
    layout: ParallelLayout | None,
    world_size: int | None,
    join: RecorderJoin | None,
    logged: WatchdogJoin | None,
    stacks: tuple[Stack, ...] = (),
) -> Splits:
    """The split group instances and their roles: from the layout's groups, the recorder's and the log's; without
    any of them, only the world-group calls that every rank must enter."""
    if layout is None and join is None and logged is None:
        return _world_op_step(by_rank, world_size, stacks)
    found = _group_splits(by_rank, layout, join, logged, stacks)
    return found if layout is not None else replace(found, notes=(*found.notes, NO_LAYOUT_NOTE))


def _group_splits(
    by_rank: dict[int, RankView],
    layout: ParallelLayout | None,
    join: RecorderJoin | None,
    logged: WatchdogJoin | None,
    stacks: tuple[Stack, ...],
) -> Splits:
    stacked = {r: v for r, v in by_rank.items() if r not in join.dump_only} if join and join.dump_only else by_rank
    from_stacks = find_mismatches(stacked, layout) if layout is not None else []
    split = with_recorder_splits(from_stacks, join) if join is not None else tuple(from_stacks)
    if logged is not None:
        split = (*split, *logged.evidence.mismatches)
    causes = find_causes(split, by_rank, layout, join.evidence.root_hints if join is not None else frozenset(), stacks)
    return Splits(
        mode=Mode.GROUPS,
        causes=causes,
        mismatches=_ordered_mismatches(causes.mismatches),
        notes=_idle_notes(by_rank, causes),
    )


def _idle_notes(by_rank: dict[int, RankView], causes: Causes) -> Notes:
    """Stopped ranks that no group waits for yet (the distinct states are asked first, in C: 16k ranks)."""
    if RankState.STOPPED not in set(map(attrgetter("state"), by_rank.values())):
        return ()
    idle = [r for r, v in by_rank.items() if v.state == RankState.STOPPED and r not in causes.blocked_on]
    if not idle:
        return ()
    return (
        f"rank{'s' if len(idle) > 1 else ''} {_list(idle)} {'are' if len(idle) > 1 else 'is'} "
        "stopped, but no group waits for them yet",
    )


def _world_op_step(by_rank: dict[int, RankView], world_size: int | None, stacks: tuple[Stack, ...]) -> Splits:
    splits = _world_op_splits(by_rank, world_size)
    if not splits:
        return Splits(mode=Mode.LAYOUT_FREE, causes=None, mismatches=(), notes=(NO_LAYOUT_NOTE,))
    causes = find_causes(splits, by_rank, None, stacks=stacks)
    return Splits(
        mode=Mode.WORLD_OPS, causes=causes, mismatches=_ordered_mismatches(causes.mismatches), notes=(NO_LAYOUT_NOTE,)
    )


def _world_op_splits(by_rank: dict[int, RankView], world_size: int | None) -> list[Mismatch]:
    """Without a layout, the collectives that run on the world group whatever the layout (barrier, group and
    communicator creation) can still be found split: every rank of the world must enter them."""
    if world_size is None or not by_rank or not any(v.op in WORLD_OPS for v in by_rank.values()):
        return []
    world = ParallelLayout.for_world(world_size)
    in_world_ops = {r: v for r, v in by_rank.items() if 0 <= r < world_size}
    splits = [m for m in find_mismatches(in_world_ops, world) if m.op in WORLD_OPS and m.group == GroupKind.WORLD]
    # Only where the absent ranks are in world-group calls too: one in a collective of a group the missing
    # layout would name may be the root, and without the layout this cannot say.
    return [m for m in splits if all(by_rank.get(a) is not None and by_rank[a].op in WORLD_OPS for a in m.absent)]


def _ordered_mismatches(mismatches: tuple[Mismatch, ...]) -> tuple[Mismatch, ...]:
    return tuple(sorted(mismatches, key=lambda m: (m.role != Role.ROOT, m.members[0], m.op)))


# ---------------------------------------------------------------- ranks nobody captured


class Missing(msgspec.Struct, frozen=True):
    """The ranks of the world that were not captured, and whether that is a finding (else a note says what the
    capture covers)."""

    ranks: tuple[int, ...]
    is_a_finding: bool
    notes: Notes


def judge_missing(
    snapshot: Snapshot,
    world: World,
    by_rank: dict[int, RankView],
    splits: Splits,
    join: RecorderJoin | None,
    logged: WatchdogJoin | None,
) -> Missing:
    """A partial capture (one node of many) is normal; ranks something waits on, or any missing rank when
    nothing says how the world is grouped, are a finding."""
    if world.size is None:
        return Missing(ranks=(), is_a_finding=False, notes=())
    if not by_rank and snapshot.captures:  # processes by pid only: which ranks they are is unknown, not missing
        n = len(snapshot.captures)
        return Missing(
            ranks=(),
            is_a_finding=False,
            notes=(f"{n} of {world.size} ranks captured, by pid only: which ranks they are is unknown",),
        )
    missing = tuple(filterfalse(by_rank.__contains__, range(world.size)))
    if not missing:
        return Missing(ranks=(), is_a_finding=False, notes=())
    waited_on = set(splits.causes.blocked_on) if splits.causes is not None and splits.mode == Mode.GROUPS else set()
    if join is not None:  # members of a group a dumped member waits in, that have no dump
        waited_on |= join.evidence.waited_on_undumped
    recorded = join is not None or logged is not None
    if not snapshot.captures and recorded:
        rests_on = "Flight Recorder" if join is not None else "watchdog log"
        return Missing(ranks=missing, is_a_finding=False, notes=(f"no stacks: the diagnosis rests on the {rests_on}",))
    if world.layout is None and not recorded or waited_on.intersection(missing):
        return Missing(ranks=missing, is_a_finding=True, notes=())
    note = (
        f"{world.size - len(missing)} of {world.size} ranks captured; rank{'s' if len(missing) > 1 else ''} "
        f"{_list(list(missing))} not captured, and nothing captured waits on them"
    )
    return Missing(ranks=missing, is_a_finding=False, notes=(note,))


# ---------------------------------------------------------------- what the captures lack, and the verdict


def _capture_notes(snapshot: Snapshot, views: tuple[RankView, ...], states: set[str]) -> list[str]:
    """What the captures lack (``states``: the captures' /proc state letters, as ``StackReader.states`` saw
    them). Each question is asked of the distinct states and (op, site) pairs first (read in C), and of the
    ranks only when one of them says yes: a job's 16k ranks hold a handful."""
    notes = []
    view_states = set(map(attrgetter("state"), views))
    if RankState.UNREADABLE in view_states or RankState.GONE in view_states:
        bad = [v for v in views if v.state in (RankState.UNREADABLE, RankState.GONE)]
        notes.append(f"{len(bad)} rank{'s' if len(bad) > 1 else ''} could not be read (first: {who_and_why(bad[0])})")
    if snapshot.errors:
        more = f" (and {len(snapshot.errors) - 1} more)" if len(snapshot.errors) > 1 else ""
        notes.append(f"not captured: {snapshot.errors[0]}{more}")
    if STATE_UNKNOWN in states:
        notes.append("process states unknown (dumps read from files): a stopped rank looks like a waiting one")
    unknown_peers = _unknown_peers(views)
    if unknown_peers:
        notes.append(
            f"the peer of rank{'s' if len(unknown_peers) > 1 else ''} {_list(unknown_peers)}'s "
            "send/recv is unknown: it is not matched"
        )
    return notes


def _unknown_peers(views: tuple[RankView, ...]) -> list[int]:
    """Ranks in a send/recv whose peer is unknown (the distinct (op, site) pairs are asked first)."""
    pairs = list(map(attrgetter("op", "site"), views))
    p2p = {pair for pair in set(pairs) if is_p2p_op(*pair)}
    if not p2p:
        return []
    return [
        v.rank
        for v in compress(views, map(p2p.__contains__, pairs))
        if v.peer is None and v.rank is not None and v.state == RankState.COLLECTIVE
    ]


def judge(
    found: tuple[Finding, ...], by_rank: dict[int, RankView], layout: ParallelLayout | None
) -> tuple[Verdict, Notes]:
    """``problem`` when a finding names one; ``ok`` only when no rank is stuck; else ``incomplete`` (then the
    ``unexplained-wait`` finding says what the ranks wait on and what to collect next). A single dump cannot
    prove a hang, so ``ok`` needs every rank seen running its own code."""
    if any(findings.is_problem(f) for f in found):
        return Verdict.PROBLEM, ()
    if not by_rank:  # the watchdog log's finding, when there is one, says what it shows
        return Verdict.INCOMPLETE, (() if found else ("no capture carries a rank: nothing to diagnose",))
    waiting = [v for v in by_rank.values() if v.state == RankState.COLLECTIVE]
    notes: Notes = ()
    if layout is None and waiting and len({(v.op, v.site) for v in by_rank.values()}) > 1:
        notes = ("ranks wait at different sites; a layout is needed to tell which group is split",)
    return Verdict.INCOMPLETE if found else Verdict.OK, notes


def _list(ranks: list[int]) -> str:
    return rank_list(ranks, _LIST, more=", … ({n})")
