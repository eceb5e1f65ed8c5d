"""Findings about the whole world: ``missing-rank``, ``all-waiting`` (from the stacks, or the recorder's groups
that all wait at one number) and ``unexplained-wait``, the finding of an incomplete verdict."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import msgspec

from mtpdiag.analysis.findings.facts import Facts, Mode
from mtpdiag.analysis.findings.words import (
    FLIGHT_RECORDER_HINT,
    FR_HOW,
    SIGNATURE_HANGS,
    SIZE_FLAGS,
    Words,
    capture_remedy,
    union,
)
from mtpdiag.analysis.known_sites import KnownSite, lookup, signature_of
from mtpdiag.analysis.mismatch import doing
from mtpdiag.analysis.wait import is_stuck
from mtpdiag.layout import ParallelLayout
from mtpdiag.model import (
    AllWaiting,
    AllWaitingDetails,
    Finding,
    KnownSiteAt,
    MissingDetails,
    MissingRank,
    OpSite,
    RankView,
    Site,
    UnexplainedWait,
    UnexplainedWaitDetails,
    WaitingGroup,
)
from mtpdiag.vocabulary.groups import GroupKind
from mtpdiag.vocabulary.states import FROZEN_STATES, RankState, Source
from mtpdiag.vocabulary.waits import WAIT_PHRASES, WaitKind

if TYPE_CHECKING:  # the Flight Recorder's analysis is imported only when there are dumps
    from mtpdiag.analysis.flight_recorder.evidence import StuckGroup


def missing(facts: Facts, _found: Sequence[Finding] = ()) -> list[Finding]:
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


def unexplained(facts: Facts, _found: Sequence[Finding] = ()) -> list[Finding]:
    """Ranks that wait on what the evidence cannot name (the registry builds it only when nothing else is a
    problem): a single dump cannot prove a job healthy, so a stuck rank is never ``ok``."""
    if facts.views and all(v.state == RankState.UNREADABLE for v in facts.views):
        return [no_stack_finding(facts.views)]  # with or without ranks: a pid is enough to say what to do
    stuck = [v for v in facts.views if v.state in FROZEN_STATES or is_stuck(v.wait)]
    if not facts.by_rank:  # processes by pid only: where they wait, named by pid
        rankless = [v for v in stuck if v.rank is None]
        alone = len(facts.views) == 1
        return (
            [unexplained_wait_finding(rankless, facts.layout is not None, facts.fr_found, alone=alone)]
            if rankless
            else []
        )
    if not stuck:
        return []
    known = known_site_lead(facts.views) if facts.mode == Mode.LAYOUT_FREE else None
    alone = len(facts.views) == 1
    return [unexplained_wait_finding(stuck, facts.layout is not None, facts.fr_found, known, alone=alone)]


def no_stack_finding(unreadable: Sequence[RankView]) -> Finding:
    """No rank's stack could be read (every capture failed, or the input holds the ranks' log lines only): the
    job's ranks are known and stuck, nothing says where. The next step is to get the stacks: first what made
    the capture fail, from its reason, then a dump of every rank."""
    words = Words(None)
    ranks = tuple(sorted(v.rank for v in unreadable if v.rank is not None))
    reasons = list(dict.fromkeys(v.error for v in unreadable if v.error))
    pids = [f"pid {v.pid}" for v in unreadable if v.rank is None and v.pid is not None]
    who = ", ".join([words.ranks(ranks)] * bool(ranks) + pids) or f"{len(unreadable)} process(es) of no known rank"
    why = f" ({reasons[0]}{'; …' if len(reasons) > 1 else ''})" if reasons else ""
    n = len(unreadable)
    summary = (
        f"no stack in the input: {who} could not be read{why}"
        if n == 1
        else (f"no stack in the input: none of {who} could be read{why}")
    )
    return UnexplainedWait(
        ranks=ranks,
        summary=summary,
        remedy=capture_remedy(reasons),
        details=UnexplainedWaitDetails(waits={"unreadable": ranks}),
    )


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


def unexplained_wait_finding(
    stuck: Sequence[RankView],
    layout_known: bool,
    fr_found: bool = False,
    known: KnownLead | None = None,
    alone: bool = False,
) -> Finding:
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
        named = words.ranks(who) if who else _by_pid(views)
        sites = list(dict.fromkeys(words.where(v.site) for v in views if v.site is not None))
        where = f" ({'; '.join(sites[:2])}{'; …' if len(sites) > 2 else ''})" if sites else ""
        phrase = WAIT_PHRASES.get(kind, kind).replace("waiting", "wait", 1)
        if kind == WaitKind.COLLECTIVE:
            ops = list(dict.fromkeys(v.op for v in views if v.op))
            phrase = f"wait in {', '.join(ops[:3])}"
        elif kind in FROZEN_STATES:
            phrase = f"are {kind}" if len(who) != 1 else f"is {kind}"
        elif kind == WaitKind.RUNNING:
            phrase = "on the CPU in their own code (a busy step, or a wait that spins: one dump cannot tell them apart)"
        if not who and len(views) == 1 and phrase.startswith("wait "):  # one process by pid
            phrase = "waits " + phrase[len("wait ") :]
        parts.append(f"{named} {phrase}{where}")
    ranks = tuple(sorted(v.rank for v in stuck if v.rank is not None))
    kinds = set(by_kind)
    known_sites: tuple[KnownSiteAt, ...] = ()
    if known is not None and not layout_known:
        summary = known.lead
        remedy = f"give the layout ({known.flags} with the other sizes, or --config) to confirm which group is split"
        if known.fix:
            remedy += f"; once confirmed: {known.fix}"
        remedy += f"; the Flight Recorder names the groups too: {FR_HOW}"
        known_sites = known.sites
    elif kinds == {WaitKind.COLLECTIVE} and alone:  # the input holds this one process: who it waits for is elsewhere
        summary = "one process's stack cannot say who the collective waits for: " + "; ".join(parts)
        remedy = (
            "dump every rank's stack (`mtpdiag collect --out DIR` on each node, or `py-spy dump --pid <pid>` of "
            "each rank into files named rankN, then `mtpdiag analyze DIR`): the ranks that are not in this "
            f"collective are the ones it waits for; the Flight Recorder names them too: {FR_HOW}"
        )
    elif kinds == {WaitKind.COLLECTIVE} and not layout_known:
        summary = "ranks wait in collectives at different call sites and no parallel layout is known: " + "; ".join(
            parts
        )
        remedy = (
            "give the layout (--tp/--cp/--pp/--ep, or --config) so the split process group can be found; "
            f"the Flight Recorder names the groups too: {FR_HOW}"
        )
    else:
        summary, remedy = _unexplained_words(kinds, parts, fr_found)
    return UnexplainedWait(
        ranks=ranks,
        summary=summary,
        remedy=remedy,
        details=UnexplainedWaitDetails(
            waits={k: tuple(sorted(v.rank for v in vs if v.rank is not None)) for k, vs in sorted(by_kind.items())},
            known_sites=known_sites,
        ),
    )


def _by_pid(views: Sequence[RankView]) -> str:
    """Processes of no known rank, named by pid (``pid 4242, pid 4243``, ``2 processes of no known rank``)."""
    pids = [f"pid {v.pid}" for v in views if v.pid is not None]
    unnamed = len(views) - len(pids)
    if unnamed:
        pids.append("a process of no known rank" if unnamed == 1 else f"{unnamed} processes of no known rank")
    return ", ".join(pids)


def _unexplained_words(kinds: set[str], parts: Sequence[str], fr_found: bool) -> tuple[str, str]:
    """The summary and the next steps of ranks stuck where the stacks do not say why."""
    lead = (
        "no rank is in a collective the stacks can see"
        if WaitKind.COLLECTIVE not in kinds
        else "the stacks do not explain the hang"
    )
    summary = f"{lead}: " + "; ".join(parts)
    if WaitKind.HOST_SYNC in kinds:
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
    return summary, "; ".join(steps)


class KnownLead(msgspec.Struct, frozen=True):
    """What known call sites imply without a layout: the headline's lead, the sizes that would confirm it, the
    fix once confirmed, and the sites (for ``details``)."""

    lead: str
    flags: str
    fix: str | None
    sites: tuple[KnownSiteAt, ...]


def known_site_lead(views: Sequence[RankView]) -> KnownLead | None:
    """Without a layout, a collective at a site whose group the known-site table names still speaks: ``rank 2 is
    in megatron-core's MTP-loss all_reduce over DP×CP, and ranks 0, 1, 3 are elsewhere. This is the verl #5895
    deadlock when CP > 1: pass --cp``. A metric tracker's reduce leads; else every known site is named."""
    at: dict[tuple[str, Site | None], list[int]] = {}
    for v in views:
        if v.state == RankState.COLLECTIVE and v.op is not None and v.rank is not None:
            at.setdefault((v.op, v.site), []).append(v.rank)
    known = [(op, site, ranks, row) for (op, site), ranks in at.items() if _speaks(row := lookup(site)) and row]
    if not known:
        return None
    signed = [k for k in known if signature_of(k[1]) in SIGNATURE_HANGS]
    lead = signed[:1] or known
    words = Words(None)
    phrases: list[str] = []
    flags: list[str] = []
    fixes: list[str] = []
    sites: list[KnownSiteAt] = []
    for op, site, ranks, row in lead:
        kind = row.kinds[0]
        signature = signature_of(site)
        is_are = words.verb(ranks, "is", "are")
        if signature in SIGNATURE_HANGS:
            name, hang, flag = SIGNATURE_HANGS[signature]
            where = f"{os.path.basename(site.file)}:{site.line}" if site else "?"
            phrases.append(
                f"{words.ranks(ranks)} {is_are} in {row.package}'s {name} {op} over {words.group(kind)} ({where})"
            )
            fixes.append(f"this is {hang}")
            flags.append(flag)
        else:
            phrases.append(
                f"{words.ranks(ranks)} {is_are} in {op} at {words.where(site)}, on the {words.group(kind)} group by "
                f"the known-site table ({row.why})"
            )
            flags += [SIZE_FLAGS[k] for k in kind.split("_") if k in SIZE_FLAGS] or ["--tp/--cp/--pp"]
        sites.append(KnownSiteAt(op=op, site=site, ranks=tuple(sorted(ranks)), group=kind))
    inside = {r for _, _, ranks, _ in lead for r in ranks}
    others = [v for v in views if v.rank is not None and v.rank not in inside]
    text = "; ".join(phrases)
    if others:
        who = [v.rank for v in others if v.rank is not None]
        places = _whereabouts(others, words)
        where = f", {places[0][1]}" if len(places) == 1 else f" ({'; '.join(f'{r} {w}'.strip() for r, w in places)})"
        text += f", and {words.ranks(who)} {words.verb(who, 'is', 'are')} elsewhere{where}"
    flag_text = "/".join(dict.fromkeys(flags))
    text += f". {fixes[0][0].upper()}{fixes[0][1:]}: pass {flag_text}" if fixes else f": pass {flag_text}"
    mtp = any(signature_of(site) == "mtp" for _, site, _, _ in lead)
    fix = "mtpdiag check && mtpdiag apply (verl PR #5895)" if mtp else None
    return KnownLead(lead=text, flags=flag_text, fix=fix, sites=tuple(sites))


def _whereabouts(views: Sequence[RankView], words: Words) -> list[tuple[str, str]]:
    """(``rank 0``, ``in send at send_forward (worker.py:68)``) for each place the ranks are at (four at most,
    then ``…``)."""
    by: dict[str, list[int]] = {}
    for v in views:
        what = f"in {v.op} at {words.where(v.site)}" if v.op is not None else doing(v)
        by.setdefault(what, []).append(v.rank if v.rank is not None else -1)
    said = [(words.ranks(ranks), what) for what, ranks in by.items()]
    return said[:4] + ([("…", "")] if len(said) > 4 else [])


def _speaks(row: KnownSite | None) -> bool:
    """A known row that names the group of a collective (not pipeline p2p, matched by peers; not the world)."""
    return row is not None and not row.p2p and bool(row.kinds) and row.kinds[0] != GroupKind.WORLD


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
