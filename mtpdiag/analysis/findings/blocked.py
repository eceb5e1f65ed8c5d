"""``straggler`` and ``frozen-rank``: captured ranks that others wait on, because they run or wait on something
of their own, or are stopped, gone or unreadable. With a layout (or the recorder's groups) the wait-for graph
says who waits on them; without one, a rank that holds up a world waiting in collectives."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mtpdiag.analysis.causes import Causes, holds_up
from mtpdiag.analysis.causes import Waiter as Waiting
from mtpdiag.analysis.findings.facts import Facts, Mode
from mtpdiag.analysis.findings.p2p import p2p_call
from mtpdiag.analysis.findings.words import Words, pids, union
from mtpdiag.layout import ParallelLayout
from mtpdiag.model import (
    Finding,
    FrozenDetails,
    FrozenRank,
    Mismatch,
    RankView,
    Site,
    Straggler,
    StragglerDetails,
    Waiter,
)
from mtpdiag.vocabulary.states import FROZEN_STATES, FindingId, RankState
from mtpdiag.vocabulary.waits import WAIT_PHRASES, WaitKind


def _waiting_phrase(waiters: Sequence[Waiting], mismatches: Sequence[Mismatch], words: Words, them: str) -> str:
    """``ranks 0, 1, 2 wait for it in all_reduce at reduce_gradients (…) on the DP×CP group``."""
    first = waiters[0]
    if first.mismatch is not None:
        m = mismatches[first.mismatch]
        entered = union(
            mismatches[w.mismatch].entered
            for w in waiters
            if w.mismatch is not None and mismatches[w.mismatch].site == m.site
        )
        return (
            f"{words.ranks(entered)} {words.verb(entered, 'waits', 'wait')} for {them} in {m.op} at "
            f"{words.where(m.site)} on the {words.group(m.group)} group"
        )
    w = first.p2p
    assert w is not None
    return f"rank {w.rank} waits for {them} in {p2p_call(w)} at {words.where(w.site)}"


def stragglers(facts: Facts, _found: Sequence[Finding] = ()) -> list[Finding]:
    """Captured ranks that others wait on while they run, or wait on something of their own."""
    return _held_up_by(facts, FindingId.STRAGGLER)


def frozen(facts: Facts, _found: Sequence[Finding] = ()) -> list[Finding]:
    """Captured ranks that others wait on while they are stopped, gone or unreadable."""
    return _held_up_by(facts, FindingId.FROZEN_RANK)


def _held_up_by(facts: Facts, wanted: FindingId) -> list[Finding]:
    if not facts.by_rank and facts.views:  # a paste that names no rank: its processes, by pid
        made = _rankless(facts.views)
    elif facts.mode == Mode.LAYOUT_FREE:
        made = _layout_free(list(facts.by_rank.values()))
    elif facts.mode == Mode.GROUPS and facts.causes is not None:
        made = _blocked(facts.causes, facts.by_rank, facts.layout)
    else:
        return []
    return [f for f in made if f.id == wanted]


def _blocked(causes: Causes, views: Mapping[int, RankView], layout: ParallelLayout | None) -> list[Finding]:
    """``straggler`` and ``frozen-rank`` for captured ranks that others wait on."""
    words = Words(layout)
    running: dict[tuple[Site | None, WaitKind], list[int]] = {}
    frozen: dict[RankState, list[int]] = {}
    for rank in causes.blocked_on:
        view = views.get(rank)
        if view is None:
            continue  # never captured: missing-rank
        if view.state in (RankState.RUNNING, RankState.WAITING):
            kind = view.wait.kind if view.wait is not None else WaitKind.RUNNING
            running.setdefault((view.site, kind), []).append(rank)
        else:
            frozen.setdefault(view.state, []).append(rank)
    out: list[Finding] = []
    for (site, kind), ranks in running.items():
        waiters = [w for r in ranks for w in causes.blocked_on[r]]
        them = words.verb(ranks, "it", "them")
        out.append(
            Straggler(
                ranks=tuple(ranks),
                summary=(
                    f"{words.ranks(ranks, coords=True)} {words.verb(ranks, 'is', 'are')} "
                    f"{WAIT_PHRASES.get(kind, kind)} in {words.where(site)}, in no collective, while "
                    f"{_waiting_phrase(waiters, causes.mismatches, words, them)}"
                ),
                remedy=straggler_remedy(ranks, views, kind),
                details=StragglerDetails(site=site, wait=kind, waiting=_waiting_details(waiters, causes)),
            )
        )
    for state, ranks in frozen.items():
        waiters = [w for r in ranks for w in causes.blocked_on[r]]
        reasons = list(dict.fromkeys(views[r].error or state for r in ranks))
        them = words.verb(ranks, "it", "them")
        out.append(
            FrozenRank(
                ranks=tuple(ranks),
                summary=(
                    f"{words.ranks(ranks, coords=True)} {words.verb(ranks, 'is', 'are')} {state} "
                    f"({'; '.join(reasons[:2])}) while {_waiting_phrase(waiters, causes.mismatches, words, them)}"
                ),
                remedy=frozen_remedy(state, ranks, views),
                details=FrozenDetails(state=state, waiting=_waiting_details(waiters, causes)),
            )
        )
    return out


def _waiting_details(waiters: Sequence[Waiting], causes: Causes) -> tuple[Waiter, ...]:
    out: list[Waiter] = []
    for w in waiters[:16]:
        if w.mismatch is not None:
            m = causes.mismatches[w.mismatch]
            out.append(Waiter(op=m.op, site=m.site, group=m.group, entered=m.entered))
        elif w.p2p is not None:
            out.append(Waiter(op=w.p2p.op, site=w.p2p.site, rank=w.p2p.rank))
    return tuple(out)


_STRAGGLER_CAUSES = {
    "data_loader": "a DataLoader worker that died or stalls (its own stack: py-spy dump --pid on the worker)",
    "lock": "a lock or queue that nobody releases or fills (look for the other holder: py-spy dump --native)",
    "io": "a file system or network endpoint that does not answer (dmesg, the mount, the remote end)",
    "sleep": "a polling loop whose condition never comes true",
    "unknown": "a C call that blocks (py-spy dump --native shows on what)",
}


def straggler_remedy(ranks: Sequence[int], views: Mapping[int, RankView], kind: str = "running") -> str:
    cause = _STRAGGLER_CAUSES.get(kind, "a data loader, I/O or a loop that never ends")
    return (
        "find out what the straggler is doing (its stack below, or py-spy dump --pid "
        f"{pids(ranks, views)}): {cause}; the others only wait for it"
    )


def frozen_remedy(state: str, ranks: Sequence[int], views: Mapping[int, RankView]) -> str:
    if state == RankState.STOPPED:
        return (
            f"find what stopped it (a debugger, a job scheduler, a stray Ctrl-Z) and resume it with "
            f"kill -CONT {pids(ranks, views)}; state D means a filesystem or device driver is stuck"
        )
    return "the process died or could not be read: check its log, dmesg (OOM killer) and the node"


def _layout_free(views: Sequence[RankView]) -> list[Finding]:
    """Without a layout: stopped ranks while others wait, or ranks that hold up the rest while all others
    wait in collectives."""
    ranked = [(v.rank, v) for v in views if v.rank is not None]
    by_rank = dict(ranked)
    waiting = [r for r, v in ranked if v.state == RankState.COLLECTIVE]
    out: list[Finding] = []
    frozen: dict[str, list[int]] = {}
    for r, v in ranked:
        if v.state in FROZEN_STATES:
            frozen.setdefault(v.state, []).append(r)
    held = [r for r, v in ranked if v.state in (RankState.RUNNING, RankState.WAITING) and holds_up(v)]
    words = Words(None)
    if waiting:
        for state, ranks in frozen.items():
            out.append(
                FrozenRank(
                    ranks=tuple(ranks),
                    remedy=frozen_remedy(state, ranks, by_rank),
                    summary=(
                        f"{words.ranks(ranks)} {words.verb(ranks, 'is', 'are')} {state} while "
                        f"{words.ranks(waiting)} {words.verb(waiting, 'waits', 'wait')} in collectives "
                        "(no layout: groups unknown)"
                    ),
                )
            )
    if held and waiting and len(held) + len(waiting) == len(ranked):
        kinds = list(dict.fromkeys(w.kind if (w := by_rank[r].wait) else "running" for r in held))
        what = WAIT_PHRASES.get(kinds[0], kinds[0]) if len(kinds) == 1 else "outside any collective"
        out.append(
            Straggler(
                ranks=tuple(held),
                remedy=straggler_remedy(held, by_rank, kinds[0] if len(kinds) == 1 else "running"),
                summary=(
                    f"{words.ranks(held)} {words.verb(held, 'is', 'are')} {what} while every other "
                    "rank waits in a collective (no layout: groups unknown)"
                ),
            )
        )
    return out


def _rankless(views: Sequence[RankView]) -> list[Finding]:
    """A paste whose processes carry no rank (py-spy dumps by pid, grouped by hand): the layout-free reading by
    pid. Processes that hold up the rest (running, or waiting on something of their own, or stopped or
    unreadable) while every other process waits in a collective are what the others wait for, whichever
    groups those are."""
    procs = [v for v in views if v.rank is None and v.pid is not None]
    if len(procs) < 2 or len(procs) != len(views):
        return []
    waiting = [v for v in procs if v.state == RankState.COLLECTIVE]
    # Only a wait of its own (a data loader, a lock, I/O) or a stopped or unreadable process: from a paste that names
    # no rank, a process on the CPU may be a spinning host sync as well as a busy step.
    held = [v for v in procs if holds_up(v) and v.state != RankState.RUNNING]
    if not waiting or not held or len(held) + len(waiting) != len(procs):
        return []
    words = Words(None)
    at: dict[tuple[str | None, Site | None], int] = {}
    for v in waiting:
        at[(v.op, v.site)] = at.get((v.op, v.site), 0) + 1
    places = [f"{op or 'a collective'} at {words.where(site)}: {n}" for (op, site), n in at.items()]
    more = "; …" if len(places) > 4 else ""
    others = f"the {len(waiting)} other processes wait in collectives ({'; '.join(places[:4])}{more})"
    who = ", ".join(f"pid {v.pid}" for v in held[:SHOW_PIDS]) + (", …" if len(held) > SHOW_PIDS else "")
    is_are = "is" if len(held) == 1 else "are"
    tail = "; the input names no rank, so groups and coordinates are unknown (name the files rankN, or --rank-from)"
    pid_list = " ".join(str(v.pid) for v in held[:SHOW_PIDS])
    frozen = [v for v in held if v.state in FROZEN_STATES]
    if frozen:
        reasons = list(dict.fromkeys(v.error or v.state for v in frozen))
        return [
            FrozenRank(
                ranks=(),
                summary=f"{who} {is_are} {frozen[0].state} ({'; '.join(reasons[:2])}) while {others}{tail}",
                remedy="the process died, stopped or could not be read: check its log, dmesg (OOM killer) and the node",
            )
        ]
    kinds = list(dict.fromkeys(v.wait.kind if v.wait is not None else WaitKind.RUNNING for v in held))
    kind = kinds[0] if len(kinds) == 1 else WaitKind.RUNNING
    what = WAIT_PHRASES.get(kind, kind) if len(kinds) == 1 else "outside any collective"
    sites = list(dict.fromkeys(words.where(v.site) for v in held if v.site is not None))
    where = f" in {'; '.join(sites[:2])}" if sites else ""
    cause = _STRAGGLER_CAUSES.get(kind, "a data loader, I/O or a loop that never ends")
    return [
        Straggler(
            ranks=(),
            summary=f"{who} {is_are} {what}{where}, in no collective, while {others}{tail}",
            remedy=(
                f"find out what the straggler is doing (its stack below, or py-spy dump --pid {pid_list}): {cause}; "
                "the others only wait for it"
            ),
        )
    ]


SHOW_PIDS = 6
