"""A sample in which py-spy ran out of time on every rank (a node too busy to give it a CPU) is a sample without
stacks, and watch goes on; it is not the end of the watch (exit 3), as it was in a loaded CI run (issue #22:
"could not capture any of 2 target(s) (... py-spy timed out after 1s (3s in all, waiting for a CPU))").

The Watcher takes its capture as a parameter: here one that times out as ``capture`` does under starvation,
then returns the recorded capture of a real hung job (tests/fixtures/captures/mtp_cp_pp).
"""

from __future__ import annotations

import pytest

from mtpdiag.errors import NothingCaptured
from mtpdiag.pipeline import LayoutOptions
from mtpdiag.pipeline.watcher import JobEnded, Watcher
from support.captures import load_scenario

STARVED = "could not capture any of 4 target(s) (pid 1: py-spy timed out after 1s (3s in all, waiting for a CPU))"


def _watcher(take_stacks, targets=(1, 2, 3, 4)) -> Watcher:
    return Watcher(
        list_targets=lambda: list(targets), take_stacks=take_stacks, layout=LayoutOptions(), interval=1.0, stall=5.0
    )


def test_a_sample_that_timed_out_on_every_rank_has_no_stacks_and_the_next_reads_them():
    snapshot, _, _ = load_scenario("mtp_cp_pp")
    tries = []

    def take_stacks(targets, _busy):
        tries.append(targets)
        if len(tries) <= 2:
            raise NothingCaptured(STARVED, timed_out=True)
        return snapshot

    watcher = _watcher(take_stacks)
    assert watcher._stacks_or_none([1, 2, 3, 4]) is None
    assert watcher._stacks_or_none([1, 2, 3, 4]) is None
    assert watcher._stacks_or_none([1, 2, 3, 4]) is snapshot
    watcher.last = snapshot
    assert watcher.last_look()[0] is snapshot
    assert len(tries) == 4


def test_unreadable_for_another_reason_still_ends_the_watch():
    def take_stacks(_targets, _busy):
        raise NothingCaptured("could not capture any of 4 target(s) (pid 1: permission denied)")

    with pytest.raises(NothingCaptured, match="permission denied"):
        _watcher(take_stacks)._stacks_or_none([1, 2, 3, 4])


def test_the_last_look_starved_shows_the_last_sample_read_or_says_nothing_was_captured():
    snapshot, _, _ = load_scenario("mtp_cp_pp")

    def starved(_targets, _busy):
        raise NothingCaptured(STARVED, timed_out=True)

    watcher = _watcher(starved)
    with pytest.raises(NothingCaptured, match="timed out") as raised:  # never read: exit 3, never "the job ended"
        watcher.last_look()
    assert raised.value.timed_out and not isinstance(raised.value, JobEnded)
    watcher.last = snapshot
    assert watcher.last_look()[0] is snapshot  # the ranks are still there: where they were last seen


def test_ranks_that_changed_under_a_starved_dump_are_a_job_that_ends():
    listings = iter([[1, 2, 3, 4], [1, 2]])

    def starved(_targets, _busy):
        raise NothingCaptured(STARVED, timed_out=True)

    watcher = Watcher(
        list_targets=lambda: next(listings), take_stacks=starved, layout=LayoutOptions(), interval=1.0, stall=5.0
    )
    with pytest.raises(JobEnded):
        watcher.last_look()
