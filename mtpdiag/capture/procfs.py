"""Reading /proc: process state, parentage, CPU time and whitelisted environment keys.

Only keys in ``ENV_WHITELIST`` ever leave this module; the rest of a target's environment is parsed
and dropped here.
"""

from __future__ import annotations

import os
import re

import msgspec

from mtpdiag.model import ENV_WHITELIST, printable
from mtpdiag.vocabulary.states import ProcessState

PROC = "/proc"


class ProcStat(msgspec.Struct, frozen=True):
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
    return ProcStat(
        pid=pid,
        comm=comm,
        state=fields[0],
        ppid=int(fields[1]),
        pgid=int(fields[2]),
        cpu_ticks=int(fields[11]) + int(fields[12]),
        session=int(fields[3]),
    )


def read_stat(pid: int) -> ProcStat | None:
    """The process's stat, or None when it does not exist (or vanished)."""
    try:
        with open(f"{PROC}/{pid}/stat") as f:
            return _parse_stat(f.read())
    except (OSError, ValueError, IndexError):
        return None


def main_thread_ticks(pid: int) -> int | None:
    """CPU ticks of the main thread alone: flat while it blocks, even as helper threads tick."""
    stat = _main_thread_stat(pid)
    return None if stat is None else stat.cpu_ticks


def main_thread_busy(pid: int) -> bool:
    """Whether the main thread is running or waiting for a CPU (state R), or for the kernel to finish work of its
    own, a disk read or a page fault among them (D): then flat ticks are no sign of a wait on another process."""
    stat = _main_thread_stat(pid)
    return stat is not None and stat.state in (ProcessState.RUNNING, ProcessState.DISK)


def _main_thread_stat(pid: int) -> ProcStat | None:
    try:
        with open(f"{PROC}/{pid}/task/{pid}/stat") as f:
            return _parse_stat(f.read())
    except (OSError, ValueError, IndexError):
        return None


def main_thread_cpu_ns(pid: int) -> int | None:
    """The main thread's CPU time in ns (schedstat), else its ticks from stat: 10 ms ticks miss short steps."""
    return main_thread_schedstat(pid)[0]


def main_thread_schedstat(pid: int) -> tuple[int | None, int | None]:
    """(CPU time, run delay) of the main thread in ns, from one read of its schedstat. The run delay is the time
    it spent runnable, waiting for a CPU (throttled time included); the kernel adds a wait when the thread next
    gets a CPU, so a thread waiting now shows none of it yet. Without schedstat: the CPU from stat's ticks, and
    no run delay."""
    try:
        with open(f"{PROC}/{pid}/task/{pid}/schedstat") as f:
            cpu_ns, run_delay_ns = f.read().split()[:2]
        return int(cpu_ns), int(run_delay_ns)
    except (OSError, ValueError):
        ticks = main_thread_ticks(pid)
        return (None if ticks is None else ticks * (1_000_000_000 // os.sysconf("SC_CLK_TCK"))), None


def threads_cpu(pid: int) -> dict[int, tuple[str, int]]:
    """Each thread of ``pid``: its state and CPU time in ns (schedstat); empty when the process is gone."""
    try:
        tids = os.listdir(f"{PROC}/{pid}/task")
    except OSError:
        return {}
    threads = {}
    for tid in tids:
        try:
            with open(f"{PROC}/{pid}/task/{tid}/stat") as f:
                state = _parse_stat(f.read()).state
            with open(f"{PROC}/{pid}/task/{tid}/schedstat") as f:
                threads[int(tid)] = (state, int(f.read().split()[0]))
        except (OSError, ValueError, IndexError):
            continue
    return threads


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


# System calls a blocked thread sits in that say something about what it waits on, by machine: the
# numbers of x86_64's table, and of the generic table that aarch64 and riscv64 use.
_SYSCALLS = {
    "x86_64": {
        219: "restart_syscall",
        0: "read",
        1: "write",
        7: "poll",
        17: "pread64",
        18: "pwrite64",
        19: "readv",
        20: "writev",
        23: "select",
        24: "sched_yield",
        35: "nanosleep",
        42: "connect",
        43: "accept",
        44: "sendto",
        45: "recvfrom",
        46: "sendmsg",
        47: "recvmsg",
        61: "wait4",
        74: "fsync",
        75: "fdatasync",
        16: "ioctl",
        202: "futex",
        230: "clock_nanosleep",
        232: "epoll_wait",
        257: "openat",
        270: "pselect6",
        271: "ppoll",
        281: "epoll_pwait",
        288: "accept4",
        247: "waitid",
        441: "epoll_pwait2",
    },
    "generic": {
        128: "restart_syscall",
        63: "read",
        64: "write",
        65: "readv",
        66: "writev",
        67: "pread64",
        68: "pwrite64",
        72: "pselect6",
        73: "ppoll",
        82: "fsync",
        83: "fdatasync",
        29: "ioctl",
        98: "futex",
        101: "nanosleep",
        115: "clock_nanosleep",
        124: "sched_yield",
        22: "epoll_pwait",
        56: "openat",
        202: "accept",
        203: "connect",
        206: "sendto",
        207: "recvfrom",
        211: "sendmsg",
        212: "recvmsg",
        242: "accept4",
        260: "wait4",
        95: "waitid",
        441: "epoll_pwait2",
    },
}
# Shared libraries whose presence makes a process a CUDA (and NCCL) one.
_CUDA_LIBS = ("/libcuda.so", "/libcudart.so", "/libnccl.so", "libcuda.so.", "libnccl.so.")


def _syscall_table() -> dict[int, str]:
    return _SYSCALLS["x86_64"] if os.uname().machine == "x86_64" else _SYSCALLS["generic"]


def main_thread_syscall(pid: int) -> str | None:
    """The system call the main thread sits in (``futex``, ``clock_nanosleep``, ...), ``running`` when it is
    on the CPU, ``syscall-N`` for one this table does not name; None when unreadable (another user's process).

    ``/proc/PID/syscall`` needs the same ptrace access as py-spy; it costs the target nothing.
    """
    try:
        with open(f"{PROC}/{pid}/syscall") as f:
            text = f.read().split()
    except OSError:
        return None
    if not text:
        return None
    if text[0] == "running":
        return "running"
    if not text[0].isdigit():  # "-1 sp pc": blocked, but not in a system call
        return None
    number = int(text[0])
    return _syscall_table().get(number, f"syscall-{number}")


def maps_cuda(pid: int) -> bool | None:
    """Whether the process has CUDA or NCCL libraries mapped; None when its maps cannot be read."""
    try:
        with open(f"{PROC}/{pid}/maps", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return any(lib.encode() in data for lib in _CUDA_LIBS)


def start_time(pid: int) -> float | None:
    """When the process started, in seconds since the epoch (stat's start time after /proc/stat's btime)."""
    try:
        with open(f"{PROC}/{pid}/stat") as f:
            text = f.read()
        with open(f"{PROC}/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        ticks = int(text[text.rindex(")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def real_uid(pid: int) -> int | None:
    """The real user id of a process (from /proc/PID/status)."""
    try:
        with open(f"{PROC}/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def is_running(pid: int) -> bool:
    """The process exists and has not exited (a zombie has: its parent has yet to reap it)."""
    stat = read_stat(pid)
    return stat is not None and stat.state != ProcessState.ZOMBIE


def zombie_exit_code(pid: int) -> int | None:
    """The exit code of an exited child its parent has not reaped yet (``/proc/PID/stat``'s exit_code field)."""
    try:
        with open(f"{PROC}/{pid}/stat", encoding="utf-8", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if not fields or fields[0] != ProcessState.ZOMBIE or len(fields) < 50:
        return None
    status = int(fields[49])
    return 128 + (status & 0x7F) if status & 0x7F else (status >> 8) & 0xFF
