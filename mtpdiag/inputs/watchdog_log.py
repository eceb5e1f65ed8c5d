"""NCCL watchdog lines of a job's log, read into ``model.watchdog`` records (``analyze --log FILE``).

When a collective times out, ProcessGroupNCCL logs (formats of torch 2.3 to 2.13, any log prefix):

* the timeout, ``[Rank R] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2,
  OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600012 milliseconds before timing
  out.`` (``WorkNCCL::checkTimeout``; R is the rank in the group), repeated in the watchdog's exception;
* the group's progress, with the group's log prefix ``[PG ID 2 PG GUID 3(DATA_PARALLEL_GROUP_WITH_CP)
  Rank 1]`` (2.5+; 2.4: ``[PG 3 (DATA_PARALLEL_GROUP_WITH_CP) Rank 1]``): ``failure detected by watchdog at
  work sequence id: 2 PG status: last enqueued work: 2, last completed work: 1`` (2.5+), ``Exception (either
  an error or timeout) detected by watchdog at work: 2, last enqueued NCCL work: 2, last completed NCCL
  work: 1.`` or ``Timeout at NCCL work: 2, ...`` (2.3, 2.4), and, from the heartbeat monitor,
  ``Received a dump signal due to a collective timeout from rank 3 and we will try our best to dump the
  debug info. Last enqueued NCCL work: 2, last completed NCCL work: 1.``;
* with ``TORCH_NCCL_DESYNC_DEBUG=1``, the desync report: ``[0, 2] joined but didn't finish collective #5``,
  ``[1] finished collective #5, but didn't join collective #6``, ``ranks [3] are the lagging ranks``
  (group ranks).

The global rank comes from torch's ``[rankN]:`` line prefix when the log has it. Lines that match
nothing are skipped; a line is read up to ``MAX_LINE`` characters.
"""

from __future__ import annotations

import re

from mtpdiag.errors import InputError
from mtpdiag.model import replace
from mtpdiag.model.watchdog import DesyncReport, PGRef, WatchdogLog, WatchdogStatus, WatchdogTimeout
from mtpdiag.vocabulary.ops import WORK_OP_TYPES

MAX_LINE = 65536
MAX_LOG_BYTES = 512 * 1024 * 1024
_N = r"-?\d{1,19}"
_GLOBAL = re.compile(r"\[rank(\d{1,9})\]:")
_THREAD = re.compile(r"\[[EWIF]\d{4} [\d:.]{8,24} (\d{1,12}) ")  # glog: [E1130 17:44:26.121021000 3117 file:line]
_PG_ID = re.compile(r"\[PG ID (\d{1,9}) PG GUID ([^\s()\[\]]+)(?:\(([^()\[\]]*)\))? Rank (\d{1,9})\]")
_PG_OLD = re.compile(r"\[PG ([^\s()\[\]]+)(?: \(([^()\[\]]*)\))? Rank (\d{1,9})\]")
_RANK = re.compile(r"\[Rank (\d{1,9})\]")
_TIMEOUT = re.compile(
    r"(?:Watchdog caught collective operation timeout: |Work )WorkNCCL\((?P<work>.{0,400}?)\)"
    r"(?: ran for (?P<ran>\d{1,19}) milliseconds| timed out in blocking wait)"
)
_FIELD = {
    "seq": re.compile(r"SeqNum=(\d{1,19})"),
    "op": re.compile(r"OpType=([A-Za-z_]{1,64})"),
    "numel_in": re.compile(rf"NumelIn=({_N})"),
    "numel_out": re.compile(rf"NumelOut=({_N})"),
    "timeout_ms": re.compile(r"Timeout\(ms\)=(\d{1,19})"),
}
_FAILED_AT = re.compile(r"(?:at work sequence id: |detected by watchdog at work: |Timeout at NCCL work: )(\d{1,19})")
_ENQUEUED = re.compile(rf"[Ll]ast enqueued (?:NCCL )?work: ({_N})")
_STARTED = re.compile(rf"last started (?:NCCL )?work: ({_N})")
_COMPLETED = re.compile(rf"last completed (?:NCCL )?work: ({_N})")
_SIGNAL = re.compile(r"Received a dump signal (?:due to a collective timeout )?from (.{1,80}?) and ")
_JOINED = re.compile(r"\[([\d, ]{0,4000})\] joined but didn't finish collective #(\d{1,19})")
_FINISHED = re.compile(r"\[([\d, ]{0,4000})\] finished collective #(\d{1,19}), but didn't join")
_LAGGING = re.compile(r"ranks \[([\d, ]{0,4000})\] are the lagging ranks")


def parse_watchdog_log(text: str) -> WatchdogLog:
    """The watchdog records of a log's text (pure)."""
    timeouts: dict[tuple, WatchdogTimeout] = {}
    statuses: list[WatchdogStatus] = []
    desync: list[DesyncReport] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw[:MAX_LINE]
        if "WorkNCCL(" in line:
            t = _timeout(line, number)
            if t is not None:
                key = (t.rank, t.seq, t.op_type, t.numel_in, t.numel_out, t.group.rank)
                if t.rank is None:  # an exception's what(), printed without torch's [rankN]: prefix
                    key = next((k for k in reversed(timeouts) if k[1:] == key[1:]), key)
                first = timeouts.get(key)
                timeouts[key] = t if first is None else _merge_group(first, t.group)
                continue
        if "ast enqueued" in line:
            statuses.append(_status(line, number))
        elif "collective #" in line or "lagging ranks" in line:
            d = _desync(line, number)
            if d is not None:
                desync.append(d)
    claimed: set[int] = set()
    joined = tuple(_join(t, statuses, claimed) for t in sorted(timeouts.values(), key=lambda t: t.line))
    return WatchdogLog(timeouts=joined, statuses=tuple(statuses), desync=tuple(desync))


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
    if not any(log.timeouts or log.statuses for log in logs):
        raise InputError(
            f'no NCCL watchdog line ("Watchdog caught collective operation timeout") in {", ".join(paths)}'
        )
    return WatchdogLog(
        timeouts=tuple(t for log in logs for t in log.timeouts),
        statuses=tuple(s for log in logs for s in log.statuses),
        desync=tuple(d for log in logs for d in log.desync),
    )


def _timeout(line: str, number: int) -> WatchdogTimeout | None:
    m = _TIMEOUT.search(line)
    if m is None:
        return None
    work = m.group("work")
    values = {k: (hit.group(1) if (hit := r.search(work)) else None) for k, r in _FIELD.items()}
    if values["seq"] is None or values["op"] is None:
        return None
    op_type = values["op"]
    return WatchdogTimeout(
        line=number,
        rank=_global(line),
        group=_group(line[: m.start()]),
        seq=int(values["seq"]),
        op_type=op_type,
        op=WORK_OP_TYPES.get(op_type, op_type.lower().lstrip("_")),
        numel_in=_opt(values["numel_in"]),
        numel_out=_opt(values["numel_out"]),
        timeout_ms=_opt(values["timeout_ms"]),
        ran_for_ms=_opt(m.group("ran")),
        blocking_wait=m.group("ran") is None,
        thread=_first(_THREAD, line),
    )


def _status(line: str, number: int) -> WatchdogStatus:
    failed = _FAILED_AT.search(line)
    signal = _SIGNAL.search(line)
    return WatchdogStatus(
        line=number,
        rank=_global(line),
        group=_group(line),
        failed_seq=int(failed.group(1)) if failed else None,
        last_enqueued=_first(_ENQUEUED, line),
        last_started=_first(_STARTED, line),
        last_completed=_first(_COMPLETED, line),
        signal_from=signal.group(1).strip() if signal else None,
        thread=_first(_THREAD, line),
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
    """The timeout with its group's status line: the nearest line of the same rank about the same work
    (a later one first), not taken by another timeout, and of the same group where both name one. Each group's watchdog
    logs the two back to back; other groups' lines may come between, so the same glog thread id and the
    same group rank are preferred (torch's "[Rank r]" on the timeout line is only a hint: it is the group
    rank of the first work that logged in the process)."""
    candidates = [
        s
        for s in statuses
        if s.line not in claimed
        and s.rank == t.rank
        and s.failed_seq == t.seq
        and (t.group.name is None or s.group.name in (None, t.group.name))
    ]
    if not candidates:
        return t
    s = min(
        candidates,
        key=lambda s: (s.thread != t.thread, s.group.rank != t.group.rank, s.line < t.line, abs(s.line - t.line)),
    )
    claimed.add(s.line)
    return replace(
        _merge_group(t, s.group),
        last_enqueued=s.last_enqueued,
        last_started=s.last_started,
        last_completed=s.last_completed,
    )


def _merge_group(t: WatchdogTimeout, g: PGRef) -> WatchdogTimeout:
    old = t.group
    return replace(
        t,
        group=PGRef(
            pg_id=old.pg_id if old.pg_id is not None else g.pg_id,
            name=old.name if old.name is not None else g.name,
            desc=old.desc if old.desc is not None else g.desc,
            rank=old.rank if old.rank is not None else g.rank,
        ),
    )


def _group(text: str) -> PGRef:
    m = _PG_ID.search(text)
    if m:
        return PGRef(pg_id=int(m.group(1)), name=m.group(2), desc=m.group(3) or None, rank=int(m.group(4)))
    m = _PG_OLD.search(text)
    if m:
        return PGRef(name=m.group(1), desc=m.group(2) or None, rank=int(m.group(3)))
    m = _RANK.search(text)
    return PGRef(rank=int(m.group(1))) if m else PGRef()


def _global(line: str) -> int | None:
    m = _GLOBAL.search(line)
    return int(m.group(1)) if m else None


def _first(regex: re.Pattern, line: str) -> int | None:
    m = regex.search(line)
    return int(m.group(1)) if m else None


def _opt(value: str | None) -> int | None:
    return int(value) if value is not None else None


def _ranks(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d{1,9}", text))
