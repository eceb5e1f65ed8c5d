"""Live capture: find the workers, read /proc, dump every worker's stacks with py-spy in parallel.

The only package of mtpdiag that touches other processes. ``capture()`` returns a ``Snapshot``.
``py-spy dump --json`` ignores ``--subprocesses``, so ``discover`` finds the workers itself; ``procfs`` reads
/proc, ``pyspy`` runs py-spy (``inputs.pyspy_json`` parses what it prints), ``source`` reads the blocked line's
calls, and ``flight_recorder``/``fr_locate`` pick up a live job's Flight Recorder dumps.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Collection, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timezone
from typing import NamedTuple

import mtpdiag
from mtpdiag.capture import procfs, pyspy
from mtpdiag.capture.discover import find_targets
from mtpdiag.capture.pyspy import CaptureFailed
from mtpdiag.errors import NothingCaptured
from mtpdiag.layout import cmdline
from mtpdiag.model import STATE_GONE, STATE_STOPPED, STATE_UNREADABLE, Env, RankCapture, Snapshot, ThreadStack, decimal
from mtpdiag.vocabulary.states import ProcessState

_STOPPED = (STATE_STOPPED, "t")  # job-control stop, tracing stop
_NO_THREAD = "py-spy found no Python thread in it (its interpreter is starting or shutting down)"
_MAX_PARALLEL = 32

__all__ = ["capture", "find_targets", "own_lineage", "raylet_hints", "CaptureFailed", "STATE_GONE", "STATE_UNREADABLE"]


def capture(
    pids: Iterable[int] = (),
    *,
    scan_all: bool = False,
    native: bool = False,
    nonblocking: bool = False,
    timeout: float = 10.0,
    progress: bool = False,
    host: str | None = None,
    native_timeout: float = 30.0,
    exclude: Collection[int] = (),
    require_any: bool = True,
    meanwhile: Callable[[], object] | None = None,
    hints_cache: dict[int, dict[str, int]] | None = None,
    expand: bool = True,
) -> Snapshot:
    """Capture every worker behind ``pids`` (and, with ``scan_all``, every ranked process here).

    ``native`` adds C/C++ frames (evidence of what a rank waits on); a native dump can take seconds, so it
    has its own ``native_timeout``, and a rank whose native dump fails is dumped again without it.
    ``exclude``: pids that are neither targets nor layout hints (``--ray``: the mtpdiag driver on this node).
    Without ``require_any`` a capture that read no stack is returned (one node of several) instead of raising.
    ``meanwhile`` runs on this thread while py-spy dumps (``inspect`` imports the analysis then).
    ``hints_cache`` (pid -> layout hints) keeps each worker's hints across captures of one job (``run`` samples
    for days): they come from command lines, which do not change, and reading them walks every process here.
    ``expand=False``: ``pids`` are workers already (``find_targets``'s), not launchers to expand again.
    """
    targets = find_targets(list(pids), scan_all, exclude) if expand else sorted(set(pids))
    pyspy.find_pyspy()  # fail early, with one line, when py-spy is missing
    label = host or os.uname().nodename  # what socket.gethostname() returns on Linux, without importing socket
    # What describes the moment is read first, all at once, and py-spy is started on each rank right after:
    # the stacks and these facts should describe one moment. What does not change while a rank waits (the
    # command lines its layout hints come from, its mapped libraries) is read while py-spy runs.
    moments = [(pid, _Moment.read(pid)) for pid in targets]
    started = {
        pid: _start_first(pid, moment.stat, native=native, nonblocking=nonblocking)
        for pid, moment in moments[:_MAX_PARALLEL]
    }

    def one(item: tuple[int, _Moment]) -> _Dumped:
        pid, moment = item
        return _dump_one(
            pid,
            moment.stat,
            started.get(pid),
            native=native,
            nonblocking=nonblocking,
            timeout=timeout,
            native_timeout=native_timeout,
        )

    with ThreadPoolExecutor(max_workers=min(_MAX_PARALLEL, len(moments))) as pool:
        futures = [pool.submit(one, item) for item in moments]
        hints = _CachedHints(_HintReader(exclude), {} if hints_cache is None else hints_cache)
        lasting = [
            (hints.for_process(pid) if moment.stat is not None else {}, procfs.maps_cuda(pid))
            for pid, moment in moments
        ]
        if meanwhile is not None:
            meanwhile()
        dumps = _results(futures, show=progress and len(moments) > 4 and sys.stderr.isatty())
    captures = [
        RankCapture(
            pid=pid,
            host=label,
            rank=moment.rank,
            state=dumped.state,
            threads=dumped.threads,
            env=Env.of(moment.env),
            error=dumped.error,
            nonblocking=dumped.nonblocking,
            main_cpu_ticks=moment.main_cpu_ticks,
            layout_hints=layout_hints,
            main_syscall=moment.main_syscall,
            cuda=cuda,
        )
        for (pid, moment), dumped, (layout_hints, cuda) in zip(moments, dumps, lasting, strict=True)
    ]
    if require_any and not any(c.threads for c in captures):
        reasons = "; ".join(f"pid {c.pid}: {c.error or c.state}" for c in captures[:3])
        timed_out = bool(dumps) and all(d.timed_out for d in dumps)
        exiting = bool(dumps) and all(d.no_interpreter or d.state == STATE_GONE for d in dumps)
        raise NothingCaptured(
            f"could not capture any of {len(captures)} target(s) ({reasons})", timed_out=timed_out, exiting=exiting
        )
    return Snapshot(
        captures=tuple(sorted(captures, key=_order)),
        host=label,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        tool_version=mtpdiag.__version__,
    )


class _Moment(NamedTuple):
    """What /proc says about a worker just before its stacks are dumped."""

    stat: procfs.ProcStat | None
    env: dict[str, str]  # whitelisted keys only
    main_cpu_ticks: int | None
    main_syscall: str | None

    @classmethod
    def read(cls, pid: int) -> _Moment:
        return cls(
            stat=procfs.read_stat(pid),
            env=procfs.read_env(pid) or {},
            main_cpu_ticks=procfs.main_thread_ticks(pid),
            main_syscall=procfs.main_thread_syscall(pid),
        )

    @property
    def rank(self) -> int | None:
        for key in ("RANK", "SLURM_PROCID"):
            value = decimal(self.env.get(key))
            if value is not None:
                return value
        return None


class _Dumped(NamedTuple):
    """What dumping one rank gave: its state, its threads, and why not or how (``error``)."""

    state: str
    threads: tuple[ThreadStack, ...] = ()
    error: str | None = None
    nonblocking: bool = False
    timed_out: bool = False  # unread because py-spy ran out of time
    no_interpreter: bool = False  # no Python to read: its interpreter is not there (exiting, or not started)


def _start_first(pid: int, stat: procfs.ProcStat | None, *, native: bool, nonblocking: bool) -> pyspy.Running | None:
    """The first py-spy dump of a rank, started (None for a rank that is gone): native when asked and the rank
    can be paused, else without pausing it when asked or when it is stopped already."""
    if stat is None or stat.state == ProcessState.ZOMBIE:
        return None
    use_nonblocking = nonblocking or stat.state in _STOPPED
    if native and not use_nonblocking:  # py-spy reads native stacks only of a paused process
        return pyspy.start(pid, native=True)
    return pyspy.start(pid, nonblocking=use_nonblocking)


def _dump_one(
    pid: int,
    stat: procfs.ProcStat | None,
    first: pyspy.Running | None,
    *,
    native: bool,
    nonblocking: bool,
    timeout: float,
    native_timeout: float = 30.0,
) -> _Dumped:
    """Finish the rank's first dump (``first``, or started here), and dump it again as its failure calls for."""
    if stat is None or stat.state == ProcessState.ZOMBIE:
        return _Dumped(STATE_GONE, error="the process exited before it could be captured")
    running = first or _start_first(pid, stat, native=native, nonblocking=nonblocking)
    assert running is not None  # the rank is not gone
    use_nonblocking = nonblocking or stat.state in _STOPPED
    note = None
    if native and not use_nonblocking:
        try:
            return _Dumped(stat.state, pyspy.finish(running, native_timeout))
        except CaptureFailed as exc:
            note = f"native dump failed ({exc}): Python frames only"
        running = pyspy.start(pid)
    elif native:
        note = "no native frames: py-spy reads them only by pausing the process (--nonblocking, or stopped)"
    try:
        threads = pyspy.finish(running, timeout)
    except CaptureFailed as exc:
        return _dump_again(pid, exc, paused=not use_nonblocking, timeout=timeout, note=note)
    if not threads:  # an interpreter without a thread: one finalizing (a rank's teardown), or starting
        return _Dumped(stat.state, error=_NO_THREAD, nonblocking=use_nonblocking, no_interpreter=True)
    return _Dumped(stat.state, threads, nonblocking=use_nonblocking, error=note)


def _dump_again(pid: int, exc: CaptureFailed, *, paused: bool, timeout: float, note: str | None) -> _Dumped:
    """The rank's dump failed with ``exc`` (``paused``: a blocking one): it is gone, or it is read again without
    pausing it where the failure calls for that, or it is unreadable."""
    now = procfs.read_stat(pid)
    if now is None or now.state == ProcessState.ZOMBIE:
        return _Dumped(STATE_GONE, error="the process exited during the capture")
    if paused and (exc.timed_out or "Failed to suspend process" in str(exc)):
        # Pausing a rank that spins on a busy machine can take longer than the timeout, and one that another
        # tracer holds cannot be paused at all: read its memory without pausing it instead.
        try:
            threads = _read_running(pid, timeout)
        except CaptureFailed as exc2:
            return _Dumped(STATE_UNREADABLE, error=f"{exc}; without pausing: {exc2}", timed_out=exc2.timed_out)
        return _Dumped(
            now.state, threads, nonblocking=True, error=f"{exc}: read without pausing it (py-spy --nonblocking)"
        )
    torn = exc.torn and not paused
    stopped_meanwhile = paused and now.state in _STOPPED
    if not (torn or stopped_meanwhile):
        return _Dumped(STATE_UNREADABLE, error=str(exc), timed_out=exc.timed_out, no_interpreter=exc.no_interpreter)
    # A torn read of a running rank, or a rank stopped during its blocking dump: read it (again) without pausing.
    try:
        threads = _read_running(pid, timeout)
    except CaptureFailed as exc2:
        return _Dumped(STATE_UNREADABLE, error=str(exc2), timed_out=exc2.timed_out)
    return _Dumped(now.state, threads, nonblocking=True, error=note)


def _read_running(pid: int, timeout: float, tries: int = 3) -> tuple[ThreadStack, ...]:
    """``py-spy --nonblocking``, dumped again (up to ``tries`` in all) while its read was torn: reading a process
    that runs, py-spy can follow a pointer the process is changing (1 dump in about 200 of a spinning job)."""
    for _ in range(tries - 1):
        try:
            return pyspy.dump(pid, nonblocking=True, timeout=timeout)
        except CaptureFailed as exc:
            if not exc.torn:
                raise
    return pyspy.dump(pid, nonblocking=True, timeout=timeout)


def _results(futures: list[Future[_Dumped]], *, show: bool) -> list[_Dumped]:
    if not show:
        return [f.result() for f in futures]
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("py-spy dump", total=len(futures))
        for f in futures:
            f.add_done_callback(lambda _f: bar.advance(task))
        return [f.result() for f in futures]


def _order(c: RankCapture) -> tuple[bool, int, int]:
    return (c.rank is None, c.rank if c.rank is not None else 0, c.pid or 0)


class _CachedHints(NamedTuple):
    """A worker's layout hints, read once per pid into ``cache``."""

    reader: _HintReader
    cache: dict[int, dict[str, int]]

    def for_process(self, pid: int) -> dict[str, int]:
        if pid not in self.cache:
            self.cache[pid] = self.reader.for_process(pid)
        return self.cache[pid]


def raylet_hints(raylet: int, exclude: Collection[int] = ()) -> dict[str, int]:
    """The parallel sizes on the command lines of the job drivers this raylet's node runs (see ``_HintReader``)."""
    return _HintReader(exclude).for_raylet(raylet)


def own_lineage() -> list[int]:
    """This process and its ancestors below the nearest raylet: mtpdiag's own, never a rank or a layout hint.

    A raylet and what started it belong to the cluster, not to mtpdiag, even when mtpdiag runs below them (a
    ``--ray`` capture task, a capture job): a driver that started its cluster itself (``ray.init()``,
    ``cluster_utils``) is the raylet's parent, and its command line is the job's layout (#20)."""
    lineage = [os.getpid()]
    for pid in procfs.ancestors(os.getpid()):
        if procfs.is_raylet(pid):
            break
        lineage.append(pid)
    return lineage


class _HintReader:
    """Layout hints of a worker: its own argv, its ancestors', its session's Python processes, then the
    drivers of the Ray jobs submitted to its raylet.

    verl's Ray workers carry no sizes on their command lines; their driver does. A driver started from
    a shell shares the workers' session (the shell that ran ``ray start``, or its own ``ray.init``); one
    started by ``ray job submit`` runs in a session of its own, below the raylet's ``ray::JobSupervisor``.
    Argv is read, reduced to sizes and dropped here.
    """

    def __init__(self, exclude: Collection[int] = ()) -> None:
        self._own = {*own_lineage(), *exclude}
        self._argv_hints: dict[int, dict[str, int]] = {}
        self._session_hints: dict[int, dict[str, int]] = {}
        self._job_driver_hints: dict[int, dict[str, int]] = {}
        self._sessions: dict[int, list[int]] | None = None  # session id -> its pids, from one pass over /proc

    def for_process(self, pid: int) -> dict[str, int]:
        ancestors = procfs.ancestors(pid)
        sources = [self._hints_of(p) for p in [pid, *ancestors] if p not in self._own]
        raylets = [p for p in ancestors if procfs.is_raylet(p)]
        if raylets:  # a Ray worker: its driver is in its session, or below its raylet (never for other processes:
            # a shell session can hold any other job, whose sizes would be taken for this one's)
            stat = procfs.read_stat(pid)
            if stat is not None and stat.session > 0:
                sources.append(self._of_session(stat.session))
        sources += [self._of_job_drivers(p) for p in raylets]
        return cmdline.merge_hints(*sources)

    def for_raylet(self, raylet: int) -> dict[str, int]:
        """Hints of the job drivers a raylet knows: its session's Python processes (a driver started from the
        shell that ran ``ray start``) and the jobs submitted to it. On a node without ranks (a CPU-only head
        that runs verl's driver) these are the only place the sizes are."""
        stat = procfs.read_stat(raylet)
        session = self._of_session(stat.session) if stat is not None and stat.session > 0 else {}
        return cmdline.merge_hints(session, self._of_job_drivers(raylet))

    def _of_job_drivers(self, raylet: int) -> dict[str, int]:
        """Hints of the Python processes that the raylet's job supervisors started (submitted drivers)."""
        if raylet not in self._job_driver_hints:
            drivers = [
                d
                for child in procfs.descendants(raylet)
                if procfs.is_ray_job_supervisor(child)
                for d in procfs.descendants(child)
                if d not in self._own and procfs.is_python(d)
            ]
            self._job_driver_hints[raylet] = cmdline.merge_hints(*(self._hints_of(d) for d in sorted(drivers)))
        return self._job_driver_hints[raylet]

    def _hints_of(self, pid: int) -> dict[str, int]:
        if pid not in self._argv_hints:
            self._argv_hints[pid] = cmdline.layout_hints(procfs.read_cmdline(pid) or [])
        return self._argv_hints[pid]

    def _of_session(self, session: int) -> dict[str, int]:
        if session not in self._session_hints:
            if self._sessions is None:  # torchrun gives each worker a session of its own: /proc is read once
                self._sessions = {}
                for pid in procfs.all_pids():
                    stat = procfs.read_stat(pid)
                    if stat:
                        self._sessions.setdefault(stat.session, []).append(pid)
            members = [pid for pid in self._sessions.get(session, ()) if pid not in self._own and procfs.is_python(pid)]
            self._session_hints[session] = cmdline.merge_hints(*(self._hints_of(p) for p in members))
        return self._session_hints[session]
