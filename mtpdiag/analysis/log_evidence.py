"""What NCCL's watchdog lines say about a hang, as split collectives and size problems (pure).

Every rank whose collective times out logs ``WorkNCCL(SeqNum=k, OpType=…, NumelIn=…)`` with its group. Ranks of
one group that time out at the same number with different OpTypes issued different collectives there; with
the same OpType and a different NumelIn, the same collective with different sizes (Megatron-LM #3400). Members
of the group that log no timeout at that number never enqueued it. The log has no call sites: the Flight
Recorder's dumps, when there are any, are the better evidence; this is what is left when there are none.
"""

from __future__ import annotations

from dataclasses import dataclass

from mtpdiag.analysis.flight_recorder.evidence import SizeProblem
from mtpdiag.analysis.gate import CoordsOf, read_gate
from mtpdiag.layout import GROUP_KINDS, ParallelLayout
from mtpdiag.model import Mismatch
from mtpdiag.model.watchdog import WatchdogLog
from mtpdiag.vocabulary.groups import MEGATRON_GROUP_KINDS
from mtpdiag.vocabulary.states import GroupFrom, Source


@dataclass(frozen=True)
class LogEvidence:
    mismatches: tuple[Mismatch, ...]
    size_problems: tuple[SizeProblem, ...]
    lines: tuple[str, ...]  # the timeouts in words, for the report


def fold_log(log: WatchdogLog, layout: ParallelLayout | None, coords_of: CoordsOf | None) -> LogEvidence:
    """Split collectives and size problems from the timeouts of each group at each sequence number."""
    by_group: dict[tuple[str, int], dict[int, tuple[str, int | None]]] = {}
    desc_of: dict[str, str] = {}
    for t in log.timeouts:
        if t.rank is None:
            continue
        name = t.group.name or (t.group.desc or "?")
        desc_of[name] = t.group.desc or ""
        by_group.setdefault((name, t.seq), {})[t.rank] = (t.op, t.numel_in)
    mismatches: list[Mismatch] = []
    sizes: list[SizeProblem] = []
    for (name, seq), ranks in sorted(by_group.items()):
        desc = desc_of.get(name, "")
        kind = MEGATRON_GROUP_KINDS.get(desc)
        members = _members(kind, sorted(ranks), layout)
        ops: dict[str, list[int]] = {}
        for rank, (op, _) in sorted(ranks.items()):
            ops.setdefault(op, []).append(rank)
        if len(ops) == 1 and len(members) == len(ranks):
            (op,) = ops
            numels: dict[str, list[int]] = {}
            for rank, (_, numel) in sorted(ranks.items()):
                numels.setdefault(f"{numel} element{'s' if numel != 1 else ''}", []).append(rank)
            if len(numels) > 1:
                sizes.append(
                    SizeProblem(
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
                )
            continue
        for op, entered in ops.items():
            absent = tuple(r for r in members if r not in entered)
            if not absent:
                continue
            gate = read_gate([_Split(members, tuple(entered), absent)], coords_of) if coords_of else None
            doing = {
                a: (f"{ranks[a][0]} #{seq} (timed out)" if a in ranks else "no timeout logged at this number")
                for a in absent
            }
            mismatches.append(
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
    lines = tuple(
        f"rank {t.rank}: {t.op} #{t.seq} in {t.group.desc or t.group.name} timed out after "
        f"{t.ran_for_ms} ms (NumelIn={t.numel_in}; last enqueued {t.last_enqueued}, last completed "
        f"{t.last_completed})"
        for t in log.timeouts
    )
    return LogEvidence(tuple(mismatches), tuple(sizes), lines)


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
