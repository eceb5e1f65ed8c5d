"""``diagnose(snapshot, layout) -> Report``: the pure analysis pipeline.

classify each rank → group ranks by site → split group instances (with gates) → the wait-for graph
(root cause vs consequence) → findings → verdict and notes. No I/O; near-linear in the number of
ranks (groups are looked up by rank through the layout's cached index).
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import compress, filterfalse
from operator import attrgetter
from types import ModuleType
from typing import TYPE_CHECKING

from mtpdiag.analysis import findings
from mtpdiag.analysis.causes import find_causes
from mtpdiag.analysis.findings.facts import Facts, Mode
from mtpdiag.analysis.gate import CoordsOf
from mtpdiag.analysis.mismatch import find_mismatches, is_p2p_op
from mtpdiag.analysis.sites import group_sites
from mtpdiag.analysis.views import StackReader
from mtpdiag.layout import LayoutError, ParallelLayout
from mtpdiag.model import (
    STATE_UNKNOWN,
    Finding,
    Mismatch,
    RankView,
    Report,
    Snapshot,
    WatchdogSection,
    replace,
    who_and_why,
)
from mtpdiag.model.flight_recorder import FRDump
from mtpdiag.model.watchdog import WatchdogLog
from mtpdiag.vocabulary.labels import rank_list
from mtpdiag.vocabulary.ops import WORLD_OPS
from mtpdiag.vocabulary.states import RankState, Role, Verdict

if TYPE_CHECKING:
    from mtpdiag.analysis.flight_recorder.evidence import FREvidence

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
    if fr is None:
        fr = snapshot.flight_recorder
    notes: list[str] = []
    world_size = _world_size(snapshot, layout, notes, fr)
    layout = _usable_layout(layout, world_size, notes)
    if world_size is None and layout is not None:
        world_size = layout.world_size
    fr_evidence = _fr_evidence() if fr is not None else None
    read = StackReader(layout)
    captured = read.views(snapshot.captures)
    coords_of = _Coordinates(layout, captured).__getitem__
    stacks = read.stacks()
    evidence = (
        fr_evidence.fold(fr, layout, coords_of if layout is not None else None)
        if fr and fr_evidence is not None
        else None
    )
    fr_only: set[int] = set()
    if fr is not None and evidence is not None:
        captured, fr_only = _with_flight_recorder(captured, fr, evidence, layout, coords_of)
        notes += [f"Flight Recorder: {n}" for n in (*fr.notes, *evidence.analysis.notes)]
    views, by_rank = _sorted_and_indexed(captured, layout, notes)
    missing = list(filterfalse(by_rank.__contains__, range(world_size))) if world_size is not None else []

    mode, causes = Mode.LAYOUT_FREE, None
    mismatches: tuple[Mismatch, ...] = ()
    if log is not None:  # the watchdog's log, like the recorder, is read only when given
        from mtpdiag.analysis.log_evidence import fold_log
    logged = fold_log(log, layout, coords_of if layout is not None else None) if log and not evidence else None
    if layout is not None or evidence is not None or logged is not None:
        mode = Mode.GROUPS
        stacked = {r: v for r, v in by_rank.items() if r not in fr_only} if fr_only else by_rank
        from_stacks = find_mismatches(stacked, layout) if layout is not None else []
        split = (
            fr_evidence.merge(from_stacks, evidence.mismatches)
            if evidence and fr_evidence is not None
            else tuple(from_stacks)
        )
        if logged is not None:
            split = (*split, *logged.mismatches)
        causes = find_causes(split, by_rank, layout, evidence.root_hints if evidence else frozenset())
        mismatches = _ordered_mismatches(causes.mismatches)
        idle = (
            [r for r, v in by_rank.items() if v.state == RankState.STOPPED and r not in causes.blocked_on]
            if RankState.STOPPED in set(map(attrgetter("state"), by_rank.values()))
            else []
        )
        if idle:
            notes.append(
                f"rank{'s' if len(idle) > 1 else ''} {_list(idle)} {'are' if len(idle) > 1 else 'is'} "
                "stopped, but no group waits for them yet"
            )
    if layout is None:
        notes.append(NO_LAYOUT_NOTE)
        world_splits = _world_op_splits(by_rank, world_size) if evidence is None and logged is None else []
        if world_splits:
            mode = Mode.WORLD_OPS
            causes = find_causes(world_splits, by_rank, None)
            mismatches = _ordered_mismatches(causes.mismatches)
    waited_on = set(causes.blocked_on) if causes is not None and mode == Mode.GROUPS else set()
    if evidence is not None:  # members of a group a dumped member waits in, that have no dump
        waited_on |= evidence.waited_on_undumped
    missing_is_a_finding = False
    if missing and not snapshot.captures and (evidence is not None or logged is not None):
        notes.append("no stacks: the diagnosis rests on the " + ("Flight Recorder" if evidence else "watchdog log"))
    elif missing and (layout is None and evidence is None and logged is None or set(missing) & waited_on):
        missing_is_a_finding = True
    elif missing and world_size is not None:  # a partial capture (one node of many) is normal: say what it covers
        notes.append(
            f"{world_size - len(missing)} of {world_size} ranks captured; rank"
            f"{'s' if len(missing) > 1 else ''} {_list(missing)} not captured, and nothing captured "
            "waits on them"
        )
    facts = Facts(
        mode=mode,
        layout=layout,
        views=views,
        by_rank=by_rank,
        world_size=world_size,
        mismatches=mismatches,
        causes=causes,
        size_problems=evidence.size_problems if evidence else logged.size_problems if logged else (),
        stuck_groups=evidence.stuck if evidence else (),
        missing=tuple(missing),
        missing_is_a_finding=missing_is_a_finding,
        fr_found=fr is not None,
        waited_on_undumped=evidence.waited_on_undumped if evidence else frozenset(),
    )
    found = findings.build(facts)
    notes += _capture_notes(snapshot, views, read.states)
    verdict = _verdict(found, by_rank, layout, notes)
    report = Report(
        verdict=verdict,
        world_size=world_size,
        layout=layout.record() if layout is not None else None,
        ranks=views,
        stacks=stacks,
        sites=group_sites(views),
        mismatches=mismatches,
        findings=found,
        layout_source=layout_source,
        notes=tuple(notes),
    )
    if fr is not None and evidence is not None and fr_evidence is not None:
        report = replace(report, flight_recorder=fr_evidence.section(report, fr, evidence))
    if log is not None:
        shown = logged or fold_log(log, layout, coords_of if layout is not None else None)
        report = replace(
            report, watchdog=WatchdogSection(timeouts=tuple(t.logged() for t in log.timeouts), lines=tuple(shown.lines))
        )
    return report


def _world_op_splits(by_rank: dict[int, RankView], world_size: int | None) -> list[Mismatch]:
    """Without a layout, the collectives that run on the world group whatever the layout (barrier, group and
    communicator creation) can still be found split: every rank of the world must enter them."""
    if world_size is None or not by_rank or not any(v.op in WORLD_OPS for v in by_rank.values()):
        return []
    world = ParallelLayout.for_world(world_size)
    in_world_ops = {r: v for r, v in by_rank.items() if 0 <= r < world_size}
    splits = [m for m in find_mismatches(in_world_ops, world) if m.op in WORLD_OPS and m.group == "world"]
    # Only where the absent ranks are in world-group calls too: one in a collective of a group the missing
    # layout would name may be the root, and without the layout this cannot say.
    return [m for m in splits if all(by_rank.get(a) is not None and by_rank[a].op in WORLD_OPS for a in m.absent)]


def _fr_evidence() -> ModuleType:
    """The Flight Recorder's analysis, imported only when there are dumps (``inspect`` of a job without them
    never loads it)."""
    from mtpdiag.analysis.flight_recorder import evidence

    return evidence


def _with_flight_recorder(
    views: list[RankView], fr: FRDump, evidence: FREvidence, layout: ParallelLayout | None, coords_of: CoordsOf
) -> tuple[list[RankView], set[int]]:
    """Each captured rank's wait with what the recorder has pending for it; a view for each rank that has a
    dump but no stack (``analyze --fr`` alone), and the set of those ranks."""
    fr_evidence = _fr_evidence()
    out = [fr_evidence.with_pending(v, evidence.pending) for v in views]
    seen = {v.rank for v in views if v.rank is not None}
    added = set()
    for dump in fr.ranks:
        if dump.rank in seen:
            continue
        view = fr_evidence.view_without_stack(dump.rank, fr, evidence.pending)
        if layout is not None and dump.rank < layout.world_size:
            view = replace(view, coords=coords_of(dump.rank))
        out.append(view)
        added.add(dump.rank)
    return out, added


# ---------------------------------------------------------------- ranks


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


def _sorted_and_indexed(
    captured: list[RankView], layout: ParallelLayout | None, notes: list[str]
) -> tuple[tuple[RankView, ...], dict[int, RankView]]:
    """The views by rank (unranked last, then by pid), and ``_index`` of them. When every view has a rank of its
    own, inside the layout's world (a job's captures, merged by rank), the rank alone orders them and indexes
    them, read in C (8 ms of Python at 16k ranks)."""
    ranks = list(map(attrgetter("rank"), captured))
    if ranks and None not in ranks and len(set(ranks)) == len(ranks):
        ranks.sort()
        if layout is None or 0 <= ranks[0] and ranks[-1] < layout.world_size:
            views = tuple(sorted(captured, key=attrgetter("rank")))
            return views, dict(zip(ranks, views, strict=True))
    views = tuple(sorted(captured, key=lambda v: (v.rank is None, v.rank if v.rank is not None else 0, v.pid or 0)))
    return views, _index(views, layout, notes)


def _index(views: tuple[RankView, ...], layout: ParallelLayout | None, notes: list[str]) -> dict[int, RankView]:
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
    if unranked:
        notes.append(
            f"{unranked} capture{'s carry' if unranked > 1 else ' carries'} no rank (no RANK in "
            "the environment or the file name): left out of the group analysis"
        )
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
    return by_rank


# ---------------------------------------------------------------- world and layout


def _world_size(
    snapshot: Snapshot, layout: ParallelLayout | None, notes: list[str], fr: FRDump | None = None
) -> int | None:
    sizes = snapshot.world_sizes
    if len(sizes) > 1:
        notes.append(f"captures disagree on WORLD_SIZE ({', '.join(map(str, sizes))}): using {sizes[-1]}")
    if sizes:
        return sizes[-1]
    recorded: int | None = _fr_evidence().world_size(fr) if fr is not None else None
    if recorded is not None:
        if layout is None or layout.world_size == recorded:
            return recorded
    if layout is not None:
        notes.append(f"WORLD_SIZE not in the captures: the layout's world of {layout.world_size} is assumed")
        return None
    notes.append("WORLD_SIZE unknown (not in the captures' environment): cannot tell whether every rank was captured")
    return None


def _usable_layout(layout: ParallelLayout | None, world_size: int | None, notes: list[str]) -> ParallelLayout | None:
    if layout is None or world_size is None or layout.world_size == world_size:
        return layout
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
        notes.append(
            f"the layout ({layout.world_size} ranks) does not fit WORLD_SIZE {world_size} ({exc}): it is ignored"
        )
        return None
    notes.append(
        f"the layout described {layout.world_size} ranks but WORLD_SIZE is {world_size}: dp is taken as {fitted.dp}"
    )
    return fitted


# ---------------------------------------------------------------- report


def _ordered_mismatches(mismatches: tuple[Mismatch, ...]) -> tuple[Mismatch, ...]:
    return tuple(sorted(mismatches, key=lambda m: (m.role != Role.ROOT, m.members[0], m.op)))


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
    pairs = list(map(attrgetter("op", "site"), views))
    p2p = {pair for pair in set(pairs) if is_p2p_op(*pair)}
    unknown_peers = (
        [
            v.rank
            for v in compress(views, map(p2p.__contains__, pairs))
            if v.peer is None and v.rank is not None and v.state == RankState.COLLECTIVE
        ]
        if p2p
        else []
    )
    if unknown_peers:
        notes.append(
            f"the peer of rank{'s' if len(unknown_peers) > 1 else ''} {_list(unknown_peers)}'s "
            "send/recv is unknown: it is not matched"
        )
    return notes


def _verdict(
    found: tuple[Finding, ...], by_rank: dict[int, RankView], layout: ParallelLayout | None, notes: list[str]
) -> Verdict:
    """``problem`` when a finding names one; ``ok`` only when no rank is stuck; else ``incomplete`` (then the
    ``unexplained-wait`` finding says what the ranks wait on and what to collect next). A single dump cannot
    prove a hang, so ``ok`` needs every rank seen running its own code."""
    if any(findings.is_problem(f) for f in found):
        return Verdict.PROBLEM
    if not by_rank:
        notes.append("no capture carries a rank: nothing to diagnose")
        return Verdict.INCOMPLETE
    waiting = [v for v in by_rank.values() if v.state == RankState.COLLECTIVE]
    if layout is None and waiting and len({(v.op, v.site) for v in by_rank.values()}) > 1:
        notes.append("ranks wait at different sites; a layout is needed to tell which group is split")
    return Verdict.INCOMPLETE if found else Verdict.OK


def _list(ranks: list[int]) -> str:
    return rank_list(ranks, _LIST, more=", … ({n})")
