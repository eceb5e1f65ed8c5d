"""Which processes are the workers: a rank-carrying Python process is one; a launcher expands.

A pid without ``RANK`` (torchrun's elastic agent, a raylet, a shell) stands for its descendant
Python processes that carry ``RANK``. Only the topmost ranked process of a subtree counts: a
worker's DataLoader or compile subprocesses inherit its ``RANK`` but are not ranks of their own.
"""

from __future__ import annotations

import os
from collections.abc import Collection

from mtpdiag.capture import procfs
from mtpdiag.errors import InputError
from mtpdiag.vocabulary.ops import is_launcher_argv
from mtpdiag.vocabulary.states import ProcessState


def find_targets(pids: list[int], scan_all: bool, exclude: Collection[int] = ()) -> list[int]:
    """Worker pids for the given pids (launchers expanded) and, with ``scan_all``, the whole host; never a pid
    in ``exclude`` (the capturing process and its ancestors are left out anyway)."""
    if not pids and not scan_all:
        raise InputError("no target: give --pid PID (a worker or its launcher) or --all")
    found: list[int] = []
    for pid in pids:
        found.extend(_expand(pid, exclude))
    if scan_all:
        found.extend(_scan_host(exclude))
    if scan_all and not pids and not found:
        raise InputError("--all found no process with RANK and WORLD_SIZE in its environment on this host")
    return sorted(set(found))


def is_worker(pid: int, env: dict[str, str] | None = None) -> bool:
    """A Python process that carries RANK."""
    env = procfs.read_env(pid) if env is None else env
    return env is not None and "RANK" in env and procfs.is_python(pid)


def is_launcher(pid: int) -> bool:
    """torchrun's agent: it may carry RANK itself (a Kubeflow PyTorchJob sets the node's RANK)."""
    return is_launcher_argv(procfs.read_cmdline(pid) or [])


def workers_below(pid: int, exclude: Collection[int] = ()) -> tuple[list[int], int]:
    """The workers among ``pid``'s descendants (a raylet's ranked actors), and how many descendants'
    environment could not be read. A Ray task that runs this sits below the same raylet: it is left out."""
    ranked, unreadable = _ranked_descendants(pid, exclude)
    return _topmost_workers(ranked), unreadable


def _own() -> set[int]:
    """This process and its ancestors: never a target, even when a Ray worker running mtpdiag carries RANK."""
    return {os.getpid(), *procfs.ancestors(os.getpid())}


def _expand(pid: int, exclude: Collection[int] = ()) -> list[int]:
    if pid <= 0:
        raise InputError(f"pid {pid} is not a valid process id")
    stat = procfs.read_stat(pid)
    if stat is None:
        raise InputError(f"pid {pid} does not exist")
    if stat.state == ProcessState.ZOMBIE:
        raise InputError(f"pid {pid} has exited (a zombie waiting for its parent)")
    env = procfs.read_env(pid)
    ranked, unreadable = _ranked_descendants(pid, exclude)
    if env is not None and is_worker(pid, env) and pid not in exclude:
        ranked[pid] = env["RANK"]
    workers = _topmost_workers(ranked)
    if workers:
        return workers
    python = procfs.is_python(pid)
    if python and env is not None and "SLURM_PROCID" in env:
        return [pid]  # srun-launched worker that sets up torch.distributed from SLURM_* itself
    if env is None:
        raise InputError(
            f"cannot read the environment of pid {pid} (permission denied: run mtpdiag as the job's user or as root)"
        )
    if unreadable:
        raise InputError(
            f"pid {pid} has {unreadable} descendant process(es) whose environment cannot be read "
            "(permission denied: run mtpdiag as the job's user or as root)"
        )
    what = "a Python process without RANK in its environment" if python else "not a Python process"
    raise InputError(f"pid {pid} is {what} and has no ranked Python descendants")


def _ranked_descendants(pid: int, exclude: Collection[int] = ()) -> tuple[dict[int, str], int]:
    """RANK of every ranked Python descendant of ``pid``, and how many could not be read."""
    ranked, unreadable = {}, 0
    skip = _own().union(exclude)
    for child in procfs.descendants(pid):
        if child in skip:
            continue
        env = procfs.read_env(child)
        if env is None:
            unreadable += procfs.read_stat(child) is not None
        elif is_worker(child, env):
            ranked[child] = env["RANK"]
    return ranked, unreadable


def _scan_host(exclude: Collection[int] = ()) -> list[int]:
    """Every worker on the host: Python processes with RANK and WORLD_SIZE (Ray actors included)."""
    own = _own().union(exclude)
    ranked = {}
    for pid in procfs.all_pids():
        env = procfs.read_env(pid) if pid not in own else None
        if env and "RANK" in env and "WORLD_SIZE" in env and procfs.is_python(pid):
            ranked[pid] = env["RANK"]
    return _topmost_workers(ranked)


def _topmost_workers(ranked: dict[int, str]) -> list[int]:
    """Ranked processes that are workers: not launchers, not Ray's own, not the helpers of another worker.

    A launcher is torchrun itself, or any ranked process with a ranked descendant of another RANK.
    A helper (DataLoader worker, compile subprocess) inherits its worker's RANK and sits below it.
    """
    lineage = {pid: procfs.ancestors(pid) for pid in ranked}
    launchers = {pid for pid in ranked if is_launcher(pid)}
    for pid, ancestors in lineage.items():
        launchers.update(a for a in ancestors if a in ranked and ranked[a] != ranked[pid])
    workers = set(ranked) - launchers - _with_a_raylets_env(ranked, lineage)
    return sorted(pid for pid in workers if not workers.intersection(lineage[pid]))


def _with_a_raylets_env(ranked: dict[int, str], lineage: dict[int, list[int]]) -> set[int]:
    """Ranked processes whose whitelisted environment is that of a raylet above some ranked process.

    A node's RANK (a Kubeflow PyTorchJob pod has one) passes from the shell that ran ``ray start`` to the
    raylet, Ray's agents, idle workers, the driver and its TaskRunner. A Ray worker's RANK comes from its
    actor's ``runtime_env``, so its environment differs from the raylet's.
    """
    raylets = {a for ancestors in lineage.values() for a in ancestors if procfs.is_raylet(a)}
    node_envs = [env for env in map(procfs.read_env, raylets) if env and "RANK" in env]
    if not node_envs:
        return set()
    return {pid for pid in ranked if procfs.read_env(pid) in node_envs}
