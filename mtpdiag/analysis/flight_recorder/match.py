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
    signature,
    size_key,
)
from mtpdiag.model import Mismatch, Site
from mtpdiag.model.flight_recorder import FRDump, FREntry, FRRankDump
from mtpdiag.vocabulary.groups import MEGATRON_GROUP_KINDS
from mtpdiag.vocabulary.states import Role

MISSING, OP_TYPE, SIZES, DTYPES = "missing_ranks", "op_type", "sizes", "dtypes"

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
            ranks, source = configured[name], "pg_config"
        elif members is not None and name in members:
            ranks, source = tuple(sorted(set(members[name]))), "given"
        else:
            ranks, source = tuple(sorted(r for r, by_group in calls.items() if name in by_group)), "entries"
        groups.append(_match_group(name, used[name], ranks, source, fr, calls, indexes))
    p2p = tuple(m for g in groups for m in _match_p2p(g, calls, indexes))
    return FRAnalysis(groups=tuple(groups), p2p=p2p, notes=tuple(notes))


def mismatches(analysis: FRAnalysis) -> tuple[Mismatch, ...]:
    """Every split of every divergence as mtpdiag's ``Mismatch`` (gate left to the layout's analysis)."""
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
                    role=Role.CONSEQUENCE if c.role == "consequence" else Role.ROOT,
                )
            )
    return tuple(out)


# ---------------------------------------------------------------- one group


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


def _match_group(
    name: str, desc: str, members: tuple[int, ...], source: str, fr: FRDump, calls: Calls, indexes: Indexes
) -> GroupMatch:
    seqs: dict[int, dict[int, Call]] = {}
    entered: dict[int, int] = {}
    completed: dict[int, int] = {}
    no_dump = tuple(r for r in members if fr.rank(r) is None)
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
    divergence, stuck = None, None
    dumped = [r for r in members if r in seqs]
    if dumped:
        firsts = [min(seqs[r]) for r in dumped if seqs[r]]
        lo = max(firsts) if firsts else 1
        # only numbers some member recorded: a counter from pg_status may be anything
        for k in sorted({k for r in dumped for k in seqs[r] if k >= max(lo, 1)}):
            here = {r: seqs[r][k] for r in dumped if k in seqs[r]}
            missing = tuple(r for r in dumped if k not in seqs[r] and entered[r] < k)
            problems = _problems(here, missing)
            if problems:
                divergence = _divergence(
                    name,
                    desc,
                    members,
                    source,
                    k,
                    problems,
                    here,
                    missing,
                    no_dump,
                    seqs,
                    entered,
                    completed,
                    calls,
                    indexes,
                )
                break
            if stuck is None and any(not c.done for c in here.values()):
                stuck = k
    return GroupMatch(
        name=name,
        desc=desc,
        kind=MEGATRON_GROUP_KINDS.get(desc),
        members=members,
        members_from=source,
        last_entered=entered,
        last_completed=completed,
        no_dump=no_dump,
        divergence=divergence,
        stuck=stuck if divergence is None else None,
    )


def _problems(here: Mapping[int, Call], missing: tuple[int, ...]) -> tuple[str, ...]:
    out = []
    if missing:
        out.append(MISSING)
    by_op: dict[str, list[Call]] = {}
    for c in here.values():
        by_op.setdefault(c.op, []).append(c)
    if len(by_op) > 1:
        out.append(OP_TYPE)
    if any(len({size_key(c) for c in cs}) > 1 for cs in by_op.values()):
        out.append(SIZES)
    if any(len({(c.input_dtypes, c.output_dtypes) for c in cs}) > 1 for cs in by_op.values()):
        out.append(DTYPES)
    return tuple(out)


def _divergence(
    name: str,
    desc: str,
    members: tuple[int, ...],
    source: str,
    k: int,
    problems: tuple[str, ...],
    here: Mapping[int, Call],
    missing: tuple[int, ...],
    no_dump: tuple[int, ...],
    seqs: Seqs,
    entered: Mapping[int, int],
    completed: Mapping[int, int],
    calls: Calls,
    indexes: Indexes,
) -> Divergence:
    ranks = tuple(_rank_at(r, k, here, seqs, entered, completed, indexes) for r in members)
    keys: dict[tuple[str, Site | None], list[int]] = {}
    for r, c in sorted(here.items()):
        keys.setdefault((c.op, c.site), []).append(r)
    splits = []
    for (op, site), who in sorted(keys.items(), key=lambda kv: (-len(kv[1]), kv[1][0])):
        call = here[who[0]]
        absent = tuple(r for r in members if r not in who)
        doing = {a: _doing(a, k, here, ranks) for a in absent}
        why = {}
        for a in absent:
            if a in indexes:
                later = tuple(c for c in calls[a].get(name, ()) if not c.p2p and c.seq > k)
                why[a] = absent_why([(indexes[r], here[r]) for r in who], indexes[a], later, here.get(a))
        splits.append(
            FRCallSplit(
                op=op,
                profiling_name=call.profiling_name,
                site=site,
                entered=tuple(who),
                absent=absent,
                absent_doing=doing,
                why=why,
                role=_role(absent, why),
            )
        )
    counts: dict[Signature, list[int]] = {}
    for r, c in sorted(here.items()):
        counts.setdefault(signature(c), []).append(r)
    reference = sorted(counts.values(), key=lambda rs: (-len(rs), rs[0]))[0][0]
    return Divergence(
        group=name,
        desc=desc,
        kind=MEGATRON_GROUP_KINDS.get(desc),
        members=members,
        members_from=source,
        seq=k,
        problems=problems,
        calls=tuple(splits),
        ranks=ranks,
        missing=missing,
        no_dump=no_dump,
        reference=reference,
        culprits=culprits(ranks, missing, reference),
    )


def _role(absent: tuple[int, ...], why: Mapping[int, AbsentWhy]) -> str:
    if not absent:
        return "root"  # every member entered: the call itself is wrong (sizes, dtypes)
    verdicts = [w.verdict for w in why.values()]
    if SKIPPED in verdicts:
        return "root"
    if verdicts and all(v in (SHIFTED, BEHIND) for v in verdicts):
        return "consequence"
    return "unknown"


def _rank_at(
    r: int,
    k: int,
    here: Mapping[int, Call],
    seqs: Seqs,
    entered: Mapping[int, int],
    completed: Mapping[int, int],
    indexes: Indexes,
) -> RankAt:
    if r not in indexes:
        return RankAt(
            rank=r, call=None, state="no dump", last_entered=0, last_completed=0, doing="no Flight Recorder dump"
        )
    call = here.get(r)
    if call is not None:
        state = "timed out" if call.timed_out else call.state
    else:
        state = "not reached" if entered.get(r, 0) < k else "not recorded"
    latest = indexes[r].latest()
    return RankAt(
        rank=r,
        call=call,
        state=state,
        last_entered=entered.get(r, 0),
        last_completed=completed.get(r, 0),
        doing=_entry_text(latest) if latest else "recorded no op",
    )


def _doing(a: int, k: int, here: Mapping[int, Call], ranks: tuple[RankAt, ...]) -> str:
    at = next(r for r in ranks if r.rank == a)
    if at.state == "no dump":
        return at.doing
    if a in here:
        c = here[a]
        return f"{c.op} #{k}{_at(c.site)}"
    return f"reached only #{at.last_entered} here; {at.doing}"


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
                    kind="sizes" if other is not None else "unmatched",
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
