"""The NCCL watchdog log in words (pure): one line per timeout and dump signal, the notes on what the log
cannot tell, and, when nothing in it is split, the ``unexplained-wait`` finding that says which ranks timed
out where and what to collect next (``analysis.log_evidence``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from mtpdiag.analysis.findings.words import FR_HOW
from mtpdiag.model import Finding, UnexplainedWait, UnexplainedWaitDetails
from mtpdiag.model.watchdog import PGRef, WatchdogLog, WatchdogStatus, WatchdogTimeout
from mtpdiag.vocabulary.labels import rank_list
from mtpdiag.vocabulary.states import Source

UNNAMED = "unnamed"  # the group of a timeout whose lines name none
SHOW = 8  # ranks named before "…"
GROUPS_SHOWN = 3  # groups a summary names before "and N more"
NO_SEQ_NOTE = (
    "the log has no sequence numbers (torch before 1.10 printed none): ranks are compared by op type, and group "
    "where a line names one, and that is all the log allows: it cannot tell whether they timed out in the same "
    "collective"
)
NO_GLOBAL_NOTE = (
    "the log has no [rankN]: prefixes: ranks are the watchdog's own [Rank r], a rank in the timed-out work's group "
    "(the global rank only if that group is the world)"
)
NEXT_STEPS = (
    "the watchdog log cannot say which rank did not join: get {fr}; and each rank's stack while the job hangs "
    "(`mtpdiag collect` on every node, or `mtpdiag inspect --all`); the logs of ranks that logged no timeout "
    "say where those ranks were"
)


def lines(log: WatchdogLog) -> tuple[str, ...]:
    """Each timeout and dump signal in words, in the log's order."""
    said = [(t.line, _timeout_line(t)) for t in log.timeouts]
    said += [(s.line, _signal_line(s)) for s in log.statuses if s.signal_from is not None]
    return tuple(text for _, text in sorted(said, key=lambda item: item[0]))


def limits(log: WatchdogLog, global_ranks: bool) -> tuple[str, ...]:
    """What the log's form cannot tell: no sequence numbers, no global ranks."""
    notes = []
    if any(t.seq is None and t.op_type is not None for t in log.timeouts):  # a WorkNCCL line without SeqNum
        notes.append(NO_SEQ_NOTE)
    if any(t.seq is None and t.op_type is None and t.site is not None for t in log.timeouts):
        notes.append(
            "the stack torch logged of a failed collective comes with no timeout line here: its sequence number "
            "and group are not known"
        )
    if log.timeouts and not global_ranks:
        notes.append(NO_GLOBAL_NOTE)
    return tuple(notes)


def unnamed_differ(
    by_group: Mapping[tuple[str, int | None, str], Mapping[int, tuple[str | None, int | None]]],
) -> tuple[str, ...]:
    """Ranks that timed out at the same number in different ops, where the log names the group of only some of
    them: said, not called a split (the number may belong to two groups)."""
    by_seq: dict[int, dict[str, dict[str, list[int]]]] = {}
    for (name, seq, count), slots in by_group.items():
        if seq is None or count:
            continue
        for rank, (op, _) in slots.items():
            if op is not None:
                by_seq.setdefault(seq, {}).setdefault(op, {}).setdefault(name, []).append(rank)
    notes = []
    for seq, ops in sorted(by_seq.items()):
        names = {name for groups in ops.values() for name in groups}
        if len(ops) > 1 and UNNAMED in names and len(names) > 1:
            parts = [
                f"{_ranks(sorted(r for rs in groups.values() for r in rs))} in {op}"
                for op, groups in sorted(ops.items())
            ]
            notes.append(
                f"ranks timed out at #{seq} in different ops ({'; '.join(parts)}), but the log names the group of "
                "only some of them: not called a split"
            )
    return tuple(notes)


def unexplained(log: WatchdogLog, rank_of: Callable[[WatchdogTimeout], int | None]) -> tuple[Finding, ...]:
    """The log's account when nothing in it is split: who timed out at which number of which group (or who was
    signalled of whose timeout), and what to collect next. Never ``ok``: a timeout is a hang."""
    where: dict[tuple[str, int | None], _Where] = {}
    for t in log.timeouts:
        at = where.setdefault((_group(t.group), t.seq), _Where())
        at.add(rank_of(t), t)
    parts = [at.says(group, seq) for (group, seq), at in where.items()]
    signals = [s for s in log.statuses if s.signal_from is not None]
    stuck = [s for s in log.statuses if s.stuck_s is not None]
    if not parts and not signals and not stuck:
        return ()
    more = f"; and {len(parts) - GROUPS_SHOWN} more" if len(parts) > GROUPS_SHOWN else ""
    if parts:
        summary = (
            f"the NCCL watchdog log shows timeouts but no split it can prove: {'; '.join(parts[:GROUPS_SHOWN])}{more}"
        )
    elif signals:
        summary = f"the NCCL watchdog log holds dump signals only: {_signals_part(signals)}"
    else:
        summary = f"the NCCL watchdog log names no collective: {_stuck_part(stuck)}"
    remedy = NEXT_STEPS.format(fr=FR_HOW)
    if stuck and not parts:
        remedy = f"{STUCK_STEP}; {remedy}"
    timed_out = sorted({r for at in where.values() for r in at.ranks})
    ranks = sorted(
        set(timed_out)
        | {s.signal_rank for s in signals if s.signal_rank is not None}
        | {r for s in stuck if (r := s.rank if s.rank is not None else s.group.rank) is not None}
    )
    return (
        UnexplainedWait(
            ranks=tuple(ranks),
            summary=summary,
            remedy=remedy,
            details=UnexplainedWaitDetails(source=Source.WATCHDOG_LOG, timed_out=tuple(timed_out)),
        ),
    )


class _Where:
    """The timeouts of one group at one number: who, in which ops, and the group's progress."""

    def __init__(self) -> None:
        self.ranks: dict[int, None] = {}
        self.ops: dict[str, None] = {}
        self.unlogged_op = self.unnamed = 0
        self.completed: int | None = None
        self.enqueued: int | None = None
        self.sites: dict[str, None] = {}

    def add(self, rank: int | None, t: WatchdogTimeout) -> None:
        if rank is None:
            self.unnamed += 1
        else:
            self.ranks[rank] = None
        if t.op is None:
            self.unlogged_op += 1
        else:
            self.ops[t.op] = None
        if t.site is not None:
            self.sites[t.site] = None
        self.completed = t.last_completed if self.completed is None else self.completed
        self.enqueued = t.last_enqueued if self.enqueued is None else self.enqueued

    def says(self, group: str, seq: int | None) -> str:
        ops = ", ".join(self.ops) or "op not logged"
        said = [f"{ops} where logged" if self.ops and self.unlogged_op else ops]
        said += [f"last completed {self.completed}"] if self.completed is not None else []
        said += [f"last enqueued {self.enqueued}"] if self.enqueued is not None else []
        who = [_ranks(sorted(self.ranks), "rank")] if self.ranks else []
        who += [f"{self.unnamed} line{'s' if self.unnamed > 1 else ''} naming no rank"] if self.unnamed else []
        at = f" at #{seq}" if seq is not None else ""
        called = f", called from {'; '.join(self.sites)} (the stack torch logged)" if self.sites else ""
        return f"{' and '.join(who)} timed out{at} in {group} ({', '.join(said)}){called}"


STUCK_STEP = (
    "see what the stuck rank's threads wait on, its watchdog thread's CUDA or NCCL call and the thread that holds "
    "the GIL: `mtpdiag inspect --native` on its node (py-spy dump --native --pid <pid>)"
)


def _stuck_part(stuck: list[WatchdogStatus]) -> str:
    """``rank 2's watchdog thread was stuck for 480 s ...``: the heartbeat monitor's word, per rank."""
    by_rank: dict[int | None, int] = {}
    for s in stuck:
        who = s.rank if s.rank is not None else s.group.rank
        by_rank[who] = max(by_rank.get(who, 0), s.stuck_s or 0)
    named = [f"rank {r}" for r in by_rank if r is not None] + ["a rank the log does not name"] * (None in by_rank)
    seconds = max(by_rank.values())
    return (
        f"the NCCL watchdog thread of {', '.join(named)} was stuck for up to {seconds} s without checking its "
        "collectives (the heartbeat monitor's line): a CUDA or NCCL call hangs in that thread, or another thread "
        "holds the GIL inside one"
    )


def _signals_part(signals: list[WatchdogStatus]) -> str:
    told: dict[int | None, list[int]] = {}
    for s in signals:
        if s.rank is not None:
            told.setdefault(s.signal_rank, []).append(s.rank)
    parts = []
    for source, ranks in told.items():
        heard = sorted(set(ranks) - {source}) if source is not None else sorted(set(ranks))
        timed = f"rank {source} timed out" if source is not None else "a rank timed out"
        parts.append(f"{timed}{f' (rank {_ranks(heard)} told)' if heard else ''}")
    idle = sorted({s.rank for s in signals if s.rank is not None and s.last_enqueued == s.last_completed})
    if idle:
        parts.append(
            f"{_ranks(idle, 'rank')} had completed every work {'it' if len(idle) == 1 else 'they'} enqueued in the "
            "group it logs for: it is not in that group's pending collective"
        )
    return "; ".join(parts) or "no rank named"


def _timeout_line(t: WatchdogTimeout) -> str:
    who = (
        f"rank {t.rank}"
        if t.rank is not None
        else f"[Rank {t.group.rank}] (no global rank on the line)"
        if t.group.rank is not None
        else "a rank the log does not name"
    )
    what = t.op or "a collective (op not logged)"
    at = f" #{t.seq}" if t.seq is not None else " (no SeqNum)"
    ran = f" after {t.ran_for_ms} ms" if t.ran_for_ms is not None else ""
    wait = " in a blocking wait" if t.blocking_wait else ""
    said = [f"NumelIn={t.numel_in}"] if t.numel_in is not None else []
    said += [f"last enqueued {t.last_enqueued}"] if t.last_enqueued is not None else []
    said += [f"last completed {t.last_completed}"] if t.last_completed is not None else []
    rest = f" ({'; '.join(said)})" if said else ""
    called = f", called from {t.site}" if t.site is not None else ""
    return f"{who}: {what}{at} in {_group(t.group)} timed out{ran}{wait}{rest}{called}"


def _signal_line(s: WatchdogStatus) -> str:
    who = f"rank {s.rank}" if s.rank is not None else f"[Rank {s.group.rank}]"
    source = f"rank {s.signal_rank}" if s.signal_rank is not None else (s.signal_from or "?")
    pending = " (nothing pending)" if s.last_enqueued is not None and s.last_enqueued == s.last_completed else ""
    return (
        f"{who} ({_group(s.group)}): dump signal, {source} timed out; last enqueued {s.last_enqueued}, last "
        f"completed {s.last_completed}{pending}"
    )


def _group(g: PGRef) -> str:
    if g.desc:
        return g.desc
    return f"PG {g.name}" if g.name is not None else "a group the line does not name"


def _ranks(ranks: list[int], word: str = "") -> str:
    plural = f"{word}s " if word and len(ranks) != 1 else (f"{word} " if word else "")
    return plural + rank_list(ranks, SHOW, more=", … ({n})")
