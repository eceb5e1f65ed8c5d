"""Run ``py-spy dump --json`` on one process and turn its output into ``ThreadStack``s.

``--locals`` is asked for because torch.distributed frames carry the peer of a send/recv (``dst``,
``src``). Locals may hold secrets, so every local except a few integer arguments of torch.distributed
frames is dropped while parsing (``inputs.pyspy_json``, the reader of the same format in files), before
anything else sees it.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from functools import partial
from typing import IO, NamedTuple

from mtpdiag.capture import procfs, source
from mtpdiag.errors import InputError
from mtpdiag.inputs.pyspy_json import threads_from_bytes
from mtpdiag.model import ThreadStack
from mtpdiag.vocabulary.states import ProcessState

# py-spy's cause lines when ptrace or /proc/PID/mem is refused (another user, no CAP_SYS_PTRACE, a
# non-dumpable target); its headline then says "Check that the process is running", which misleads.
_DENIED = re.compile(r"Permission denied \(os error 13\)|Operation not permitted \(os error 1\)")
# py-spy's cause lines when, reading a running process (--nonblocking), it followed a pointer the process was
# changing: a torn read, which the next dump is unlikely to repeat.
_TORN = re.compile(r"Failed to get stack trace|Failed to copy|Bad address \(os error 14\)")
# py-spy's error when the process has no Python interpreter to read: one that finalized it and is exiting (a
# rank's teardown: C atexit handlers, library destructors), or one not yet started. A Python build py-spy does
# not support says it too, for good; only a process read before can be taken for one that is exiting.
_NO_INTERPRETER = re.compile(r"Failed to find a python interpreter|Failed to find python version")

# The timeout counts py-spy's own time, not the time it waited for a CPU: on a node whose ranks spin at a host
# sync on every core, or beside other jobs, a dump that needs 20 ms of CPU was measured taking 20-45 s of wall
# time (/proc/PID/schedstat: all but those 20 ms spent runnable, waiting). Up to this many timeouts of wall time,
# and at least STARVED_WAIT_MIN_S: only a py-spy that the machine gives almost no CPU for that long is given up on
# while it waits (at load 80-110 on 2 cores, a py-spy at nice 19 waited over 60 s for its 20 ms).
STARVED_WAIT_FACTOR = 60
STARVED_WAIT_MIN_S = 300.0
_POLL_S = 0.25


class CaptureFailed(Exception):
    """py-spy could not dump a process; the message is one line saying why."""

    def __init__(self, message: str, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out

    @property
    def torn(self) -> bool:
        """Whether py-spy failed in the middle of reading a process that kept running (worth another try)."""
        return not self.timed_out and _TORN.search(str(self)) is not None

    @property
    def no_interpreter(self) -> bool:
        """Whether py-spy found no Python interpreter in the process (see ``_NO_INTERPRETER``)."""
        return _NO_INTERPRETER.search(str(self)) is not None


def find_pyspy() -> str:
    """The py-spy executable installed with mtpdiag (next to this interpreter), else the first on PATH.

    The one beside the interpreter first: the first on PATH may be a pyenv shim (a bash script that costs
    0.1–0.2 s a call) or another version.
    """
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("py-spy")
    if found:
        return found
    raise InputError("py-spy not found on PATH (pip install py-spy)")


class Running(NamedTuple):
    """A ``py-spy dump`` started on one process (``start``); ``finish`` waits for it and reads its stacks."""

    pid: int
    proc: subprocess.Popen[bytes]
    nonblocking: bool
    before: procfs.ProcStat | None  # the state before py-spy paused it (to undo a pause a timeout leaves)
    out: IO[bytes]  # what py-spy prints goes to memory files, not pipes: a py-spy that filled a pipe would wait
    err: IO[bytes]  # for a reader the busy machine keeps from running, and that wait would count as its own


def start(pid: int, *, native: bool = False, nonblocking: bool = False) -> Running:
    """Start dumping ``pid`` without waiting: a caller that dumps several ranks starts them all, then waits."""
    cmd = [find_pyspy(), "dump", "--json", "--locals"]
    if native:
        cmd.append("--native")
    if nonblocking:
        cmd.append("--nonblocking")
    cmd += ["--pid", str(pid)]
    before = procfs.read_stat(pid)
    out, err = _memory_file("py-spy-out"), _memory_file("py-spy-err")
    try:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
    except BaseException:
        out.close()
        err.close()
        raise
    return Running(pid, proc, nonblocking, before, out, err)


def _memory_file(name: str) -> IO[bytes]:
    """An anonymous file in memory (memfd): py-spy's output holds locals, which never go to a disk."""
    return os.fdopen(os.memfd_create(name, os.MFD_CLOEXEC), "w+b")


def finish(running: Running, timeout: float = 10.0) -> tuple[ThreadStack, ...]:
    """Every thread of the process ``running`` dumps, innermost frame first. Raises CaptureFailed on failure or
    once py-spy has had ``timeout`` seconds of its own (see ``wait``)."""
    proc, pid = running.proc, running.pid
    waiting_since = time.monotonic()
    try:
        out, err = wait(running, timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        waited = time.monotonic() - waiting_since
        busy = f" ({waited:.0f}s in all, waiting for a CPU)" if waited > 2 * timeout else ""
        note = "" if running.nonblocking else _resume_if_left_stopped(pid, running.before)
        raise CaptureFailed(f"py-spy timed out after {timeout:g}s{busy}{note}", timed_out=True) from None
    finally:
        running.out.close()
        running.err.close()
    if proc.returncode != 0:
        text = err.decode("utf-8", "replace")
        if _DENIED.search(text):
            raise CaptureFailed(
                f"permission denied: py-spy cannot read pid {pid} (run mtpdiag as the job's user, "
                "or as root with CAP_SYS_PTRACE)"
            )
        raise CaptureFailed(one_line(text) or f"py-spy exited with {proc.returncode}")
    try:
        return threads_from_bytes(out, line_calls=partial(source.line_calls, pid), live=True)
    except ValueError as exc:
        raise CaptureFailed(f"py-spy printed unreadable JSON ({exc})") from None


def wait(running: Running, timeout: float) -> tuple[bytes, bytes]:
    """What py-spy printed, once it exits within ``timeout`` seconds of its own time (``_OwnClock``): the time it
    was runnable but waiting for a CPU (a busy node) does not count, up to ``STARVED_WAIT_FACTOR`` timeouts of
    wall time (at least ``STARVED_WAIT_MIN_S``). Raises subprocess.TimeoutExpired.

    A py-spy that has exited is done, whatever the clock says: a starved mtpdiag ticks late, and a tick that finds
    py-spy exited counts the time since it exited too (seen in a starved capture: a py-spy found a zombie at a tick
    2.9 s after the last had 0.4 s more counted; CI-45's "py-spy timed out after 1s (4s in all, ...)" in the same
    test)."""
    proc, clock = running.proc, _OwnClock(running.proc.pid, None if running.nonblocking else running.pid)
    while proc.poll() is None:
        left = min(timeout - clock.own_s, max(STARVED_WAIT_FACTOR * timeout, STARVED_WAIT_MIN_S) - clock.wall_s)
        if left <= 0:
            raise subprocess.TimeoutExpired(proc.args, timeout)
        try:
            proc.wait(timeout=min(left, _POLL_S))
        except subprocess.TimeoutExpired:
            clock.tick()
    running.out.seek(0)
    running.err.seek(0)
    return running.out.read(), running.err.read()


class _OwnClock:
    """The time a process has had since it started: its CPU time, plus the time it slept or was blocked (on its
    target, on the kernel), but not the time it was runnable without running: waiting for a CPU. A py-spy blocked
    on its target (pausing it) waits for a CPU too when the target cannot run to stop: while one of the target's
    threads is runnable and got less than half the interval's CPU, only the CPU that thread got counts (a loaded
    CI run: 1 s of "own" time in 28 s of a starved rank's pause).

    Read from /proc at each ``tick`` (``own_s_of``). On a loaded node the ticks come late, since mtpdiag waits for
    a CPU too: the state read at a tick says nothing of the seconds before it (CI-31, CI-38: a py-spy seen once
    blocked on I/O after 8 s of waiting for a CPU counted all 8 s, and "timed out after 1s (9s in all, waiting for
    a CPU)"). Where /proc cannot be read, every second counts, as a plain timeout would.
    """

    def __init__(self, pid: int, target: int | None = None) -> None:
        self.pid, self.target = pid, target
        self.started = self._last = time.monotonic()
        self._cpu_ns, self._waited_ns = procfs.main_thread_schedstat(pid)
        self._target_threads = procfs.threads_cpu(target) if target is not None else {}
        self.own_s = 0.0

    @property
    def wall_s(self) -> float:
        return time.monotonic() - self.started

    def tick(self) -> None:
        now = time.monotonic()
        interval, self._last = now - self._last, now
        stat, (cpu_ns, waited_ns) = procfs.read_stat(self.pid), procfs.main_thread_schedstat(self.pid)
        threads = procfs.threads_cpu(self.target) if self.target is not None else {}
        cpu_s = None if cpu_ns is None or self._cpu_ns is None else (cpu_ns - self._cpu_ns) / 1e9
        waited_s = None if waited_ns is None or self._waited_ns is None else (waited_ns - self._waited_ns) / 1e9
        self.own_s += own_s_of(
            interval,
            runnable=stat is not None and stat.state == ProcessState.RUNNING,
            cpu_s=cpu_s,
            waited_s=waited_s,
            target_s=starved_target_s(self._target_threads, threads, interval),
        )
        self._cpu_ns, self._waited_ns, self._target_threads = cpu_ns, waited_ns, threads


def own_s_of(interval: float, *, runnable: bool, cpu_s: float | None, waited_s: float | None, target_s: float) -> float:
    """How much of ``interval`` a process had as its own. Runnable now: only the CPU it got (its current wait is not
    in its run delay yet). Asleep or blocked now: the interval less the waits for a CPU the kernel has added since
    (it has run after each of them, so all are there), and no more than ``target_s`` (``starved_target_s``).
    Unknown (/proc unreadable): all of it, up to ``target_s``."""
    if runnable and cpu_s is not None:
        return min(interval, cpu_s)
    return max(0.0, min(interval - (waited_s or 0.0), target_s))


def starved_target_s(before: dict[int, tuple[str, int]], after: dict[int, tuple[str, int]], interval: float) -> float:
    """How much of ``interval`` a py-spy waiting on its target counts as its own: all of it, unless a thread of the
    target is runnable now and got less than half the interval's CPU since ``before`` (it waits for a CPU); then
    the least CPU such a thread got (a spinning target that runs counts in full)."""
    starved = [
        (cpu - before[tid][1]) / 1e9
        for tid, (state, cpu) in after.items()
        if state == ProcessState.RUNNING and tid in before and (cpu - before[tid][1]) / 1e9 < interval / 2
    ]
    return min(starved) if starved else interval


def dump(
    pid: int, *, native: bool = False, nonblocking: bool = False, timeout: float = 10.0
) -> tuple[ThreadStack, ...]:
    """Every thread of ``pid``, innermost frame first. Raises CaptureFailed on failure or timeout."""
    return finish(start(pid, native=native, nonblocking=nonblocking), timeout)


def _resume_if_left_stopped(pid: int, before: procfs.ProcStat | None) -> str:
    """A blocking py-spy killed mid-dump can leave its target stopped; undo that, never a user's stop."""
    after = procfs.read_stat(pid)
    if before is None or after is None or before.state in "Tt" or after.state not in "Tt":
        return ""
    try:
        os.kill(pid, signal.SIGCONT)
    except OSError:
        return " and left the process stopped"
    return " (the process was resumed with SIGCONT)"


def one_line(text: str) -> str:
    """py-spy's stderr reduced to one line: its ``Error:`` lines, then their causes (``Caused by: 0: Failed to
    suspend process 1: EPERM``), blank lines dropped."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.lower().startswith("error")]
    causes, in_causes = [], False
    for line in lines:
        if line == "Caused by:":
            in_causes = True
        elif in_causes and re.match(r"[0-9]{1,3}: ", line):
            causes.append(line.split(":", 1)[1].strip())
        else:
            in_causes = False  # a backtrace's numbered lines are not causes
    return ": ".join(errors + causes if errors else lines)[:300]
