"""Live capture: find the workers, read /proc, dump every worker's stacks with py-spy in parallel.

The only package of mtpdiag that touches other processes. ``capture()`` returns a ``Snapshot``.
``py-spy dump --json`` ignores ``--subprocesses``, so ``discover`` finds the workers itself; ``procfs`` reads
/proc, ``pyspy`` runs py-spy (``inputs.pyspy_json`` parses what it prints), ``source`` reads the blocked line's
calls, and ``flight_recorder``/``fr_locate`` pick up a live job's Flight Recorder dumps.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable, Collection, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone

import mtpdiag
from mtpdiag.capture import procfs, pyspy
from mtpdiag.capture.discover import find_targets
from mtpdiag.capture.pyspy import CaptureFailed
from mtpdiag.errors import NothingCaptured
from mtpdiag.layout import cmdline
from mtpdiag.model import STATE_GONE, STATE_STOPPED, STATE_UNREADABLE, Env, RankCapture, Snapshot, ThreadStack, decimal

_STOPPED = (STATE_STOPPED, "t")  # job-control stop, tracing stop
_MAX_PARALLEL = 32

__all__ = ["capture", "find_targets", "raylet_hints", "CaptureFailed", "STATE_GONE", "STATE_UNREADABLE"]


def capture(pids: Iterable[int] = (), *, scan_all: bool = False, native: bool = False,
            nonblocking: bool = False, timeout: float = 10.0, progress: bool = False,
            host: str | None = None, native_timeout: float = 30.0, exclude: Collection[int] = (),
            require_any: bool = True) -> Snapshot:
    """Capture every worker behind ``pids`` (and, with ``scan_all``, every ranked process here).

    ``native`` adds C/C++ frames (evidence of what a rank waits on); a native dump can take seconds, so it
    has its own ``native_timeout``, and a rank whose native dump fails is dumped again without it.
    ``exclude``: pids that are neither targets nor layout hints (``--ray``: the mtpdiag driver on this node).
    Without ``require_any`` a capture that read no stack is returned (one node of several) instead of raising.
    """
    targets = find_targets(list(pids), scan_all, exclude)
    pyspy.find_pyspy()  # fail early, with one line, when py-spy is missing
    label = host or socket.gethostname()
    hints = _HintReader(exclude)
    # /proc reads first, all at once: the moment the stacks describe should be one moment.
    pending = [(pid, _read_proc(pid, hints)) for pid in targets]

    def one(item: tuple[int, _ProcFacts]) -> RankCapture:
        pid, facts = item
        return _capture_one(pid, facts, label, native=native, nonblocking=nonblocking, timeout=timeout,
                            native_timeout=native_timeout)

    with ThreadPoolExecutor(max_workers=min(_MAX_PARALLEL, len(pending))) as pool:
        captures = _run_with_progress(pool, one, pending, show=progress and len(pending) > 4
                                      and sys.stderr.isatty())
    if require_any and not any(c.threads for c in captures):
        reasons = "; ".join(f"pid {c.pid}: {c.error or c.state}" for c in captures[:3])
        raise NothingCaptured(f"could not capture any of {len(captures)} target(s) ({reasons})")
    return Snapshot(
        captures=tuple(sorted(captures, key=_order)),
        host=label,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        tool_version=mtpdiag.__version__,
    )


@dataclass(frozen=True)
class _ProcFacts:
    """What /proc says about a worker just before its stacks are dumped."""

    stat: procfs.ProcStat | None
    env: dict[str, str]  # whitelisted keys only
    main_cpu_ticks: int | None
    hints: dict[str, int]
    main_syscall: str | None = None
    cuda: bool | None = None

    @property
    def rank(self) -> int | None:
        for key in ("RANK", "SLURM_PROCID"):
            value = decimal(self.env.get(key))
            if value is not None:
                return value
        return None


def _read_proc(pid: int, hints: _HintReader) -> _ProcFacts:
    stat = procfs.read_stat(pid)
    return _ProcFacts(stat=stat, env=procfs.read_env(pid) or {}, main_cpu_ticks=procfs.main_thread_ticks(pid),
                      hints=hints.for_process(pid) if stat is not None else {},
                      main_syscall=procfs.main_thread_syscall(pid), cuda=procfs.maps_cuda(pid))


def _capture_one(pid: int, facts: _ProcFacts, host: str, *, native: bool, nonblocking: bool,
                 timeout: float, native_timeout: float = 30.0) -> RankCapture:
    stat = facts.stat

    def made(state: str, threads: tuple[ThreadStack, ...] = (), *, error: str | None = None,
             nonblocking: bool = False) -> RankCapture:
        return RankCapture(pid=pid, host=host, rank=facts.rank, state=state, threads=threads,
                           env=Env.of(facts.env), error=error, nonblocking=nonblocking,
                           main_cpu_ticks=facts.main_cpu_ticks, layout_hints=dict(facts.hints),
                           main_syscall=facts.main_syscall, cuda=facts.cuda)

    if stat is None or stat.state == "Z":
        return made(STATE_GONE, error="the process exited before it could be captured")
    use_nonblocking = nonblocking or stat.state in _STOPPED
    note = None
    if native and not use_nonblocking:  # py-spy reads native stacks only of a paused process
        try:
            return made(stat.state, pyspy.dump(pid, native=True, timeout=native_timeout))
        except CaptureFailed as exc:
            note = f"native dump failed ({exc}): Python frames only"
    elif native:
        note = "no native frames: py-spy reads them only by pausing the process (--nonblocking, or stopped)"
    try:
        threads = pyspy.dump(pid, nonblocking=use_nonblocking, timeout=timeout)
    except CaptureFailed as exc:
        now = procfs.read_stat(pid)
        if now is None or now.state == "Z":
            return made(STATE_GONE, error="the process exited during the capture")
        if not use_nonblocking and (exc.timed_out or "Failed to suspend process" in str(exc)):
            # Pausing a rank that spins on a busy machine can take longer than the timeout, and one that another
            # tracer holds cannot be paused at all: read its memory without pausing it instead.
            try:
                threads = pyspy.dump(pid, nonblocking=True, timeout=timeout)
            except CaptureFailed as exc2:
                return made(STATE_UNREADABLE, error=f"{exc}; without pausing: {exc2}")
            return made(now.state, threads, nonblocking=True,
                        error=f"{exc}: read without pausing it (py-spy --nonblocking)")
        if use_nonblocking or now.state not in _STOPPED:
            return made(STATE_UNREADABLE, error=str(exc))
        stat, use_nonblocking = now, True
        try:
            threads = pyspy.dump(pid, nonblocking=True, timeout=timeout)
        except CaptureFailed as exc2:
            return made(STATE_UNREADABLE, error=str(exc2))
    return made(stat.state, threads, nonblocking=use_nonblocking, error=note)


def _run_with_progress(pool: ThreadPoolExecutor, fn: Callable, items: list, *, show: bool) -> list:
    futures = [pool.submit(fn, item) for item in items]
    if not show:
        return [f.result() for f in futures]
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("py-spy dump", total=len(futures))
        for f in futures:
            f.add_done_callback(lambda _f: bar.advance(task))
        return [f.result() for f in futures]


def _order(c: RankCapture) -> tuple:
    return (c.rank is None, c.rank if c.rank is not None else 0, c.pid or 0)


def raylet_hints(raylet: int, exclude: Collection[int] = ()) -> dict[str, int]:
    """The parallel sizes on the command lines of the job drivers this raylet's node runs (see ``_HintReader``)."""
    return _HintReader(exclude).for_raylet(raylet)


class _HintReader:
    """Layout hints of a worker: its own argv, its ancestors', its session's Python processes, then the
    drivers of the Ray jobs submitted to its raylet.

    verl's Ray workers carry no sizes on their command lines; their driver does. A driver started from
    a shell shares the workers' session (the shell that ran ``ray start``, or its own ``ray.init``); one
    started by ``ray job submit`` runs in a session of its own, below the raylet's ``ray::JobSupervisor``.
    Argv is read, reduced to sizes and dropped here.
    """

    def __init__(self, exclude: Collection[int] = ()) -> None:
        self._own = {os.getpid(), *procfs.ancestors(os.getpid()), *exclude}
        self._argv_hints: dict[int, dict[str, int]] = {}
        self._session_hints: dict[int, dict[str, int]] = {}
        self._job_driver_hints: dict[int, dict[str, int]] = {}

    def for_process(self, pid: int) -> dict[str, int]:
        ancestors = procfs.ancestors(pid)
        sources = [self._hints_of(p) for p in [pid, *ancestors] if p not in self._own]
        stat = procfs.read_stat(pid)
        if stat is not None and stat.session > 0:
            sources.append(self._of_session(stat.session))
        sources += [self._of_job_drivers(p) for p in ancestors if procfs.is_raylet(p)]
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
            drivers = [d for child in procfs.descendants(raylet) if procfs.is_ray_job_supervisor(child)
                       for d in procfs.descendants(child) if d not in self._own and procfs.is_python(d)]
            self._job_driver_hints[raylet] = cmdline.merge_hints(*(self._hints_of(d) for d in sorted(drivers)))
        return self._job_driver_hints[raylet]

    def _hints_of(self, pid: int) -> dict[str, int]:
        if pid not in self._argv_hints:
            self._argv_hints[pid] = cmdline.layout_hints(procfs.read_cmdline(pid) or [])
        return self._argv_hints[pid]

    def _of_session(self, session: int) -> dict[str, int]:
        if session not in self._session_hints:
            members = []
            for pid in procfs.all_pids():
                stat = procfs.read_stat(pid)
                if stat and stat.session == session and pid not in self._own and procfs.is_python(pid):
                    members.append(pid)
            self._session_hints[session] = cmdline.merge_hints(*(self._hints_of(p) for p in members))
        return self._session_hints[session]
