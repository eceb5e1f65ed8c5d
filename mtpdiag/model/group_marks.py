"""Progress per process group across ranks, for ``run``'s Flight Recorder signal (pure).

Every member of a process group completes the same sequence of collectives, so a group's progress can be read
from any member's dump: the highest completed collective seen from any member is the group's *mark*, and a
dump shows progress only when one of its groups is past its mark. A rank read for the first time, or read
rarely, therefore adds nothing its group's other members already showed: its first dump after a hang is no
progress when another member's dump already reached the same collective. The progress is dated by when that
collective completed (``time_discovered_completed_ns``), not by when the dump was read, so the quiet window of
a hang runs from the last collective completed however late the dump that shows it was read.

A group is named by its name and its ranks (``pg_config``): two subgroups that carry the same name on different
ranks (one name per rank's own subgroup, as ``split_group`` gives them) never share a mark. Point-to-point ops
count per rank (``pg_status`` counts them with their own sequence, which the group's members do not share): a
group whose last completed op is a send or recv is marked per rank, against that rank's earlier dumps only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import msgspec

Marks = dict[str, list[float]]  # group key -> [highest completed seq seen, when it completed (time.time())]


class GroupCompleted(msgspec.Struct, frozen=True):
    """One group's progress in one rank's dump: its key (``group_key``), its last completed op's sequence
    number (``pg_status``) and when that op completed (time.time() seconds)."""

    key: str
    seq: int
    at: float


def group_key(name: str, ranks: Sequence[int], rank: int, pg_id: int, p2p: bool) -> str:
    """The key a group's mark is kept under: its name and ranks; per rank when the dump does not name the group
    (its entries were overwritten) or give its ranks (torch 2.13's JSON form leaves ``pg_config`` empty), or when
    its last completed op was point-to-point."""
    if not name or not ranks or p2p:
        return f"rank {rank} pg {pg_id}" + (f" {name}{list(ranks)}" if name else "")
    return f"{name}{list(ranks)}"


def advance(marks: Mapping[str, Sequence[float]], groups: Iterable[GroupCompleted]) -> tuple[Marks, float | None]:
    """The marks with ``groups`` (read from fresh dumps) folded in, and when the newest collective past a mark
    completed (None when no group went past its mark). A group seen for the first time sets its mark and is not
    progress: there is nothing to compare it with."""
    out: Marks = {key: [float(v[0]), float(v[1])] for key, v in marks.items()}
    newest: float | None = None
    for g in groups:
        mark = out.get(g.key)
        if mark is None:
            out[g.key] = [float(g.seq), g.at]
        elif g.seq > mark[0]:
            out[g.key] = [float(g.seq), g.at]
            newest = g.at if newest is None else max(newest, g.at)
    return out, newest


def every_rank_read_at(piped: Iterable[int], first_read: Mapping[int, float]) -> float | None:
    """When the signal could first see every rank's groups move (time.time()): the latest of the first dumps read
    of the ranks with a debug-info pipe (each of their groups has a mark from then on). None while one of them
    has not answered yet; -inf when no rank has a pipe (there is nothing to wait for)."""
    firsts = [first_read.get(rank) for rank in piped]
    if not firsts:
        return float("-inf")
    return None if any(f is None for f in firsts) else max(f for f in firsts if f is not None)
