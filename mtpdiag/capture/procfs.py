"""Reading /proc: process state, parentage, CPU time and whitelisted environment keys.

Only keys in ``ENV_WHITELIST`` ever leave this module; the rest of a target's environment is parsed
and dropped here.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from mtpdiag.model import ENV_WHITELIST, printable

PROC = "/proc"


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/PID/stat that mtpdiag uses."""

    pid: int
    comm: str
    state: str
    ppid: int
    pgid: int
    cpu_ticks: int  # utime + stime
    session: int = 0  # session id: a job's driver and its workers often share one


def _parse_stat(text: str) -> ProcStat:
    # comm is in parentheses and may itself hold spaces or parentheses: split on the last ')'.
    open_paren, close_paren = text.index("("), text.rindex(")")
    pid = int(text[:open_paren].strip())
    comm = text[open_paren + 1 : close_paren]
    fields = text[close_paren + 2 :].split()
    return ProcStat(pid=pid, comm=comm, state=fields[0], ppid=int(fields[1]), pgid=int(fields[2]),
                    cpu_ticks=int(fields[11]) + int(fields[12]), session=int(fields[3]))


def read_stat(pid: int) -> ProcStat | None:
    """The process's stat, or None when it does not exist (or vanished)."""
    try:
        with open(f"{PROC}/{pid}/stat") as f:
            return _parse_stat(f.read())
    except (OSError, ValueError, IndexError):
        return None


def main_thread_ticks(pid: int) -> int | None:
    """CPU ticks of the main thread alone: flat while it blocks, even as helper threads tick."""
    try:
        with open(f"{PROC}/{pid}/task/{pid}/stat") as f:
            return _parse_stat(f.read()).cpu_ticks
    except (OSError, ValueError, IndexError):
        return None


def main_thread_cpu_ns(pid: int) -> int | None:
    """The main thread's CPU time in ns (schedstat), else its ticks from stat: 10 ms ticks miss short steps."""
    try:
        with open(f"{PROC}/{pid}/task/{pid}/schedstat") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ticks = main_thread_ticks(pid)
        return None if ticks is None else ticks * (1_000_000_000 // os.sysconf("SC_CLK_TCK"))


def read_cmdline(pid: int) -> list[str] | None:
    """argv of a process. Callers must not store it: it may hold secrets. Extract what you need."""
    try:
        with open(f"{PROC}/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def read_exe(pid: int) -> str | None:
    """Path of the executable, or None when it cannot be read (gone, or another user's process)."""
    try:
        return os.readlink(f"{PROC}/{pid}/exe")
    except OSError:
        return None


_PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)*)?[dmtu]*$")


def is_python(pid: int) -> bool:
    """Whether the process runs a Python interpreter (Ray workers retitle themselves ``ray::...``)."""
    exe = read_exe(pid)
    if exe is not None:
        return bool(_PYTHON_NAME.match(os.path.basename(exe.removesuffix(" (deleted)"))))
    # The executable is hidden (another user's process): judge by the title.
    stat = read_stat(pid)
    if stat is not None and (stat.comm.startswith("python") or stat.comm.startswith("ray::")):
        return True
    argv = read_cmdline(pid) or []
    if argv:
        first = os.path.basename(argv[0].split(" ")[0])
        return bool(_PYTHON_NAME.match(first)) or argv[0].startswith("ray::")
    return False


def is_raylet(pid: int) -> bool:
    """Ray's per-node daemon, the parent of that node's Ray workers (verl's actors among them)."""
    stat = read_stat(pid)
    return stat is not None and stat.comm == "raylet"


def is_ray_job_supervisor(pid: int) -> bool:
    """The Ray worker that runs a ``ray job submit`` entrypoint (its title is ``ray::JobSupervisor``)."""
    argv = read_cmdline(pid) or []
    return bool(argv) and argv[0].startswith("ray::JobSupervisor")


def read_env(pid: int, keys: tuple[str, ...] = ENV_WHITELIST) -> dict[str, str] | None:
    """Whitelisted environment keys of a process; None when the environment cannot be read."""
    try:
        with open(f"{PROC}/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    wanted = {k.encode() for k in keys}
    out = {}
    for entry in raw.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        if sep and key in wanted:
            out[key.decode()] = printable(value.decode("utf-8", "replace"))
    return out


def all_pids() -> list[int]:
    return sorted(int(name) for name in os.listdir(PROC) if name.isdigit())


def children_map() -> dict[int, list[int]]:
    """ppid -> child pids, for every process readable now."""
    out: dict[int, list[int]] = {}
    for pid in all_pids():
        stat = read_stat(pid)
        if stat is not None:
            out.setdefault(stat.ppid, []).append(pid)
    return out


def descendants(pid: int) -> list[int]:
    """Every descendant of ``pid`` (not itself), parents before children."""
    tree = children_map()
    out, todo = [], list(tree.get(pid, []))
    while todo:
        child = todo.pop(0)
        out.append(child)
        todo.extend(tree.get(child, []))
    return out


def ancestors(pid: int) -> list[int]:
    """Parent, grandparent, ... up to (not including) pid 1."""
    out = []
    stat = read_stat(pid)
    while stat is not None and stat.ppid > 1 and stat.ppid not in out:
        out.append(stat.ppid)
        stat = read_stat(stat.ppid)
    return out
