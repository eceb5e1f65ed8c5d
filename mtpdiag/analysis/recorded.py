"""The diagnosis' steps over what the job recorded itself: torch's Flight Recorder dumps and the NCCL
watchdog's log, each joined to the stacks.

Each step imports its analysis (``flight_recorder.evidence``, ``log_evidence``) when it runs, so a diagnosis
of stacks alone never loads them (``analyze`` of bundles without dumps, ``inspect`` of a job that wrote
none). This module is that boundary: the functions are typed, so every join of a record to the stacks is
checked by mypy, and ``diagnose`` imports nothing on a condition.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from mtpdiag.model import FlightRecorderSection, Mismatch, RankView, Report, WatchdogSection, replace

if TYPE_CHECKING:  # imported where the steps run: their import is what a diagnosis of stacks alone skips
    from mtpdiag.analysis.flight_recorder.evidence import FREvidence
    from mtpdiag.analysis.gate import CoordsOf
    from mtpdiag.analysis.log_evidence import LogEvidence
    from mtpdiag.layout import ParallelLayout
    from mtpdiag.model.flight_recorder import FRDump
    from mtpdiag.model.watchdog import WatchdogLog


class RecorderJoin(msgspec.Struct, frozen=True):
    """The Flight Recorder's evidence joined to the ranks' views: each captured rank's view with what the
    recorder has pending for it, a view for each rank that has a dump but no stack (``dump_only``), and the
    recorder's notes for the report."""

    fr: FRDump
    evidence: FREvidence
    views: list[RankView]
    dump_only: frozenset[int]
    notes: tuple[str, ...]


def recorded_world_size(fr: FRDump) -> int | None:
    """The world the dumps describe (their default group's members, else the highest rank they name)."""
    from mtpdiag.analysis.flight_recorder.evidence import world_size

    return world_size(fr)


def join_recorder(
    views: list[RankView], fr: FRDump, layout: ParallelLayout | None, coords_of: CoordsOf
) -> RecorderJoin:
    """Fold the dumps into splits and pending ops, and join them to the captured ranks' views."""
    from mtpdiag.analysis.flight_recorder.evidence import fold, view_without_stack, with_pending

    evidence = fold(fr, layout, coords_of if layout is not None else None)
    joined = [with_pending(v, evidence.pending) for v in views]
    seen = {v.rank for v in views if v.rank is not None}
    added = set()
    for dump in fr.ranks:
        if dump.rank in seen:
            continue
        view = view_without_stack(dump.rank, fr, evidence.pending)
        if layout is not None and dump.rank < layout.world_size:
            view = replace(view, coords=coords_of(dump.rank))
        joined.append(view)
        added.add(dump.rank)
    notes = tuple(f"Flight Recorder: {n}" for n in (*fr.notes, *evidence.analysis.notes))
    return RecorderJoin(fr=fr, evidence=evidence, views=joined, dump_only=frozenset(added), notes=notes)


def with_recorder_splits(from_stacks: list[Mismatch], join: RecorderJoin) -> tuple[Mismatch, ...]:
    """The splits the stacks show and those the recorder shows, the same split once (``stacks+flight-recorder``)."""
    from mtpdiag.analysis.flight_recorder.evidence import merge

    return merge(from_stacks, join.evidence.mismatches)


def recorder_section(report: Report, join: RecorderJoin) -> FlightRecorderSection:
    """The report's ``flight_recorder`` object."""
    from mtpdiag.analysis.flight_recorder.evidence import section

    return section(report, join.fr, join.evidence)


class WatchdogJoin(msgspec.Struct, frozen=True):
    """The watchdog's timeouts read group by group: their splits and size problems, and the lines in words."""

    log: WatchdogLog
    evidence: LogEvidence


def fold_watchdog(log: WatchdogLog, layout: ParallelLayout | None, coords_of: CoordsOf) -> WatchdogJoin:
    """The splits and size problems of the watchdog's timeouts, group by group."""
    from mtpdiag.analysis.log_evidence import fold_log

    return WatchdogJoin(log=log, evidence=fold_log(log, layout, coords_of if layout is not None else None))


def watchdog_section(join: WatchdogJoin) -> WatchdogSection:
    """The report's ``watchdog`` object: the timeouts as logged, and in words."""
    return WatchdogSection(
        timeouts=tuple(t.logged() for t in join.log.timeouts),
        lines=tuple(join.evidence.lines),
        signals=tuple(s.logged() for s in join.log.statuses if s.signal_from is not None),
    )
