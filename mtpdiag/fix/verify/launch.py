"""Start, watch and end local torchrun jobs: ``verify``'s worlds, the README's demo, the examples and the tests.

Ending a job walks its descendants by pid and SIGKILLs each one (``kill_pids``): torchrun may give workers
their own process groups, and a SIGSTOPped worker ignores SIGTERM, so killing a process group is not enough.
Whether a job has gone quiet is read with the stall detector's test of main-thread CPU (``analysis.stall``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from mtpdiag.analysis.stall import cpu_moved
from mtpdiag.capture import procfs

# A tick of /proc's CPU times in ns: a main thread whose ticks did not change used no CPU to speak of.
TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK")


@dataclass
class Job:
    """A launched torchrun job. ``proc`` is the torchrun agent."""

    proc: subprocess.Popen[bytes]
    nproc: int
    log_path: str | None = None
    _known: set[int] = field(default_factory=set)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def workers(self) -> list[int]:
        """Worker pids, in rank order: descendants of the agent that carry RANK in their environment.

        A child still between fork and exec shows the agent's environment, RANK included where the
        agent has one (a Kubeflow pod's); it is no worker yet. Counting it once gave ranks 0, 3, 1, 2.
        A child of a worker with the worker's RANK (a DataLoader worker) is a helper, not a worker.
        """
        agent_env = procfs.read_env(self.pid)
        ranks: dict[int, int] = {}
        for pid in procfs.descendants(self.pid):
            env = procfs.read_env(pid)
            if env and "RANK" in env and env != agent_env:
                ranks[pid] = int(env["RANK"] or 0)
        self._known.update(ranks)
        # A worker's own children (DataLoader workers, helpers) inherit its RANK: they are no workers.
        helpers = {pid for pid in ranks if (stat := procfs.read_stat(pid)) and ranks.get(stat.ppid) == ranks[pid]}
        return sorted((pid for pid in ranks if pid not in helpers), key=ranks.__getitem__)

    def wait_for_workers(self, timeout: float = 60.0) -> list[int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pids = self.workers()
            if len(pids) >= self.nproc:
                return pids
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"torchrun exited with {self.proc.returncode} before its workers started{self._log_tail()}"
                )
            time.sleep(0.2)
        raise TimeoutError(f"only {len(self.workers())} of {self.nproc} workers appeared in {timeout}s")

    def wait_until_stuck(self, quiet_s: float = 3.0, timeout: float = 90.0) -> list[int]:
        """Wait until every worker's main thread has used no CPU, and was never runnable or in a disk wait (states
        R and D), for ``quiet_s`` seconds.

        A runnable thread that waits for a CPU uses none either: on a loaded machine (CI-26) four ranks still
        importing got no CPU for 3 s and were taken for hung. Nor does one in D, which waits for the kernel (a
        module's pages read from disk, say), not for a peer; a rank was once read with importlib at the top of its
        stack, and D is one way an importing rank looks quiet. A rank blocked in a collective sleeps (S)."""
        pids = self.wait_for_workers(timeout)
        wait_until_quiet(pids, quiet_s, timeout, still_on=self._still_running)
        return pids

    def _still_running(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"the job finished (exit {self.proc.returncode}) instead of hanging{self._log_tail()}")

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """SIGKILL the agent and every descendant it ever had, by pid."""
        pids = set(self._known) | set(procfs.descendants(self.pid))
        kill_pids([self.pid], wait_s=0)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        kill_pids(pids)

    def _log_tail(self) -> str:
        if not self.log_path:
            return ""
        try:
            with open(self.log_path, errors="replace") as f:
                return ": " + " | ".join(f.read().strip().splitlines()[-5:])
        except OSError:
            return ""

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


def start_torchrun(
    script: str,
    args: list[str],
    nproc: int,
    env: dict[str, str] | None = None,
    log_path: str | None = None,
    prefix: tuple[str, ...] = (),
) -> Job:
    """Launch ``torchrun --standalone --nproc-per-node N script args`` in the background.

    ``prefix`` runs it under another command that must exec into torchrun (so ``Job.pid`` is still the
    agent's): ``examples/network_loss`` gives the job a network namespace of its own that way.
    """
    cmd = [
        *prefix,
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        script,
        *args,
    ]
    full_env = dict(os.environ)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env.update(env or {})
    out = open(log_path, "w") if log_path else None  # the child keeps its own copy; ours closes below
    try:
        proc = subprocess.Popen(
            cmd,
            env=full_env,
            stdout=out if out is not None else subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    finally:
        if out is not None:
            out.close()
    return Job(proc=proc, nproc=nproc, log_path=log_path)


def wait_until_quiet(
    pids: list[int], quiet_s: float, timeout: float, still_on: Callable[[], None] = lambda: None
) -> None:
    """Until no main thread of ``pids`` has used CPU, or been runnable or in the kernel (R, D), for ``quiet_s``
    (``Job.wait_until_stuck`` says why); ``still_on()`` raises when waiting longer is pointless (the job ended).
    TimeoutError after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: dict[int, int | None] = {}
    since = time.monotonic()
    while time.monotonic() < deadline:
        still_on()
        cpu = main_thread_cpu(pids)
        if any(procfs.main_thread_busy(p) for p in pids) or cpu_moved(last, cpu, TICK_NS):
            last, since = cpu, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.25)
    raise TimeoutError(f"the job did not go quiet within {timeout}s")


def main_thread_cpu(pids: list[int]) -> dict[int, int | None]:
    """Each main thread's CPU time, in ns at the resolution of /proc's ticks (None when unreadable)."""
    out: dict[int, int | None] = {}
    for pid in pids:
        ticks = procfs.main_thread_ticks(pid)
        out[pid] = None if ticks is None else ticks * TICK_NS
    return out


def kill_pids(pids: Iterable[int], wait_s: float = 10.0) -> None:
    """SIGKILL every pid (gone or foreign ones are skipped), then wait up to ``wait_s`` until none is left but
    zombies. A pid is only ever killed on the strength of a listing made just before: a reaped pid may
    already belong to someone else."""
    pids = list(pids)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and any(procfs.is_running(p) for p in pids):
        time.sleep(0.05)
