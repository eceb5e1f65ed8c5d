"""What NCCL's watchdog logs about a hang, as typed records (read by ``inputs.watchdog_log``)."""

from __future__ import annotations

from mtpdiag.model.fields import Record


class PGRef(Record, frozen=True):
    """A process group as a log prefix names it. ``name`` is torch's group name (the Flight Recorder's
    ``process_group[0]``), ``pg_id`` the process-local id (the dump's ``pg_id``), ``rank`` the group rank."""

    pg_id: int | None = None
    name: str | None = None
    desc: str | None = None
    rank: int | None = None


class WatchdogTimeout(Record, frozen=True, kw_only=True):
    """One timed-out work. ``rank``: global rank (log prefix), ``group``: the group (from the same line's
    prefix or the matching status line), ``op``: the public op name of ``op_type``. ``last_enqueued`` /
    ``last_completed`` come from the group's status line for the same rank and work, when logged.

    ``seq`` is None in torch 1.x logs (no ``SeqNum``); ``op_type`` and ``op`` are None for a failure that only a
    group's status line reports (``failure detected by watchdog at work sequence id: N``, ``Timeout at NCCL
    work: N``) with no ``WorkNCCL(...)`` line. ``work_rank`` is the ``[Rank r]`` printed before the timeout
    (torch keeps the first group's rank there); ``group.rank`` is the group prefix's rank when one names it."""

    line: int
    rank: int | None
    group: PGRef
    seq: int | None
    op_type: str | None
    op: str | None
    numel_in: int | None
    numel_out: int | None
    timeout_ms: int | None
    ran_for_ms: int | None
    blocking_wait: bool = False
    thread: int | None = None  # glog's thread id, when the prefix has one
    last_enqueued: int | None = None
    last_started: int | None = None
    last_completed: int | None = None
    work_rank: int | None = None
    tensor_shape: str | None = None  # torch 1.x-2.1: the output's shape, for some ops (``TensorShape=[8, 16]``)
    site: str | None = None  # torch 2.7+: where the job called the failed collective (``name (file.py:12)``)

    def logged(self) -> LoggedTimeout:
        """The timeout as the report's ``watchdog`` section lists it (the group's fields flattened)."""
        g = self.group
        return LoggedTimeout(
            line=self.line,
            rank=self.rank,
            pg_id=g.pg_id,
            pg_name=g.name,
            pg_desc=g.desc,
            group_rank=g.rank,
            seq=self.seq,
            op_type=self.op_type,
            op=self.op,
            numel_in=self.numel_in,
            numel_out=self.numel_out,
            timeout_ms=self.timeout_ms,
            ran_for_ms=self.ran_for_ms,
            blocking_wait=self.blocking_wait,
            last_enqueued=self.last_enqueued,
            last_started=self.last_started,
            last_completed=self.last_completed,
            work_rank=self.work_rank,
            tensor_shape=self.tensor_shape,
        )


class LoggedTimeout(Record, frozen=True, kw_only=True, omit_defaults=False):
    """One timed-out work in the report (``watchdog.timeouts``): ``WatchdogTimeout`` with its group flattened."""

    line: int
    rank: int | None
    pg_id: int | None
    pg_name: str | None
    pg_desc: str | None
    group_rank: int | None
    seq: int | None
    op_type: str | None
    op: str | None
    numel_in: int | None
    numel_out: int | None
    timeout_ms: int | None
    ran_for_ms: int | None
    blocking_wait: bool
    last_enqueued: int | None
    last_started: int | None
    last_completed: int | None
    work_rank: int | None = None
    tensor_shape: str | None = None


class WatchdogStatus(Record, frozen=True, kw_only=True):
    """A "last enqueued / last completed" line. ``failed_seq``: the work it reports on, when it names one;
    ``signal_from``: for a heartbeat dump signal, who raised it ("this local rank", " rank 3")."""

    line: int
    rank: int | None
    group: PGRef
    failed_seq: int | None
    last_enqueued: int | None
    last_started: int | None
    last_completed: int | None
    signal_from: str | None = None
    thread: int | None = None
    signal_rank: int | None = None  # the global rank the dump signal names ("this local rank": the line's own)
    stuck_s: int | None = None  # the heartbeat monitor's "watchdog got stuck for N seconds": N

    def logged(self) -> LoggedSignal:
        """The status line as the report's ``watchdog.signals`` lists a dump signal (the group flattened)."""
        g = self.group
        return LoggedSignal(
            line=self.line,
            rank=self.rank,
            pg_id=g.pg_id,
            pg_name=g.name,
            pg_desc=g.desc,
            group_rank=g.rank,
            signal_from=self.signal_from,
            signal_rank=self.signal_rank,
            last_enqueued=self.last_enqueued,
            last_completed=self.last_completed,
        )


class LoggedSignal(Record, frozen=True, kw_only=True, omit_defaults=False):
    """A heartbeat monitor's dump signal in the report (``watchdog.signals``): which rank's timeout the line's
    rank was told of, and that rank's progress in the group it logs for."""

    line: int
    rank: int | None
    pg_id: int | None
    pg_name: str | None
    pg_desc: str | None
    group_rank: int | None
    signal_from: str | None
    signal_rank: int | None
    last_enqueued: int | None
    last_completed: int | None


class DesyncReport(Record, frozen=True, kw_only=True, omit_defaults=False):
    """``TORCH_NCCL_DESYNC_DEBUG``'s verdict (group ranks): who joined collective #seq but did not finish,
    who finished it but did not join the next, who never joined any."""

    line: int
    rank: int | None
    seq: int | None
    joined_not_finished: tuple[int, ...] = ()
    finished_not_joined: tuple[int, ...] = ()
    never_joined: tuple[int, ...] = ()


class WatchdogLog(Record, frozen=True):
    """Every watchdog record of one log, in line order. A timeout is reported once though torch logs it up to
    three times (the watchdog's line, its exception, and the exception's ``what():`` without a rank prefix).
    ``notes``: where the log's own lines disagree (a rank the timeout line and its group's line give
    differently), said rather than settled."""

    timeouts: tuple[WatchdogTimeout, ...] = ()
    statuses: tuple[WatchdogStatus, ...] = ()
    desync: tuple[DesyncReport, ...] = ()
    notes: tuple[str, ...] = ()
