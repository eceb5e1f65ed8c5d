"""Findings: the diagnosed problems, each with a stable id (docs/design.md), in plain words.

Root split collectives become ``mtp-cp-gated-reduce`` (the verl #5895 signature) or
``gated-collective``; root send/recv waits become ``p2p-unmatched``; ranks others wait on that run,
stopped or were never captured become ``straggler``, ``frozen-rank`` and ``missing-rank``; a world
that waits with nothing split is ``all-waiting``. Consequences get no finding of their own.
"""

from __future__ import annotations

import os
from typing import Iterable, Mapping, Sequence

from mtpdiag.analysis.gate import describe_gate
from mtpdiag.analysis.known_sites import is_mtp_site, signature_of, skip_of
from mtpdiag.analysis.mismatch import doing
from mtpdiag.analysis.causes import Causes, P2PWait, Waiter, holds_up
from mtpdiag.layout import ParallelLayout
from mtpdiag.model import Finding, Mismatch, RankView, Site
from mtpdiag.vocabulary.groups import GROUP_NAMES
from mtpdiag.vocabulary.labels import rank_list
from mtpdiag.vocabulary.ops import RECV_OPS, SEND_OPS
from mtpdiag.vocabulary.waits import WAIT_PHRASES

# Order of findings: causes first.
_PRIORITY = {"mtp-cp-gated-reduce": 0, "frozen-rank": 1, "straggler": 2, "gated-collective": 3,
             "size-mismatch": 3, "dtype-mismatch": 3, "p2p-unmatched": 4, "missing-rank": 5, "all-waiting": 6,
             "unexplained-wait": 7}
# Findings that describe a gap in the evidence rather than a problem: they make the verdict ``incomplete``.
INCOMPLETE_FINDINGS = frozenset({"unexplained-wait"})
_SHOW = 6  # ranks named in a summary before "…"
# Megatron's metric trackers other than MTP that hang the same way: what to call them, and the fix.
TRACKER_WORDS = {
    "dsa-indexer": ("DeepSeek indexer loss reduce (DSAIndexerLossLoggingHelper, not the MTP loss)",
                    "every pipeline stage must take part in the indexer's PP all_reduce: take Megatron-LM #4518 "
                    "(dev), or seed the indexer tracker with zeros on every stage before reduce_loss_in_tracker"),
    "moe-aux-loss": ("MoE aux-loss tracker reduce",
                     "every pipeline stage must hold the same tracker entries: call track_moe_metrics with "
                     "force_initialize=True (and count the MTP layers: Megatron-LM #3400/#3401), or create the "
                     "entries on stages without MoE layers (NeMo-RL #3419)"),
}

FR_LAUNCH_ENV = ("TORCH_FR_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1 TORCH_FR_DUMP_TEMP_FILE=/shared/fr/rank_ "
                 "TORCH_NCCL_DEBUG_INFO_PIPE_FILE=/tmp/fr_pipe_rank_")
FR_HOW = ("the Flight Recorder dumps ${TORCH_FR_DUMP_TEMP_FILE}<rank> (default ~/.cache/torch/comm_lib_trace_rank_"
          "<rank>, /tmp/nccl_trace_rank_<rank> before torch 2.6), written on every rank when the NCCL watchdog "
          "times out (TORCH_NCCL_TIMEOUT, 10 min by default), or now with `mtpdiag inspect --fr-dump` when the "
          "job set TORCH_NCCL_DEBUG_INFO_PIPE_FILE; then `mtpdiag analyze --fr <prefix>` (with the stacks, or "
          f"alone). If the job did not record them, relaunch with {FR_LAUNCH_ENV}")
FLIGHT_RECORDER_HINT = (
    "look below Python: the network, NCCL or a device (NCCL_DEBUG=INFO, dmesg); compare each rank's last "
    f"collective in {FR_HOW}"
)


class _Words:
    """Rank and site phrases, with coordinates when a layout is known."""

    def __init__(self, layout: ParallelLayout | None) -> None:
        self.layout = layout

    def rank(self, rank: int) -> str:
        if self.layout is not None and 0 <= rank < self.layout.world_size:
            return f"rank {rank} ({self.layout.describe(rank)})"
        return f"rank {rank}"

    def ranks(self, ranks: Sequence[int], coords: bool = False) -> str:
        """``rank 3 (tp0 cp1 pp1)``, ``ranks 0, 2``, ``4096 ranks (0, 2, 4, …)``."""
        ranks = sorted(ranks)
        if len(ranks) == 1:
            return self.rank(ranks[0]) if coords else f"rank {ranks[0]}"
        if len(ranks) <= 3 and coords and self.layout is not None:
            return "ranks " + ", ".join(self.rank(r).removeprefix("rank ") for r in ranks)
        if len(ranks) <= _SHOW:
            return "ranks " + rank_list(ranks)
        return f"{len(ranks)} ranks ({rank_list(ranks, _SHOW)})"

    @staticmethod
    def members(ranks: Sequence[int]) -> str:
        return "[" + rank_list(sorted(ranks), 2 * _SHOW, show=_SHOW, more=", … ({n} ranks)") + "]"

    @staticmethod
    def where(site: Site | None) -> str:
        if site is None:
            return "an unknown site"
        return f"{site.function.rsplit('.', 1)[-1]} ({os.path.basename(site.file)}:{site.line})"

    @staticmethod
    def group(kind: str) -> str:
        return GROUP_NAMES.get(kind, kind)

    @staticmethod
    def verb(ranks: Sequence[int], one: str, many: str) -> str:
        return one if len(ranks) == 1 else many


def _groups_phrase(kind: str, instances: Sequence[Mismatch], words: "_Words") -> str:
    """``the DP×CP group [2, 3]``, ``the TP groups [0, 1] and [2, 3]``, ``4096 CP groups ([0, 1], …)``,
    followed by where the group kind came from when it was not the known-site table."""
    name = words.group(kind)
    lists = [words.members(m.members) for m in instances]
    if len(lists) == 1:
        text = f"the {name} group {lists[0]}"
    elif len(lists) <= 3:
        text = f"the {name} groups {', '.join(lists[:-1])} and {lists[-1]}"
    else:
        text = f"{len(lists)} {name} groups ({', '.join(lists[:2])}, …)"
    return text + group_source_phrase(instances[0])


def group_source_phrase(m: Mismatch) -> str:
    """`` (group guessed from who waits: TP or TP×DP)``: where a split's group kind came from, when that is
    not plain (the known-site table and the Flight Recorder's pg_config name it; membership only fits it)."""
    if m.group_from == "guess":
        names = " or ".join(GROUP_NAMES.get(k, k) for k in m.group_candidates) or GROUP_NAMES.get(m.group, m.group)
        return f" (group guessed from which ranks wait: {names} fit)"
    if m.group_from == "unique-fit":
        return " (the only group kind whose members fit who waits)"
    if m.group_from == "world-op":
        return f" ({m.op} is taken as a world-group call: the stack does not keep its group argument)"
    return ""


SOURCE_WORDS = {"stacks": "the stacks", "flight-recorder": "the Flight Recorder", "watchdog-log": "the watchdog log"}
GROUP_SOURCES = {
    "known-site": "the known-site table names the group of this call",
    "flight-recorder": "the Flight Recorder records the group (its pg_config and description)",
    "watchdog-log": "the watchdog log names the group",
    "unique-fit": "the only group kind whose members fit who waits",
    "world-op": "taken as a world-group call (the stack does not keep the group argument)",
}


def provenance(m: Mismatch) -> str:
    """Where a split's group kind and gate came from, in one parenthesis for the split's sentence."""
    if m.group_from == "guess":
        names = " or ".join(GROUP_NAMES.get(k, k) for k in m.group_candidates) or GROUP_NAMES.get(m.group, m.group)
        group = f"group guessed from who waits ({names} fit)"
    else:
        group = GROUP_SOURCES.get(m.group_from, m.group_from)
    if m.gate is None or m.role == "consequence":
        gate = ""
    elif m.gate_strength == "strong":
        gate = "; gate read from the coordinates of who entered and who did not"
        if is_mtp_site(m.site) and m.group == "dp_cp" and m.gate == {"cp": 0}:
            gate += ": the known verl #5895 signature"
        else:
            gate += ", which split cleanly along it (several ranks on each side)"
    else:
        gate = "; gate" + gate_source_phrase(m).removeprefix(" (").removesuffix(")").replace("weak:", " weak:", 1)
    sources = " and ".join(SOURCE_WORDS.get(part, part) for part in m.source.split("+"))
    return f" [{group}{gate}; from {sources}]"


def gate_source_phrase(m: Mismatch) -> str:
    """What the gate rests on, when it is weak: a rank test fits, and so does data-dependent divergence."""
    if m.gate is None or m.gate_strength != "weak":
        return ""
    others = "".join(f" or {describe_gate(g)}" for g in m.gate_alternatives)
    if others:
        return (f" (weak: {describe_gate(m.gate)}{others} separate the ranks equally well; a branch on rank-local "
                "data fits too)")
    return (" (weak: too few ranks on one side to tell a rank test from data-dependent divergence, e.g. a loop "
            "that ran once more on some ranks)")


def _doing_phrase(ranks: Sequence[int], doing_of: Mapping[int, str]) -> str:
    values = list(dict.fromkeys(doing_of.get(r, "not captured") for r in sorted(ranks)))
    return "; ".join(values[:3]) + ("; …" if len(values) > 3 else "")


def _union(values: Iterable[Sequence[int]]) -> tuple[int, ...]:
    return tuple(sorted({r for v in values for r in v}))


def _grouped(items: Iterable, key) -> dict:
    out: dict = {}
    for item in items:
        out.setdefault(key(item), []).append(item)
    return out


# ---------------------------------------------------------------- split collectives


def collective_findings(roots: Sequence[Mismatch], layout: ParallelLayout | None) -> list[Finding]:
    """One finding per root (op, site, group): the verl #5895 signature or a gated collective."""
    words = _Words(layout)
    out = []
    for (op, site, kind), instances in _grouped(roots, lambda m: (m.op, m.site, m.group)).items():
        members = _union(m.members for m in instances)
        entered = _union(m.entered for m in instances)
        absent = _union(m.absent for m in instances)
        gate = instances[0].gate
        doing_of = {r: d for m in instances for r, d in m.absent_doing.items()}
        details = {"op": op, "site": site.to_dict() if site else None, "group": kind,
                   "gate": dict(gate) if gate is not None else None, "members": list(members),
                   "entered": list(entered), "absent": list(absent), "instances": len(instances),
                   "group_from": instances[0].group_from, "group_candidates": list(instances[0].group_candidates),
                   "gate_strength": instances[0].gate_strength, "source": instances[0].source}
        group = _groups_phrase(kind, instances, words)
        never = (f"{words.ranks(absent, coords=True)} never joined ({_doing_phrase(absent, doing_of)})")
        if is_mtp_site(site) and kind == "dp_cp" and gate is not None and gate.get("cp") == 0:
            cp = layout.cp if layout is not None else "N"
            out.append(Finding(
                id="mtp-cp-gated-reduce", ranks=members, details=details,
                summary=(f"MTP loss {op} on {group} entered only by {describe_gate(gate)} ranks "
                         f"({words.ranks(entered)}); {never}: verl #5895 deadlock"),
                remedy=f"mtpdiag check && mtpdiag apply (verl PR #5895), then mtpdiag verify --cp {cp}",
            ))
            continue
        where = f"{site.file}:{site.line}" if site else "its call site"
        signature = signature_of(site)
        if signature in TRACKER_WORDS and gate is not None:
            name, fix = TRACKER_WORDS[signature]
            details["signature"] = signature
            out.append(Finding(
                id="gated-collective", ranks=members, details=details,
                summary=(f"{name} {op} at {words.where(site)} on {group} entered only by {describe_gate(gate)} "
                         f"ranks ({words.ranks(entered)}); {never}: {skip_of(site) or 'a tracker skip'}"),
                remedy=fix))
            continue
        if gate:
            summary = (f"{op} at {words.where(site)} on {group} entered only by {describe_gate(gate)} ranks "
                       f"({words.ranks(entered)}){gate_source_phrase(instances[0])}; {never}")
            remedy = (f"every rank of the {words.group(kind)} group must call {op} at {where}: move it out "
                      f"of the {describe_gate(gate)} branch, or run it on a group whose members all pass that test")
            if instances[0].gate_strength == "weak":
                remedy += ("; if no such branch exists, look for a loop or branch on rank-local data (a count, a "
                           "length, a flag) that made these ranks skip or repeat it")
        else:
            summary = (f"{op} at {words.where(site)} on {group} entered only by {words.ranks(entered)}; "
                       f"{never}; no single coordinate separates them")
            remedy = (f"every rank of the {words.group(kind)} group must reach {op} at {where}; "
                      "compare the absent ranks' stacks with the entered ones to see where they turned off")
        out.append(Finding(id="gated-collective", ranks=members, summary=summary, remedy=remedy,
                           details=details))
    return out


# ---------------------------------------------------------------- point to point


def _p2p_call(w: P2PWait) -> str:
    if w.op in SEND_OPS:
        return f"{w.op}(dst={w.peer})"
    if w.op in RECV_OPS:
        return f"{w.op}(src={w.peer})"
    return f"{w.op} with rank {w.peer}"


def _matching(op: str) -> str:
    return "recv" if op in SEND_OPS else "send" if op in RECV_OPS else "matching send/recv"


def _peer_doing(view: RankView | None, words: _Words) -> str:
    """``in send(dst=0) at send_backward (worker.py:92)``, ``running in load_batch``, ``not captured``."""
    if view is None or view.state != "collective" or view.op is None:
        return doing(view)
    call = view.op
    if view.peer is not None and view.rank is not None:
        call = _p2p_call(P2PWait(view.rank, view.op, view.site, view.peer))
    return f"in {call} at {words.where(view.site)}"


def p2p_findings(roots: Sequence[P2PWait], views: Mapping[int, RankView],
                 layout: ParallelLayout | None) -> list[Finding]:
    """One finding per root (op, site) of unmatched send/recv waits; the summary names both ends."""
    words = _Words(layout)
    out = []
    for (op, site), waits in _grouped(roots, lambda w: (w.op, w.site)).items():
        first = waits[0]
        summary = (f"{words.rank(first.rank)} waits in {_p2p_call(first)} at {words.where(site)}; "
                   f"{words.rank(first.peer)} is {_peer_doing(views.get(first.peer), words)}, "
                   f"not in a matching {_matching(op)}")
        if len(waits) > 1:
            summary += f" (and {len(waits) - 1} more such pair{'s' if len(waits) > 2 else ''})"
        ranks = _union([[w.rank, w.peer] for w in waits])
        out.append(Finding(
            id="p2p-unmatched", ranks=ranks, summary=summary,
            remedy=("the two ends disagree on the number or order of their sends and receives: compare "
                    "the microbatch counts and the schedules of both pipeline stages"),
            details={"op": op, "site": site.to_dict() if site else None,
                     "pairs": [[w.rank, w.peer] for w in waits],
                     "peer_doing": {str(w.peer): doing(views.get(w.peer)) for w in waits}},
        ))
    return out


# ---------------------------------------------------------------- ranks others wait on


def _waiting_phrase(waiters: Sequence[Waiter], mismatches: Sequence[Mismatch], words: _Words,
                    them: str) -> str:
    """``ranks 0, 1, 2 wait for it in all_reduce at reduce_gradients (…) on the DP×CP group``."""
    first = waiters[0]
    if first.mismatch is not None:
        m = mismatches[first.mismatch]
        entered = _union(mismatches[w.mismatch].entered for w in waiters
                         if w.mismatch is not None and mismatches[w.mismatch].site == m.site)
        return (f"{words.ranks(entered)} {words.verb(entered, 'waits', 'wait')} for {them} in {m.op} at "
                f"{words.where(m.site)} on the {words.group(m.group)} group")
    w = first.p2p
    assert w is not None
    return f"rank {w.rank} waits for {them} in {_p2p_call(w)} at {words.where(w.site)}"


def blocked_findings(causes: Causes, views: Mapping[int, RankView],
                     layout: ParallelLayout | None) -> list[Finding]:
    """``straggler`` and ``frozen-rank`` for captured ranks that others wait on."""
    words = _Words(layout)
    running: dict[tuple[Site | None, str], list[int]] = {}
    frozen: dict[str, list[int]] = {}
    for rank in causes.blocked_on:
        view = views.get(rank)
        if view is None:
            continue  # never captured: missing-rank
        if view.state in ("running", "waiting"):
            kind = view.wait.kind if view.wait is not None else "running"
            running.setdefault((view.site, kind), []).append(rank)
        else:
            frozen.setdefault(view.state, []).append(rank)
    out = []
    for (site, kind), ranks in running.items():
        waiters = [w for r in ranks for w in causes.blocked_on[r]]
        them = words.verb(ranks, "it", "them")
        out.append(Finding(
            id="straggler", ranks=tuple(ranks),
            summary=(f"{words.ranks(ranks, coords=True)} {words.verb(ranks, 'is', 'are')} "
                     f"{WAIT_PHRASES.get(kind, kind)} in {words.where(site)}, in no collective, while "
                     f"{_waiting_phrase(waiters, causes.mismatches, words, them)}"),
            remedy=_straggler_remedy(ranks, views, kind),
            details={"site": site.to_dict() if site else None, "wait": kind,
                     "waiting": _waiting_details(waiters, causes)},
        ))
    for state, ranks in frozen.items():
        waiters = [w for r in ranks for w in causes.blocked_on[r]]
        reasons = list(dict.fromkeys(views[r].error or state for r in ranks))
        them = words.verb(ranks, "it", "them")
        out.append(Finding(
            id="frozen-rank", ranks=tuple(ranks),
            summary=(f"{words.ranks(ranks, coords=True)} {words.verb(ranks, 'is', 'are')} {state} "
                     f"({'; '.join(reasons[:2])}) while {_waiting_phrase(waiters, causes.mismatches, words, them)}"),
            remedy=_frozen_remedy(state, ranks, views),
            details={"state": state, "waiting": _waiting_details(waiters, causes)},
        ))
    return out


def _waiting_details(waiters: Sequence[Waiter], causes: Causes) -> list[dict]:
    out = []
    for w in waiters[:16]:
        if w.mismatch is not None:
            m = causes.mismatches[w.mismatch]
            out.append({"op": m.op, "site": m.site.to_dict() if m.site else None, "group": m.group,
                        "entered": list(m.entered)})
        elif w.p2p is not None:
            out.append({"op": w.p2p.op, "site": w.p2p.site.to_dict() if w.p2p.site else None,
                        "rank": w.p2p.rank})
    return out


def _pids(ranks: Sequence[int], views: Mapping[int, RankView]) -> str:
    pids = [str(views[r].pid) for r in ranks[:_SHOW] if r in views and views[r].pid is not None]
    return " ".join(pids) if pids else "PID"


_STRAGGLER_CAUSES = {
    "data_loader": "a DataLoader worker that died or stalls (its own stack: py-spy dump --pid on the worker)",
    "lock": "a lock or queue that nobody releases or fills (look for the other holder: py-spy dump --native)",
    "io": "a file system or network endpoint that does not answer (dmesg, the mount, the remote end)",
    "sleep": "a polling loop whose condition never comes true",
    "unknown": "a C call that blocks (py-spy dump --native shows on what)",
}


def _straggler_remedy(ranks: Sequence[int], views: Mapping[int, RankView], kind: str = "running") -> str:
    cause = _STRAGGLER_CAUSES.get(kind, "a data loader, I/O or a loop that never ends")
    return ("find out what the straggler is doing (its stack below, or py-spy dump --pid "
            f"{_pids(ranks, views)}): {cause}; the others only wait for it")


def _frozen_remedy(state: str, ranks: Sequence[int], views: Mapping[int, RankView]) -> str:
    if state == "stopped":
        return (f"find what stopped it (a debugger, a job scheduler, a stray Ctrl-Z) and resume it with "
                f"kill -CONT {_pids(ranks, views)}; state D means a filesystem or device driver is stuck")
    return "the process died or could not be read: check its log, dmesg (OOM killer) and the node"


# ---------------------------------------------------------------- whole world


def missing_finding(missing: Sequence[int], world_size: int, waited_on: Iterable[int],
                    layout: ParallelLayout | None) -> Finding:
    """Ranks 0..world_size-1 that are not in the capture."""
    words = _Words(layout)
    waited = sorted(set(waited_on) & set(missing))
    summary = (f"{words.ranks(missing, coords=True)} of a world of {world_size} "
               f"{words.verb(missing, 'was', 'were')} not captured")
    if waited:
        summary += f"; {words.ranks(waited)} {words.verb(waited, 'is', 'are')} waited on by others"
    details: dict = {"missing": list(missing), "world_size": world_size}
    if layout is not None:
        details["coords"] = {str(r): layout.coords(r) for r in missing if r < layout.world_size}
    return Finding(
        id="missing-rank", ranks=tuple(missing), summary=summary, details=details,
        remedy=("capture every worker (--all on every node, or every pid or bundle); a rank that is "
                "missing may have crashed: look at its log"),
    )


def all_waiting_finding(views: Sequence[RankView]) -> Finding:
    """Every rank waits in a collective and nothing is split: the cause is below Python."""
    words = _Words(None)
    sites = list(dict.fromkeys((v.op, v.site) for v in views))
    ranks = tuple(sorted(v.rank for v in views if v.rank is not None))
    if len(sites) == 1:
        op, site = sites[0]
        what = f"waits in {op} at {words.where(site)}"
    else:
        what = f"waits in a collective ({len(sites)} sites)"
    return Finding(
        id="all-waiting", ranks=ranks, remedy=FLIGHT_RECORDER_HINT,
        summary=f"every rank ({len(ranks)}) {what} and no group is split: the cause is below Python",
        details={"sites": [{"op": op, "site": site.to_dict() if site else None} for op, site in sites]},
    )


def unexplained_wait_finding(stuck: Sequence[RankView], layout_known: bool, fr_found: bool = False) -> Finding:
    """Ranks that wait, and evidence that cannot say for what: where they wait, and what to collect next.

    On NCCL this is the usual picture of a hang: the collective that hangs only enqueued a kernel, and every
    rank sits at a later host sync (``.item()``, ``.cpu()``) with no collective on its stack.
    """
    words = _Words(None)
    by_kind: dict[str, list[RankView]] = {}
    for view in stuck:
        kind = view.wait.kind if view.wait is not None else view.state
        by_kind.setdefault(kind, []).append(view)
    parts = []
    for kind, views in sorted(by_kind.items(), key=lambda item: (-len(item[1]), item[0])):
        ranks = sorted(v.rank for v in views if v.rank is not None)
        sites = list(dict.fromkeys(words.where(v.site) for v in views if v.site is not None))
        where = f" ({'; '.join(sites[:2])}{'; …' if len(sites) > 2 else ''})" if sites else ""
        phrase = WAIT_PHRASES.get(kind, kind).replace("waiting", "wait", 1)
        if kind == "collective":
            ops = list(dict.fromkeys(v.op for v in views if v.op))
            phrase = f"wait in {', '.join(ops[:3])}"
        elif kind in ("stopped", "gone", "unreadable"):
            phrase = f"are {kind}" if len(ranks) != 1 else f"is {kind}"
        elif kind == "running":
            phrase = ("on the CPU in their own code (a busy step, or a wait that spins: one dump cannot tell "
                      "them apart)")
        parts.append(f"{words.ranks(ranks)} {phrase}{where}")
    ranks = tuple(sorted(v.rank for v in stuck if v.rank is not None))
    kinds = set(by_kind)
    if kinds == {"collective"} and not layout_known:
        summary = ("ranks wait in collectives at different call sites and no parallel layout is known: "
                   + "; ".join(parts))
        remedy = ("give the layout (--tp/--cp/--pp/--ep, or --config) so the split process group can be found; "
                  f"the Flight Recorder names the groups too: {FR_HOW}")
    else:
        lead = ("no rank is in a collective the stacks can see" if "collective" not in kinds
                else "the stacks do not explain the hang")
        summary = f"{lead}: " + "; ".join(parts)
        if "host_sync" in kinds:
            summary += (". On NCCL a collective only enqueues a kernel, so the one that hangs is not on any "
                        "stack: the ranks wait for it at their next host sync")
        steps = []
        native_first = not kinds & {"host_sync", "collective", "comm_init"}
        if native_first:
            steps.append("see what the C calls wait on with `mtpdiag inspect --native` (py-spy --native)")
        if fr_found:
            steps.append("the Flight Recorder dumps found with this capture did not name a split collective: "
                         "check that they are from this hang and cover every rank")
        else:
            steps.append(f"get {FR_HOW}")
        steps.append("tell a hang from a slow step with `mtpdiag watch --pid <pid>`")
        if not native_first and kinds & {"lock", "io", "unknown"}:
            steps.append("see what the C calls wait on with `mtpdiag inspect --native`")
        remedy = "; ".join(steps)
    return Finding(
        id="unexplained-wait", ranks=ranks, summary=summary, remedy=remedy,
        details={"waits": {k: sorted(v.rank for v in vs if v.rank is not None) for k, vs in sorted(by_kind.items())}},
    )


def size_findings(problems: Sequence, layout: ParallelLayout | None) -> list[Finding]:
    """Every member entered the same collective, with different sizes or dtypes (``fr_evidence.SizeProblem``).

    NCCL does not check: it hangs, or reduces garbage. Megatron-LM #3400: the MoE aux-loss tracker held 14
    entries on some ranks and 15 on others because the MTP layers were left out of ``force_initialize``. The
    same picture shows when one rank has gone to validation while the others still train.
    """
    words = _Words(layout)
    out = []
    for p in problems:
        name = words.group(p.kind) if p.kind else p.desc or p.group
        values = "; ".join(f"{words.ranks(list(ranks))} with {value}" for value, ranks in p.by_value.items())
        what = "sizes" if p.problem == "sizes" else "dtypes"
        known = signature_of(p.site)
        if known == "moe-aux-loss":
            remedy = ("the ranks' MoE aux-loss trackers hold different entries: initialise every entry on every "
                      "rank (megatron's track_moe_metrics(force_initialize=True), and count the MTP layers too: "
                      "Megatron-LM #3400/#3401)")
        else:
            remedy = (f"every member must pass tensors of the same {'size' if what == 'sizes' else 'dtype'} to "
                      f"{p.op} at {words.where(p.site)}: compare how each rank builds it (a list whose length "
                      "depends on the layers a stage holds, a rank in another phase such as validation)")
        out.append(Finding(
            id="size-mismatch" if what == "sizes" else "dtype-mismatch", ranks=p.members, remedy=remedy,
            summary=(f"{p.op} #{p.seq} at {words.where(p.site)} on the {name} group {words.members(p.members)} "
                     f"was entered by every member, with different {what}: {values}"),
            details={"op": p.op, "seq": p.seq, "group": p.kind or p.desc, "fr_group": p.group,
                     "site": p.site.to_dict() if p.site else None,
                     "values": {k: list(v) for k, v in p.by_value.items()}, "source": "flight-recorder"},
        ))
    return out


def stuck_groups_finding(stuck: Sequence) -> Finding:
    """The Flight Recorder shows groups whose every member waits at one collective, and nothing split."""
    ranks = _union(s.members for s in stuck)
    first = stuck[0]
    more = f" (and {len(stuck) - 1} more group{'s' if len(stuck) > 2 else ''})" if len(stuck) > 1 else ""
    return Finding(
        id="all-waiting", ranks=ranks, remedy=FLIGHT_RECORDER_HINT.split("; compare")[0],
        summary=(f"the Flight Recorder shows every member of {first.desc or first.group} waiting in {first.op} "
                 f"#{first.seq}{more}, and no group split: the cause is below Python"),
        details={"source": "flight-recorder",
                 "groups": [{"group": s.group, "desc": s.desc, "seq": s.seq, "op": s.op,
                             "members": list(s.members)} for s in stuck]},
    )


def layout_free_findings(views: Sequence[RankView]) -> list[Finding]:
    """Without a layout: stopped ranks while others wait, or ranks that hold up the rest while all others
    wait in collectives."""
    ranked = [v for v in views if v.rank is not None]
    by_rank = {v.rank: v for v in ranked}
    waiting = [v.rank for v in ranked if v.state == "collective"]
    out = []
    frozen: dict[str, list[int]] = {}
    for v in ranked:
        if v.state in ("stopped", "gone", "unreadable"):
            frozen.setdefault(v.state, []).append(v.rank)
    held = [v.rank for v in ranked if v.state in ("running", "waiting") and holds_up(v)]
    words = _Words(None)
    if waiting:
        for state, ranks in frozen.items():
            out.append(Finding(
                id="frozen-rank", ranks=tuple(ranks), remedy=_frozen_remedy(state, ranks, by_rank),
                summary=(f"{words.ranks(ranks)} {words.verb(ranks, 'is', 'are')} {state} while "
                         f"{words.ranks(waiting)} {words.verb(waiting, 'waits', 'wait')} in collectives "
                         "(no layout: groups unknown)"),
            ))
    if held and waiting and len(held) + len(waiting) == len(ranked):
        kinds = list(dict.fromkeys(by_rank[r].wait.kind if by_rank[r].wait else "running" for r in held))
        what = WAIT_PHRASES.get(kinds[0], kinds[0]) if len(kinds) == 1 else "outside any collective"
        out.append(Finding(
            id="straggler", ranks=tuple(held),
            remedy=_straggler_remedy(held, by_rank, kinds[0] if len(kinds) == 1 else "running"),
            summary=(f"{words.ranks(held)} {words.verb(held, 'is', 'are')} {what} while every other "
                     "rank waits in a collective (no layout: groups unknown)"),
        ))
    return out


def ordered(findings: Iterable[Finding]) -> tuple[Finding, ...]:
    """Causes first (by id), then by first rank."""
    return tuple(sorted(findings, key=lambda f: (_PRIORITY.get(f.id, 99), f.ranks[:1])))
