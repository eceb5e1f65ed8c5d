"""A CPU group with a quota (the cgroup v1 ``cpu`` controller): the processes and threads put in it stay runnable
(state R) and get only the quota's CPU, as on a node whose every core is taken, without burning a core to make
them wait. Where no group can be made (no cgroup v1 ``cpu`` controller, or not root), the test that needs one is
``unavailable``: a failure in CI, a skip elsewhere."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from conftest import unavailable

CPU_CONTROLLER = "/sys/fs/cgroup/cpu"


@dataclass(frozen=True)
class QuotaGroup:
    """A CPU group the caller puts tasks in (its directory under the ``cpu`` controller)."""

    path: str

    def add_process(self, pid: int) -> None:
        """Every thread of ``pid``, and what it starts from now on."""
        self._write("cgroup.procs", pid)

    def add_thread(self, tid: int) -> None:
        """One thread (``threading.get_native_id()``), and the processes it starts from now on."""
        self._write("tasks", tid)

    def lift(self) -> None:
        """No quota any more: a throttled process needs CPU to die."""
        self._write("cpu.cfs_quota_us", -1)

    def _write(self, name: str, value: int) -> None:
        with open(os.path.join(self.path, name), "w") as f:
            f.write(str(value))


@contextmanager
def cpu_quota(quota_us: int, period_us: int, why: str) -> Iterator[QuotaGroup]:
    """A group whose tasks share ``quota_us`` of CPU every ``period_us``; ``why`` says what needs it, for the
    message when none can be made. On exit the quota is lifted and the group removed once its tasks have ended
    (end them after ``lift``)."""
    path = os.path.join(CPU_CONTROLLER, f"mtpdiag-quota-{os.getpid()}-{time.monotonic_ns()}")
    try:
        os.mkdir(path)
    except OSError as exc:
        unavailable(f"no CPU group can be made here ({exc}): {why} needs a cgroup v1 cpu quota")
    group = QuotaGroup(path)
    try:
        group._write("cpu.cfs_period_us", period_us)
        group._write("cpu.cfs_quota_us", quota_us)
        yield group
    finally:
        group.lift()
        for _ in range(100):
            try:
                os.rmdir(path)
                break
            except OSError:  # tasks still in it: a thread or a process that has not ended yet
                time.sleep(0.1)
