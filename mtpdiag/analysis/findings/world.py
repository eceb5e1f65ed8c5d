"""Findings about the whole world: ``missing-rank``, ``all-waiting`` (from the stacks, or the recorder's groups
that all wait at one number) and ``unexplained-wait``, the finding of an incomplete verdict."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from mtpdiag.analysis.findings.facts import Facts
from mtpdiag.analysis.findings.words import FLIGHT_RECORDER_HINT, FR_HOW, Words, union
from mtpdiag.analysis.wait import is_stuck
from mtpdiag.layout import ParallelLayout
from mtpdiag.model import (
    AllWaiting,
    AllWaitingDetails,
    Finding,
    MissingDetails,
    MissingRank,
    OpSite,
    RankView,
    UnexplainedWait,
    UnexplainedWaitDetails,
    WaitingGroup,
)
from mtpdiag.vocabulary.states import FROZEN_STATES, RankState, Source
from mtpdiag.vocabulary.waits import WAIT_PHRASES

if TYPE_CHECKING:  # the Flight Recorder's analysis is imported only when there are dumps
    from mtpdiag.analysis.flight_recorder.evidence import StuckGroup


def missing(facts: Facts, found: Sequence[Finding] = ()) -> list[Finding]:
    """Ranks of the world nobody captured, when something waits on them or nothing else can tell."""
    if not facts.missing_is_a_finding or facts.world_size is None:
        return []
    return [missing_finding(facts.missing, facts.world_size, facts.waited_on | facts.waited_on_undumped, facts.layout)]


def all_waiting(facts: Facts, found: Sequence[Finding]) -> list[Finding]:
    """Every rank waits in one collective (or the recorder shows whole groups waiting at one number) and
    nothing is split or otherwise found: the cause is below Python."""
    ranked = list(facts.by_rank.values())
    if (
        ranked
        and not facts.missing
        and not facts.mismatches
        and not facts.unmatched_p2p
        and not found
        and all(v.state == RankState.COLLECTIVE for v in ranked)
        and (facts.layout is not None or len({(v.op, v.site) for v in ranked}) == 1)
    ):
        return [all_waiting_finding(ranked)]
    if facts.stuck_groups and not facts.mismatches and not found:
        return [stuck_groups_finding(facts.stuck_groups)]
    return []


def unexplained(facts: Facts, found: Sequence[Finding] = ()) -> list[Finding]:
    """Ranks that wait on what the evidence cannot name (the registry builds it only when nothing else is a
    problem): a single dump cannot prove a job healthy, so a stuck rank is never ``ok``."""
    if not facts.by_rank:
        return []
    stuck = [v for v in facts.views if v.state in FROZEN_STATES or is_stuck(v.wait)]
    return [unexplained_wait_finding(stuck, facts.layout is not None, facts.fr_found)] if stuck else []


def missing_finding(
    missing: Sequence[int], world_size: int, waited_on: Iterable[int], layout: ParallelLayout | None
) -> Finding:
    """Ranks 0..world_size-1 that are not in the capture."""
    words = Words(layout)
    waited = sorted(set(waited_on) & set(missing))
    summary = (
        f"{words.ranks(missing, coords=True)} of a world of {world_size} "
        f"{words.verb(missing, 'was', 'were')} not captured"
    )
    if waited:
        summary += f"; {words.ranks(waited)} {words.verb(waited, 'is', 'are')} waited on by others"
    coords = {r: layout.coords(r) for r in missing if r < layout.world_size} if layout is not None else None
    details = MissingDetails(missing=tuple(missing), world_size=world_size, coords=coords)
    return MissingRank(
        ranks=tuple(missing),
        summary=summary,
        details=details,
        remedy=(
            "capture every worker (--all on every node, or every pid or bundle); a rank that is "
            "missing may have crashed: look at its log"
        ),
    )


def all_waiting_finding(views: Sequence[RankView]) -> Finding:
    """Every rank waits in a collective and nothing is split: the cause is below Python."""
    words = Words(None)
    sites = list(dict.fromkeys((v.op, v.site) for v in views))
    ranks = tuple(sorted(v.rank for v in views if v.rank is not None))
    if len(sites) == 1:
        op, site = sites[0]
        what = f"waits in {op} at {words.where(site)}"
    else:
        what = f"waits in a collective ({len(sites)} sites)"
    return AllWaiting(
        ranks=ranks,
        remedy=FLIGHT_RECORDER_HINT,
        summary=f"every rank ({len(ranks)}) {what} and no group is split: the cause is below Python",
        details=AllWaitingDetails(sites=tuple(OpSite(op, site) for op, site in sites)),
    )


def unexplained_wait_finding(stuck: Sequence[RankView], layout_known: bool, fr_found: bool = False) -> Finding:
    """Ranks that wait, and evidence that cannot say for what: where they wait, and what to collect next.

    On NCCL this is the usual picture of a hang: the collective that hangs only enqueued a kernel, and every
    rank sits at a later host sync (``.item()``, ``.cpu()``) with no collective on its stack.
    """
    words = Words(None)
    by_kind: dict[str, list[RankView]] = {}
    for view in stuck:
        by_kind.setdefault(view.wait.kind if view.wait is not None else view.state, []).append(view)
    parts = []
    for kind, views in sorted(by_kind.items(), key=lambda item: (-len(item[1]), item[0])):
        who = sorted(v.rank for v in views if v.rank is not None)
        sites = list(dict.fromkeys(words.where(v.site) for v in views if v.site is not None))
        where = f" ({'; '.join(sites[:2])}{'; …' if len(sites) > 2 else ''})" if sites else ""
        phrase = WAIT_PHRASES.get(kind, kind).replace("waiting", "wait", 1)
        if kind == "collective":
            ops = list(dict.fromkeys(v.op for v in views if v.op))
            phrase = f"wait in {', '.join(ops[:3])}"
        elif kind in ("stopped", "gone", "unreadable"):
            phrase = f"are {kind}" if len(who) != 1 else f"is {kind}"
        elif kind == "running":
            phrase = "on the CPU in their own code (a busy step, or a wait that spins: one dump cannot tell them apart)"
        parts.append(f"{words.ranks(who)} {phrase}{where}")
    ranks = tuple(sorted(v.rank for v in stuck if v.rank is not None))
    kinds = set(by_kind)
    if kinds == {"collective"} and not layout_known:
        summary = "ranks wait in collectives at different call sites and no parallel layout is known: " + "; ".join(
            parts
        )
        remedy = (
            "give the layout (--tp/--cp/--pp/--ep, or --config) so the split process group can be found; "
            f"the Flight Recorder names the groups too: {FR_HOW}"
        )
    else:
        lead = (
            "no rank is in a collective the stacks can see"
            if "collective" not in kinds
            else "the stacks do not explain the hang"
        )
        summary = f"{lead}: " + "; ".join(parts)
        if "host_sync" in kinds:
            summary += (
                ". On NCCL a collective only enqueues a kernel, so the one that hangs is not on any "
                "stack: the ranks wait for it at their next host sync"
            )
        steps = []
        native_first = not kinds & {"host_sync", "collective", "comm_init"}
        if native_first:
            steps.append("see what the C calls wait on with `mtpdiag inspect --native` (py-spy --native)")
        if fr_found:
            steps.append(
                "the Flight Recorder dumps found with this capture did not name a split collective: "
                "check that they are from this hang and cover every rank"
            )
        else:
            steps.append(f"get {FR_HOW}")
        steps.append("tell a hang from a slow step with `mtpdiag watch --pid <pid>`")
        if not native_first and kinds & {"lock", "io", "unknown"}:
            steps.append("see what the C calls wait on with `mtpdiag inspect --native`")
        remedy = "; ".join(steps)
    return UnexplainedWait(
        ranks=ranks,
        summary=summary,
        remedy=remedy,
        details=UnexplainedWaitDetails(
            {k: tuple(sorted(v.rank for v in vs if v.rank is not None)) for k, vs in sorted(by_kind.items())}
        ),
    )


def stuck_groups_finding(stuck: Sequence[StuckGroup]) -> Finding:
    """The Flight Recorder shows groups whose every member waits at one collective, and nothing split."""
    ranks = union(s.members for s in stuck)
    first = stuck[0]
    more = f" (and {len(stuck) - 1} more group{'s' if len(stuck) > 2 else ''})" if len(stuck) > 1 else ""
    return AllWaiting(
        ranks=ranks,
        remedy=FLIGHT_RECORDER_HINT.split("; compare")[0],
        summary=(
            f"the Flight Recorder shows every member of {first.desc or first.group} waiting in {first.op} "
            f"#{first.seq}{more}, and no group split: the cause is below Python"
        ),
        details=AllWaitingDetails(
            source=Source.FLIGHT_RECORDER,
            groups=tuple(
                WaitingGroup(group=s.group, desc=s.desc, seq=s.seq, op=s.op, members=s.members) for s in stuck
            ),
        ),
    )
