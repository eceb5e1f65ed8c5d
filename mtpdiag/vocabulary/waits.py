"""What a rank in no collective waits on: the kinds, how sure a reading is, and the calls that say so."""

from __future__ import annotations

import re

from mtpdiag.vocabulary.states import StrEnum


class WaitKind(StrEnum):
    COLLECTIVE = "collective"
    HOST_SYNC = "host_sync"
    COMM_INIT = "comm_init"
    DATA_LOADER = "data_loader"
    LOCK = "lock"
    IO = "io"
    SLEEP = "sleep"
    RUNNING = "running"
    UNKNOWN = "unknown"


class Confidence(StrEnum):
    CERTAIN = "certain"
    LIKELY = "likely"
    POSSIBLE = "possible"


WAIT_KINDS = tuple(WaitKind)
# Kinds in which the rank itself holds the job up when a group waits for it (a straggler): it is not waiting
# for anybody else. A host sync waits on the device, which waits on a collective: never a straggler.
SELF_INFLICTED = frozenset(
    {WaitKind.RUNNING, WaitKind.DATA_LOADER, WaitKind.LOCK, WaitKind.IO, WaitKind.SLEEP, WaitKind.UNKNOWN}
)

# How each kind reads in a sentence: "rank 3 is <phrase> in load_batch (worker.py:40)".
WAIT_PHRASES: dict[str, str] = {
    WaitKind.COLLECTIVE: "waiting in a collective",
    WaitKind.HOST_SYNC: "waiting on the device at a host sync",
    WaitKind.COMM_INIT: "creating a communicator",
    WaitKind.DATA_LOADER: "waiting for a DataLoader batch",
    WaitKind.LOCK: "waiting on a lock, queue or condition",
    WaitKind.IO: "waiting on file or network I/O",
    WaitKind.SLEEP: "sleeping",
    WaitKind.RUNNING: "running",
    WaitKind.UNKNOWN: "blocked in a C call",
}

# Calls on a source line that can block a thread, and what each says the thread waits on. A capture reads
# the blocked line of the target's own file and keeps only these names (never the line).
CALL_KINDS = {
    "item": WaitKind.HOST_SYNC,
    "cpu": WaitKind.HOST_SYNC,
    "tolist": WaitKind.HOST_SYNC,
    "numpy": WaitKind.HOST_SYNC,
    "synchronize": WaitKind.HOST_SYNC,
    "_local_scalar_dense": WaitKind.HOST_SYNC,
    "acquire": WaitKind.LOCK,
    "join": WaitKind.LOCK,
    "result": WaitKind.LOCK,
    "sleep": WaitKind.SLEEP,
    "read": WaitKind.IO,
    "write": WaitKind.IO,
    "flush": WaitKind.IO,
    "fsync": WaitKind.IO,
    "recv": WaitKind.IO,
    "send": WaitKind.IO,
    "accept": WaitKind.IO,
    "readline": WaitKind.IO,
    "open": WaitKind.IO,
}
WAIT_CALLS = frozenset(CALL_KINDS)
_CALL = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(")
_WITH_LOCK = re.compile(r"\s*(?:async\s+)?with\s+[\w.]*(?:lock|mutex|LOCK|MUTEX|Lock)\w*\s*[:,]")
MAX_SOURCE_LINE = 4096


def calls_in(text: str) -> tuple[str, ...]:
    """The ``WAIT_CALLS`` names a line of source calls, in order (pystack prints the line under its frame;
    a live capture reads it from the target's file). ``with METRICS_LOCK:`` acquires a lock without a call in
    the text: a ``with`` on a name that says lock counts as ``acquire``."""
    if not text:
        return ()
    text = text[:MAX_SOURCE_LINE]
    names = [name for name in _CALL.findall(text) if name in WAIT_CALLS]
    if _WITH_LOCK.match(text):
        names.append("acquire")
    return tuple(dict.fromkeys(names))
