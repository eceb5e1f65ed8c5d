"""Match every rank's record across ranks, per process group, and find where the group first diverged (pure).

A group's members must issue the same collectives in the same order: the k-th collective of a group
(``collective_seq_id`` k) is one and the same op on every member, with the same element count and dtype
(all_to_all, scatter and gather excepted: their per-rank sizes legitimately differ). The first sequence
number at which that fails is the group's *divergence*, of one or more kinds:

* ``missing_ranks``: some members never reached k (their last entered number, from the entries and
  ``pg_status``, is below k) while others entered it;
* ``op_type``: members issued different ops at k (the verl bug on NCCL: an all_reduce on one rank, the
  distributed optimizer's all-gather on the other);
* ``sizes`` / ``dtypes``: the same op with a different element count (Megatron-LM #3400: 14 vs 15) or dtype.

Each distinct (op, call site) at k becomes an ``FRCallSplit``: the ranks that issued it, the members that
did not, what those did instead, and whether they skipped it (a root) or will get to it (a consequence,
see ``order``). Point-to-point ops are matched per pair of ranks instead (``P2PMismatch``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from mtpdiag.analysis.flight_recorder.calls import Call, group_calls
from mtpdiag.analysis.flight_recorder.order import BEHIND, SHIFTED, SKIPPED, AbsentWhy, RankIndex, absent_why
from mtpdiag.analysis.flight_recorder.progress import group_sort_key
from mtpdiag.analysis.flight_recorder.results import (
    Divergence,
    FRAnalysis,
    FRCallSplit,
    GroupMatch,
    P2PMismatch,
    RankAt,
    Signature,
    culprits,
    rank_at,
    signature,
    size_key,
)
from mtpdiag.model import Mismatch, Site
from mtpdiag.model.flight_recorder import FRDump, FREntry, FRRankDump
from mtpdiag.vocabulary.groups import MEGATRON_GROUP_KINDS
from mtpdiag.vocabulary.matching import DivergenceKind, MatchRole, MembersFrom, P2PKind
from mtpdiag.vocabulary.states import Role

MISSING, OP_TYPE, SIZES, DTYPES = (
    DivergenceKind.MISSING_RANKS,
    DivergenceKind.OP_TYPE,
    DivergenceKind.SIZES,
    DivergenceKind.DTYPES,
)
# A split's role in the diagnosis, before the wait-for graph (``causes``) gives every split its own: a call the
# recorder cannot order (``MatchRole.UNKNOWN``) stays a root candidate, as one some rank skipped is.
PROVISIONAL_ROLE = {MatchRole.ROOT: Role.ROOT, MatchRole.CONSEQUENCE: Role.CONSEQUENCE, MatchRole.UNKNOWN: Role.ROOT}

Calls = Mapping[int, Mapping[str, tuple[Call, ...]]]  # rank -> group name -> its calls, in record order
Indexes = Mapping[int, RankIndex]  # rank -> its record in program order
Seqs = Mapping[int, Mapping[int, Call]]  # rank -> collective sequence number -> the call


def match_groups(fr: FRDump, members: Mapping[str, Iterable[int]] | None = None) -> FRAnalysis:
    """Match every group some dump recorded an op in. ``members`` (group name -> global ranks) supplies
    membership where no dump's ``pg_config`` has it (torch 2.13's gloo records none)."""
    indexes = {d.rank: RankIndex(d) for d in fr.ranks}
    calls = {d.rank: _calls_by_group(d) for d in fr.ranks}
    configured, notes = _configured(fr)
    used: dict[str, str] = {}
    for d in fr.ranks:
        for e in d.entries:
            used.setdefault(e.group, e.group_desc)
    groups = []
    for name in sorted(used, key=group_sort_key):
        if name in configured:
            ranks, source = configured[name], MembersFrom.PG_CONFIG
        elif members is not None and name in members:
            ranks, source = tuple(sorted(set(members[name]))), MembersFrom.GIVEN
        else:
            ranks, source = tuple(sorted(r for r, by_group in calls.items() if name in by_group)), MembersFrom.ENTRIES
        groups.append(_match_group(_recorded(name, used[name], ranks, source, fr, calls, indexes)))
    p2p = tuple(m for g in groups for m in _match_p2p(g, calls, indexes))
    return FRAnalysis(groups=tuple(groups), p2p=p2p, notes=tuple(notes))


def mismatches(analysis: FRAnalysis) -> tuple[Mismatch, ...]:
    """Every split of every divergence as mtpdiag's ``Mismatch`` (gate left to the layout's analysis; the role
    ``PROVISIONAL_ROLE`` gives the matcher's)."""
    out: list[Mismatch] = []
    for d in analysis.divergences:
        for c in d.calls:
            if not c.absent:
                continue  # every member entered: a sizes/dtypes divergence, not a split group
            out.append(
                Mismatch(
                    op=c.op,
                    site=c.site,
                    group=d.kind or d.desc or d.group,
                    members=d.members,
                    entered=c.entered,
                    absent=c.absent,
                    gate=None,
                    absent_doing=dict(c.absent_doing),
                    role=PROVISIONAL_ROLE[c.role],
                )
            )
    return tuple(out)


# ---------------------------------------------------------------- one group


class _Recorded(msgspec.Struct, frozen=True, gc=False):
    """One group as every member's dump recorded it, read once: what ``_divergence`` and its steps share.

    ``seqs``: each dumped member's collectives by sequence number; ``entered``/``completed``: the last number
    each dumped member entered and completed (its entries and torch's ``pg_status``); ``calls`` and
    ``indexes``: every rank's calls by group and its record in program order."""

    name: str
    desc: str
    members: tuple[int, ...]
    source: MembersFrom
    no_dump: tuple[int, ...]
    seqs: Seqs
    entered: Mapping[int, int]
    completed: Mapping[int, int]
    calls: Calls
    indexes: Indexes

    @property
    def dumped(self) -> list[int]:
        return [r for r in self.members if r in self.seqs]


class _At(msgspec.Struct, frozen=True, gc=False):
    """A sequence number of the group, and who recorded what there: ``here`` (rank -> its call) and ``missing``
    (dumped members that never reached it)."""

    k: int
    here: Mapping[int, Call]
    missing: tuple[int, ...]


def _calls_by_group(dump: FRRankDump) -> dict[str, tuple[Call, ...]]:
    names = {e.group for e in dump.entries}
    return {name: group_calls(dump, name) for name in names}


def _configured(fr: FRDump) -> tuple[dict[str, tuple[int, ...]], list[str]]:
    out: dict[str, tuple[int, ...]] = {}
    seen: dict[str, int] = {}
    notes = []
    for d in fr.ranks:
        for g in d.groups:
            if not g.ranks:
                continue
            if g.name in out and out[g.name] != g.ranks:
                notes.append(
                    f"group {g.name} ({g.desc}) has members {list(out[g.name])} in rank "
                    f"{seen[g.name]}'s dump but {list(g.ranks)} in rank {d.rank}'s"
                )
                continue
            out.setdefault(g.name, g.ranks)
            seen.setdefault(g.name, d.rank)
    return out, notes


def _recorded(
    name: str, desc: str, members: tuple[int, ...], source: MembersFrom, fr: FRDump, calls: Calls, indexes: Indexes
) -> _Recorded:
    """Each dumped member's collectives in the group by number, and how far it got."""
    seqs: dict[int, dict[int, Call]] = {}
    entered: dict[int, int] = {}
    completed: dict[int, int] = {}
    for r in members:
        dump = fr.rank(r)
        if dump is None:
            continue
        mine = calls[r].get(name, ())
        coll = {c.seq: c for c in mine if not c.p2p}
        seqs[r] = coll
        has_p2p = any(c.p2p for c in mine)
        status = [s for s in dump.status if s.group == name] if not has_p2p else []
        entered[r] = max([c.seq for c in coll.values()] + [s.last_enqueued for s in status] + [0])
        completed[r] = max([c.seq for c in coll.values() if c.done] + [s.last_completed for s in status] + [0])
    no_dump = tuple(r for r in members if fr.rank(r) is None)
    return _Recorded(name, desc, members, source, no_dump, seqs, entered, completed, calls, indexes)


def _match_group(g: _Recorded) -> GroupMatch:
    divergence, stuck = _first_divergence(g)
    return GroupMatch(
        name=g.name,
        desc=g.desc,
        kind=MEGATRON_GROUP_KINDS.get(g.desc),
        members=g.members,
        members_from=g.source,
        last_entered=dict(sorted(g.entered.items())),
        last_completed=dict(sorted(g.completed.items())),
        no_dump=g.no_dump,
        stuck=stuck if divergence is None else None,
        divergence=divergence,
    )


def _first_divergence(g: _Recorded) -> tuple[Divergence | None, int | None]:
    """The group's first divergence, and the lowest number before it that some member still waits in."""
    dumped = g.dumped
    if not dumped:
        return None, None
    firsts = [min(g.seqs[r]) for r in dumped if g.seqs[r]]
    lo = max(firsts) if firsts else 1
    stuck = None
    # only numbers some member recorded: a counter from pg_status may be anything
    for k in sorted({k for r in dumped for k in g.seqs[r] if k >= max(lo, 1)}):
        here = {r: g.seqs[r][k] for r in dumped if k in g.seqs[r]}
        at = _At(k, here, tuple(r for r in dumped if k not in g.seqs[r] and g.entered[r] < k))
        problems = _problems(at)
        if problems:
            return _divergence(g, at, problems), stuck
        if stuck is None and any(not c.done for c in here.values()):
            stuck = k
    return None, stuck


def _problems(at: _At) -> tuple[DivergenceKind, ...]:
    out = []
    if at.missing:
        out.append(MISSING)
    by_op: dict[str, list[Call]] = {}
    for c in at.here.values():
        by_op.setdefault(c.op, []).append(c)
    if len(by_op) > 1:
        out.append(OP_TYPE)
    if any(len({size_key(c) for c in cs}) > 1 for cs in by_op.values()):
        out.append(SIZES)
    if any(len({(c.input_dtypes, c.output_dtypes) for c in cs}) > 1 for cs in by_op.values()):
        out.append(DTYPES)
    return tuple(out)


def _divergence(g: _Recorded, at: _At, problems: tuple[DivergenceKind, ...]) -> Divergence:
    """The group's divergence at ``at``: each member's place, each distinct call's split, the reference."""
    ranks = tuple(_rank_at(g, at, r) for r in g.members)
    reference = _reference(at.here)
    return Divergence(
        group=g.name,
        desc=g.desc,
        kind=MEGATRON_GROUP_KINDS.get(g.desc),
        members=g.members,
        members_from=g.source,
        seq=at.k,
        problems=problems,
        calls=_splits(g, at, ranks),
        ranks=ranks,
        missing=at.missing,
        no_dump=g.no_dump,
        reference=reference,
        culprits=culprits(ranks, at.missing, reference),
    )


def _splits(g: _Recorded, at: _At, ranks: tuple[RankAt, ...]) -> tuple[FRCallSplit, ...]:
    """One split per distinct (op, call site) at the number, the most issued first."""
    keys: dict[tuple[str, Site | None], list[int]] = {}
    for r, c in sorted(at.here.items()):
        keys.setdefault((c.op, c.site), []).append(r)
    ordered = sorted(keys.values(), key=lambda who: (-len(who), who[0]))
    return tuple(_split(g, at, ranks, tuple(who)) for who in ordered)


def _split(g: _Recorded, at: _At, ranks: tuple[RankAt, ...], who: tuple[int, ...]) -> FRCallSplit:
    """The call ``who`` issued at the number: what each absent member did instead, and why it is absent."""
    call = at.here[who[0]]
    absent = tuple(r for r in g.members if r not in who)
    why = {a: _why(g, at, who, a) for a in absent if a in g.indexes}
    return FRCallSplit(
        op=call.op,
        profiling_name=call.profiling_name,
        site=call.site,
        entered=who,
        absent=absent,
        role=_role(absent, why),
        absent_doing={a: _doing(a, at, ranks) for a in absent},
        why=why,
    )


def _why(g: _Recorded, at: _At, who: tuple[int, ...], a: int) -> AbsentWhy:
    later = tuple(c for c in g.calls[a].get(g.name, ()) if not c.p2p and c.seq > at.k)
    return absent_why([(g.indexes[r], at.here[r]) for r in who], g.indexes[a], later, at.here.get(a))


def _reference(here: Mapping[int, Call]) -> int:
    """A rank of the largest set of members whose calls agree (the lowest rank on a tie)."""
    counts: dict[Signature, list[int]] = {}
    for r, c in sorted(here.items()):
        counts.setdefault(signature(c), []).append(r)
    return sorted(counts.values(), key=lambda rs: (-len(rs), rs[0]))[0][0]


def _role(absent: tuple[int, ...], why: Mapping[int, AbsentWhy]) -> MatchRole:
    if not absent:
        return MatchRole.ROOT  # every member entered: the call itself is wrong (sizes, dtypes)
    verdicts = [w.verdict for w in why.values()]
    if SKIPPED in verdicts:
        return MatchRole.ROOT
    if verdicts and all(v in (SHIFTED, BEHIND) for v in verdicts):
        return MatchRole.CONSEQUENCE
    return MatchRole.UNKNOWN


def _rank_at(g: _Recorded, at: _At, r: int) -> RankAt:
    if r not in g.indexes:
        return rank_at(r, None, "no dump", 0, 0, "no Flight Recorder dump")
    call = at.here.get(r)
    entered = g.entered.get(r, 0)
    if call is not None:
        state = "timed out" if call.timed_out else call.state
    else:
        state = "not reached" if entered < at.k else "not recorded"
    latest = g.indexes[r].latest()
    doing = _entry_text(latest) if latest else "recorded no op"
    return rank_at(r, call, state, entered, g.completed.get(r, 0), doing)


def _doing(a: int, at: _At, ranks: tuple[RankAt, ...]) -> str:
    mine = next(r for r in ranks if r.rank == a)
    if mine.state == "no dump":
        return mine.doing
    if a in at.here:
        c = at.here[a]
        return f"{c.op} #{at.k}{_at(c.site)}"
    return f"reached only #{mine.last_entered} here; {mine.doing}"


# ---------------------------------------------------------------- point to point


def _match_p2p(g: GroupMatch, calls: Calls, indexes: Indexes) -> list[P2PMismatch]:
    """Pending sends and receives of one group, paired in order per (sender, receiver)."""
    pending: dict[tuple[str, int, int], list[FREntry]] = {}
    for r in g.members:
        if r not in indexes:
            continue
        for c in calls[r].get(g.name, ()):
            if not c.p2p or c.done:
                continue
            for e in c.parts:
                if e.op in ("send", "recv") and e.src is not None and e.dst is not None:
                    pending.setdefault((e.op, e.src, e.dst), []).append(e)
    out = []
    for (op, src, dst), mine in sorted(pending.items()):
        me, peer = (src, dst) if op == "send" else (dst, src)
        theirs = pending.get(("recv" if op == "send" else "send", src, dst), [])
        for i, e in enumerate(mine):
            other = theirs[i] if i < len(theirs) else None
            if other is not None and op == "recv":
                continue  # a matched pair is reported once, from the sender's side
            if other is not None and e.input_numel == other.output_numel:
                continue
            latest = indexes[peer].latest() if peer in indexes else None
            doing = (
                "no Flight Recorder dump"
                if peer not in indexes
                else _entry_text(latest)
                if latest
                else "recorded no op"
            )
            out.append(
                P2PMismatch(
                    group=g.name,
                    desc=g.desc,
                    kind=P2PKind.SIZES if other is not None else P2PKind.UNMATCHED,
                    op=op,
                    rank=me,
                    peer=peer,
                    numel=e.input_numel if op == "send" else e.output_numel,
                    peer_numel=other.output_numel if other is not None else None,
                    site=e.site,
                    peer_doing=doing,
                )
            )
    return out


def _entry_text(e: FREntry) -> str:
    seq = f"p2p #{e.p2p_seq_id}" if e.is_p2p else f"#{e.collective_seq_id}"
    text = f"{e.op} {seq} in {e.group_desc or e.group}{_at(e.site)}"
    if e.done:
        return f"nothing pending; last recorded {text} (completed)"
    return f"{text} ({'timed out' if e.timed_out else e.state})"


def _at(site: Site | None) -> str:
    return f" at {site.function} ({site.file}:{site.line})" if site else ""
