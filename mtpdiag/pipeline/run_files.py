"""What keeps ``mtpdiag run``'s directory small over a job of days, and what a rank that exited left behind.

* ``append_bounded``: ``events.log`` and ``mtpdiag-errors.log`` grow by a line per event; past ``MAX_LOG_BYTES``
  the file becomes ``<name>.1`` (replacing an older one) and a new one starts, so each takes at most twice that.
* ``MAX_HANG_REPORTS``: the hangs written in full (reports and bundle); a job that keeps hanging and recovering
  gets its later calls in ``events.log`` only. Nothing already written is replaced.
* ``rank_log_tail``: the last lines a rank wrote, from the per-rank log files torchrun keeps when it was given
  ``--redirects`` or ``--tee`` (``<log-dir>/<run id>/attempt_<N>/<local rank>/stderr.log``, found beside the
  ``TORCHELASTIC_ERROR_FILE`` torchrun gives each worker). ``run`` leaves the job's own stdout and stderr
  untouched, so without those files there are no lines to give, and the event says how to get them.
"""

from __future__ import annotations

import os
from pathlib import Path

from mtpdiag.capture import procfs
from mtpdiag.model import printable

MAX_LOG_BYTES = 1 << 20
MAX_HANG_REPORTS = 10
TAIL_LINES = 10
_TAIL_BYTES = 16 << 10  # read from the end of a rank's log: ten lines of a traceback fit
_ERROR_FILE_ENV = ("TORCHELASTIC_ERROR_FILE",)  # read to find the rank's log; never written anywhere
_LOG_NAMES = ("stderr.log", "stdout.log")
_LINE_CHARS = 400
NO_LOG_HINT = "(no log of its own: start torchrun with --tee 3 or --redirects 3 to have its last lines here)"


def append_bounded(path: Path, text: str, max_bytes: int = MAX_LOG_BYTES) -> None:
    """Append ``text``; a file already past ``max_bytes`` is moved to ``<name>.1`` first. Raises OSError."""
    try:
        if os.stat(path).st_size >= max_bytes:
            os.replace(path, path.with_name(path.name + ".1"))
    except FileNotFoundError:
        pass
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)


def rank_log_dir(pid: int) -> str | None:
    """The directory torchrun keeps the rank's files in (``TORCHELASTIC_ERROR_FILE``'s), read while it lives."""
    value = (procfs.read_env(pid, _ERROR_FILE_ENV) or {}).get(_ERROR_FILE_ENV[0], "").strip()
    return os.path.dirname(value) if os.path.isabs(value) else None


def rank_log_tail(directory: str | None, lines: int = TAIL_LINES) -> tuple[str, tuple[str, ...]] | None:
    """The last ``lines`` non-empty lines of the rank's ``stderr.log`` (else ``stdout.log``), printable, with the
    file's name; None when torchrun kept no log for it."""
    if directory is None:
        return None
    for name in _LOG_NAMES:
        try:
            with open(os.path.join(directory, name), "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - _TAIL_BYTES))
                data = f.read(_TAIL_BYTES)
        except OSError:
            continue
        kept = [printable(line[:_LINE_CHARS]) for line in data.decode("utf-8", "replace").splitlines() if line.strip()]
        if kept:
            return name, tuple(kept[-lines:])
    return None


def exit_text(rank: int | None, pid: int, how: str, tail: tuple[str, tuple[str, ...]] | None) -> str:
    """The ``rank exited`` event, with the rank's last lines indented below it."""
    head = f"rank exited: rank {rank} (pid {pid}) {how}"
    if tail is None:
        return f"{head} {NO_LOG_HINT}"
    name, lines = tail
    return f"{head}; the last {len(lines)} lines of its {name}:" + "".join(f"\n    {line}" for line in lines)
