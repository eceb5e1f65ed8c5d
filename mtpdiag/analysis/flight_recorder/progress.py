"""How far each member of each process group got, by the recorder's account (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from mtpdiag.model.flight_recorder import FRDump, FREntry, FRGroup
from mtpdiag.vocabulary.groups import MEGATRON_GROUP_KINDS, GroupKind
from mtpdiag.vocabulary.matching import MembersFrom


@dataclass(frozen=True)
class GroupProgress:
    """How far each member got in one group's collective sequence, by the recorder's account.

    ``last_entered``/``last_completed`` map a member rank to a collective sequence id (0: none seen).
    ``behind`` are members whose last entered id is lower than another member's. ``members_from`` says
    whether membership is torch's exact ``pg_config`` or only the ranks seen using the group.
    """

    name: str
    desc: str
    members: tuple[int, ...]
    members_from: MembersFrom  # pg_config | entries
    last_entered: Mapping[int, int]
    last_completed: Mapping[int, int]
    pending: Mapping[int, tuple[FREntry, ...]]
    behind: tuple[int, ...]
    no_dump: tuple[int, ...]

    @property
    def kind(self) -> GroupKind | None:
        """The layout group kind megatron's description names (``dp_cp``), if any."""
        return MEGATRON_GROUP_KINDS.get(self.desc)


def group_progress(fr: FRDump) -> tuple[GroupProgress, ...]:
    """Every group that some rank recorded an op in, with each member's progress in it."""
    used = sorted({(e.group, e.group_desc) for d in fr.ranks for e in d.entries}, key=lambda g: group_sort_key(g[0]))
    members = _memberships(fr)
    out = []
    for name, desc in used:
        ranks = members.get(name)
        source = MembersFrom.PG_CONFIG
        if not ranks:
            ranks = tuple(sorted(d.rank for d in fr.ranks if any(e.group == name for e in d.entries)))
            source = MembersFrom.ENTRIES
        entered, completed, pending = {}, {}, {}
        for rank in ranks:
            dump = fr.rank(rank)
            if dump is None:
                continue
            mine = [e for e in dump.entries if e.group == name]
            status = [s for s in dump.status if s.group == name]
            collectives = [e for e in mine if not e.is_p2p]
            entered[rank] = max([e.collective_seq_id for e in collectives] + [s.last_enqueued for s in status] + [0])
            completed[rank] = max(
                [e.collective_seq_id for e in collectives if e.done] + [s.last_completed for s in status] + [0]
            )
            waiting = tuple(e for e in mine if not e.done)
            if waiting:
                pending[rank] = waiting
        top = max(entered.values(), default=0)
        out.append(
            GroupProgress(
                name=name,
                desc=desc,
                members=ranks,
                members_from=source,
                last_entered=entered,
                last_completed=completed,
                pending=pending,
                behind=tuple(r for r in ranks if r in entered and entered[r] < top),
                no_dump=tuple(r for r in ranks if r not in entered),
            )
        )
    return tuple(out)


def _memberships(fr: FRDump) -> dict[str, tuple[int, ...]]:
    return {name: g.ranks for name, g in recorded_groups(fr).items()}


def recorded_groups(fr: FRDump) -> dict[str, FRGroup]:
    """Group name -> the first record of it that lists members (see ``conflicting_memberships``)."""
    out: dict[str, FRGroup] = {}
    for dump in fr.ranks:
        for g in dump.groups:
            if g.ranks:
                out.setdefault(g.name, g)
    return out


def conflicting_memberships(fr: FRDump) -> list[str]:
    """Ranks whose dumps disagree on a group's members: the groups were not built alike."""
    seen: dict[str, tuple[int, tuple[int, ...]]] = {}
    lines = []
    for dump in fr.ranks:
        for g in dump.groups:
            if not g.ranks:
                continue
            first = seen.setdefault(g.name, (dump.rank, g.ranks))
            if first[1] != g.ranks:
                lines.append(
                    f"FR group {g.name} ({g.desc}) has members {list(first[1])} in rank {first[0]}'s "
                    f"dump but {list(g.ranks)} in rank {dump.rank}'s"
                )
    return lines


def group_sort_key(name: str) -> tuple[int, int | str]:
    return (0, int(name)) if name.isascii() and name.isdigit() else (1, name)
