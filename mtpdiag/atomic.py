"""Writing a file so that a reader (or a kill) never sees half of it: the one atomic writer of mtpdiag.

Bundles, HTML reports and ``apply``'s engine rewrite all go through ``write_atomic``: the data goes to a temp
file in the target's directory, is fsynced and given its mode, and the temp file is renamed over the target;
the directory is then fsynced (best effort) so that the rename itself survives a crash.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from pathlib import Path


def write_atomic(
    path: str | os.PathLike[str],
    data: bytes | str,
    *,
    mode: int,
    prefix: str | None = None,
    suffix: str = ".tmp",
    pause: float = 0.0,
) -> None:
    """Replace ``path`` with ``data`` (text is written as UTF-8), whole or not at all. Raises OSError.

    ``prefix``/``suffix`` name the temp file (default ``.<name>.*.tmp``), so that a caller can find the ones a
    kill left behind; ``pause`` waits between the temp file and the rename (a test hook of ``apply``).
    """
    path = Path(path)
    directory = path.parent
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=prefix if prefix is not None else f".{path.name}.", suffix=suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        if pause > 0:
            time.sleep(pause)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def shared_mode() -> int:
    """0666 less the umask: the mode of a file made to be shared (a report), unlike mkstemp's 0600."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask
