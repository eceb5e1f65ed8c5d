"""Where a job's ranks write their Flight Recorder dumps, and how to ask a live job for one.

torch's ``DebugInfoWriter`` writes ``<prefix><global rank>``. The prefix is ``TORCH_FR_DUMP_TEMP_FILE``,
else the older name ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``, else a default: recent torch uses
``$XDG_CACHE_HOME/torch/comm_lib_trace_rank_`` or ``$HOME/.cache/torch/comm_lib_trace_rank_``
(``HOME`` defaulting to ``/tmp``); older torch used ``/tmp/nccl_trace_rank_``.

With ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE=<prefix>`` every rank's global process group opens a named pipe
``<prefix><rank>.pipe``; writing anything to it makes that rank dump without stopping the job
(ProcessGroupNCCL.hpp ``DumpPipe``).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping

import msgspec

DUMP_ENV = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
PIPE_ENV = "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"
# The environment keys these helpers read: the capture must whitelist them (model.ENV_WHITELIST).
ENV_KEYS = (*DUMP_ENV, PIPE_ENV, "XDG_CACHE_HOME")
DEFAULT_NAME = "comm_lib_trace_rank_"
OLD_DEFAULT = "/tmp/nccl_trace_rank_"


def dump_prefixes(env: Mapping[str, str], home: str | None) -> tuple[str, ...]:
    """The prefixes a target with (whitelisted) environment ``env`` and home directory ``home`` may
    write its dumps under, the one torch uses first. Set variables are exact; without them the
    defaults of recent and of older torch are both candidates."""
    for key in DUMP_ENV:
        value = (env.get(key) or "").strip()
        if value:
            return (value,)
    out = []
    cache = (env.get("XDG_CACHE_HOME") or "").strip()
    if cache:
        out.append(os.path.join(cache, "torch", DEFAULT_NAME))
    out.append(os.path.join(home or "/tmp", ".cache", "torch", DEFAULT_NAME))
    out.append(OLD_DEFAULT)
    return tuple(dict.fromkeys(out))


def pipe_prefix(env: Mapping[str, str]) -> str | None:
    """``TORCH_NCCL_DEBUG_INFO_PIPE_FILE``, when the target set it (no pipe exists otherwise)."""
    value = (env.get(PIPE_ENV) or "").strip()
    return value or None


class LiveDumpRequest(msgspec.Struct, frozen=True):
    """What ``request_live_dump`` did: ``sent`` when a reader got the request; else ``reason``."""

    path: str
    sent: bool
    reason: str = ""


def request_live_dump(pipe_prefix: str, rank: int) -> LiveDumpRequest:
    """Ask rank ``rank`` to write its dump now, through ``<pipe_prefix><rank>.pipe``.

    Never blocks: the pipe is opened write-only and non-blocking, which fails at once when no process
    holds it open for reading, and only a FIFO is written to (a regular file of that name is left alone).
    """
    path = f"{pipe_prefix}{rank}.pipe"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            return LiveDumpRequest(path, False, "no process reads the pipe (the rank is gone or never opened it)")
        return LiveDumpRequest(path, False, exc.strerror or str(exc))
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return LiveDumpRequest(path, False, "not a named pipe")
        os.write(fd, b"1\n")
        return LiveDumpRequest(path, True)
    except BlockingIOError:
        return LiveDumpRequest(path, True, "the pipe is full: a request is already waiting")
    except OSError as exc:
        return LiveDumpRequest(path, False, exc.strerror or str(exc))
    finally:
        os.close(fd)
