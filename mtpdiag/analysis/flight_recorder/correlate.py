"""The recorder's view next to the stack diagnosis, and where the two disagree (pure)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from mtpdiag.analysis.flight_recorder.progress import (
    GroupProgress,
    conflicting_memberships,
    group_progress,
    group_sort_key,
    recorded_groups,
)
from mtpdiag.model import FlightRecorderSection, Mismatch, RankView, Report, Site, replace
from mtpdiag.model.flight_recorder import FRDump, FREntry, FRGroup, FRRankDump
from mtpdiag.model.fr_analysis import FRGroupProgress, FRPendingOp, FRSplitCheck
from mtpdiag.vocabulary.groups import COORDINATES, MEGATRON_GROUP_KINDS, GroupKind
from mtpdiag.vocabulary.labels import rank_list
from mtpdiag.vocabulary.matching import MembersFrom
from mtpdiag.vocabulary.ops import P2P_CALLS, RECORDED_FOR
from mtpdiag.vocabulary.states import RankState
from mtpdiag.vocabulary.waits import WaitKind

if TYPE_CHECKING:
    from mtpdiag.layout import ParallelLayout

MAX_LINES = 20


def ops_match(stack_op: str, fr_op: str) -> bool:
    return fr_op == stack_op or fr_op in RECORDED_FOR.get(stack_op, ())


def correlate(report: Report, fr: FRDump) -> FlightRecorderSection:
    """The recorder's view next to the diagnosis (the report's ``flight_recorder`` section, before
    ``evidence.section`` adds each group's divergence). ``lines`` tell the same story in plain words."""
    progress = group_progress(fr)
    disagreements = conflicting_memberships(fr) + _layout_conflicts(report, recorded_groups(fr).values())
    matched: list[FRSplitCheck] = []
    for m in report.mismatches:
        view, lines = _match_mismatch(m, progress, fr)
        matched.append(view)
        disagreements += lines
    rank_lines, notes = _rank_checks(report, fr)
    disagreements += rank_lines
    dumped = [d.rank for d in fr.ranks]
    missing = [r for r in range(report.world_size or 0) if r not in dumped]
    if missing:
        notes.append(f"no Flight Recorder dump for rank(s) {_ranks_text(missing)}")
    return FlightRecorderSection(
        source=fr.source,
        version=next((d.version for d in fr.ranks if d.version), ""),
        ranks=tuple(dumped),
        missing_ranks=tuple(missing),
        groups=tuple(_group_record(g) for g in progress),
        mismatches=tuple(matched),
        disagreements=tuple(disagreements),
        notes=tuple(notes),
        lines=tuple(_lines(fr, progress, matched, disagreements, notes)),
    )


def _match_mismatch(m: Mismatch, progress: Iterable[GroupProgress], fr: FRDump) -> tuple[FRSplitCheck, list[str]]:
    """Find the recorder's group for a mismatch of the diagnosis, and compare who entered it.

    Without ``pg_config`` membership the layout's members are used, and a member whose dump has no
    entry in the group counts as never having entered it.
    """
    view = FRSplitCheck(
        op=m.op, group=m.group, role=m.role, members=m.members, entered=m.entered, absent=m.absent, fr_group=None
    )
    candidates = [g for g in progress if any(ops_match(m.op, e.op) for r in m.entered for e in g.pending.get(r, ()))]
    if not candidates:
        return view, [
            f"stacks say rank(s) {_ranks_text(m.entered)} wait in {m.op} ({m.group} "
            f"{list(m.members)}); FR has no pending {m.op} for them"
        ]
    g = sorted(candidates, key=lambda c: (c.kind != m.group, set(c.members) != set(m.members), group_sort_key(c.name)))[
        0
    ]
    exact = g.members_from == MembersFrom.PG_CONFIG
    members = list(g.members) if exact else sorted(set(m.members) | set(g.members))
    reached = {r: g.last_entered.get(r, 0) for r in members if fr.rank(r) is not None}
    seq = max(e.collective_seq_id for r in m.entered for e in g.pending.get(r, ()) if ops_match(m.op, e.op))
    fr_entered = [r for r in members if r in reached and reached[r] >= seq]
    fr_absent = [r for r in members if r in reached and reached[r] < seq]
    agrees = set(members) == set(m.members) and fr_entered == list(m.entered) and fr_absent == list(m.absent)
    view = replace(
        view,
        fr_group=g.name,
        fr_desc=g.desc,
        fr_members=tuple(members),
        fr_members_from=g.members_from,
        seq=seq,
        fr_entered=tuple(fr_entered),
        fr_absent=tuple(fr_absent),
        agrees=agrees,
    )
    lines = []
    if exact and set(members) != set(m.members):
        lines.append(
            f"FR group {g.name} ({g.desc}) has members {members}; the layout's {m.group} group is {list(m.members)}"
        )
    if fr_entered != list(m.entered) or fr_absent != list(m.absent):
        lines.append(
            f"FR says {m.op} #{seq} in group {g.name} ({g.desc}) was entered by {fr_entered} and "
            f"not by {fr_absent}; stacks say entered {list(m.entered)}, absent {list(m.absent)}"
        )
    return view, lines


def _layout_conflicts(report: Report, groups: Iterable[FRGroup]) -> list[str]:
    """Megatron groups whose recorded members differ from the layout's: one line per group kind."""
    layout = _layout(report)
    if layout is None:
        return []
    groups = sorted((g for g in groups if g.ranks), key=lambda g: group_sort_key(g.name))
    outside = [r for g in groups for r in (min(g.ranks), max(g.ranks)) if not 0 <= r < layout.world_size]
    if outside:  # a dump of another job or layout, or a damaged one: no group of the layout to hold it against
        return [f"FR groups hold rank {outside[0]}, outside the layout's world of {layout.world_size}"]
    wrong: dict[GroupKind, list[FRGroup]] = {}
    for g in groups:
        kind = MEGATRON_GROUP_KINDS.get(g.desc)
        if kind is not None and tuple(layout.group_of(kind, g.ranks[0])) != g.ranks:
            wrong.setdefault(kind, []).append(g)
    lines = []
    for kind, bad in wrong.items():
        descs = ", ".join(sorted({g.desc for g in bad}))
        recorded = " ".join(str(list(r)) for r in sorted({g.ranks for g in bad}))
        ranks = {r for g in bad for r in g.ranks}
        expected = " ".join(str(list(r)) for r in sorted({tuple(layout.group_of(kind, r)) for r in ranks}))
        lines.append(
            f"FR records the {kind} groups ({descs}) as {recorded}; the layout "
            f"({_layout_text(layout)}) makes them {expected}"
        )
    return lines


def _layout_text(layout: ParallelLayout) -> str:
    return " ".join(f"{k}={getattr(layout, k)}" for k in COORDINATES)


def _layout(report: Report) -> ParallelLayout | None:
    if not report.layout:
        return None
    from mtpdiag.layout import LayoutError, ParallelLayout

    try:
        return ParallelLayout(**report.layout.sizes(), order=report.layout.order)
    except (LayoutError, TypeError):
        return None


_NO_P2P_NOTE = "FR holds no send/recv at all (torch 2.13's gloo does not record point-to-point ops)"


def _rank_checks(report: Report, fr: FRDump) -> tuple[list[str], list[str]]:
    """Each rank's stack op against its latest pending recorded op."""
    lines: list[str] = []
    notes: list[str] = []
    any_p2p = any(e.is_p2p or e.op in P2P_CALLS for d in fr.ranks for e in d.entries)
    for view in report.ranks:
        dump = fr.rank(view.rank) if view.rank is not None else None
        if dump is None or view.state in (RankState.GONE, RankState.UNREADABLE):
            continue
        if view.op in P2P_CALLS and not any_p2p:
            if _NO_P2P_NOTE not in notes:
                notes.append(_NO_P2P_NOTE)
            continue
        line = _rank_check(view, dump)
        if line is not None:
            lines.append(line)
    return lines, notes


def _rank_check(view: RankView, dump: FRRankDump) -> str | None:
    """Where the stacks and the recorder disagree on one rank, the sentence that says so."""
    pending = [e for e in dump.entries if not e.done]
    latest = max(pending, key=lambda e: e.record_id) if pending else None
    op = view.op
    if op is None:
        at_host_sync = view.wait is not None and view.wait.kind == WaitKind.HOST_SYNC
        if latest is None or at_host_sync:  # on NCCL a rank waits for its collective at a sync
            return None
        entry = _entry_text(latest)
        return f"FR says rank {view.rank} waits in {entry}; stacks say it is in no collective{_at(view.site)}"
    if op == "wait":
        return (
            None
            if latest is not None
            else f"stacks say rank {view.rank} waits on a Work handle; FR has nothing pending for it"
        )
    if op in P2P_CALLS:
        if any(ops_match(op, e.op) for e in pending):
            return None
        return f"stacks say rank {view.rank} waits in {op}; FR has no pending {op} for it"
    if latest is None:
        done = [e for e in dump.entries if e.done]
        last = max(done, key=lambda e: e.record_id) if done else None
        what = f"last completed {_entry_text(last)}" if last else "recorded no op"
        return f"FR says rank {view.rank} {what} and has nothing pending; stacks say it waits in {op}"
    if not ops_match(op, latest.op):
        return f"FR says rank {view.rank} waits in {_entry_text(latest)}; stacks say it waits in {op}"
    return None


def _lines(
    fr: FRDump,
    progress: Sequence[GroupProgress],
    matched: Sequence[FRSplitCheck],
    disagreements: Sequence[str],
    notes: Sequence[str],
) -> list[str]:
    dumped = [d.rank for d in fr.ranks]
    out = [f"Flight Recorder: {len(dumped)} dump(s), rank(s) {_ranks_text(dumped)}, from {fr.source}"]
    for g in progress:
        if not g.behind and not g.pending:
            continue
        waiting = "; ".join(
            f"rank {r} waits in {_entry_text(max(es, key=lambda e: e.record_id), group=False)}"
            for r, es in sorted(g.pending.items())
        )
        text = f"group {g.name} ({g.desc}, ranks {_ranks_text(g.members)}): {waiting or 'nothing pending'}"
        if g.behind:
            behind = ", ".join(f"{r} (#{g.last_entered[r]})" for r in g.behind)
            text += f"; behind: rank(s) {behind}"
        out.append(text)
    for m in matched:
        if m.agrees:
            out.append(
                f"FR agrees with the stacks on {m.op} #{m.seq} in group {m.fr_group} "
                f"({m.fr_desc}, ranks {_ranks_text(m.fr_members or ())}): entered by "
                f"{_ranks_text(m.fr_entered or ())}, never reached by {_ranks_text(m.fr_absent or ())}"
            )
    shown = disagreements[:MAX_LINES]
    out += [f"disagreement: {d}" for d in shown]
    if len(disagreements) > len(shown):
        out.append(f"... and {len(disagreements) - len(shown)} more disagreement(s) in the JSON")
    out += [f"note: {n}" for n in notes]
    return out


def _group_record(g: GroupProgress) -> FRGroupProgress:
    return FRGroupProgress(
        name=g.name,
        desc=g.desc,
        kind=g.kind,
        members=g.members,
        members_from=g.members_from,
        last_entered=dict(sorted(g.last_entered.items())),
        last_completed=dict(sorted(g.last_completed.items())),
        pending={r: tuple(_pending_op(e) for e in es) for r, es in sorted(g.pending.items())},
        behind=g.behind,
        no_dump=g.no_dump,
    )


def _pending_op(e: FREntry) -> FRPendingOp:
    return FRPendingOp(
        op=e.op,
        collective_seq_id=e.collective_seq_id,
        p2p_seq_id=e.p2p_seq_id,
        state=e.state,
        input_sizes=e.input_sizes,
        output_sizes=e.output_sizes,
        site=e.site,
    )


def _entry_text(e: FREntry, group: bool = True) -> str:
    seq = f"p2p #{e.p2p_seq_id}" if e.is_p2p else f"#{e.collective_seq_id}"
    where = f" in group {e.group} ({e.group_desc})" if group else ""
    # the short name, as these lines always read: sites are qualified now (MTPLossLoggingHelper.reduce_...)
    site = f" from {e.site.function.rsplit('.', 1)[-1]}" if e.site else ""
    return f"{e.op} {seq}{where}{site}"


def _at(site: Site | None) -> str:
    return f" (at {site.function})" if site else ""


def _ranks_text(ranks: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5"; [] -> "none"."""
    return rank_list(sorted(set(ranks)), runs=True, sep=",") or "none"
