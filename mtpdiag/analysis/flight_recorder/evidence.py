"""The Flight Recorder's account of a hang, folded into the diagnosis (pure).

On NCCL the stacks of a hung job usually show no collective: every rank sits at a later host sync. The
Flight Recorder then says which collective hangs, who issued it from where, and who did not. This module
turns ``flight_recorder.match_groups`` into what ``diagnose`` works with:

* split collectives (``Mismatch``, ``source="flight-recorder"``), with their gate read from the layout and
  the recorder's own evidence of root or consequence (``FRSplitHint``);
* size and dtype disagreements inside one collective, which are not splits at all;
* groups where every member waits at one number (nothing split: below Python);
* a view of each rank that has a dump but no stack (``analyze --fr`` alone), and, for ranks with both,
  the recorder's pending op as evidence of what their host sync waits for.

Stacks say where each rank is now; the recorder says which collective hangs. Where both show the same split,
``merge`` keeps one, marked ``stacks+flight-recorder``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from mtpdiag.analysis.flight_recorder.correlate import correlate
from mtpdiag.analysis.flight_recorder.match import match_groups
from mtpdiag.analysis.flight_recorder.results import Divergence, FRAnalysis, FRCallSplit, GroupMatch
from mtpdiag.analysis.gate import read_gate
from mtpdiag.analysis.known_sites import is_mtp_site
from mtpdiag.analysis.mismatch import mismatch_key
from mtpdiag.layout import GROUP_KINDS, ParallelLayout
from mtpdiag.model import FlightRecorderSection, Mismatch, RankView, Report, Site, WaitState, replace
from mtpdiag.model.flight_recorder import FRDump, FREntry
from mtpdiag.vocabulary.groups import MEGATRON_GROUP_KINDS, GroupKind
from mtpdiag.vocabulary.labels import rank_list
from mtpdiag.vocabulary.matching import DivergenceKind, MatchRole
from mtpdiag.vocabulary.states import GateStrength, GroupFrom, RankState, Role, Source
from mtpdiag.vocabulary.waits import Confidence, WaitKind

CoordsOf = Callable[[int], Mapping[str, int]]


@dataclass(frozen=True)
class SizeProblem:
    """Every member entered the collective at ``seq``, but their sizes (or dtypes) differ."""

    group: str
    desc: str
    kind: str | None
    members: tuple[int, ...]
    seq: int
    op: str
    site: Site | None
    problem: str  # sizes | dtypes
    by_value: Mapping[str, tuple[int, ...]]  # "14 elements" -> ranks


@dataclass(frozen=True)
class StuckGroup:
    """Every member of a group that reached ``seq`` waits there, and nothing diverged before it."""

    group: str
    desc: str
    members: tuple[int, ...]
    seq: int
    op: str
    site: Site | None


SplitKey = tuple[object, ...]  # what makes two reports of a split the same split (``mismatch_key``)


@dataclass(frozen=True)
class FREvidence:
    analysis: FRAnalysis
    mismatches: tuple[Mismatch, ...]
    root_hints: frozenset[SplitKey]  # mismatch keys the recorder's program order makes a root
    size_problems: tuple[SizeProblem, ...]
    stuck: tuple[StuckGroup, ...]
    pending: Mapping[int, str]  # rank -> its oldest pending op, in words
    # Members without a dump of a group in which a dumped member waits: the capture lacks them, and others
    # wait for them (what ``missing-rank`` is for).
    waited_on_undumped: frozenset[int] = frozenset()


def section(report: Report, fr: FRDump, evidence: FREvidence) -> FlightRecorderSection:
    """The report's ``flight_recorder`` object: the older per-group view next to the diagnosis (``correlate``),
    each group's first divergence, and the lines the console shows."""
    # Hold the recorder against what the stacks alone said: splits it found itself agree by construction,
    # and ranks known only from their dumps have no stack to compare.
    stacks_only = replace(
        report,
        mismatches=tuple(m for m in report.mismatches if m.source == Source.STACKS),
        ranks=tuple(v for v in report.ranks if v.stack is not None),
    )
    out = correlate(stacks_only, fr)
    lines = list(out.lines[:1])
    for d in evidence.analysis.divergences:
        lines.append(_divergence_line(d))
    lines += [line for line in out.lines[1:] if not line.startswith("group ")]
    return replace(
        out,
        lines=tuple(lines),
        divergences=evidence.analysis.divergences,
        unmatched_p2p=evidence.analysis.p2p,
    )


def _divergence_line(d: Divergence) -> str:
    calls = "; ".join(f"{c.op}{_at(c.site)} by {_ranks(c.entered)}" for c in d.calls)
    missing = f"; never reached by {_ranks(d.missing)}" if d.missing else ""
    return (
        f"group {d.group} ({d.desc or '?'}, ranks {_ranks(d.members)}) first diverges at #{d.seq} "
        f"({', '.join(d.problems)}): {calls}{missing}"
    )


def _at(site: Site | None) -> str:
    return f" at {site.function.rsplit('.', 1)[-1]} ({os.path.basename(site.file)}:{site.line})" if site else ""


def _ranks(ranks: Sequence[int]) -> str:
    return "[" + rank_list(ranks, 12) + "]"


def world_size(fr: FRDump) -> int | None:
    """The world the dumps describe: the default group's members, else the highest rank any group names."""
    ranks = [r for d in fr.ranks for g in d.groups if g.desc == "default_pg" for r in g.ranks]
    if not ranks:
        ranks = [r for d in fr.ranks for g in d.groups for r in g.ranks] + [d.rank for d in fr.ranks]
    return max(ranks) + 1 if ranks else None


def layout_members(fr: FRDump, layout: ParallelLayout | None) -> dict[str, tuple[int, ...]]:
    """Group name -> members, from the layout, for groups whose dumps carry no ``pg_config`` membership
    (torch 2.13's gloo records none): megatron's description names the kind."""
    if layout is None:
        return {}
    out: dict[str, tuple[int, ...]] = {}
    for dump in fr.ranks:
        if dump.rank >= layout.world_size:
            continue
        for entry in dump.entries:
            if entry.group in out:
                continue
            kind = MEGATRON_GROUP_KINDS.get(entry.group_desc)
            if kind is not None and kind in GROUP_KINDS:
                out[entry.group] = tuple(sorted(layout.group_of(kind, dump.rank)))
    return out


def fold(fr: FRDump, layout: ParallelLayout | None, coords_of: CoordsOf | None) -> FREvidence:
    """The recorder's splits, size problems, stuck groups and pending ops, ready for ``diagnose``."""
    analysis = match_groups(fr, layout_members(fr, layout))
    hints: set[SplitKey] = set()
    sizes: list[SizeProblem] = []
    # Splits of one call (op and site) in several instances of a group kind share one gate, read over all of
    # them, as the stacks' analysis does: two pipeline groups with one rank on each side are two and two.
    by_call: dict[
        tuple[str, Site | None, str], list[tuple[Divergence, FRCallSplit, str, GroupFrom, tuple[str, ...]]]
    ] = {}
    for d in analysis.divergences:
        kind, group_from, candidates = _kind_of(d, layout)
        splits = [c for c in d.calls if c.absent]
        for call in splits:
            by_call.setdefault((call.op, call.site, kind), []).append((d, call, kind, group_from, candidates))
        if not splits and d.calls and ({"sizes", "dtypes"} & set(d.problems)):
            sizes += _size_problems(d, kind)
    mismatches: list[Mismatch] = []
    for (op, site, kind), items in by_call.items():
        reading = (
            read_gate([_Split(d.members, c.entered, c.absent) for d, c, *_ in items], coords_of) if coords_of else None
        )
        if reading is not None and reading.gate is None:
            reading = None
        strength = reading.strength if reading else None
        if (
            reading
            and strength == GateStrength.WEAK
            and is_mtp_site(site)
            and kind == GroupKind.DP_CP
            and reading.gate == {"cp": 0}
        ):
            strength = GateStrength.STRONG  # the known verl #5895 signature
        for d, call, _, group_from, candidates in items:
            m = Mismatch(
                op=op,
                site=site,
                group=kind,
                members=d.members,
                entered=call.entered,
                absent=call.absent,
                gate=reading.gate if reading else None,
                absent_doing=dict(call.absent_doing),
                role=Role.ROOT,
                group_from=group_from,
                group_candidates=candidates,
                gate_strength=strength,
                gate_alternatives=reading.alternatives if reading else (),
                source=Source.FLIGHT_RECORDER,
                seq=d.seq,
            )
            mismatches.append(m)
            if call.role == MatchRole.ROOT:
                hints.add(mismatch_key(m))
    stuck = tuple(_stuck(g, fr) for g in analysis.groups if g.stuck is not None and g.divergence is None)
    waited = frozenset(
        r
        for g in analysis.groups
        if g.no_dump and any(g.last_entered.get(m, 0) > g.last_completed.get(m, 0) for m in g.members)
        for r in g.no_dump
    )
    return FREvidence(
        analysis=analysis,
        mismatches=tuple(mismatches),
        root_hints=frozenset(hints),
        size_problems=tuple(sizes),
        stuck=stuck,
        pending=_pending(fr),
        waited_on_undumped=waited,
    )


def merge(stack_mismatches: Sequence[Mismatch], fr_mismatches: Sequence[Mismatch]) -> tuple[Mismatch, ...]:
    """One list: a split both sources show once (the recorder's group, seq and membership win; the stacks'
    absent_doing, which says where each rank is now), the rest as they are."""
    by_key = {mismatch_key(m): m for m in fr_mismatches}
    out = []
    for m in stack_mismatches:
        fr = by_key.pop(mismatch_key(m), None)
        if fr is None:
            out.append(m)
        else:
            out.append(
                replace(
                    fr, absent_doing={**fr.absent_doing, **m.absent_doing}, source=Source.STACKS_AND_FLIGHT_RECORDER
                )
            )
    out += by_key.values()
    return tuple(out)


def view_without_stack(rank: int, fr: FRDump, pending: Mapping[int, str]) -> RankView:
    """A rank known only from its dump: in the collective the recorder has pending for it, if any."""
    entry = _oldest_pending(fr, rank)
    op, site = (entry.op, entry.site) if entry is not None else (None, None)
    text = pending.get(rank)
    wait = WaitState(
        WaitKind.COLLECTIVE if op else WaitKind.UNKNOWN,
        Confidence.LIKELY,
        (f"Flight Recorder: {text}" if text else "Flight Recorder: nothing pending",),
    )
    return RankView(
        rank=rank,
        pid=None,
        host="unknown",
        state=RankState.COLLECTIVE if op else RankState.WAITING,
        coords=None,
        op=op,
        site=site,
        stack=None,
        wait=wait,
    )


def with_pending(view: RankView, pending: Mapping[int, str]) -> RankView:
    """A rank's wait, with what the recorder says it waits for (the collective behind a host sync).

    A rank the stacks see on the CPU or blocked in an unnamed C call, while the recorder has one of its
    collectives pending, waits on the device for that collective: NCCL's picture of a hang, not a straggler.
    """
    if view.rank is None or view.rank not in pending or view.wait is None or view.op is not None:
        return view
    evidence = (*view.wait.evidence, f"Flight Recorder: {pending[view.rank]}")
    if view.wait.kind in (WaitKind.RUNNING, WaitKind.UNKNOWN):
        return replace(
            view,
            state=RankState.WAITING,
            wait=replace(view.wait, kind=WaitKind.HOST_SYNC, confidence=Confidence.LIKELY, evidence=evidence),
        )
    return replace(view, wait=replace(view.wait, evidence=evidence))


# ---------------------------------------------------------------- details


@dataclass(frozen=True)
class _Split:
    members: tuple[int, ...]
    entered: tuple[int, ...]
    absent: tuple[int, ...]


def _kind_of(d: Divergence, layout: ParallelLayout | None) -> tuple[str, GroupFrom, tuple[str, ...]]:
    """The layout kind of a recorded group: megatron's description names it; else the one kind whose
    instance has exactly these members; else the recorder's own name for the group."""
    if d.kind is not None:
        return d.kind, GroupFrom.FLIGHT_RECORDER, (d.kind,)
    if layout is not None and d.members and max(d.members) < layout.world_size:
        fits = [k for k in GROUP_KINDS if tuple(sorted(layout.group_of(k, d.members[0]))) == d.members]
        if fits:
            return fits[0], GroupFrom.FLIGHT_RECORDER, tuple(fits)
    return d.desc or d.group, GroupFrom.FLIGHT_RECORDER, ()


def _size_problems(d: Divergence, kind: str | None) -> list[SizeProblem]:
    out = []
    for problem in ("sizes", "dtypes"):
        if problem not in d.problems:
            continue
        by_value: dict[str, list[int]] = {}
        op = site = None
        for r in d.ranks:
            if r.op is None:  # it issued nothing at the number
                continue
            op, site = op or r.op, site or r.site
            value = (
                f"{r.input_numel} element{'s' if r.input_numel != 1 else ''}"
                if problem == DivergenceKind.SIZES
                else "/".join(r.input_dtypes or ()) or "?"
            )
            by_value.setdefault(value, []).append(r.rank)
        out.append(
            SizeProblem(
                group=d.group,
                desc=d.desc,
                kind=kind,
                members=d.members,
                seq=d.seq,
                op=op or "?",
                site=site,
                problem=problem,
                by_value={k: tuple(v) for k, v in by_value.items()},
            )
        )
    return out


def _stuck(g: GroupMatch, fr: FRDump) -> StuckGroup:
    entry = next(
        (
            e
            for d in fr.ranks
            for e in d.entries
            if e.group == g.name and not e.is_p2p and e.collective_seq_id == g.stuck
        ),
        None,
    )
    return StuckGroup(
        group=g.name,
        desc=g.desc,
        members=g.members,
        seq=g.stuck or 0,
        op=entry.op if entry else "?",
        site=entry.site if entry else None,
    )


def _pending(fr: FRDump) -> dict[int, str]:
    """Each rank's oldest op that has not completed, in words (``all_reduce #1 in DATA_PARALLEL_GROUP_WITH_CP
    (timed out)``)."""
    out = {}
    for dump in fr.ranks:
        e = _oldest_pending(fr, dump.rank)
        if e is None:
            continue
        seq = f"p2p #{e.p2p_seq_id}" if e.is_p2p else f"#{e.collective_seq_id}"
        state = "timed out" if e.timed_out else e.state
        out[dump.rank] = f"waits for {e.op} {seq} in {e.group_desc or e.group} ({state})"
    return out


def _oldest_pending(fr: FRDump, rank: int) -> FREntry | None:
    dump = fr.rank(rank)
    waiting = [e for e in dump.entries if not e.done] if dump is not None else []
    return min(waiting, key=lambda e: e.record_id) if waiting else None
