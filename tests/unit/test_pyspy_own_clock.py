"""py-spy's timeout counts its own time, not the time it waited for a CPU, and a blocking py-spy waits for a CPU
too when the rank it pauses cannot run to stop (issue #22: in a loaded CI run, 1 s of "own" time in 28 s of a
starved rank's pause timed the dump out and fell back to reading it without pausing)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from mtpdiag.capture import procfs, pyspy
from mtpdiag.capture.pyspy import own_s_of, starved_target_s

MS = 1_000_000  # ns


def test_a_target_thread_runnable_without_running_counts_only_the_cpu_it_got():
    before = {1: ("S", 0), 2: ("R", 100 * MS)}
    after = {1: ("S", 0), 2: ("R", 110 * MS)}  # runnable, 10 ms of CPU in 250 ms: waiting for a CPU
    assert starved_target_s(before, after, 0.25) == 0.01


def test_a_spinning_target_that_runs_and_a_sleeping_one_count_in_full():
    spinning = ({1: ("R", 0)}, {1: ("R", 240 * MS)})  # runnable and running: py-spy waits on it, not on a CPU
    sleeping = ({1: ("S", 0), 2: ("t", 5 * MS)}, {1: ("S", 0), 2: ("t", 5 * MS)})  # asleep or stopped already
    gone = ({1: ("R", 0)}, {})  # the target exited, or /proc could not be read
    for before, after in (spinning, sleeping, gone):
        assert starved_target_s(before, after, 0.25) == 0.25


def test_the_most_starved_thread_and_only_threads_seen_twice_count():
    before = {1: ("R", 0), 2: ("R", 0)}
    after = {1: ("R", 30 * MS), 2: ("R", 2 * MS), 3: ("R", 0)}  # 3 is new: nothing to compare it with
    assert starved_target_s(before, after, 0.25) == 0.002


def test_threads_cpu_reads_every_thread_of_a_live_process():
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        deadline = time.monotonic() + 30  # until the new thread blocks in its wait (it may still be starting)
        while (threads := procfs.threads_cpu(os.getpid())).get(worker.native_id, ("R", 0))[0] != "S":
            assert time.monotonic() < deadline, threads
            time.sleep(0.05)
        assert os.getpid() in threads and all(cpu >= 0 for _, cpu in threads.values())
    finally:
        stop.set()
        worker.join()
    assert procfs.threads_cpu(999_999_999) == {}


def test_a_py_spy_seen_blocked_after_a_long_wait_for_a_cpu_counts_only_what_it_did_not_wait():
    """CI-38: mtpdiag's own tick came 3 s late on a loaded node; py-spy had waited 2.9 s of them for a CPU and was
    blocked (on I/O) at the tick. Only 0.1 s is its own; counting the state read at the tick took all 3 s."""
    assert own_s_of(3.0, runnable=False, cpu_s=0.01, waited_s=2.9, target_s=3.0) == pytest.approx(0.1)
    assert own_s_of(3.0, runnable=True, cpu_s=0.01, waited_s=0.0, target_s=3.0) == 0.01  # waiting now: its CPU
    assert own_s_of(0.25, runnable=False, cpu_s=0.0, waited_s=0.0, target_s=0.25) == 0.25  # asleep on its target
    assert own_s_of(0.25, runnable=False, cpu_s=0.0, waited_s=0.0, target_s=0.01) == 0.01  # the target starved
    assert own_s_of(0.25, runnable=False, cpu_s=None, waited_s=None, target_s=0.25) == 0.25  # /proc unreadable
    assert own_s_of(0.25, runnable=False, cpu_s=0.0, waited_s=0.3, target_s=0.25) == 0.0  # never below nothing


def test_schedstat_reads_the_main_threads_cpu_and_its_wait_for_a_cpu_in_one_read():
    cpu_ns, run_delay_ns = procfs.main_thread_schedstat(os.getpid())
    assert cpu_ns is not None and cpu_ns > 0 and run_delay_ns is not None and run_delay_ns >= 0
    assert procfs.main_thread_schedstat(999_999_999) == (None, None)


def test_a_py_spy_that_exited_before_a_late_tick_is_done_not_timed_out(monkeypatch):
    """A starved mtpdiag ticks late; a tick that finds py-spy exited counted the seconds since it exited as its
    own, and the next look at the clock timed out a py-spy that had finished. The stand-in for py-spy here exits
    only when the late tick lets it (its stdin closed), and that tick counts ten timeouts."""
    out, err = (os.fdopen(os.memfd_create(name), "w+b") for name in ("out", "err"))
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read(); print('[]')"],
        stdin=subprocess.PIPE,
        stdout=out,
        stderr=err,
    )

    def late_tick(clock: pyspy._OwnClock) -> None:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()
        clock.own_s += 10.0

    monkeypatch.setattr(pyspy._OwnClock, "tick", late_tick)
    running = pyspy.Running(proc.pid, proc, True, None, out, err)
    try:
        assert pyspy.wait(running, timeout=1.0) == (b"[]\n", b"")
    finally:
        out.close()
        err.close()
