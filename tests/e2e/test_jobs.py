"""``mtpdiag.fix.verify.launch`` on real processes (the helpers that the demo, ``verify`` and the e2e tests start
jobs with)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from mtpdiag.capture import procfs
from mtpdiag.fix.verify.launch import Job
from support.cpu_quota import cpu_quota

# An "agent" with a node RANK, as in a Kubeflow pod: it starts two workers with their own RANK (rank 1
# first, so pid order is not rank order) and forks one child that never execs, which therefore keeps
# the agent's environment, as a worker does between fork and exec.
AGENT = """
import os, subprocess, sys, time
for rank in (1, 0):
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                     env={**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2"})
if os.fork() == 0:
    time.sleep(60)
    os._exit(0)
time.sleep(60)
"""


def test_workers_are_the_ranked_children_in_rank_order_not_a_copy_of_the_agent():
    """A CI run got ranks 0, 3, 1, 2: a child read between fork and exec was taken for a rank-0 worker."""
    agent = subprocess.Popen([sys.executable, "-c", AGENT], env={**os.environ, "RANK": "0", "WORLD_SIZE": "1"})
    job = Job(proc=agent, nproc=2)
    try:

        def started() -> list[int]:  # both workers exec'd (they alone have LOCAL_RANK) and the copy forked
            children = procfs.descendants(agent.pid)
            execd = [p for p in children if "LOCAL_RANK" in (procfs.read_env(p) or {})]
            return children if len(children) == 3 and len(execd) == 2 else []

        deadline = time.monotonic() + 30
        while not started() and time.monotonic() < deadline:
            time.sleep(0.05)
        children = started()
        assert len(children) == 3
        copy = [p for p in children if procfs.read_env(p) == procfs.read_env(agent.pid)]
        assert len(copy) == 1 and (procfs.read_env(copy[0]) or {}).get("RANK") == "0"  # what the old code counted
        workers = job.workers()
        assert [procfs.read_env(p)["RANK"] for p in workers] == ["0", "1"]
        assert copy[0] not in workers
    finally:
        job.kill()


# Two ranked workers that would compute for ever; once started, they are moved into a CPU group whose quota is
# 1 ms a second, so they are runnable all the time and get next to no CPU: a starved job, not a hung one.
STARVED_AGENT = """
import os, subprocess, sys, time
for rank in (0, 1):
    subprocess.Popen([sys.executable, "-c", "while True: pass"],
                     env={**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2"})
time.sleep(120)
"""


def test_a_starved_job_whose_workers_wait_for_a_cpu_is_not_taken_for_stuck():
    """CI-26: four ranks still importing got no CPU for 3 s on a loaded machine; ``wait_until_stuck`` said they
    were hung, and the test read them mid-import. A runnable main thread is never quiet."""
    with cpu_quota(1_000, 1_000_000, "the starved job") as group:  # 1 ms of CPU a second
        agent = subprocess.Popen(
            [sys.executable, "-c", STARVED_AGENT], env={**os.environ, "RANK": "0", "WORLD_SIZE": "1"}
        )
        job = Job(proc=agent, nproc=2)
        try:
            workers = job.wait_for_workers(timeout=60)
            for pid in workers:
                group.add_process(pid)
            states = {procfs.read_stat(p).state for p in workers}
            assert states == {"R"}, states  # runnable, whether or not a CPU is theirs
            with pytest.raises(TimeoutError):
                job.wait_until_stuck(quiet_s=1.0, timeout=6.0)
        finally:
            group.lift()  # a throttled process needs CPU to die
            job.kill()


# Two ranked workers whose main thread waits in the kernel (state D) and uses no CPU: each spawns a program with
# posix_spawn, whose child opens a FIFO before it execs; until a writer opens the FIFO the child blocks, and the
# parent waits for it in the kernel (vfork). Once released, each worker sleeps (state S): a quiet job.
IN_THE_KERNEL_AGENT = """
import os, subprocess, sys, time
worker = '''
import os, sys, time
os.posix_spawn("/bin/true", ["true"], os.environ,
               file_actions=[(os.POSIX_SPAWN_OPEN, 3, sys.argv[1], os.O_RDONLY, 0)])
time.sleep(120)
'''
for rank in (0, 1):
    subprocess.Popen([sys.executable, "-c", worker, sys.argv[1 + rank]],
                     env={**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2"})
time.sleep(120)
"""


def test_workers_waiting_in_the_kernel_are_not_stuck_until_they_sleep(tmp_path):
    """A main thread in D (a disk read, a page fault, here a vfork) waits for the kernel, not for a peer: it uses
    no CPU, as a rank blocked in a collective, yet it is on its way. Once it sleeps (S), the job is quiet."""
    fifos = [tmp_path / f"fifo{rank}" for rank in (0, 1)]
    for fifo in fifos:
        os.mkfifo(fifo)
    agent = subprocess.Popen([sys.executable, "-c", IN_THE_KERNEL_AGENT, *map(str, fifos)],
                             env={**os.environ, "RANK": "0", "WORLD_SIZE": "1"})  # fmt: skip
    job = Job(proc=agent, nproc=2)
    try:
        workers = job.wait_for_workers(timeout=60)
        deadline = time.monotonic() + 60
        while {procfs.read_stat(p).state for p in workers} != {"D"}:  # each has reached its posix_spawn
            assert time.monotonic() < deadline, [procfs.read_stat(p).state for p in workers]
            time.sleep(0.05)
        with pytest.raises(TimeoutError):
            job.wait_until_stuck(quiet_s=1.0, timeout=4.0)
        assert {procfs.read_stat(p).state for p in workers} == {"D"}  # still in the kernel all along
        for fifo in fifos:  # a writer lets each child exec; its parent goes on into time.sleep
            os.close(os.open(fifo, os.O_WRONLY))
        assert job.wait_until_stuck(quiet_s=1.0, timeout=60.0) == workers
    finally:
        job.kill()
