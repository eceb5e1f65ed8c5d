"""Which processes are the workers: a rank-carrying Python process is one; a launcher expands.

A pid without ``RANK`` (torchrun's elastic agent, a raylet, a shell) stands for its descendant
Python processes that carry ``RANK``. Only the topmost ranked process of a subtree counts: a
worker's DataLoader or compile subprocesses inherit its ``RANK`` but are not ranks of their own.
"""

from __future__ import annotations

import os

from mtpdiag.capture import procfs
from mtpdiag.errors import InputError


def find_targets(pids: list[int], scan_all: bool) -> list[int]:
    """Worker pids for the given pids (launchers expanded) and, with ``scan_all``, the whole host."""
    if not pids and not scan_all:
        raise InputError("no target: give --pid PID (a worker or its launcher) or --all")
    found: list[int] = []
    for pid in pids:
        found.extend(_expand(pid))
    if scan_all:
        found.extend(_scan_host())
    if scan_all and not pids and not found:
        raise InputError("--all found no process with RANK and WORLD_SIZE in its environment on this host")
    return sorted(set(found))


def is_worker(pid: int, env: dict[str, str] | None = None) -> bool:
    """A Python process that carries RANK."""
    env = procfs.read_env(pid) if env is None else env
    return bool(env) and "RANK" in env and procfs.is_python(pid)


def _expand(pid: int) -> list[int]:
    if pid <= 0:
        raise InputError(f"pid {pid} is not a valid process id")
    stat = procfs.read_stat(pid)
    if stat is None:
        raise InputError(f"pid {pid} does not exist")
    if stat.state == "Z":
        raise InputError(f"pid {pid} has exited (a zombie waiting for its parent)")
    env = procfs.read_env(pid)
    if env is not None and is_worker(pid, env):
        return [pid]
    workers, unreadable = _ranked_descendants(pid)
    if workers:
        return workers
    python = procfs.is_python(pid)
    if python and env is not None and "SLURM_PROCID" in env:
        return [pid]  # srun-launched worker that sets up torch.distributed from SLURM_* itself
    if env is None:
        raise InputError(f"cannot read the environment of pid {pid} (permission denied: "
                         "run mtpdiag as the job's user or as root)")
    if unreadable:
        raise InputError(f"pid {pid} has {unreadable} descendant process(es) whose environment cannot be read "
                         "(permission denied: run mtpdiag as the job's user or as root)")
    what = "a Python process without RANK in its environment" if python else "not a Python process"
    raise InputError(f"pid {pid} is {what} and has no ranked Python descendants")


def _ranked_descendants(pid: int) -> tuple[list[int], int]:
    """Topmost ranked Python descendants of ``pid``, and how many descendants could not be read."""
    tree = procfs.children_map()
    workers, unreadable = [], 0
    todo = list(tree.get(pid, []))
    while todo:
        child = todo.pop(0)
        env = procfs.read_env(child)
        if env is None:
            unreadable += procfs.read_stat(child) is not None
        elif is_worker(child, env):
            workers.append(child)
            continue  # its own children are its helpers, not ranks
        todo.extend(tree.get(child, []))
    return sorted(workers), unreadable


def _scan_host() -> list[int]:
    """Every topmost Python process on the host with RANK and WORLD_SIZE (Ray actors included)."""
    own = {os.getpid(), *procfs.ancestors(os.getpid())}
    ranked = set()
    for pid in procfs.all_pids():
        if pid in own:
            continue
        env = procfs.read_env(pid)
        if env and "RANK" in env and "WORLD_SIZE" in env and procfs.is_python(pid):
            ranked.add(pid)
    return [pid for pid in ranked if not ranked.intersection(procfs.ancestors(pid))]
