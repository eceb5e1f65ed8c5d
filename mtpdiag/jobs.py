"""Start, watch and end local torchrun jobs: used by the demo, ``verify`` and the tests.

Ending a job walks its descendants by pid and SIGKILLs each one: torchrun may give workers their own
process groups, and a SIGSTOPped worker ignores SIGTERM, so killing a process group is not enough.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from mtpdiag.capture import procfs

# Prefix that runs a command in a new network namespace with its own loopback up: a job started so
# has a private network that ``Job.cut_network`` can take away without touching the host's.
PRIVATE_NETWORK = ("unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh")


@dataclass
class Job:
    """A launched torchrun job. ``proc`` is the torchrun agent."""

    proc: subprocess.Popen
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
        ranks = {}
        for pid in procfs.descendants(self.pid):
            env = procfs.read_env(pid)
            if env and "RANK" in env and env != agent_env:
                ranks[pid] = int(env["RANK"] or 0)
        self._known.update(ranks)
        # A worker's own children (DataLoader workers, helpers) inherit its RANK: they are no workers.
        helpers = {pid for pid in ranks if (stat := procfs.read_stat(pid)) and ranks.get(stat.ppid) == ranks[pid]}
        return sorted((pid for pid in ranks if pid not in helpers), key=ranks.get)

    def wait_for_workers(self, timeout: float = 60.0) -> list[int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pids = self.workers()
            if len(pids) >= self.nproc:
                return pids
            if self.proc.poll() is not None:
                raise RuntimeError(f"torchrun exited with {self.proc.returncode} before its workers started"
                                   f"{self._log_tail()}")
            time.sleep(0.2)
        raise TimeoutError(f"only {len(self.workers())} of {self.nproc} workers appeared in {timeout}s")

    def wait_until_stuck(self, quiet_s: float = 3.0, timeout: float = 90.0) -> list[int]:
        """Wait until every worker's main thread has used no CPU for ``quiet_s`` seconds."""
        pids = self.wait_for_workers(timeout)
        deadline = time.monotonic() + timeout
        last: dict[int, int | None] = {}
        since = time.monotonic()
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the job finished (exit {self.proc.returncode}) instead of hanging"
                                   f"{self._log_tail()}")
            ticks = {p: procfs.main_thread_ticks(p) for p in pids}
            if ticks != last:
                last, since = ticks, time.monotonic()
            elif time.monotonic() - since >= quiet_s:
                return pids
            time.sleep(0.25)
        raise TimeoutError(f"the job did not go quiet within {timeout}s")

    def cut_network(self) -> None:
        """Take down the loopback of the job's private network namespace (``start_torchrun(...,
        private_network=True)``): established connections then stop delivering while sends still
        succeed, so every rank blocks in its next collective below Python, as on a lost network."""
        own = os.readlink("/proc/self/ns/net")
        try:
            theirs = os.readlink(f"/proc/{self.pid}/ns/net")
        except OSError as exc:
            raise RuntimeError(f"cannot read the network namespace of pid {self.pid}: {exc}") from exc
        if theirs == own:
            raise RuntimeError(f"pid {self.pid} shares this process's network namespace; refusing to take "
                               "its loopback down (start the job with private_network=True)")
        done = subprocess.run(["nsenter", f"--net=/proc/{self.pid}/ns/net", "ip", "link", "set", "lo", "down"],
                              capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise RuntimeError(f"could not cut the job's network: {done.stderr.strip()}")

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """SIGKILL the agent and every descendant it ever had, by pid."""
        pids = set(self._known) | set(procfs.descendants(self.pid))
        for pid in [self.pid, *pids]:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(procfs.read_stat(p) and procfs.read_stat(p).state != "Z"
                                                   for p in pids):
            time.sleep(0.05)

    def _log_tail(self) -> str:
        if not self.log_path:
            return ""
        try:
            with open(self.log_path, errors="replace") as f:
                return ": " + " | ".join(f.read().strip().splitlines()[-5:])
        except OSError:
            return ""

    def __enter__(self) -> "Job":
        return self

    def __exit__(self, *exc) -> None:
        self.kill()


def start_torchrun(script: str, args: list[str], nproc: int, env: dict[str, str] | None = None,
                   log_path: str | None = None, private_network: bool = False) -> Job:
    """Launch ``torchrun --standalone --nproc-per-node N script args`` in the background.

    ``private_network`` runs it in its own network namespace (needs root; see ``PRIVATE_NETWORK``);
    ``unshare`` and ``sh`` exec into torchrun, so ``Job.pid`` is still the agent's.
    """
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           script, *args]
    if private_network:
        cmd = [*PRIVATE_NETWORK, *cmd]
    full_env = dict(os.environ)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env.update(env or {})
    out = open(log_path, "w") if log_path else subprocess.DEVNULL
    try:
        proc = subprocess.Popen(cmd, env=full_env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    finally:
        if log_path:
            out.close()
    return Job(proc=proc, nproc=nproc, log_path=log_path)
