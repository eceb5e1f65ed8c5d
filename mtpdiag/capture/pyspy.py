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
from functools import partial
from typing import NamedTuple

from mtpdiag.capture import procfs, source
from mtpdiag.errors import InputError
from mtpdiag.inputs.pyspy_json import threads_from_bytes
from mtpdiag.model import ThreadStack

# py-spy's cause lines when ptrace or /proc/PID/mem is refused (another user, no CAP_SYS_PTRACE, a
# non-dumpable target); its headline then says "Check that the process is running", which misleads.
_DENIED = re.compile(r"Permission denied \(os error 13\)|Operation not permitted \(os error 1\)")


class CaptureFailed(Exception):
    """py-spy could not dump a process; the message is one line saying why."""

    def __init__(self, message: str, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


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


def start(pid: int, *, native: bool = False, nonblocking: bool = False) -> Running:
    """Start dumping ``pid`` without waiting: a caller that dumps several ranks starts them all, then waits."""
    cmd = [find_pyspy(), "dump", "--json", "--locals"]
    if native:
        cmd.append("--native")
    if nonblocking:
        cmd.append("--nonblocking")
    cmd += ["--pid", str(pid)]
    before = procfs.read_stat(pid)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    return Running(pid, proc, nonblocking, before)


def finish(running: Running, timeout: float = 10.0) -> tuple[ThreadStack, ...]:
    """Every thread of the process ``running`` dumps, innermost frame first. Raises CaptureFailed on failure or
    after ``timeout`` seconds of waiting."""
    proc, pid = running.proc, running.pid
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        note = "" if running.nonblocking else _resume_if_left_stopped(pid, running.before)
        raise CaptureFailed(f"py-spy timed out after {timeout:g}s{note}", timed_out=True) from None
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
