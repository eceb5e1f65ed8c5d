"""What NCCL's watchdog lines say about a hang, as split collectives and size problems (pure).

Every rank whose collective times out logs ``WorkNCCL(SeqNum=k, OpType=…, NumelIn=…)`` with its group. Ranks of
one group that time out at the same number with different OpTypes issued different collectives there; with
the same OpType and a different NumelIn, the same collective with different sizes (Megatron-LM #3400). Members
of the group that log no timeout at that number never enqueued it. A rank whose group's status line reports
the failure without a ``WorkNCCL`` line (torch 2.5+'s ``failure detected by watchdog``) timed out at that number
in an op the log does not name: it contradicts no one. torch 1.x logs carry no ``SeqNum``: their ranks are
compared by op type (and group where given) alone, which is all such a log allows.

The log has no call sites: the Flight Recorder's dumps, when there are any, are the better evidence; this is
what is left when there are none. When nothing in it is split, it still says which ranks timed out where, and
what to collect next (``log_words.unexplained``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mtpdiag.analysis import log_words
from mtpdiag.analysis.flight_recorder.evidence import SizeProblem
from mtpdiag.analysis.gate import CoordsOf, read_gate
from mtpdiag.analysis.log_words import UNNAMED
from mtpdiag.layout import GROUP_KINDS, ParallelLayout
from mtpdiag.model import Finding, Mismatch
from mtpdiag.model.watchdog import WatchdogLog, WatchdogTimeout
from mtpdiag.vocabulary.groups import MEGATRON_GROUP_KINDS
from mtpdiag.vocabulary.ops import UNEVEN_INPUT_OPS, WORK_OWN_COUNT_OPS, WORK_P2P_OPS
from mtpdiag.vocabulary.states import GroupFrom, Source

Slot = tuple[str | None, int | None]  # a rank's op (None: not logged) and NumelIn at one number of one group


@dataclass(frozen=True)
class LogEvidence:
    mismatches: tuple[Mismatch, ...]
    size_problems: tuple[SizeProblem, ...]
    lines: tuple[str, ...]  # the timeouts and dump signals in words, for the report
    notes: tuple[str, ...] = ()  # what the log cannot tell, and where its lines disagree
    findings: tuple[Finding, ...] = ()  # when nothing is split: what the log shows, and what to collect next


def fold_log(log: WatchdogLog, layout: ParallelLayout | None, coords_of: CoordsOf | None) -> LogEvidence:
    """Split collectives and size problems from the timeouts of each group at each sequence number."""
    global_ranks = any(t.rank is not None for t in log.timeouts)
    rank_of: Callable[[WatchdogTimeout], int | None] = (lambda t: t.rank) if global_ranks else (lambda t: t.group.rank)
    by_group: dict[tuple[str, int | None, str], dict[int, Slot]] = {}
    desc_of: dict[str, str] = {}
    for t in log.timeouts:
        rank = rank_of(t)
        if rank is None:
            continue
        name = t.group.name or t.group.desc or UNNAMED
        desc_of[name] = t.group.desc or ""
        slots = by_group.setdefault((name, t.seq, _count(t.op)), {})
        if slots.get(rank, (None, None))[0] is None:  # a logged op outranks a status line's failure
            slots[rank] = (t.op, t.numel_in)
    mismatches: list[Mismatch] = []
    sizes: list[SizeProblem] = []
    for (name, seq, _), slots in sorted(by_group.items(), key=lambda item: (item[0][0], item[0][1] or -1, item[0][2])):
        split, size = _fold_group(name, seq, slots, desc_of.get(name, ""), layout, coords_of)
        mismatches += split
        sizes += [size] if size is not None else []
    notes = (*log.notes, *log_words.limits(log, global_ranks), *log_words.unnamed_differ(by_group))
    found = () if mismatches or sizes else log_words.unexplained(log, rank_of)
    return LogEvidence(tuple(mismatches), tuple(sizes), log_words.lines(log), notes, found)


def _fold_group(
    name: str,
    seq: int | None,
    slots: dict[int, Slot],
    desc: str,
    layout: ParallelLayout | None,
    coords_of: CoordsOf | None,
) -> tuple[list[Mismatch], SizeProblem | None]:
    """The splits of one group at one number (or, without numbers, at its timeouts), or its size problem."""
    kind = MEGATRON_GROUP_KINDS.get(desc)
    members = _members(kind, sorted(slots), layout)
    ops: dict[str, list[int]] = {}
    for rank, (op, _) in sorted(slots.items()):
        if op is not None:
            ops.setdefault(op, []).append(rank)
    if len(ops) <= 1 and len(members) == len(slots):
        return [], _sizes(name, seq, slots, desc, kind, members, ops)
    unknown = {r for r, (op, _) in slots.items() if op is None}
    out = []
    for op, entered in ops.items():
        inside = unknown.union(entered)
        absent = tuple(r for r in members if r not in inside)
        if not absent:
            continue
        gate = read_gate([_Split(members, tuple(entered), absent)], coords_of) if coords_of else None
        at = f"#{seq}" if seq is not None else "(no SeqNum)"
        doing = {
            a: (f"{slots[a][0]} {at} (timed out)" if a in slots else "no timeout logged at this number") for a in absent
        }
        out.append(
            Mismatch(
                op=op,
                site=None,
                group=kind or desc or name,
                members=members,
                entered=tuple(entered),
                absent=absent,
                gate=gate.gate if gate else None,
                absent_doing=doing,
                group_from=GroupFrom.WATCHDOG_LOG if kind else GroupFrom.GUESS,
                group_candidates=(kind,) if kind else (),
                gate_strength=gate.strength if gate else None,
                gate_alternatives=gate.alternatives if gate else (),
                source=Source.WATCHDOG_LOG,
                seq=seq,
            )
        )
    return out, None


def _sizes(
    name: str,
    seq: int | None,
    slots: dict[int, Slot],
    desc: str,
    kind: str | None,
    members: tuple[int, ...],
    ops: dict[str, list[int]],
) -> SizeProblem | None:
    """The one op of a group's number entered with different NumelIn (ranks that logged it only)."""
    if not ops or seq is None:
        return None
    ((op, ranks),) = ops.items()
    if op in WORK_OWN_COUNT_OPS or op in UNEVEN_INPUT_OPS:  # sizes that differ by design (p2p, batches, all_to_all)
        return None
    numels: dict[str, list[int]] = {}
    for rank in ranks:
        numel = slots[rank][1]
        if numel is not None:
            numels.setdefault(f"{numel} element{'s' if numel != 1 else ''}", []).append(rank)
    if len(numels) <= 1:
        return None
    return SizeProblem(
        group=name,
        desc=desc,
        kind=kind,
        members=members,
        seq=seq,
        op=op,
        site=None,
        problem="sizes",
        by_value={k: tuple(v) for k, v in numels.items()},
    )


def _count(op: str | None) -> str:
    """Which of the group's sequences a work counts in: p2p works and coalesced batches apart from collectives
    (a status line's failure, whose op is not logged, is read with the collectives: it contradicts no one)."""
    if op in WORK_P2P_OPS:
        return "p2p"
    return "coalesced" if op in WORK_OWN_COUNT_OPS else ""


@dataclass(frozen=True)
class _Split:
    members: tuple[int, ...]
    entered: tuple[int, ...]
    absent: tuple[int, ...]


def _members(kind: str | None, seen: list[int], layout: ParallelLayout | None) -> tuple[int, ...]:
    """The group's members: from the layout when megatron's description names the kind, else who logged."""
    if kind is not None and kind in GROUP_KINDS and layout is not None and seen and max(seen) < layout.world_size:
        return tuple(sorted(layout.group_of(kind, seen[0])))
    return tuple(seen)
