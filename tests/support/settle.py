"""Reading a live process until it is where a test expects it: one read of a job that has just gone quiet is a race.

On a loaded machine a rank can be quiet (no CPU, not runnable) and still on its way: a run read rank 0 of a hung
job with importlib at the top of its main thread. A test that reads where a live process waits reads it again
while its check fails, for up to a minute; a process that never gets there fails with the last read's assertion.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

SETTLE_S = 60.0  # a bound, not a wait: a process already where its check expects passes at the first read


def settled(read: Callable[[], T], check: Callable[[T], object], within_s: float = SETTLE_S) -> T:
    """``read()`` until ``check`` of what it read raises no AssertionError; again every half second while it does,
    for up to ``within_s``; then the last AssertionError stands. Returns what passed the check."""
    deadline = time.monotonic() + within_s
    while True:
        seen = read()
        try:
            check(seen)
            return seen
        except AssertionError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.5)
