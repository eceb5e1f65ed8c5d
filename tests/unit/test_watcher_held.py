"""The time mtpdiag's own blocking dumps hold the ranks stopped is not time without progress.

A blocking py-spy dump pauses a rank; on a loaded node a py-spy that paused it and then waited for a CPU held it
for seconds. CI-64 called a healthy job hung that way: its 3 s device steps stopped while both ranks were held
(their Flight Recorder dumps, asked for before, were written 5 s late, together), and ``watch`` said "hang after
5.3 s without progress" as they were let go. ``StallTracker.held_s`` keeps that time out of the window.

The Watcher tests take the recorded capture of a real hung job (tests/fixtures/captures/mtp_cp_pp) as the stacks,
and a real process as the target, whose main-thread CPU the samples read from /proc.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from mtpdiag.analysis.stall import StallTracker
from mtpdiag.model import replace
from mtpdiag.pipeline import LayoutOptions, diagnose_snapshot
from mtpdiag.vocabulary.states import Verdict
from support.captures import load_scenario
from support.watchers import watcher_of

CPU = {1: 0}  # a main thread that never runs
STACKS = {("h", 1): ((("wait", "worker.py", 7),), None)}  # the same stack at every sample
MOVED = {("h", 1): ((("step", "worker.py", 9),), None)}


def _quiet_spell(holds: list[float], gap: float = 5.0) -> list[StallTracker]:
    """A stack sample every ``gap`` s of a job that never moves, the n-th holding the ranks ``holds[n]`` s."""
    tracker = StallTracker.start(0.0).observe(0.0, CPU, None)
    seen = []
    for n, held in enumerate(holds, start=1):
        tracker = tracker.observe(n * gap - held, CPU, STACKS, done=n * gap, held_s=held)
        seen.append(tracker)
    return seen


def test_a_window_spent_holding_the_ranks_is_no_window():
    """Samples 5 s apart that each held the ranks 4.5 s leave them free 0.5 s a sample: ten samples to a window."""
    seen = _quiet_spell([4.5] * 12)
    hangs = [t.is_hang(n * 5.0, 5.0) for n, t in enumerate(seen, start=1)]
    assert hangs.index(True) == 9  # 50 s after the last progress, of which 5 s with the ranks free to run
    assert seen[9].stalled_for(50.0) == pytest.approx(5.0) and seen[9].held_s == pytest.approx(45.0)
    # the same spell with dumps that held nothing is a hang at its second stack sample past 5 s
    free = _quiet_spell([0.0] * 3)
    assert [t.is_hang(n * 5.0, 5.0) for n, t in enumerate(free, start=1)] == [False, True, True]


def test_progress_starts_a_new_window_with_nothing_held():
    (tracker,) = _quiet_spell([4.0])
    assert tracker.held_s == 4.0
    moved = tracker.observe(8.0, CPU, MOVED, done=10.0, held_s=2.0)
    assert (moved.quiet_since, moved.held_s) == (10.0, 0.0)  # held before the stack that moved: not in the window


def test_a_collective_completed_during_a_hold_keeps_only_the_hold_after_it():
    """The Flight Recorder dates a collective when it completed: of a 3 s hold that ended at 10 s, at most the part
    after a collective completed at 8 s can fall in the new window."""
    (tracker,) = _quiet_spell([4.0])
    after = tracker.observe(7.0, CPU, STACKS, fr_at=8.0, done=10.0, held_s=3.0)
    assert (after.quiet_since, after.held_s) == (8.0, 2.0)
    skipped = tracker.skipped(7.0, CPU, 9.5, 10.0, held_s=3.0)
    assert (skipped.quiet_since, skipped.held_s) == (9.5, 0.5)


def test_a_timed_out_read_still_held_the_ranks():
    """A py-spy that got no CPU in time may have held the ranks until it was killed: no stacks, yet held."""
    (tracker,) = _quiet_spell([0.0])
    starved = tracker.skipped(5.0, CPU, None, 9.0, held_s=4.0)
    assert starved.held_s == 4.0 and starved.stalled_for(9.0) == pytest.approx(5.0)


def test_the_main_thread_running_during_a_pause_ends_the_hold():
    (tracker,) = _quiet_spell([4.0])
    resumed = tracker.after_pause(6.0, {1: 5_000_000})
    assert (resumed.quiet_since, resumed.held_s) == (6.0, 0.0)


@pytest.fixture
def sleeper():
    """A real process whose main thread does not run: each sample reads its stacks blocking (a pause)."""
    script = "import time; print('ready', flush=True); time.sleep(600)"
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"  # past its start-up: quiet from now
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("spare", [False, True], ids=["watch", "run"])
def test_the_watcher_counts_a_blocking_read_as_held(sleeper, spare):
    """Each blocking read holds the ranks for as long as it takes (at least the 0.2 s this one sleeps); a read
    that does not pause them (``busy``) holds nothing."""
    snapshot, _, _ = load_scenario("mtp_cp_pp")
    reads: list[bool] = []

    def take_stacks(_targets, busy):
        reads.append(busy)
        time.sleep(0.2)
        return snapshot

    watcher = watcher_of(lambda: [sleeper], take_stacks, spare=spare)
    for n in range(4):
        watcher.sample(float(n))
    blocking = [busy for busy in reads if not busy]
    assert blocking and len(blocking) == len(reads), reads  # a quiet main thread: every read pauses it
    assert watcher.tracker.held_s >= 0.2 * (len(reads) - 1)  # the first read is the stack baseline of the spell


def test_a_read_of_running_ranks_holds_nothing():
    tracker = StallTracker.start(0.0).observe(0.0, CPU, None)
    busy = tracker.observe(1.0, {1: 9_000_000}, STACKS, done=1.5, held_s=0.0)
    assert busy.held_s == 0.0


def test_a_spell_quiet_by_the_clock_is_never_ok_when_the_time_runs_out():
    """The held time delays a hang's call; it never makes a job that was quiet for a whole window by the clock ok."""
    from mtpdiag.errors import EXIT_INCOMPLETE, EXIT_OK
    from mtpdiag.pipeline import exit_code
    from mtpdiag.pipeline.sampling import progress_report

    snapshot, _, _ = load_scenario("mtp_cp_pp")
    calm = replace(
        diagnose_snapshot(snapshot, LayoutOptions(cp=2, pp=2)), verdict=Verdict.OK, findings=(), mismatches=()
    )
    moved = StallTracker.start(0.0).observe(0.0, CPU, None).observe(1.0, CPU, STACKS, fr_at=1.0)
    assert moved.progressed
    held = moved.observe(3.0, CPU, STACKS, done=4.0, held_s=1.5).observe(5.0, CPU, STACKS, done=6.5, held_s=1.5)
    assert not held.is_hang(6.5, 5.0) and held.quiet_by_the_clock(6.5, 5.0)  # 5.5 s by the clock, 2.5 s free
    late = progress_report(calm, held, 6.5, 1.0, 5.0)
    assert exit_code(late) == EXIT_INCOMPLETE and "held stopped by mtpdiag" in late.notes[-1], late.notes
    free = moved.observe(3.0, CPU, STACKS, done=3.0).observe(4.0, CPU, STACKS, done=4.0)
    assert not free.quiet_by_the_clock(4.5, 5.0) and exit_code(progress_report(calm, free, 4.5, 1.0, 5.0)) == EXIT_OK
