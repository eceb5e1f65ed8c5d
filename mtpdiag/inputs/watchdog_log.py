"""NCCL watchdog lines of a job's log, read into ``model.watchdog`` records (``analyze --log FILE``).

When a collective times out, ProcessGroupNCCL logs (every form torch has printed, 1.x to 2.13, behind any
log prefix: glog's, torch's ``[rankN]:``, torchrun's ``[default0]:``, srun's ``11:``, pdsh's ``host:``, Ray's
``(WorkerDict pid=…)``, timestamps, line numbers, a progress bar left on the line):

* the timeout, ``[Rank R] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE,
  NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600012 milliseconds before timing out.``
  (``WorkNCCL::checkTimeout``), repeated in the watchdog's exception and its ``what():``. torch 1.x printed
  ``WorkNCCL(OpType=ALLREDUCE, TensorShape=[8], Timeout(ms)=1800000)`` (no ``SeqNum`` before 1.10, no
  ``Numel*`` before 2.2); a blocking wait says ``Work WorkNCCL(...) timed out in blocking wait`` (1.7: ``Caught
  collective operation timeout for work: WorkNCCL(...)``). R is a group rank: torch prints the first group's;
* the group's progress, with the group's log prefix ``[PG ID 2 PG GUID 3(DATA_PARALLEL_GROUP_WITH_CP) Rank 1]``
  (2.5+; 2.4: ``[PG 3 (DATA_PARALLEL_GROUP_WITH_CP) Rank 1]``; 2.3: ``[PG 3 Rank 1]``): ``failure detected by
  watchdog at work sequence id: 2 PG status: last enqueued work: 2, last completed work: 1`` (2.5+, often with
  no ``WorkNCCL`` line), ``Exception (either an error or timeout) detected by watchdog at work: 2, last enqueued
  NCCL work: 2, last completed NCCL work: 1.`` and ``Timeout at NCCL work: 2, ...`` (2.3, 2.4; one per group),
  and the heartbeat monitor's ``Received a dump signal due to a collective timeout from rank 3 and we will try
  our best to dump the debug info. Last enqueued NCCL work: 2, last completed NCCL work: 1.`` (2.3: ``Received a
  timeout signal from this local rank and will start to dump the debug info``), and its ``ProcessGroupNCCL's
  watchdog got stuck for 480 seconds without making progress in monitoring enqueued collectives`` (``stuck_s``);
* with ``TORCH_NCCL_DESYNC_DEBUG=1``, the desync report: ``[0, 2] joined but didn't finish collective #5``,
  ``[1] finished collective #5, but didn't join collective #6``, ``ranks [3] are the lagging ranks``
  (group ranks).

With the Flight Recorder on (torch 2.7+), the watchdog also prints the Python stack of the collective that
failed, ``Stack trace of the failed collective:`` then ``#0 broadcast from .../distributed_c10d.py:2968``, ``#1
...`` (innermost first): its op and first frame outside torch are the timeout's ``site``, on the rank's failure
when the log has one, else as a failure of its own (a paste of the block alone still names where it failed).

Wrapped lines are joined first (``inputs.watchdog_lines``). The global rank comes from torch's ``[rankN]:``
prefix when the log has it. Lines that match nothing are skipped.
"""

from __future__ import annotations

import re

from mtpdiag.errors import InputError
from mtpdiag.inputs.watchdog_lines import MAX_LINE, logical_lines
from mtpdiag.inputs.watchdog_stacks import FailedStack, with_stacks
from mtpdiag.model import replace
from mtpdiag.model.watchdog import DesyncReport, PGRef, WatchdogLog, WatchdogStatus, WatchdogTimeout
from mtpdiag.vocabulary.ops import WORK_OP_TYPES, WORK_TIMEOUT_PHRASES

__all__ = ["MAX_LINE", "MAX_LOG_BYTES", "load_watchdog_log", "load_watchdog_logs", "parse_watchdog_log"]

MAX_LOG_BYTES = 512 * 1024 * 1024
_N = r"-?\d{1,20}"  # torch prints an unknown numel as 2**64 - 1
_GLOBAL = re.compile(r"\[rank(\d{1,9})\]:")
_THREAD = re.compile(r"\[[EWIF]\d{4} [\d:.]{8,24} (\d{1,12}) ")  # glog: [E1130 17:44:26.121021000 3117 file:line]
_PG_ID = re.compile(
    r"\[PG\s*ID\s*(\d{1,9})\s*PG\s*GUID\s*([^\s()\[\]]{1,200}?)\s*(?:\(([^()\[\]]{0,200})\))?\s*Rank\s*(\d{1,9})\]"
)
_PG_OLD = re.compile(r"\[PG\s*([^\s()\[\]]{1,200}?)\s*(?:\(([^()\[\]]{0,200})\))?\s*Rank\s*(\d{1,9})\]")
_RANK = re.compile(r"\[Rank\s*(\d{1,9})\]")
_WORK = re.compile(r"WorkNCCL\((?P<work>(?:[^()]|\(ms\)){0,400})\)?")
_TIMEOUT_BEFORE = re.compile("|".join(WORK_TIMEOUT_PHRASES))
_RAN_FOR = re.compile(r"\)\s*ran\s*for\s*(\d{1,19})")
_BLOCKING = re.compile(r"timed\s*out\s*in\s*blocking\s*wait")
_FIELD = {
    "seq": re.compile(r"SeqNum=(\d{1,19})"),
    "op": re.compile(r"OpType=([A-Za-z_]{1,64})"),
    "numel_in": re.compile(rf"NumelIn=({_N})"),
    "numel_out": re.compile(rf"NumelOut=({_N})"),
    "timeout_ms": re.compile(r"Timeout\(ms\)=(\d{1,19})"),
}
_SHAPE = re.compile(r"TensorShape=(\[[\d, ]{0,200}\])")
_FAILED_AT = re.compile(
    r"(?:at\s*work\s*sequence\s*id:|detected\s*by\s*watchdog\s*at\s*work:|Timeout\s*at\s*NCCL\s*work:)\s*(\d{1,19})"
)
_ENQUEUED = re.compile(rf"ast\s*enqueued\s*(?:NCCL\s*)?work:\s*({_N})")  # "Last" in a dump signal
_STARTED = re.compile(rf"ast\s*started\s*(?:NCCL\s*)?work:\s*({_N})")
_COMPLETED = re.compile(rf"ast\s*completed\s*(?:NCCL\s*)?work:\s*({_N})")
_SIGNAL = re.compile(
    r"Received\s*a\s*(?:dump|timeout)\s*signal\s*(?:due\s*to\s*a\s*collective\s*timeout\s*)?from\s*(.{1,80}?)"
    r"\s*and\s*(?:we|will)"
)
_SIGNAL_RANK = re.compile(r"rank\s*(\d{1,9})")
_JOINED = re.compile(r"\[([\d, ]{0,4000})\] joined but didn't finish collective #(\d{1,19})")
_FINISHED = re.compile(r"\[([\d, ]{0,4000})\] finished collective #(\d{1,19}), but didn't join")
_LAGGING = re.compile(r"ranks \[([\d, ]{0,4000})\] are the lagging ranks")
_STUCK = re.compile(r"watchdog\s*got\s*stuck\s*for\s*(\d{1,12})\s*seconds")
_ECHO_WORDS = ("exception", "what()", "blocking")
_ECHO = re.compile(r"exception:|what\(\):|timed\s*out\s*in\s*blocking\s*wait")
_WORLD_NAMES = ("0", "default_pg")  # the default group's name (GUID) and description: group rank = global rank


def parse_watchdog_log(text: str) -> WatchdogLog:
    """The watchdog records of a log's text (pure)."""
    timeouts = _Timeouts()
    statuses: list[WatchdogStatus] = []
    desync: list[DesyncReport] = []
    stacks: list[FailedStack] = []
    for number, line in logical_lines(text):
        if stacks and stacks[-1].takes(line):
            continue
        if "failed" in line and (stack := FailedStack.start(line, number, _global(line))) is not None:
            stacks.append(stack)
            continue
        if "WorkNCCL(" in line:
            t = _timeout(line, number)
            if t is not None:
                said = (line[: line.find("WorkNCCL(")], t.seq, t.op_type, t.numel_in, t.numel_out, t.ran_for_ms)
                echo = any(word in line for word in _ECHO_WORDS) and _ECHO.search(line) is not None
                timeouts.keep(t, echo=echo, said=said)
                continue
        if "nqueued" in line:
            statuses.append(_status(line, number))
        elif "collective #" in line or "lagging ranks" in line:
            d = _desync(line, number)
            if d is not None:
                desync.append(d)
    claimed: set[int] = set()
    by_work: dict[tuple[int | None, int | None], list[WatchdogStatus]] = {}
    for s in statuses:
        by_work.setdefault((s.rank, s.failed_seq), []).append(s)
    joined = [_join(t, by_work.get((t.rank, t.seq), []), claimed) for t in timeouts.found]
    failures = _failures(statuses, claimed, joined)
    found = with_stacks(sorted((*joined, *failures), key=lambda t: t.line), stacks)
    return WatchdogLog(timeouts=found, statuses=tuple(statuses), desync=tuple(desync), notes=_conflicts(found))


def load_watchdog_log(path: str) -> WatchdogLog:
    """``parse_watchdog_log`` of a file (bounded; undecodable bytes replaced)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_LOG_BYTES + 1)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_LOG_BYTES:
        raise InputError(f"{path}: larger than {MAX_LOG_BYTES // (1024 * 1024)} MiB; pass the part around the hang")
    return parse_watchdog_log(data.decode("utf-8", "replace"))


def load_watchdog_logs(paths: list[str]) -> WatchdogLog:
    """The watchdog lines of every log, as one ``WatchdogLog`` (a one-line InputError for an unreadable file,
    and for logs that hold no watchdog line at all: a wrong file should not pass for "no timeout")."""
    logs = [load_watchdog_log(p) for p in paths]
    if not any(log.timeouts or log.statuses or log.desync for log in logs):
        raise InputError(
            f'no NCCL watchdog line ("Watchdog caught collective operation timeout", "failure detected by '
            f'watchdog", "last enqueued NCCL work") in {", ".join(paths)}'
        )
    return WatchdogLog(
        timeouts=tuple(t for log in logs for t in log.timeouts),
        statuses=tuple(s for log in logs for s in log.statuses),
        desync=tuple(d for log in logs for d in log.desync),
        notes=tuple(n for log in logs for n in log.notes),
    )


# A work: (seq, op_type, numel_in, numel_out, work_rank).
_Work = tuple[int | None, str | None, int | None, int | None, int | None]
# A timeout line as said: (its text before ``WorkNCCL(``, seq, op_type, numel_in, numel_out, ran_for_ms).
_Said = tuple[str, int | None, str | None, int | None, int | None, int | None]


class _Timeouts:
    """The timeouts read so far, in line order. torch logs a timeout up to three times: the watchdog's line,
    the exception it throws (``watchdog thread terminated with exception: …``) and that exception's ``what():``
    (no ``[rankN]:`` prefix), and a blocking wait logs its own view of the same work: such an echo is merged
    into the last timeout of the same work (same rank where it has one, same group where both name one). Two
    watchdog lines are merged only when they are the same text twice (prefix and timestamp included, up to the
    running time): the same work number in two groups is two works."""

    def __init__(self) -> None:
        self.found: list[WatchdogTimeout] = []
        # (work, rank) and (work, None) -> indices, in line order
        self._by_work: dict[tuple[_Work, int | None], list[int]] = {}
        self._lines: set[_Said] = set()

    def keep(self, t: WatchdogTimeout, echo: bool, said: _Said) -> None:
        work = (t.seq, t.op_type, t.numel_in, t.numel_out, t.work_rank)
        if echo:
            for index in reversed(self._by_work.get((work, t.rank), ())):
                first = self.found[index]
                if t.group.name is None or first.group.name in (None, t.group.name):
                    self.found[index] = _echoed(first, t)
                    return
        else:
            if said in self._lines:  # the same line printed twice (up to its running time), not another work
                return
            self._lines.add(said)
        index = len(self.found)
        self._by_work.setdefault((work, t.rank), []).append(index)
        if t.rank is not None:
            self._by_work.setdefault((work, None), []).append(index)
        self.found.append(t)


def _echoed(first: WatchdogTimeout, echo: WatchdogTimeout) -> WatchdogTimeout:
    """A timeout with what its echo adds: the group the exception's prefix names (its rank outranks the
    ``[Rank r]``), and whether a blocking wait saw it too."""
    if first.group.name is not None:
        merged = _merge_group(first, echo.group)
    else:
        merged = replace(first, group=_merge(echo.group, first.group))
    return replace(merged, blocking_wait=first.blocking_wait or echo.blocking_wait)


def _timeout(line: str, number: int) -> WatchdogTimeout | None:
    m = _WORK.search(line)
    if m is None:
        return None
    before = line[: m.start()]
    said = _TIMEOUT_BEFORE.search(before)
    blocking = _BLOCKING.search(line, m.end()) is not None
    if said is None and not blocking:
        return None
    work = m.group("work")
    values = {k: (hit.group(1) if (hit := r.search(work)) else None) for k, r in _FIELD.items()}
    if values["seq"] is None and values["op"] is None:
        return None
    op_type = values["op"]
    ran = _RAN_FOR.search(line, m.end() - 1)
    work_rank = _last(_RANK, before[: said.start()] if said else before)
    shape = _SHAPE.search(work)
    return WatchdogTimeout(
        line=number,
        rank=_global(line),
        group=_group(before, work_rank),
        seq=_opt(values["seq"]),
        op_type=op_type,
        op=WORK_OP_TYPES.get(op_type, op_type.lower().lstrip("_")) if op_type else None,
        numel_in=_opt(values["numel_in"]),
        numel_out=_opt(values["numel_out"]),
        timeout_ms=_opt(values["timeout_ms"]),
        ran_for_ms=int(ran.group(1)) if ran else None,
        blocking_wait=blocking,
        thread=_first(_THREAD, line),
        work_rank=work_rank,
        tensor_shape=shape.group(1) if shape else None,
    )


def _status(line: str, number: int) -> WatchdogStatus:
    failed = _FAILED_AT.search(line)
    signal = _SIGNAL.search(line) if "eceived" in line else None
    rank = _global(line)
    said = signal.group(1).strip() if signal else None
    named = _SIGNAL_RANK.search(said) if said and "local" not in said else None
    return WatchdogStatus(
        line=number,
        rank=rank,
        group=_group(line, _last(_RANK, line[: failed.start()] if failed else line)),
        failed_seq=int(failed.group(1)) if failed else None,
        last_enqueued=_first(_ENQUEUED, line),
        last_started=_first(_STARTED, line) if "tarted" in line else None,
        last_completed=_first(_COMPLETED, line),
        signal_from=said,
        thread=_first(_THREAD, line),
        signal_rank=int(named.group(1)) if named else (rank if said else None),
        stuck_s=_first(_STUCK, line) if "stuck" in line else None,
    )


def _desync(line: str, number: int) -> DesyncReport | None:
    joined, finished, lagging = _JOINED.search(line), _FINISHED.search(line), _LAGGING.search(line)
    if not (joined or finished or lagging):
        return None
    seq = joined or finished
    return DesyncReport(
        line=number,
        rank=_global(line),
        seq=int(seq.group(2)) if seq else None,
        joined_not_finished=_ranks(joined.group(1)) if joined else (),
        finished_not_joined=_ranks(finished.group(1)) if finished else (),
        never_joined=_ranks(lagging.group(1)) if lagging else (),
    )


def _join(t: WatchdogTimeout, statuses: list[WatchdogStatus], claimed: set[int]) -> WatchdogTimeout:
    """The timeout with its group's status line (``statuses``: those of its rank about its work number): the
    nearest line of the same rank about the same work
    (a later one first), not taken by another timeout, and of the same group where both name one. Each group's
    watchdog logs the two back to back; other groups' lines may come between, so the same glog thread id and
    the same group rank are preferred (torch's "[Rank r]" on the timeout line is only a hint: it is the group
    rank of the first work that logged in the process). Without a sequence number nothing is joined."""
    if t.seq is None:
        return t
    candidates = [
        s
        for s in statuses
        if s.line not in claimed
        and (t.group.name is None or s.group.name in (None, t.group.name))
        and (t.rank is not None or s.group.rank in (None, t.group.rank))
    ]
    if not candidates:
        return t
    s = min(
        candidates,
        key=lambda s: (s.thread != t.thread, s.group.rank != t.group.rank, s.line < t.line, abs(s.line - t.line)),
    )
    claimed.update(c.line for c in candidates if c.group == s.group)  # 2.3/2.4 log two lines per failure
    named = s.group if s.group.name is not None else PGRef()  # a named group's rank outranks the "[Rank r]"
    return replace(
        _merge_group(replace(t, group=_merge(named, t.group)), s.group),
        last_enqueued=s.last_enqueued,
        last_started=s.last_started,
        last_completed=s.last_completed,
    )


def _failures(
    statuses: list[WatchdogStatus], claimed: set[int], timeouts: list[WatchdogTimeout]
) -> list[WatchdogTimeout]:
    """The failures only a group's status line reports (``failure detected by watchdog at work sequence id``,
    ``Timeout at NCCL work``): a timeout whose op the log does not name, once per rank, group and work."""
    seen = {(t.rank if t.rank is not None else t.group.rank, t.group.name, t.seq) for t in timeouts}
    seen |= {(t.rank if t.rank is not None else t.group.rank, None, t.seq) for t in timeouts}
    out = []
    for s in statuses:
        if s.failed_seq is None or s.line in claimed:
            continue
        who = s.rank if s.rank is not None else s.group.rank
        key = (who, s.group.name, s.failed_seq)
        if key in seen:
            continue
        seen.add(key)
        out.append(
            WatchdogTimeout(
                line=s.line,
                rank=s.rank,
                group=s.group,
                seq=s.failed_seq,
                op_type=None,
                op=None,
                numel_in=None,
                numel_out=None,
                timeout_ms=None,
                ran_for_ms=None,
                thread=s.thread,
                last_enqueued=s.last_enqueued,
                last_started=s.last_started,
                last_completed=s.last_completed,
            )
        )
    return out


def _conflicts(timeouts: tuple[WatchdogTimeout, ...]) -> tuple[str, ...]:
    """Where the log's lines give a timeout two ranks: both, in one note per kind (the first few named), and
    why neither is taken on trust."""
    work, world = [], []
    for t in timeouts:
        g, who = t.group, f"rank {t.rank}" if t.rank is not None else "a line without [rankN]:"
        at = f"#{t.seq}" if t.seq is not None else "(no SeqNum)"
        if t.work_rank is not None and g.rank is not None and g.name is not None and t.work_rank != g.rank:
            work.append(f"{who} at {at}: [Rank {t.work_rank}] on the timeout, Rank {g.rank} in {g.desc or g.name}")
        if (g.name in _WORLD_NAMES or g.desc == "default_pg") and t.rank is not None and g.rank not in (None, t.rank):
            world.append(f"[rank{t.rank}] printed Rank {g.rank} of the default group at {at}")
    notes = []
    if work:
        notes.append(
            f"the timeout line's rank and its group's line disagree for {len(work)} timeout"
            f"{'s' if len(work) > 1 else ''} ({'; '.join(work[:3])}{'; …' if len(work) > 3 else ''}): both are "
            "reported (torch prints one group's rank on every timeout line of a process), neither is trusted"
        )
    if world:
        notes.append(
            f"a line's global rank and its default-group rank disagree ({'; '.join(world[:3])}"
            f"{'; …' if len(world) > 3 else ''}): both are reported, neither is trusted"
        )
    return tuple(notes)


def _merge_group(t: WatchdogTimeout, g: PGRef) -> WatchdogTimeout:
    return replace(t, group=_merge(t.group, g))


def _merge(old: PGRef, g: PGRef) -> PGRef:
    return PGRef(
        pg_id=old.pg_id if old.pg_id is not None else g.pg_id,
        name=old.name if old.name is not None else g.name,
        desc=old.desc if old.desc is not None else g.desc,
        rank=old.rank if old.rank is not None else g.rank,
    )


def _group(text: str, work_rank: int | None) -> PGRef:
    m = _PG_ID.search(text)
    if m:
        return PGRef(pg_id=int(m.group(1)), name=m.group(2), desc=m.group(3) or None, rank=int(m.group(4)))
    m = _PG_OLD.search(text)
    if m:
        return PGRef(name=m.group(1), desc=m.group(2) or None, rank=int(m.group(3)))
    return PGRef(rank=work_rank) if work_rank is not None else PGRef()


def _global(line: str) -> int | None:
    m = _GLOBAL.search(line)
    return int(m.group(1)) if m else None


def _first(regex: re.Pattern[str], line: str) -> int | None:
    m = regex.search(line)
    return int(m.group(1)) if m else None


def _last(regex: re.Pattern[str], text: str) -> int | None:
    hits = regex.findall(text)
    return int(hits[-1]) if hits else None


def _opt(value: str | None) -> int | None:
    return int(value) if value is not None else None


def _ranks(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d{1,9}", text))
