"""Root or consequence: did a rank that is absent from a call skip it, or has it just not got there?

A call C was issued at sequence number k of group G by the entered ranks; rank a did not issue it.
Three rules, strongest first; the first that applies decides (``AbsentWhy.rule`` says which):

1. ``same-group``: a issued something else, X, at G#k. If a issued C's op from C's site later in G, a was
   *shifted* by an extra op on one side (C is a consequence). If a recorded anything after X, it went on
   without C: *skipped* (a root). If X is a's last op, the stacks decide: X before C in program order
   means a stopped short of C (*behind*), X after C means a passed it (*skipped*).
2. ``record-order``: a's latest collective is one the entered rank e also recorded. If e recorded it after
   C, a went past C's place without issuing it (*skipped*); if before, a is *behind* (it never got to C).
   A rank's record order is its program order, so this needs no clock and no stack.
3. ``stack-order``: a and e last agreed at a sync point P (the latest op e recorded before C that a also
   recorded). Stacks are compared outermost frame first: at the first frame where two stacks differ in
   line within the same function, the smaller line comes first in program order. If C comes after P
   and a's latest op is again at P's place or before it, a went round a loop and passed C (*skipped*;
   the rule assumes the loop it went round encloses both, as the training-step loop does). If a's
   latest op lies between P and C, a is *behind*. If C is at P's place (the next iteration) and a has
   not gone round the loop, a is *behind*. With no op in common with any entered rank (the job's first
   collectives), a's latest op is compared with C directly, unless a has gone round a loop itself.

Each entered rank is tried as e in turn. Otherwise *unknown*. ``time_created_ns`` is never compared across
ranks: their clocks differ.
"""

from __future__ import annotations

from collections.abc import Sequence

from mtpdiag.analysis.flight_recorder.calls import Call
from mtpdiag.analysis.program_order import program_order
from mtpdiag.model import Site
from mtpdiag.model.flight_recorder import FREntry, FRRankDump
from mtpdiag.model.fr_analysis import AbsentWhy
from mtpdiag.vocabulary.matching import AbsentVerdict, OrderRule

__all__ = ["BEHIND", "SHIFTED", "SKIPPED", "UNKNOWN", "AbsentWhy", "RankIndex", "absent_why", "program_order"]

SKIPPED, SHIFTED, BEHIND, UNKNOWN = (
    AbsentVerdict.SKIPPED,
    AbsentVerdict.SHIFTED,
    AbsentVerdict.BEHIND,
    AbsentVerdict.UNKNOWN,
)
SAME_GROUP, RECORD_ORDER, STACK_ORDER, NO_RULE = (
    OrderRule.SAME_GROUP,
    OrderRule.RECORD_ORDER,
    OrderRule.STACK_ORDER,
    OrderRule.NONE,
)


class RankIndex:
    """One rank's entries keyed by (group, kind, seq): where each op sits in the rank's record order."""

    def __init__(self, dump: FRRankDump) -> None:
        self.dump = dump
        self.entries = tuple(sorted(dump.entries, key=lambda e: e.record_id))
        self.by_key: dict[tuple[str, bool, int], FREntry] = {}
        for e in self.entries:
            self.by_key[_key(e)] = e  # the closing entry of a batch wins: it comes last

    def latest(self) -> FREntry | None:
        """What the rank is doing: its latest pending op, else its latest op."""
        pending = [e for e in self.entries if not e.done]
        latest = pending or self.entries
        return latest[-1] if latest else None


def _key(e: FREntry) -> tuple[str, bool, int]:
    return (e.group, e.is_p2p, e.seq)


def absent_why(
    entered: Sequence[tuple[RankIndex, Call]], absent: RankIndex, later: tuple[Call, ...], at_k: Call | None
) -> AbsentWhy:
    """Why ``absent`` did not issue the call that each of ``entered`` (a rank's index and its copy of the
    call) made. ``at_k``: what ``absent`` issued at the same number in the group, if anything; ``later``:
    its later calls in the group. Every entered rank is tried as the reference, in order."""
    a = absent.dump.rank
    call = entered[0][1]
    if at_k is not None:
        return _same_group(call, absent, later, at_k)
    latest = absent.latest()
    if latest is None:
        return AbsentWhy(a, UNKNOWN, NO_RULE, "recorded no op")
    for index, mine in entered:
        theirs = index.by_key.get(_key(latest))
        if theirs is None or theirs.record_id == mine.record_id:
            continue
        e = index.dump.rank
        if theirs.record_id > mine.record_id:
            return AbsentWhy(
                a, SKIPPED, RECORD_ORDER, f"is at {_op_text(latest)}, which rank {e} reached after this call"
            )
        return AbsentWhy(a, BEHIND, RECORD_ORDER, f"is at {_op_text(latest)}, which rank {e} passed before this call")
    synced = False
    for index, mine in entered:
        sync = _sync_point(mine, index, absent)
        if sync is None:
            continue
        synced = True
        why = _by_stacks(mine, sync, absent, latest)
        if why.verdict != UNKNOWN:
            return why
    if not synced:
        return _without_sync(call, absent, latest)
    return AbsentWhy(
        a,
        UNKNOWN,
        NO_RULE,
        f"is at {_op_text(latest)}; its stacks do not say whether that is before or after this call",
    )


def _same_group(call: Call, absent: RankIndex, later: tuple[Call, ...], at_k: Call) -> AbsentWhy:
    a = absent.dump.rank
    instead = f"issued {at_k.op} at #{call.seq}"
    again = next((c for c in later if c.op == call.op and c.site == call.site), None)
    if again is not None:
        return AbsentWhy(a, SHIFTED, SAME_GROUP, f"{instead} and this {call.op} later, at #{again.seq}")
    if any(e.record_id > at_k.record_id for e in absent.entries):
        return AbsentWhy(a, SKIPPED, SAME_GROUP, f"{instead}, went on, and never issued this {call.op}")
    return _stopped_at(a, SAME_GROUP, at_k.frames, call, instead, " and stopped there") or AbsentWhy(
        a, UNKNOWN, NO_RULE, f"{instead} and stopped there"
    )


def _by_stacks(call: Call, sync: FREntry, absent: RankIndex, latest: FREntry) -> AbsentWhy:
    a = absent.dump.rank
    if sync.record_id == latest.record_id:
        return AbsentWhy(a, BEHIND, RECORD_ORDER, f"is still at {_op_text(latest)}, before this call")
    s_p = _outer_first(sync.frames)
    p_to_c, p_to_l = program_order(s_p, _outer_first(call.frames)), program_order(s_p, _outer_first(latest.frames))
    where = f"is at {_op_text(latest)}"
    since = f"since {_op_text(sync)}"
    if p_to_c == "before":
        if p_to_l in ("same", "after"):
            return AbsentWhy(a, SKIPPED, STACK_ORDER, f"{where}: it went round a loop {since} and passed this call")
        if p_to_l == "before":
            found = _stopped_at(a, STACK_ORDER, latest.frames, call, where)
            if found is not None:
                return found
    elif p_to_c == "same" and p_to_l == "before":
        return AbsentWhy(
            a,
            BEHIND,
            STACK_ORDER,
            f"{where}; this call is the next round of {_op_text(sync)}, which it has not begun",
        )
    return AbsentWhy(a, UNKNOWN, NO_RULE, f"{where}; its stacks do not say whether that is before or after this call")


def _without_sync(call: Call, absent: RankIndex, latest: FREntry) -> AbsentWhy:
    """No op in common with any entered rank (the job's first collectives): compare the stacks directly,
    unless the absent rank has gone round a loop (two of its ops at one place), which would hide an order."""
    a = absent.dump.rank
    where = f"is at {_op_text(latest)}"
    stacks = [e.frames for e in absent.entries if e.frames]
    if len(set(stacks)) < len(stacks):
        return AbsentWhy(a, UNKNOWN, NO_RULE, f"{where}; no op in common to order it by")
    return _stopped_at(a, STACK_ORDER, latest.frames, call, where, " (no earlier op in common)") or AbsentWhy(
        a, UNKNOWN, NO_RULE, f"{where}; no op in common to order it by"
    )


def _stopped_at(
    a: int, rule: OrderRule, stop: tuple[Site, ...], call: Call, where: str, tail: str = ""
) -> AbsentWhy | None:
    """The verdict for a rank whose last op has stack ``stop``: before the call in program order, it is
    behind; after it, it skipped the call; None when the stacks do not say."""
    order = program_order(_outer_first(stop), _outer_first(call.frames))
    if order == "before":
        return AbsentWhy(a, BEHIND, rule, f"{where}, which comes before this {call.op}{tail}")
    if order == "after":
        return AbsentWhy(a, SKIPPED, rule, f"{where}, which comes after this {call.op}{tail}")
    return None


def _sync_point(call: Call, entered: RankIndex, absent: RankIndex) -> FREntry | None:
    """``absent``'s copy of the latest op ``entered`` recorded before ``call`` that both recorded."""
    for e in reversed(entered.entries):
        if e.record_id >= call.first_record_id:
            continue
        theirs = absent.by_key.get(_key(e))
        if theirs is not None and theirs.frames:
            return theirs
    return None


def _outer_first(frames: tuple[Site, ...]) -> tuple[Site, ...]:
    return tuple(reversed(frames))


def _op_text(e: FREntry) -> str:
    seq = f"p2p #{e.p2p_seq_id}" if e.is_p2p else f"#{e.collective_seq_id}"
    where = f" at {e.site.function}" if e.site else ""
    return f"{e.op} {seq} in {e.group_desc or e.group}{where}"
