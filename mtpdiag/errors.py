"""Errors that end a command with a documented exit code and one line on stderr."""

from __future__ import annotations

# Exit codes shared by every command (docs/design.md).
EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_USAGE = 2
EXIT_NOTHING_CAPTURED = 3


class MtpdiagError(Exception):
    """Base for errors shown to the user as one line; ``exit_code`` is what the process returns."""

    exit_code = EXIT_USAGE


class InputError(MtpdiagError):
    """Bad flags, files, pids or configs (exit 2)."""

    exit_code = EXIT_USAGE


class NothingCaptured(MtpdiagError):
    """Every target was unreadable (exit 3)."""

    exit_code = EXIT_NOTHING_CAPTURED
