"""``mtpdiag watch`` on real torchrun/gloo jobs, and ``StallTracker`` fed real samples.

Three jobs, one per test class, each killed when its class is done:

* ``TestHang``: the MTP-CP reproducer (``--gate buggy --cp 2``, on two ranks: the bug's smallest world),
  started fresh, so that watch sees it run and then go quiet.
* ``TestHealthy``: the gated_collectives healthy loop with a few ms of matmul per step plus the
  gradient all_reduce, forever, on two ranks (as ``TestSlowJob``'s).
* ``TestSlowJob``: the same loop with a 2 s data-loader wait per step (the main thread sleeps, its CPU
  is flat) and a fixed number of steps, so that the job ends while watch is still watching.

The latency from the hang's onset to watch calling it is printed (``pytest -s``), not asserted.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from mtpdiag.analysis.stall import StallTracker, stack_signatures
from mtpdiag.capture import capture, procfs
from mtpdiag.capture.procfs import main_thread_cpu_ns
from mtpdiag.fix.verify.launch import start_torchrun
from mtpdiag.inputs.bundle import load_bundle
from mtpdiag.pipeline.sampling import sample_once
from support.jobs_e2e import HEALTHY_STEPS, MTP_WORKER, ROOT, _wait_for_log, run_cli

pytestmark = pytest.mark.e2e

NS_PER_TICK = 10_000_000  # USER_HZ is 100 on Linux

STEP_JOB_RANKS = 2


def _start_step_job(tmp, load_sleep: float, steps: int):
    """The healthy loop with a realistic step (support/healthy_steps.py): a data loader that waits ``load_sleep``
    seconds for I/O, then a batch of 2048 x 64, so that the step's matmuls take a few ms."""
    args = ["--scenario", "healthy", "--steps", str(steps), "--log-every", "1"]
    env = {"HEALTHY_LOAD_SLEEP": str(load_sleep), "HEALTHY_ROWS": "2048"}
    # Two ranks: the healthy scenario is pure data parallelism at any size, and each rank of a busy step job
    # costs a core while it runs (CI's e2e tier is bound by CPU, docs/design.md).
    return start_torchrun(HEALTHY_STEPS, args, nproc=STEP_JOB_RANKS, env=env, log_path=str(tmp / "job.log"))


def _watch(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    result = run_cli("watch", *args, timeout=timeout)
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    return result


def _real_samples(tracker: StallTracker, pids: list[int], clock: list[float]) -> list[StallTracker]:
    """watch's own sampling (CPU, then stacks when nothing moved) of real workers, one second apart
    in real time; the tracker is told the times in ``clock`` so that its decisions do not depend on
    how slow the machine is today."""
    seen = []
    for now in clock:
        tracker, _ = sample_once(
            tracker, pids, now, lambda targets, busy: capture(targets, nonblocking=busy, timeout=30.0)
        )
        seen.append(tracker)
        time.sleep(1.0)
    return seen


class _QuietClock:
    """Reads every worker's main-thread ticks ten times a second; ``quiet_at`` is when the last
    one changed (the job's last progress, as ``Job.wait_until_stuck`` sees it)."""

    def __init__(self, pids: list[int]) -> None:
        self._pids, self._last = pids, {}
        self.quiet_at = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            ticks = {p: procfs.main_thread_ticks(p) for p in self._pids}
            if ticks != self._last:
                self._last, self.quiet_at = ticks, time.monotonic()
            time.sleep(0.1)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


# ------------------------------------------------------------------------------------------ the hang


@pytest.fixture(scope="class")
def hang_job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("watch-hang")
    job = start_torchrun(
        str(MTP_WORKER), ["--gate", "buggy", "--cp", "2", "--pp", "1"], nproc=2, log_path=str(tmp / "job.log")
    )
    try:
        workers = job.wait_for_workers(timeout=120)
        yield job, workers
    finally:
        job.kill()


class TestHang:
    def test_watch_calls_the_hang_with_defaults(self, hang_job, tmp_path):
        job, workers = hang_job
        started = time.monotonic()
        clock = _QuietClock(workers)  # the job is still importing torch and megatron here
        try:
            result = _watch("--pid", str(job.pid), "--json", "--out", str(tmp_path / "hang.json"))
            called = time.monotonic()
        finally:
            clock.stop()
        print(
            f"\nwatch (defaults) ran {called - started:.1f} s; the job went quiet "
            f"{clock.quiet_at - started:.1f} s in; hang called {called - clock.quiet_at:.1f} s after "
            "the last main-thread tick (incl. diagnosis, bundle, interpreter exit)"
        )
        assert result.returncode == 1, result.stderr[-2000:]
        report = json.loads(result.stdout)
        assert report["progress"]["hang"] is True
        assert report["progress"]["stalled_for_s"] >= 5.0  # the default stall window
        assert report["progress"]["interval_s"] == 1.0
        assert "mtp-cp-gated-reduce" in [f["id"] for f in report["findings"]]
        assert report["verdict"] == "problem"
        assert sorted(r["rank"] for r in report["ranks"]) == [0, 1]
        bundle = load_bundle(str(tmp_path / "hang.json"))
        assert sorted(c.pid for c in bundle.captures) == sorted(workers)
        assert all(c.main_thread is not None for c in bundle.captures)
        assert result.stderr.strip().splitlines()[-1].endswith(str(tmp_path / "hang.json"))

    def test_tracker_calls_the_hang_from_real_samples(self, hang_job):
        job, workers = hang_job
        job.wait_until_stuck(quiet_s=2.0, timeout=180)
        # The main thread's CPU time in ns, read straight from /proc, and the stacks from real py-spy dumps.
        # (Not stat's 10 ms ticks: a pause's few microseconds can cross a tick boundary and look like 10 ms.)
        tracker = StallTracker.start(0.0)
        decisions = []

        def main_thread_cpus() -> dict[int, int]:
            return {p: main_thread_cpu_ns(p) for p in workers}

        for i in range(4):
            stacks = stack_signatures(capture(workers, timeout=30.0)) if i else None
            tracker = tracker.observe(2.0 * i, main_thread_cpus(), stacks)
            if stacks is not None:
                # As watch does: the pause itself costs a blocked main thread a little kernel time;
                # the reading after the pause is the baseline.
                tracker = tracker.after_pause(2.0 * i, main_thread_cpus())
            decisions.append(tracker.is_hang(2.0 * i, stall_s=5.0))
            time.sleep(0.5)
        assert len(tracker.stacks) == len(workers) and tracker.stack_samples_while_quiet == 3  # a stack a rank
        assert decisions == [False, False, False, True]  # 0, 2, 4 s quiet: not yet; 6 s: a hang
        # watch's own sampling gives the same answer, once the time its blocking dumps held the ranks stopped (not
        # counted in the window, StallTracker.held_s) is added to the clock.
        clock = [0.0, 2.0, 4.0, 6.0]
        seen = _real_samples(StallTracker.start(0.0), workers, clock)
        assert [t.is_hang(now + t.held_s, 5.0) for t, now in zip(seen, clock, strict=True)] == [
            False,
            False,
            False,
            True,
        ]
        assert all(t.held_s > 0 for t in seen[1:])  # each stack sample paused the ranks
        assert [t.stack_samples_while_quiet for t in seen] == [0, 1, 2, 3]

    def test_a_py_spy_pause_is_not_progress(self, hang_job):
        """A pause costs a blocked main thread some kernel time; it must stay below the threshold."""
        _, workers = hang_job
        for _ in range(3):
            before = {p: main_thread_cpu_ns(p) for p in workers}
            capture(workers, timeout=30.0)
            after = {p: main_thread_cpu_ns(p) for p in workers}
            cost = {p: after[p] - before[p] for p in workers}
            print(f"\nmain-thread CPU of one py-spy pause, ns: {sorted(cost.values())}")
            tracker = StallTracker.start(0.0).observe(0.0, before, None).observe(1.0, before, None)
            assert not tracker.after_pause(1.0, after).cpu_moved(after)
            assert tracker.after_pause(1.0, after).quiet_since == 0.0

    def test_nonblocking_watch_never_pauses_the_ranks(self, hang_job, tmp_path):
        job, workers = hang_job
        job.wait_until_stuck(quiet_s=2.0, timeout=180)
        before = {p: main_thread_cpu_ns(p) for p in workers}
        result = _watch(
            "--pid",
            str(job.pid),
            "--nonblocking",
            "--interval",
            "0.5",
            "--stall",
            "2",
            "--json",
            "--out",
            str(tmp_path),
        )
        after = {p: main_thread_cpu_ns(p) for p in workers}
        assert result.returncode == 1, result.stderr[-2000:]
        report = json.loads(result.stdout)
        assert report["progress"]["hang"] is True and report["progress"]["interval_s"] == 0.5
        assert "mtp-cp-gated-reduce" in [f["id"] for f in report["findings"]]
        written = list(tmp_path.glob("mtpdiag-hang-*.json"))  # a new file per hang in a --out directory
        assert len(written) == 1
        assert all(c.nonblocking for c in load_bundle(str(written[0])).captures)
        # A blocking dump wakes each blocked main thread; --nonblocking reads memory and wakes none.
        assert after == before


# ---------------------------------------------------------------------------------- a healthy job


@pytest.fixture(scope="class")
def healthy_job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("watch-healthy")
    job = _start_step_job(tmp, load_sleep=0.05, steps=0)  # a step of ~10 ms computing, then a 50 ms wait for data
    try:
        workers = job.wait_for_workers(timeout=120)
        _wait_for_log(tmp / "job.log", "step", timeout=180)
        yield job, workers
    finally:
        job.kill()


class TestHealthy:
    def test_watch_sees_progress_and_exits_0(self, healthy_job, tmp_path):
        job, _ = healthy_job
        result = _watch("--pid", str(job.pid), "--duration", "15", "--json", "--out", str(tmp_path))
        assert result.returncode == 0, result.stderr[-2000:]
        report = json.loads(result.stdout)
        assert report["progress"]["hang"] is False
        assert report["progress"]["samples"] >= 2
        assert report["findings"] == [] and report["mismatches"] == []
        assert report["verdict"] == "ok"
        assert job.proc.poll() is None  # still training

    def test_tracker_sees_progress_in_real_samples(self, healthy_job):
        _, workers = healthy_job
        clock = [2.0 * i for i in range(6)]
        seen = _real_samples(StallTracker.start(0.0), workers, clock)
        assert not any(t.is_hang(now, 5.0) for t, now in zip(seen, clock, strict=True))
        assert seen[-1].quiet_since >= clock[-3]  # progress seen within the last two samples
        # Main-thread ticks alone move too: the loop is never idle for long (read until they move, at most 30 s:
        # on a loaded machine one second can pass without a tick of the job's).
        first = {p: procfs.main_thread_ticks(p) for p in workers}
        deadline = time.monotonic() + 30.0
        while {p: procfs.main_thread_ticks(p) for p in workers} == first and time.monotonic() < deadline:
            time.sleep(0.25)
        assert {p: procfs.main_thread_ticks(p) for p in workers} != first


# ------------------------------------------------------------------- a slow job that ends meanwhile


@pytest.fixture(scope="class")
def slow_job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("watch-slow")
    job = _start_step_job(tmp, load_sleep=2.0, steps=12)
    try:
        workers = job.wait_for_workers(timeout=120)
        _wait_for_log(tmp / "job.log", "ready", timeout=180)
        yield job, workers, tmp / "job.log"
    finally:
        job.kill()


class TestSlowJob:
    def test_tracker_sees_the_slow_steps_as_progress(self, slow_job):
        _, workers, _ = slow_job
        clock = [float(i) for i in range(7)]  # one sample a second, as watch samples
        ticks_before = {p: procfs.main_thread_ticks(p) for p in workers}
        seen = _real_samples(StallTracker.start(0.0), workers, clock)
        ticks_after = {p: procfs.main_thread_ticks(p) for p in workers}
        assert not any(t.is_hang(now, 5.0) for t, now in zip(seen, clock, strict=True))
        assert any(t.stack_samples_while_quiet for t in seen)  # the data-loader waits were sampled
        print(
            f"\nslow job, 7 s: quiet_since per sample {[t.quiet_since for t in seen]}; main-thread "
            f"ticks moved by {[ticks_after[p] - ticks_before[p] for p in workers]}"
        )

    def test_watch_follows_the_slow_job_to_its_end(self, slow_job, tmp_path):
        job, _, log = slow_job
        # the default 5 s window is checked on real samples above; on a loaded shared box a 2 s step (and the
        # job's teardown) can sit still for longer, so this end-to-end run allows 15 s
        result = _watch("--pid", str(job.pid), "--json", "--stall", "15", "--out", str(tmp_path))
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout == ""
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "the job ended" in lines[0] and "without a hang" in lines[0]
        assert job.wait(timeout=60) == 0
        assert log.read_text().count(" done") == STEP_JOB_RANKS  # every rank ran all 12 slow steps


# ------------------------------------------------------------------------------------ bad input


def test_watch_without_a_target_is_a_usage_error():
    result = subprocess.run(
        [sys.executable, "-m", "mtpdiag", "watch"], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1 and "--pid" in result.stderr


def test_watch_of_a_missing_pid_is_a_usage_error():
    result = _watch("--pid", "999999999", "--json")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["mtpdiag: error: pid 999999999 does not exist"]


def test_watch_checks_the_bundle_destination_first(tmp_path):
    result = _watch("--pid", "1", "--out", str(tmp_path / "no" / "such" / "dir" / "b.json"))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "does not exist" in result.stderr
