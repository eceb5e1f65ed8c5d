"""A sample in which py-spy ran out of time on every rank (a node too busy to give it a CPU) is a sample without
stacks, and watch goes on; it is not the end of the watch (exit 3), as it was in a loaded CI run (issue #22:
"could not capture any of 2 target(s) (... py-spy timed out after 1s (3s in all, waiting for a CPU))"). Nor is it
progress: with no stacks to compare, a spinning rank's CPU says nothing, so a hung job is never seen to move.

The Watcher takes its capture as a parameter: here one that times out as ``capture`` does under starvation,
then returns the recorded capture of a real hung job (tests/fixtures/captures/mtp_cp_pp).
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from mtpdiag.errors import NothingCaptured
from mtpdiag.pipeline.watcher import JobEnded, sampling_summary
from support.captures import load_scenario
from support.watchers import watcher_of

STARVED = "could not capture any of 4 target(s) (pid 1: py-spy timed out after 1s (3s in all, waiting for a CPU))"


@pytest.fixture
def spinning():
    """A process whose main thread burns CPU without end, as a rank spinning at a host sync does."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("spare", [False, True], ids=["watch", "run"])
def test_starved_samples_of_a_busy_rank_are_no_progress_and_the_next_sample_reads_the_stacks(spinning, spare):
    """A starved sample has no stacks to compare, so a rank's moving CPU is no progress (a spinning rank would
    look busy); it neither ends the watch nor restarts the quiet window."""
    snapshot, _, _ = load_scenario("mtp_cp_pp")
    tries = []

    def take_stacks(targets, _busy):
        tries.append(targets)
        if len(tries) <= 2:
            raise NothingCaptured(STARVED, timed_out=True)
        return snapshot

    watcher = watcher_of(lambda: [spinning], take_stacks, spare=spare)
    watcher.sample(0.0)  # the CPU baseline (spare: the first stacks)
    quiet_since = watcher.tracker.quiet_since
    for now in (1.0, 2.0):
        time.sleep(0.2)  # the rank burns CPU meanwhile
        assert watcher.sample(now).snapshot is None
        assert watcher.tracker.quiet_since == quiet_since
    assert watcher.sample(3.0).snapshot is snapshot and watcher.last is snapshot
    assert len(tries) == 3  # every sample after the baseline asked for stacks
    assert watcher.reads if spare else not watcher.reads  # run's sparing path was the one taken
    if spare:  # events.log counts the starved reads apart from the stacks read
        summary = sampling_summary(watcher)
        assert "stacks read at 1 (" in summary, summary
        assert summary.endswith("starved of CPU at 2 (py-spy got none in time on any rank)"), summary


def test_unreadable_for_another_reason_still_ends_the_watch():
    def take_stacks(_targets, _busy):
        raise NothingCaptured("could not capture any of 4 target(s) (pid 1: permission denied)")

    with pytest.raises(NothingCaptured, match="permission denied"):
        watcher_of(lambda: [1, 2, 3, 4], take_stacks)._stacks_or_none([1, 2, 3, 4])


def test_the_last_look_starved_shows_the_last_sample_read_or_says_nothing_was_captured():
    snapshot, _, _ = load_scenario("mtp_cp_pp")

    def starved(_targets, _busy):
        raise NothingCaptured(STARVED, timed_out=True)

    watcher = watcher_of(lambda: [1, 2, 3, 4], starved)
    with pytest.raises(NothingCaptured, match="timed out") as raised:  # never read: exit 3, never "the job ended"
        watcher.last_look()
    assert raised.value.timed_out and not isinstance(raised.value, JobEnded)
    watcher.last = snapshot
    assert watcher.last_look()[0] is snapshot  # the ranks are still there: where they were last seen


def test_ranks_that_changed_under_a_starved_dump_are_a_job_that_ends():
    listings = iter([[1, 2, 3, 4], [1, 2]])

    def starved(_targets, _busy):
        raise NothingCaptured(STARVED, timed_out=True)

    watcher = watcher_of(lambda: next(listings), starved)
    with pytest.raises(JobEnded):
        watcher.last_look()
