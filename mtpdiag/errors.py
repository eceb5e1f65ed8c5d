"""Errors that end a command with a documented exit code and one line on stderr."""

from __future__ import annotations

# Exit codes shared by every command (docs/design.md).
EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_USAGE = 2
EXIT_NOTHING_CAPTURED = 3
EXIT_INCOMPLETE = 4  # ranks are stuck, but the evidence cannot say why (never 0 for a stuck job)
EXIT_INTERNAL = 70  # a bug in mtpdiag (sysexits' EX_SOFTWARE), so that it never looks like a usage error


class MtpdiagError(Exception):
    """Base for errors shown to the user as one line; ``exit_code`` is what the process returns."""

    exit_code = EXIT_USAGE


class InputError(MtpdiagError):
    """Bad flags, files, pids or configs (exit 2)."""

    exit_code = EXIT_USAGE


class NothingCaptured(MtpdiagError):
    """Every target was unreadable (exit 3). ``timed_out``: every one because py-spy ran out of time (a node too
    busy to give it a CPU), which a later try may not. ``exiting``: every one had no Python interpreter left to
    read (or was gone): ranks that finalized Python and are exiting, when they were read before."""

    exit_code = EXIT_NOTHING_CAPTURED

    def __init__(self, message: str, timed_out: bool = False, exiting: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out
        self.exiting = exiting
