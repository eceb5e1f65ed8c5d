"""Plain-words phrasing shared by the console, markdown and HTML reports."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from mtpdiag.analysis.findings import provenance
from mtpdiag.analysis.gate import describe_gate, gate_terms
from mtpdiag.model import Mismatch, RankView, Report, Site
from mtpdiag.vocabulary.groups import COORDINATES, GROUP_NAMES
from mtpdiag.vocabulary.labels import coords_label, rank_list
from mtpdiag.vocabulary.states import RankState, Role, Verdict


def site_label(site: Site | None) -> str:
    if site is None:
        return "?"
    return f"{short_function(site.function)} ({site.file}:{site.line})"


def short_function(function: str) -> str:
    """``MTPLossLoggingHelper.reduce_loss_in_tracker`` -> ``reduce_loss_in_tracker``."""
    return function.rsplit(".", 1)[-1] if "<locals>" not in function else function


def rank_label(view: RankView | None, rank: int, layout: Mapping[str, object] | None) -> str:
    coords = coords_label(view.coords if view else None, layout)
    return f"rank {rank} ({coords})" if coords else f"rank {rank}"


def doing(view: RankView | None) -> str:
    """What a rank is doing, in a few words."""
    if view is None:
        return "not captured"
    if view.state in (RankState.GONE, RankState.UNREADABLE):
        return view.state + (f" ({view.error})" if view.error else "")
    prefix = "stopped (SIGSTOP/frozen), " if view.state == RankState.STOPPED else ""
    if view.op:
        direction = "from" if view.op in ("recv", "irecv") else "to"
        peer = f" {direction} rank {view.peer}" if view.peer is not None else ""
        thread = f" on thread {view.wait.thread!r}" if view.wait is not None and view.wait.thread else ""
        return f"{prefix}at {view.op}{peer} in {short_function(view.site.function) if view.site else '?'}{thread}"
    if view.site:
        what = wait_label(view.wait.kind) if view.state == RankState.WAITING and view.wait else "running"
        return f"{prefix}{what} in {short_function(view.site.function)} ({view.site.file}:{view.site.line})"
    return prefix.rstrip(", ") or "no stack"


def wait_label(kind: str | None) -> str:
    """``host_sync`` -> ``waiting on the device at a host sync``."""
    from mtpdiag.vocabulary.waits import WAIT_PHRASES

    return WAIT_PHRASES.get(kind or "running", kind or "running")


def op_cell(op: str | None, wait: str | None) -> str:
    """The op column of a site group: the collective, else what its ranks wait on, in brackets."""
    if op:
        return op
    return f"({(wait or 'running').replace('_', ' ')})"


def wait_rows(report: Report) -> list[tuple[list[int], str, str, tuple[str, ...]]]:
    """(ranks, kind, confidence, evidence) for ranks in no collective, one row per distinct reading."""
    rows: dict[tuple[str, str, tuple[str, ...]], list[int]] = {}
    for v in report.ranks:
        if v.rank is None or v.op is not None or v.wait is None:
            continue
        rows.setdefault((v.wait.kind, v.wait.confidence, v.wait.evidence), []).append(v.rank)
    return [(sorted(ranks), kind, sure, evidence) for (kind, sure, evidence), ranks in rows.items()]


def gate_phrase(gate: Mapping[str, int] | None) -> str:
    if not gate:
        return "no single coordinate separates the ranks that entered from those that did not"
    where = describe_gate(gate)
    excluded = " or ".join(f"{k} > 0" if v == 0 else f"{k} != {v}" for k, v in gate_terms(gate))
    return f"entered only where {where}: a condition that excludes {excluded} gates this collective"


def mismatch_sentence(m: Mismatch, views: Mapping[int, RankView], layout: Mapping[str, object] | None) -> str:
    group = GROUP_NAMES.get(m.group, m.group)
    entered = ", ".join(rank_label(views.get(r), r, layout) for r in m.entered)
    absent = "; ".join(
        f"{rank_label(views.get(r), r, layout)}, which is {_at(m.absent_doing.get(r) or doing(views.get(r)))}"
        for r in m.absent
    )
    where = short_function(m.site.function) if m.site else "?"
    if m.role == Role.CONSEQUENCE:  # its absent ranks are stuck elsewhere, not kept out by a condition
        return (
            f"collective {m.op} at {where} on the {group} group {list(m.members)}: entered by {entered}; "
            f"absent: {absent}. It waits because those ranks are stuck elsewhere.{provenance(m)}"
        )
    return (
        f"collective {m.op} at {where} on the {group} group {list(m.members)}: entered by {entered}; "
        f"absent: {absent}. {gate_phrase(m.gate).capitalize()}.{provenance(m)}"
    )


def layout_line(report: Report) -> str:
    """``layout: tp=1 cp=2 ... from <source>``, or how to give one."""
    if not report.layout:  # a source without a layout: sizes that were found but give none, and why
        found = f"{report.layout_source}; " if report.layout_source else ""
        return f"layout: unknown ({found}pass --tp/--cp/--pp or --config to find split process groups)"
    sizes = " ".join(f"{k}={getattr(report.layout, k)}" for k in COORDINATES)
    source = f" from {report.layout_source}" if report.layout_source else ""
    return f"layout: {sizes}{source}"


def rank_runs(ranks: Iterable[int], limit: int = 12) -> str:
    """Compact rank list: ``0-3, 8, 10``, cut after ``limit`` runs with the total count."""
    return rank_list(ranks, limit, runs=True, more=", … ({n} ranks)")


def _at(activity: str) -> str:
    """``all_gather in ring_attention`` reads as ``at all_gather in ring_attention``."""
    plain = (
        "at ",
        "running",
        "stopped",
        "not ",
        "gone",
        "unreadable",
        "no ",
        "reached ",
        "waiting",
        "blocked",
        "sleeping",
        "creating",
        "issued ",
    )
    return activity if activity.startswith(plain) else f"at {activity}"


def headline(report: Report) -> str:
    """The report's first line: the verdict and the finding a person reads first."""
    n = len(report.ranks)
    world = f" of {report.world_size}" if report.world_size else ""
    if report.verdict == Verdict.PROBLEM:
        if report.findings:
            return f"PROBLEM: {report.findings[0].summary}"
        why = report.notes[-1] if report.notes else "no finding explains it"
        return f"PROBLEM: {n}{world} ranks captured; the job is hung ({why})"
    if report.verdict == Verdict.INCOMPLETE:
        if report.findings:
            return f"INCOMPLETE: {report.findings[0].summary}"
        return f"INCOMPLETE: {n}{world} ranks captured; the evidence cannot say what is wrong"
    if report.progress is not None and not report.progress.hang:
        return f"OK: {n}{world} ranks captured; the job made progress while it was watched: no hang"
    return f"OK: {n}{world} ranks captured; every rank runs its own code: no stuck rank, split collective or straggler"
