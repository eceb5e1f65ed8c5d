"""Run ``py-spy dump --json`` on one process and turn its output into ``ThreadStack``s.

``--locals`` is asked for because torch.distributed frames carry the peer of a send/recv (``dst``,
``src``). Locals may hold secrets, so every local except a few integer arguments of
torch.distributed frames is dropped while parsing, before anything else sees it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from typing import Any, Iterable

from mtpdiag.capture import procfs, source
from mtpdiag.errors import InputError
from mtpdiag.model import Frame, ThreadStack, printable

# Locals kept, and only from frames under torch/distributed/, and only as integer literals.
KEPT_ARGS = ("dst", "src", "group_dst", "group_src", "tag")
_TORCH_DISTRIBUTED = "torch/distributed/"
_INT_LITERAL = re.compile(r"-?[0-9]{1,19}")  # ASCII and bounded: int() refuses 5000 digits
_PACKAGE_ROOTS = ("/site-packages/", "/dist-packages/")
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


def dump(pid: int, *, native: bool = False, nonblocking: bool = False,
         timeout: float = 10.0) -> tuple[ThreadStack, ...]:
    """Every thread of ``pid``, innermost frame first. Raises CaptureFailed on failure or timeout."""
    cmd = [find_pyspy(), "dump", "--json", "--locals"]
    if native:
        cmd.append("--native")
    if nonblocking:
        cmd.append("--nonblocking")
    cmd += ["--pid", str(pid)]
    before = procfs.read_stat(pid)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        note = "" if nonblocking else _resume_if_left_stopped(pid, before)
        raise CaptureFailed(f"py-spy timed out after {timeout:g}s{note}", timed_out=True) from None
    if proc.returncode != 0:
        text = err.decode("utf-8", "replace")
        if _DENIED.search(text):
            raise CaptureFailed(f"permission denied: py-spy cannot read pid {pid} (run mtpdiag as the job's user, "
                                "or as root with CAP_SYS_PTRACE)")
        raise CaptureFailed(one_line(text) or f"py-spy exited with {proc.returncode}")
    try:
        return threads_from_json(json.loads(out), pid)
    except (ValueError, TypeError, KeyError) as exc:
        raise CaptureFailed(f"py-spy printed unreadable JSON ({exc})") from None


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


def threads_from_json(data: Any, pid: int | None = None) -> tuple[ThreadStack, ...]:
    """Threads of one ``py-spy dump --json`` document (a list of thread objects).

    With the ``pid`` of a live target, each thread also gets the wait calls on its innermost Python line
    (``capture.source``), read from the target's files.
    """
    if not isinstance(data, list):
        raise ValueError("a py-spy dump is a JSON list of threads")
    return tuple(_thread(t, pid) for t in data)


def display_path(filename: str) -> str:
    """A path relative to site-packages/dist-packages when it is installed there, else as given."""
    for root in _PACKAGE_ROOTS:
        cut = filename.rfind(root)
        if cut >= 0:
            return filename[cut + len(root):]
    return filename


def kept_args(file: str, locals_: Iterable[tuple[str, str | None]]) -> tuple[tuple[str, int], ...]:
    """The whitelisted integer locals of a torch.distributed frame; every other local is dropped."""
    if not (file.startswith(_TORCH_DISTRIBUTED) or "/" + _TORCH_DISTRIBUTED in file):
        return ()
    out = {}
    for name, repr_ in locals_:
        if name in KEPT_ARGS and isinstance(repr_, str) and _INT_LITERAL.fullmatch(repr_.strip()):
            out[name] = int(repr_.strip())
    return tuple(sorted(out.items()))


def _thread(t: Any, pid: int | None = None) -> ThreadStack:
    if not isinstance(t, dict) or not isinstance(t.get("frames"), list):
        raise ValueError("a py-spy thread needs a list of frames")
    native_id = t.get("os_thread_id")
    thread_id = t.get("thread_id")
    frames = tuple(_frame(f) for f in t["frames"])
    calls: tuple[str, ...] = ()
    if pid is not None:
        innermost = next((f for f in t["frames"] if isinstance(f, dict) and f.get("module") is None), None)
        if innermost is not None and isinstance(innermost.get("filename"), str) and \
                type(innermost.get("line")) is int:
            calls = source.line_calls(pid, innermost["filename"], innermost["line"])
    return ThreadStack(
        thread_id=thread_id if isinstance(thread_id, int) else 0,
        name=printable(str(t.get("thread_name") or "")),
        native_id=native_id if isinstance(native_id, int) else None,
        active=t.get("active") if isinstance(t.get("active"), bool) else None,
        frames=frames,
        calls=calls,
        locals_key=_locals_key(t["frames"]) if pid is not None else None,
    )


def _locals_key(frames: list) -> int:
    """A hash of each frame's locals (names and py-spy's reprs): the value is kept, never the locals."""
    parts = []
    for f in frames:
        if isinstance(f, dict) and isinstance(f.get("locals"), list):
            parts.append(tuple((str(v.get("name")), str(v.get("repr"))) for v in f["locals"] if isinstance(v, dict)))
    return hash(tuple(parts))


def _frame(f: Any) -> Frame:
    if not isinstance(f, dict):
        raise ValueError("a py-spy frame must be an object")
    filename = f.get("filename") or f.get("short_filename") or "<unknown>"
    file = display_path(printable(str(filename)))
    line = f.get("line")
    locals_ = f.get("locals") or []
    pairs = [(str(v.get("name")), v.get("repr")) for v in locals_ if isinstance(v, dict)]
    return Frame(
        function=printable(str(f.get("name") or "<unknown>")),
        file=file,
        line=line if isinstance(line, int) and not isinstance(line, bool) else 0,
        args=kept_args(file, pairs),
        native=f.get("module") is not None,  # py-spy --native names the shared object of a C frame
    )
