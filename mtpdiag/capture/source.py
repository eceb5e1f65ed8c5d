"""What the line a thread is blocked on calls, read from the target's own source file.

A host sync (``loss.item()``), a lock (``lock.acquire()``) or a sleep is a C call: py-spy's innermost Python
frame is the line that made it, and nothing says what that line does. The file is on this host (a live
capture), so the line is read from ``/proc/PID/root/<path>`` (the target's view, containers included) and
reduced to the names it calls from ``WAIT_CALLS``. The line itself is never kept or shown: it may hold
anything.
"""

from __future__ import annotations

import os
import re
from functools import lru_cache

# Calls that can block a thread: host syncs, locks and queues, sleeps, file and socket I/O.
WAIT_CALLS = frozenset({
    "item", "cpu", "tolist", "numpy", "synchronize", "_local_scalar_dense",
    "acquire", "join", "result", "sleep",
    "read", "write", "flush", "fsync", "recv", "send", "accept", "readline", "open",
})
_CALL = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(")
_WITH_LOCK = re.compile(r"\s*(?:async\s+)?with\s+[\w.]*(?:lock|mutex|LOCK|MUTEX|Lock)\w*\s*[:,]")
_MAX_LINE = 4096
_MAX_FILE = 8 * 1024 * 1024


def line_calls(pid: int, path: str, line: int) -> tuple[str, ...]:
    """The ``WAIT_CALLS`` names called on ``line`` of ``path`` as process ``pid`` sees it; () if unreadable."""
    if line <= 0 or not os.path.isabs(path):
        return ()
    return calls_in(_line(f"/proc/{pid}/root{path}", line))


def calls_in(text: str) -> tuple[str, ...]:
    """The ``WAIT_CALLS`` names a line of source calls, in order (pystack prints the line under its frame).
    ``with METRICS_LOCK:`` acquires a lock without a call in the text: a ``with`` on a name that says lock
    counts as ``acquire``."""
    if not text:
        return ()
    text = text[:_MAX_LINE]
    names = [name for name in _CALL.findall(text) if name in WAIT_CALLS]
    if _WITH_LOCK.match(text):
        names.append("acquire")
    return tuple(dict.fromkeys(names))


@lru_cache(maxsize=512)
def _line(path: str, number: int) -> str:
    """One line of a file (the ranks of a job run the same files: each is read once per capture)."""
    try:
        if os.path.getsize(path) > _MAX_FILE:
            return ""
        with open(path, encoding="utf-8", errors="replace") as f:
            for i, text in enumerate(f, 1):
                if i == number:
                    return text[:_MAX_LINE]
    except OSError:
        return ""
    return ""


def clear_cache() -> None:
    """Forget the lines read (a file may change between two captures of a long watch)."""
    _line.cache_clear()
