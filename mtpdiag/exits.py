"""How a one-shot command's process ends: at once, without freeing what the command built.

``analyze`` of 16k ranks leaves about a million objects (the decoded captures, the views, the splits). Freeing
them one by one, when the command's frame unwinds and then in the interpreter's teardown, cost about a tenth
of the command's time (``benchmarks/scale.py``). mypy ends the same way (``mypy.util.hard_exit``). Only the
console entry point allows it (``allow``), for commands that leave no child process, thread, temporary file or
atexit handler behind; a command run in-process (a test's CliRunner) returns and raises ``typer.Exit`` as usual.
"""

from __future__ import annotations

import os
import sys

_allowed = False


def allow() -> None:
    """Let ``now`` end the process (the console entry point calls this for a one-shot command)."""
    global _allowed
    _allowed = True


def now(code: int) -> None:
    """End the process with ``code`` once stdout and stderr are flushed, when allowed; else return.

    Output that cannot be flushed (a closed pipe) is dropped, as a normal exit would drop it.
    """
    if not _allowed:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
