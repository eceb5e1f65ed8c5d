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
    ``last_completed`` come from the group's status line for the same rank and work, when logged."""

    line: int
    rank: int | None
    group: PGRef
    seq: int
    op_type: str
    op: str
    numel_in: int | None
    numel_out: int | None
    timeout_ms: int | None
    ran_for_ms: int | None
    blocking_wait: bool = False
    thread: int | None = None  # glog's thread id, when the prefix has one
    last_enqueued: int | None = None
    last_started: int | None = None
    last_completed: int | None = None

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
        )


class LoggedTimeout(Record, frozen=True, kw_only=True, omit_defaults=False):
    """One timed-out work in the report (``watchdog.timeouts``): ``WatchdogTimeout`` with its group flattened."""

    line: int
    rank: int | None
    pg_id: int | None
    pg_name: str | None
    pg_desc: str | None
    group_rank: int | None
    seq: int
    op_type: str
    op: str
    numel_in: int | None
    numel_out: int | None
    timeout_ms: int | None
    ran_for_ms: int | None
    blocking_wait: bool
    last_enqueued: int | None
    last_started: int | None
    last_completed: int | None


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
    three times (the watchdog's line, its exception, and the exception's ``what():`` without a rank prefix)."""

    timeouts: tuple[WatchdogTimeout, ...] = ()
    statuses: tuple[WatchdogStatus, ...] = ()
    desync: tuple[DesyncReport, ...] = ()
